"""Pipeline schedule and overlap: what hides behind what.

* **1F1B / interleaved 1F1B** (Narayanan et al. 2021, Megatron-Core ``schedules.py``
  ``forward_backward_pipelining_with(out)_interleaving``): with p stages, v virtual chunks per rank and m
  microbatches the slowest stage sets the steady state (m · S) and the warm-up/flush idles every rank for
  (p − 1)/v stage-times: step = (m + (p − 1)/v) · S_max. With m < p the warm-up cannot fill (MCore requires
  m ≥ p for interleaving); the bubble is then (p − 1)/v · S as well. A host-bound interleaved schedule does not
  block its host on the neighbours' GPUs, so its bubble leaves out the host time the host spends enqueueing
  ahead; without VPP the exchanges synchronise the device and it does not (:func:`pipeline_step`).
* **EP overlap** (``overlap_moe_expert_parallel_comm``; MCore ``combined_1f1b`` schedule): the backward of
  microbatch i runs merged with the forward of i+1, so each A2A of one can hide behind the compute of the other; the
  first forward and last backward stay exposed. ``ep_overlap_eff`` is the share of the partner's compute usable
  for hiding (both streams contend for SMs and HBM); the flex dispatchers' SMs (DeepEP 20, HybridEP 16 by default)
  are lost to compute while they run.
* **delay_wgrad_compute** moves expert weight-gradient GEMMs after the dispatch so they also cover A2A: the hiding
  window grows by the wgrad share of the MoE backward.
* **TP comm overlap** (TE userbuffers): AG/RS are split in ``num_splits`` chunks pipelined with the GEMM; one chunk
  stays exposed, and anything longer than the GEMM is exposed.
* **CP p2p**: each KV-chunk exchange overlaps the attention of the previous chunk (TE ring attention).
* **DP** (``overlap_grad_reduce`` / ``overlap_param_gather``, distributed optimizer): the gradient reduce-scatter
  runs during the last microbatch's backward and the parameter all-gather during the first microbatch's forward;
  the last / first bucket cannot overlap (MCore ``DistributedDataParallel`` buckets).
"""

from __future__ import annotations


def pipeline_step(stage_seconds: list[float], m: int, pp: int, vpp: int, stage_host: list[float] | None = None,
                  fwd_host_blocks: bool = True) -> tuple[float, float]:
    """(steady-state seconds, bubble seconds) of a (interleaved) 1F1B schedule; see module doc.

    ``stage_host`` (per stage, the exposed host seconds inside ``stage_seconds``) prices the bubble of an interleaved
    schedule on what the host cannot run ahead of. Megatron-LM turns ``overlap_p2p_comm`` on with VPP and off without
    it (``arguments.py`` ``validate_args``; ``batch_p2p_comm = not overlap_p2p_comm`` in ``core_transformer_config_from_args``):

    * without VPP (``forward_backward_pipelining_without_interleaving``) every exchange goes through
      ``P2PCommunicator._communicate`` with ``batch_isend_irecv`` and, ``batch_p2p_sync`` being on by default (no flag
      sets it), a ``torch.cuda.synchronize()`` after it: the host waits for its GPU, which waits for the neighbour,
      so the warm-up / flush idle time includes the neighbours' host time and the bubble is ``(p - 1) · S_max``;
    * with VPP (``forward_backward_pipelining_with_interleaving``, ``overlap_p2p_comm``) the sends and receives are
      ``isend`` / ``irecv`` whose ``wait()`` only orders the compute stream after the NCCL stream (ProcessGroupNCCL
      ``Work.wait``; the CPU blocks only under ``TORCH_NCCL_BLOCKING_WAIT``): a rank's host enqueues its next chunk
      while its GPU waits for the neighbour, so its host time overlaps the idle GPU. Only a host synchronisation inside
      the chunk stops that: the dropless dispatchers' per-MoE-layer ``.tolist()`` of the token counts (forward only;
      ``fwd_host_blocks``), so the warm-up keeps the forward third of the host time and the flush's backward runs
      at GPU speed: the bubble is ``(p - 1)/v · max_i(S_i - h_i · (2/3 if fwd_host_blocks else 1))`` (backward = 2 x
      forward, as :func:`offload_exposed`). The steady state keeps every rank's host time (``m · S_max``).
    """
    s_max = max(stage_seconds) if stage_seconds else 0.0
    steady = m * s_max
    if pp <= 1:
        return steady, 0.0
    unit = s_max
    if vpp > 1 and stage_host:
        hidden = 2.0 / 3.0 if fwd_host_blocks else 1.0
        unit = max([s - h * hidden for s, h in zip(stage_seconds, stage_host, strict=True)])  # a list: one frame
    return steady, (pp - 1) / max(vpp, 1) * unit


def tp_exposed(comm: float, gemm: float, *, overlap: bool, splits: int, sm_frac: float = 0.0) -> float:
    """Exposed TP/SP collective time of a layer given its GEMM time.

    With userbuffers overlap one chunk stays exposed and the rest hides behind the GEMMs, which meanwhile lose the
    ``sm_frac`` of the SMs the communication kernels occupy (TE ``CommOverlap`` ``num_sm``, 16 by default).
    """
    if comm <= 0:
        return 0.0
    if not overlap:
        return comm
    hidden = min(comm * (1 - 1 / splits), gemm)
    return comm - hidden + sm_contention(hidden, sm_frac)


def sm_contention(hidden: float, sm_frac: float) -> float:
    """Compute time lost while ``hidden`` seconds of communication run beside it on ``sm_frac`` of the SMs (the
    same rule for the TP-overlap, DP and flex-dispatcher contention of this module and step.py).

    For those ``hidden`` wall-clock seconds the overlapped kernels have the other 1 - sm_frac of the SMs, so they do
    (1 - sm_frac) x hidden seconds of whole-GPU work; the sm_frac x hidden seconds of work left over run afterwards
    on the whole GPU. The loss is sm_frac x hidden (SM-bound kernels: work per second proportional to the SMs they
    hold; the communication kernels keep their SMs for the whole transfer, DeepEP ``Buffer.set_num_sms``, HybridEP
    ``num_sms_dispatch_api`` / ``num_sms_combine_api``, TE userbuffers ``num_sm``). Charging hidden x sm_frac /
    (1 - sm_frac) would stretch the compute as if all of it ran on the reduced SM count, though only ``hidden``
    seconds of it overlap the communication.
    """
    if hidden <= 0 or sm_frac <= 0:
        return 0.0
    return hidden * min(sm_frac, 1.0)


def offload_exposed(layer_bytes: tuple[float, ...], host_gbs: float, layer_seconds: float, window: int = 1
                    ) -> float:
    """Exposed host-copy time of layer-level CPU activation offloading, per microbatch.

    Megatron-Core's ``--cpu-offloading`` builds Transformer Engine's ``AsyncDoubleBufferGroupOffloadHandler``
    (``transformer_engine/pytorch/cpu_offload.py``) with one group per decoder layer: N offloaded of L. Its
    ``layer_window_map`` spreads the copies over the model: the device-to-host copy of offloaded layer k starts when
    the forward reaches layer (L // N)·k and is waited for at the end of layer (L // N)·(k + 1) − 1
    (``synchronize_on_group_commit_forward``); in backward the reload of layer k starts at layer (L // N)·(k + 1) − 1
    and is waited for at layer (L // N)·k − 1 (``on_group_commit_backward``). So each copy hides behind ``window`` =
    L // N layers of forward (1/3 of ``layer_seconds``, the fwd + bwd time of one layer with bwd = 2 x fwd) and each
    reload behind ``window`` layers of backward (2/3); what is longer is exposed (the copies of one direction run one
    after another on one stream). ``host_gbs`` is the host link per GPU per direction (system catalog
    ``pcie_bw_gbs``: PCIe on DGX, NVLink-C2C on Grace systems).

    Fine-grained activation offloading (Megatron-Core ``pipeline_parallel/fine_grained_activation_offload.py``) is
    priced with ``window`` = 1 and ``layer_bytes`` the offloaded bytes of each decoder layer: ``on_group_commit_forward``
    starts a module group's device-to-host copy on the offload stream once the compute before it is done and the
    forward goes on; ``on_group_start_backward`` reloads the next group on the reload stream (after its offload event,
    ``bulk_reload_group``) and ``on_group_commit_backward`` makes the compute wait for it: each layer's copies hide
    behind about one layer of forward and of backward."""
    if not layer_bytes or host_gbs <= 0:
        return 0.0
    w = max(1, window)
    fwd, bwd = w * layer_seconds / 3.0, w * 2.0 * layer_seconds / 3.0
    out = 0.0
    for b in layer_bytes:
        t = b / (host_gbs * 1e9)
        out += max(0.0, t - fwd) + max(0.0, t - bwd)
    return out


def cp_exposed(comm: float, attn: float, *, cp_comm_type: str) -> float:
    """Exposed CP exchange: ``p2p`` hides behind the attention chunks, the all-to-all/all-gather variants do not."""
    if comm <= 0:
        return 0.0
    if cp_comm_type == "p2p":
        return max(0.0, comm - attn) + comm / 8  # the first chunk's exchange precedes any attention work
    return comm


def ep_exposed(a2a: float, partner_compute: float, m: int, *, overlap: bool, eff: float) -> float:
    """Exposed EP dispatch/combine per microbatch (stage total) under EP overlap or not."""
    if a2a <= 0:
        return 0.0
    if not overlap:
        return a2a
    # ``eff`` is the share of the A2A that the merged FWD-BWD schedule hides when the partner's compute is long
    # enough (nsys on Qwen3-30B-A3B 16xH100: 36.55 % of communication hidden, docs/domain.md §4.4)
    hidden = eff * min(a2a, partner_compute)
    # the first forward and the last backward of the step have no partner microbatch
    return a2a - hidden * (1 - 1 / max(m, 1))


def dp_exposed(comm: float, window: float, buckets: float, *, overlap: bool) -> float:
    """Exposed DP collective: hidden in ``window`` seconds of compute except the last bucket."""
    if comm <= 0:
        return 0.0
    if not overlap:
        return comm
    return max(comm / max(buckets, 1.0), comm - window)
