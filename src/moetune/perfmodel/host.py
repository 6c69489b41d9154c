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
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LayerLaunches:
    """Host work of one decoder layer for one microbatch (forward + backward)."""

    eager_kernels: float
    graph_launches: float
    syncs: float


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
                   tp_overlap_tp: int = 1, etp: int = 1) -> LayerLaunches:
    """Eager kernels, graph launches and host syncs of one layer (fwd + bwd) given the CUDA-graph scopes.

    ``quant_gemms`` > 0 adds the FP8/FP4 cast kernels of each quantised GEMM input; ``shared`` adds the shared
    expert's kernels to a MoE layer; ``tp_overlap_tp`` > 1 (TP size when TP comm overlap is on) adds the chunked
    GEMMs of userbuffers overlap."""
    full = graphs_on and "full_iteration" in scopes
    cast = kernels.get("fp8_casts_per_gemm", 0.0) if quant_gemms > 0 else 0.0
    eager = 0.0
    graphs = 0.0
    syncs = 0.0

    def part(name: str, count: float, scope: str | None) -> None:
        nonlocal eager, graphs
        if count <= 0:
            return
        if full:
            return
        if graphs_on and scope is not None and scope in scopes:
            graphs += 2.0  # one forward and one backward graph per scope instance
        else:
            eager += count

    if mixer in ("A", "W"):
        n = kernels["attn"] + (kernels.get("mla_extra", 0.0) if mla else 0.0) + cast * min(quant_gemms, 2)
        part("attn", n + tp_overlap_kernels(2, tp_overlap_tp), "attn")
    elif mixer in ("M", "G"):
        part("mamba", kernels["mamba"] + cast * min(quant_gemms, 2), "mamba")
    if mlp == "D":
        part("mlp", kernels["mlp"] + cast * 2 + tp_overlap_kernels(2, tp_overlap_tp), "mlp")
    elif mlp == "E":
        moe_scope = "moe" if "moe" in scopes else None
        part("router", kernels["moe_router"], moe_scope or "moe_router")
        part("preprocess", kernels["moe_preprocess"],
             moe_scope or ("moe_preprocess" if "moe_router" in scopes else None))
        part("dispatch", kernels["moe_dispatch"], moe_scope)
        part("experts", kernels["moe_experts"] + cast * 2, moe_scope)
        if shared:
            part("shared", kernels["shared_experts"] + cast * 2, moe_scope)
        if dropless and ep >= 1 and not full and not (graphs_on and moe_scope):
            syncs = 1.0
    return LayerLaunches(eager, graphs, syncs)


def host_seconds(launch: LayerLaunches, *, launch_us: float, graph_launch_us: float) -> float:
    """Host time to issue one layer's work (fwd + bwd) for one microbatch."""
    return (launch.eager_kernels * launch_us + launch.graph_launches * graph_launch_us) * 1e-6


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
