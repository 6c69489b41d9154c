"""Host (CPU launch) wall: kernels launched per layer × per-launch cost of the platform's host CPU, vs GPU time.

PyTorch eager mode issues every kernel from Python on the host; when the GPU work of a layer is shorter than the
time the host needs to launch it, the GPU starves (docs/domain.md §1 "host/launch" wall; S:wf: GB200 hits it
earlier once FP8 speeds the GEMMs; Llama-3-70B TP8 turns host-bound, D:pg). CUDA graphs replace the kernels of a
captured scope by one ``cudaGraphLaunch`` (TE ``make_graphed_callables`` per scope, or MCore's full-iteration
graph; S:cg, D:cg):

* ``attn`` — the attention block (norm, QKV, core attention, projection) forward and backward;
* ``mlp`` — a dense MLP block; ``mamba`` — a Mamba mixer block;
* ``moe_router`` — router GEMM, scoring, top-k, aux-loss bookkeeping;
* ``moe_preprocess`` — dispatcher metadata and permutation bookkeeping (needs ``moe_router``);
* ``moe`` — the whole MoE layer (static shapes only: drop-and-pad);
* ``full_iteration`` — everything, one launch per step.

Dropless token dispatch (``alltoall``/``flex``) needs the per-expert token counts on the host before the grouped
GEMM can be launched: one device-to-host synchronisation per MoE layer forward (MCore ``MoEAlltoAllTokenDispatcher``
``.tolist()`` of ``num_global_tokens_per_local_expert``); after it the queue is empty and the GPU waits for the
next launches (``host_sync_us``). Kernel counts per component are catalog constants (efficiency.yaml).

Unfused code paths launch more kernels than the fused ones Bridge's performance recipes select: Megatron's unfused
``DotProductAttention`` (``--attention-backend unfused``: baddbmm, scale-mask-softmax, dropout, bmm and their
backward), the unfused token permutation (``moe_permute_fusion`` off: MCore ``moe_utils.permute``/``unpermute`` built
from argsort / index_select / scatter_add instead of TE's fused permute kernels), and the per-expert loop of
``SequentialMLP`` (``moe_grouped_gemm`` off: fc1, activation and fc2 of every local expert, forward and backward),
and the unfused RoPE (``apply_rope_fusion`` off: Megatron-Core ``rope_utils._apply_rotary_pos_emb_bshd`` per Q and K, cos / sin
tables with their scale and cast, the multiplies, rotate-half and the add, and their autograd backward, instead of
one TE ``fused_apply_rotary_pos_emb`` kernel each way).
TE's ``GroupedLinear`` also issues one GEMM per local expert and pass (``general_grouped_gemm``).

EP overlap (``overlap_moe_expert_parallel_comm``) runs the combined 1F1B schedule (Megatron-Core
``pipeline_parallel/combined_1f1b.py``, ``models/common/model_chunk_schedule_plan.py``): each layer is split into
schedule nodes (``TransformerLayerSchedulePlan``: ``pre_dispatch_computation`` and ``mlp``, plus ``moe_dispatch`` and
``moe_combine`` on MoE layers) that run on the compute or the communication stream. The split adds host work that
the fused layer does not have (:func:`ep_overlap_node_ops`, counted in ``pipeline_parallel/utils.ScheduleNode`` and
``models/common/utils.TransformerLayerNode``): per node and direction a ``cudaStreamWaitEvent`` and a
``cudaEventRecord`` (``stream_acquire_context``); in forward a ``detach`` of every node input and of the tensors a
later node reads (``TransformerLayerNode.detach``: the residual, the dispatched probabilities, the shared-expert
output), and for the nodes that free their input (``should_free_input``: dispatch, combine, the experts unless the
alltoall dispatcher has one local expert) a ``record_stream`` and a storage ``resize_`` per input; in backward one
autograd engine call per node (``Variable._execution_engine.run_backward``: the layer's backward is four engine
calls instead of a share of one) and a ``record_stream`` per output gradient. The engine calls are priced like an
eager operation (``launch_us``), the bookkeeping calls, one C++ call each without autograd or module work, at
``native_launch_us``.

Once per step the training loop does host work that no layer owns (:func:`step_launches`): Megatron-LM
``training.train_step`` runs the optimizer (``DistributedOptimizer.step``: per-parameter main-grad copies,
``clip_grad_norm_fp32`` and ``count_zeros_fp32`` walking every parameter tensor, multi-tensor Adam) and then
``training_log`` reduces the losses; each ``.item()`` of the loss, grad norm and zero count is a device-to-host
synchronisation. The cost is the parameter tensors of a rank times kernels per tensor plus the step's syncs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LayerLaunches:
    """Host work of one decoder layer for one microbatch (forward + backward)."""

    eager_kernels: float
    graph_launches: float
    syncs: float
    native_kernels: float = 0.0  #: launched from C++ inside one Python call (TE userbuffers chunks): no Python cost


def host_cpu_family(host_cpu: str) -> str:
    """'grace' for NVIDIA Grace hosts (GB200/GB300), else 'x86' (Xeon / EPYC DGX hosts)."""
    return "grace" if "grace" in host_cpu.lower() else "x86"


def tp_overlap_kernels(gemms: int, tp: int) -> float:
    """Extra kernels of TE userbuffers TP comm overlap for ``gemms`` TP-sharded GEMMs of a layer: the ring-exchange
    AG→GEMM and GEMM→RS overlaps split each forward and data-gradient GEMM into TP chunks, each with its own
    send/recv (TE ``CommOverlapP2P`` ``ring_exchange``), so a GEMM call becomes ~2·TP kernels."""
    if tp <= 1 or gemms <= 0:
        return 0.0
    return gemms * 2 * (2 * tp - 1)


def layer_launches(mixer: str, mlp: str, *, mla: bool, quant_gemms: int, scopes: frozenset[str], graphs_on: bool,
                   dropless: bool, ep: int, kernels: dict[str, float], shared: bool = False,
                   tp_overlap_tp: int = 1, etp: int = 1, local_experts: float = 1.0, grouped_gemm: bool = True,
                   permute_fusion: bool = True, unfused_attention: bool = False,
                   unfused_rope: bool = False, ep_overlap: bool = False, dispatcher: str = "alltoall",
                   flex_backend: str | None = None, lora_attn: int = 0, lora_mlp: int = 0,
                   fused_grouped_mlp: bool = False) -> LayerLaunches:
    """Eager kernels, graph launches and host syncs of one layer (fwd + bwd) given the CUDA-graph scopes.

    ``quant_gemms`` > 0 adds the FP8/FP4 cast kernels of each quantised GEMM input; ``shared`` adds the shared
    expert's kernels to a MoE layer; ``tp_overlap_tp`` > 1 (TP size when TP comm overlap is on) adds the chunked
    GEMMs of userbuffers overlap; ``local_experts`` (experts per EP rank) with ``grouped_gemm`` on adds the
    per-expert GEMMs of TE ``GroupedLinear``, with it off the per-expert loop of ``SequentialMLP``;
    ``permute_fusion`` off, ``unfused_attention`` and ``unfused_rope`` add the unfused paths; ``ep_overlap`` adds the
    combined 1F1B schedule's per-node host work (:func:`ep_overlap_node_ops`: its autograd engine calls as eager
    operations, its bookkeeping calls as native ones; ``dispatcher``: the token dispatcher type, which decides which
    nodes free their inputs; ``flex_backend``: the flex dispatcher's backend) (module doc); ``lora_attn`` /
    ``lora_mlp``: LoRA adapters on the attention / MLP (or expert) linears, ``lora_adapter`` kernels each, inside the
    scope of the module they wrap; ``fused_grouped_mlp``: the experts run TE's CuTeDSL fused grouped MLP, which
    launches ``fused_grouped_mlp_saved`` fewer kernels (efficiency.yaml: the activation forward and backward and
    the quantisation of FC2's input and of FC1's output gradient run in the GEMM epilogues, one offsets kernel is
    added; transformer_engine/pytorch/ops/fused/grouped_mlp.py)."""
    full = graphs_on and "full_iteration" in scopes
    cast = kernels.get("fp8_casts_per_gemm", 0.0) if quant_gemms > 0 else 0.0
    adapter = kernels.get("lora_adapter", 0.0)
    eager = 0.0
    graphs = 0.0
    syncs = 0.0
    native = 0.0

    def part(name: str, count: float, scope: str | None, cpp: float = 0.0) -> None:
        nonlocal eager, graphs, native
        if count <= 0:
            return
        if full:
            return
        if graphs_on and scope is not None and scope in scopes:
            graphs += 2.0  # one forward and one backward graph per scope instance
        else:
            eager += count
            native += cpp

    if mixer in ("A", "W"):
        n = kernels["attn"] + (kernels.get("mla_extra", 0.0) if mla else 0.0) + cast * min(quant_gemms, 2)
        if unfused_attention:
            n += kernels.get("unfused_attention", 0.0)
        if unfused_rope:
            n += kernels.get("unfused_rope", 0.0)
        n += adapter * lora_attn
        part("attn", n, "attn", tp_overlap_kernels(2, tp_overlap_tp))
    elif mixer in ("M", "G"):
        part("mamba", kernels["mamba"] + cast * min(quant_gemms, 2), "mamba")
    if mlp == "D":
        part("mlp", kernels["mlp"] + cast * 2 + adapter * lora_mlp, "mlp",
             tp_overlap_kernels(2, tp_overlap_tp))
    elif mlp == "E":
        moe_scope = "moe" if "moe" in scopes else None
        part("router", kernels["moe_router"], moe_scope or "moe_router")
        part("preprocess", kernels["moe_preprocess"],
             moe_scope or ("moe_preprocess" if "moe_router" in scopes else None))
        part("dispatch", kernels["moe_dispatch"] + (0.0 if permute_fusion else kernels.get("moe_unfused_permute", 0.0)),
             moe_scope)
        per_expert = kernels.get("grouped_gemm_per_expert" if grouped_gemm else "sequential_mlp_per_expert", 0.0)
        fused = kernels.get("fused_grouped_mlp_saved", 0.0) if fused_grouped_mlp else 0.0
        part("experts", kernels["moe_experts"] + cast * 2 + per_expert * max(local_experts, 1.0)
             + adapter * lora_mlp - fused, moe_scope)
        if shared:
            part("shared", kernels["shared_experts"] + cast * 2, moe_scope)
        if dropless and ep >= 1 and not full and not (graphs_on and moe_scope):
            syncs = 1.0
    if ep_overlap and not full and mlp in ("E", "D"):
        freed = ep_overlap_freed_inputs(dispatcher, flex_backend, local_experts, quantised=quant_gemms > 0,
                                        preprocess_graphed=graphs_on and "moe_preprocess" in scopes)
        engine, calls = ep_overlap_node_ops(mlp == "E", shared=shared and mlp == "E", freed_inputs=freed)
        eager += engine
        native += calls
    return LayerLaunches(eager, graphs, syncs, native)


def ep_overlap_freed_inputs(dispatcher: str, flex_backend: str | None, local_experts: float, *, quantised: bool,
                            preprocess_graphed: bool) -> int:
    """Inputs of a MoE layer's schedule nodes that the combined 1F1B schedule frees after their forward
    (Megatron-Core ``models/common/utils.should_free_input``): the combine's one always; the dispatch's two (tokens,
    probabilities) unless a flex dispatcher (DeepEP, HybridEP, NCCL EP) keeps them for backward or the
    ``moe_preprocess`` scope is CUDA-graphed (fixed buffers); the experts' one with FP8/FP4 GEMMs, else with more
    than one local expert or a dispatcher other than alltoall, and never with HybridEP / NCCL EP."""
    flex = dispatcher == "flex"
    dispatch = 0 if flex or preprocess_graphed else 2
    experts = quantised or local_experts > 1 or dispatcher != "alltoall"
    if not quantised and flex and flex_backend in ("hybridep", "ncclep"):
        experts = False
    return 1 + dispatch + (1 if experts else 0)


def ep_overlap_node_ops(moe: bool, *, shared: bool = False, freed_inputs: int = 4) -> tuple[float, float]:
    """(autograd engine calls, stream / event / tensor bookkeeping calls) that the combined 1F1B schedule of EP
    overlap adds to one layer per microbatch, forward and backward, counted in Megatron-Core (module doc). A MoE
    layer is four schedule nodes (pre-dispatch computation, dispatch, experts, combine) with 5 inputs (hidden
    states; tokens and probabilities; dispatched tokens; expert output) and 5 outputs; a dense layer is two
    (pre-dispatch computation, MLP) with 2 inputs and 2 outputs. A hybrid model's layer without an MLP block (a Mamba
    or attention mixer alone) adds none: its mixer runs inside the pre-dispatch node of the layer group it belongs to
    (Megatron-Core ``HybridStackNode``).

    * engine calls: one ``Variable._execution_engine.run_backward`` per node in backward
      (``ScheduleNode.default_backward_func``), where the fused layer's backward is a share of one call per
      microbatch. Each goes through the Python binding and the autograd engine (graph task, dependency walk,
      hand-off to the device thread), so it is priced like an eager operation (``launch_us``);
    * bookkeeping calls, each one C++ call without autograd or module work, priced at ``native_launch_us``:
      ``event.wait`` + ``event.record`` per node and direction (``ScheduleNode.stream_acquire_context``); in forward
      one ``detach`` per node input (``ScheduleNode._forward``) and per ``TransformerLayerNode.detach`` (residual and
      dispatched probabilities, + the shared-expert output), ``record_stream`` + ``resize_(0)`` per freed input of
      a MoE layer (``freed_inputs``, :func:`ep_overlap_freed_inputs`) and the combine's ``record_stream`` of the
      residual (+ the shared-expert output); in backward a ``record_stream`` per output gradient
      (``ScheduleNode._backward``).

    MoE with the alltoall dispatcher and several local experts (4 freed inputs): 4 engine calls and
    16 + (5 + 2 + 2·4 + 1) + 5 = 37 bookkeeping calls (+2 with a shared expert); dense: 2 and 8 + 2 + 2 = 12."""
    if not moe:
        nodes, inputs, outputs, detached, freed, extra = 2, 2, 2, 0, 0, 0
    else:
        nodes, inputs, outputs, detached = 4, 5, 5, 2 + (1 if shared else 0)
        freed = freed_inputs
        extra = 1 + (1 if shared else 0)  # the combine's record_stream of the residual (+ shared-expert output)
    events = 2 * 2 * nodes
    return float(nodes), float(events + inputs + detached + 2 * freed + extra + outputs)


def host_seconds(launch: LayerLaunches, *, launch_us: float, graph_launch_us: float, native_us: float = 0.0) -> float:
    """Host time to issue one layer's work (fwd + bwd) for one microbatch: Python-dispatched kernels at
    ``launch_us`` (the effective per-op cost incl. module/autograd Python), graph launches, and kernels a single
    C++ call launches (TE userbuffers ring-exchange chunks) at the bare CUDA launch cost ``native_us``."""
    return (launch.eager_kernels * launch_us + launch.graph_launches * graph_launch_us
            + launch.native_kernels * native_us) * 1e-6


def host_exposed(host_s: float, gpu_s: float, sharpness: float) -> float:
    """GPU idle time added by the host for a piece of work needing ``host_s`` to launch and ``gpu_s`` to run.

    The launch queue lets the host run ahead, so ideally the time is max(host, GPU); launch jitter and the
    synchronising calls inside a layer make the transition soft. We use the p-norm ``(gpu^p + host^p)^(1/p)``
    (p = ``host_queue_sharpness``; p → ∞ is the ideal max): a host needing 80 % of the GPU time costs ~9 % at p = 4.
    """
    if host_s <= 0:
        return 0.0
    if gpu_s <= 0:
        return host_s
    p = sharpness
    m = max(host_s, gpu_s)
    return m * ((host_s / m) ** p + (gpu_s / m) ** p) ** (1.0 / p) - gpu_s


def step_launches(param_tensors: float, kernels: dict[str, float]) -> LayerLaunches:
    """Host work of the optimizer step and the step's bookkeeping (module doc): ``param_tensors`` (parameter
    tensors on the rank) times ``step_per_param_tensor`` kernels plus ``step_fixed`` kernels, and ``step_syncs``
    device-to-host synchronisations."""
    eager = param_tensors * kernels.get("step_per_param_tensor", 0.0) + kernels.get("step_fixed", 0.0)
    return LayerLaunches(eager, 0.0, kernels.get("step_syncs", 0.0))


def param_tensors(layer_counts: dict[tuple, float], *, local_experts: float, shared: bool, mla: bool,
                  tensors: dict[str, float]) -> float:
    """Parameter tensors of one pipeline rank: per layer of each (mixer, mlp, ...) kind the tensors of its mixer
    (norm, QKV, projection; MLA's down/up projections and norms), its dense MLP (norm, fc1, fc2) or MoE block (norm,
    router, fc1 and fc2 per local expert: TE ``GroupedLinear`` keeps one weight per expert; shared-expert fc1/fc2)."""
    total = tensors.get("edges", 0.0)
    for key, n in layer_counts.items():
        mixer, mlp = key[0], key[1]
        t = 0.0
        if mixer in ("A", "W"):
            t += tensors.get("attn", 0.0) + (tensors.get("mla_extra", 0.0) if mla else 0.0)
        elif mixer != "_":
            t += tensors.get("mamba", 0.0)
        if mlp == "D":
            t += tensors.get("mlp", 0.0)
        elif mlp == "E":
            t += tensors.get("moe", 0.0) + tensors.get("per_local_expert", 0.0) * max(local_experts, 1.0)
            if shared:
                t += tensors.get("shared_experts", 0.0)
        total += n * t
    return total
