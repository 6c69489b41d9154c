"""Rank layout / NVLink crossing (docs/rules.md §2.1, TOPO-*) and the guidance checks of the tuning seeds (GUI-*).

Group placement comes from :func:`moetune.spec.ranks.group_stays_in_domain` (Megatron-Core ``RankGenerator`` order
``tp-cp-ep-dp-pp``; ``tp-cp-ep-pp-dp`` when ``dist.use_tp_pp_dp_mapping``). Guidance sources: NVIDIA skills
``nemo-mbridge-perf-*`` (parallelism strategies, MoE dispatcher selection, CUDA graphs), docs/rules.md §10/§13.
"""

from __future__ import annotations

from moetune.memo import memo
from moetune.rules.common import I_, W_
from moetune.rules.engine import UNKNOWN, Ctx, rule

A = "topology"
G = "guidance"


def _domain(c: Ctx):
    return c.env.nvlink_domain or UNKNOWN


def _stays(c: Ctx, kind: str):
    """Tri-state: every group of ``kind`` stays inside one NVLink domain."""
    dom = _domain(c)
    if dom is UNKNOWN:
        return UNKNOWN
    order = "tp-cp-ep-pp-dp" if c.get("dist.use_tp_pp_dp_mapping") else "tp-cp-ep-dp-pp"
    args = (kind, c.tp, c.pp, c.cp, c.ep, c.etp, dom, c.env.gpus, order)
    if type(dom) is int and type(args[7]) in (int, type(None)):
        return _stays_in(*args)
    return _stays_in.__wrapped__(*args)  # an environment value the memo cannot key on


@memo(maxsize=4096)
def _stays_in(kind: str, tp: int, pp: int, cp: int, ep: int, etp: int, dom: int, world: int | None, order: str):
    """:func:`moetune.spec.ranks.group_stays_in_domain` of a group kind on these sizes; UNKNOWN where it cannot tell.
    A size the :class:`moetune.spec.layout.Layout` refuses raises (the rule is then skipped, as any rule whose
    condition meets a malformed value). Memoised: the three rules that ask (TOPO-005/006, GUI-002) share a
    layout's answers, and the planner's candidates repeat layouts."""
    from moetune.spec.layout import Layout
    from moetune.spec.ranks import group_stays_in_domain

    lay = Layout(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
    try:
        return group_stays_in_domain(kind, lay, dom, world_size=world, order=order)
    except (ValueError, TypeError):
        return UNKNOWN


def _cross(c: Ctx, kind: str):
    s = _stays(c, kind)
    return UNKNOWN if s is UNKNOWN else not s


def _nvl_tp(c: Ctx) -> dict:
    d = c.env.nvlink_domain or 8
    tp = c.tp
    while tp > 1 and (tp > d or d % tp):
        tp //= 2
    return {"model.tensor_model_parallel_size": max(1, tp)}


rule("TOPO-005", A, W_, "-", ["model.tensor_model_parallel_size", "model.expert_tensor_parallel_size",
                              "env.nvlink_domain"],
     lambda c: (c.tp > 1 and _cross(c, "tp")) or (c.is_moe and c.etp > 1 and _cross(c, "etp")),
     "tensor-parallel group crosses the NVLink domain (severe slowdown): keep TP inside one NVLink domain",
     "skills nemo-mbridge-perf-parallelism-strategies; PS RankGenerator", fix=_nvl_tp)
rule("TOPO-006", A, W_, "-", ["model.expert_model_parallel_size", "model.expert_tensor_parallel_size",
                              "model.moe_token_dispatcher_type", "env.nvlink_domain"],
     lambda c: c.is_moe and c.ep > 1 and _cross(c, "ep"),
     "EP (tp_ep) group crosses the NVLink domain: all-to-all goes over IB; consider DeepEP/HybridEP, node-limited "
     "routing (moe_router_num_groups = nodes spanned) and NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
     "TC moe_router_num_groups docstring; skills nemo-mbridge-perf-moe-dispatcher-selection")
rule("TOPO-006b", A, W_, "-", ["model.moe_flex_dispatcher_backend", "env.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
                               "env.nvlink_domain"],
     lambda c: c.flex_backend == "hybridep" and c.env.nvlink_domain is not None
     and c.var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN") is not None
     and str(c.var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")) != str(min(c.env.nvlink_domain, c.env.gpus or 10**9)),
     "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN differs from the real NVLink domain size (hurts performance and "
     "sometimes correctness)", "skills nemo-mbridge-perf-moe-dispatcher-selection",
     fix=lambda c: {"env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": str(min(c.env.nvlink_domain,
                                                                                  c.env.gpus or 10**9))})
rule("TOPO-007", A, W_, "-", ["model.context_parallel_size", "model.cp_comm_type", "env.nvlink_domain"],
     lambda c: c.cp > 1 and any(str(t) in ("a2a", "all_gather", "allgather") for t in (
         c.m("cp_comm_type") if isinstance(c.m("cp_comm_type"), list) else [c.m("cp_comm_type")]))
     and _cross(c, "cp"),
     "all-to-all / all-gather CP group crosses the NVLink domain: use p2p or a2a+p2p with hierarchical sizes",
     "TC cp_comm_type docstring; skills HCP", fix={"model.cp_comm_type": "p2p"})
rule("TOPO-008", A, I_, "-", ["model.tensor_model_parallel_size", "model.context_parallel_size",
                              "model.expert_tensor_parallel_size", "model.expert_model_parallel_size"],
     lambda c: c.is_moe and max(c.tp * c.cp, c.etp * c.ep) % min(c.tp * c.cp, c.etp * c.ep) != 0,
     "minimum world size is PP*lcm(TP*CP, ETP*EP), not PP*max(...)", "derived PAR-001/002")
# guidance ---------------------------------------------------------------------------------------------------------
rule("GUI-001", G, W_, "-", ["model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"],
     lambda c: c.pp > 1 and c.vpp is None and c.m("pipeline_model_parallel_layout") is None
     and not c.m("is_hybrid_model"),
     "PP > 1 without virtual pipeline: the 1F1B bubble is (PP-1)/NMB of the step; interleaving (VPP) shrinks it",
     "skills nemo-mbridge-perf-parallelism-strategies")
rule("GUI-002", G, W_, "-", ["model.overlap_moe_expert_parallel_comm", "model.expert_model_parallel_size",
                             "model.moe_token_dispatcher_type"],
     lambda c: c.is_moe and c.ep > 1 and not c.ep_overlap and c.dispatcher in ("alltoall", "flex")
     and _cross(c, "ep"),
     "inter-node EP without EP overlap (overlap_moe_expert_parallel_comm): the all-to-all is fully exposed",
     "skills nemo-mbridge-perf-expert-parallel-overlap")
rule("GUI-003", G, W_, "-", ["model.moe_token_dispatcher_type", "model.expert_model_parallel_size"],
     lambda c: c.is_moe and c.ep > 1 and c.dispatcher == "allgather",
     "allgather dispatcher with EP > 1: alltoall (or flex DeepEP/HybridEP) moves far less data",
     "skills nemo-mbridge-perf-moe-dispatcher-selection", fix={"model.moe_token_dispatcher_type": "alltoall"})
rule("GUI-004", G, W_, "-", ["model.moe_flex_dispatcher_backend", "env.gpu"],
     lambda c: c.flex_backend == "deepep" and c.gpu_is(lambda cc, n: cc[0] == 10) is True,
     "on Blackwell prefer the HybridEP backend (DeepEP is rejected on GB200/GB300)",
     "skills nemo-mbridge-perf-moe-dispatcher-selection", fix={"model.moe_flex_dispatcher_backend": "hybridep"})
rule("GUI-005", G, W_, "-", ["model.cuda_graph_impl", "model.recompute_granularity", "model.recompute_modules"],
     lambda c: c.te_graph and c.m("recompute_granularity") == "selective" and bool(
         {"core_attn", "layernorm"} & set(c.rmods)) and "attn" in c.cg_mods,
     "recomputing modules inside a captured attention graph wastes the recompute (graph replays the captured work)",
     "skills nemo-mbridge-perf-cuda-graphs")
rule("GUI-006", G, W_, "-", ["env.PYTORCH_CUDA_ALLOC_CONF", "ddp.nccl_ub"],
     lambda c: bool(c.get("ddp.nccl_ub")) and "expandable_segments:true" in str(
         c.var("PYTORCH_CUDA_ALLOC_CONF") or "").lower() and c.torch_below("2.11.0") is not True,
     "expandable_segments with NCCL user buffers (nccl_ub): registration and expandable segments interact badly",
     "distributed_data_parallel_config.py; skills nemo-mbridge-perf-memory")
rule("GUI-007", G, W_, "-", ["model.context_parallel_size", "model.seq_length"],
     lambda c: c.cp > 1 and c.m("seq_length") is not None and c.m("seq_length") // c.cp < 4096,
     "context parallel with short per-rank sequences (< 4096 tokens per CP rank) rarely pays off",
     "skills nemo-mbridge-perf-parallelism-strategies")
