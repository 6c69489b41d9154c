"""Environment variables that Megatron-Core / Bridge features need at launch (docs/domain.md §6.3, §6.5 table
"Environment variables"; docs/rules.md §4, §6).

One implementation used by the planner's launch output and by sweep scripts.
"""

from __future__ import annotations

from moetune.spec.features import CUTEDSL_FUSED_GROUPED_MLP_ENV
from moetune.spec.job import Job


def feature_env(job: Job) -> dict[str, str]:
    """Environment for a Job, each value justified in :func:`feature_env_reasons`."""
    return {k: v for k, (v, _) in feature_env_reasons(job).items()}


def feature_env_reasons(job: Job) -> dict[str, tuple[str, str]]:
    """``{VAR: (value, why)}`` for the features the Job uses."""
    f, lay, sysm = job.features, job.layout, job.system
    env: dict[str, tuple[str, str]] = {}
    graphs = f.cuda_graph_impl != "none"
    if f.overlap_moe_expert_parallel_comm and graphs:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = ("32", "EP overlap with CUDA graphs needs > 1 connection (MLM-MoE, S:hw)")
    elif f.overlap_moe_expert_parallel_comm:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = ("32", "EP overlap runs A2A on separate streams (MLM-MoE: must be > 1)")
    elif f.use_megatron_fsdp:
        pass  # Megatron-FSDP needs it unset or > 1 (docs/rules.md FSDP-006); with TP/CP MLM only warns (MLM-001)
    elif f.tp_comm_overlap or lay.tp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = ("1", "TP/SP comm ordering on Hopper (D:pg, S:hw)")
    env["PYTORCH_CUDA_ALLOC_CONF"] = ("expandable_segments:True",
                                      "cuts reserved-minus-allocated fragmentation for free (S:mem)")
    if graphs:
        env["NCCL_GRAPH_REGISTER"] = ("0", "required with expandable_segments + CUDA graphs (S:cg, D:pg)")
    if f.moe_token_dispatcher_type == "flex" and f.moe_flex_dispatcher_backend == "hybridep":
        env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] = (
            str(min(sysm.nvlink_domain, lay.ep * lay.expert_tp)),
            "must equal the real NVLink domain seen by the EP group (S:disp; wrong values hurt speed/correctness)")
    env["NCCL_NVLS_ENABLE"] = ("0", "saves NVLS buffer memory (D:pg, S:hw)")
    env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = ("1", "frees NCCL tensors promptly (D:pg)")
    env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = ("1", "faster non-deterministic TE kernels (S:hw)")
    if f.cutedsl_fused_grouped_mlp and job.model.is_moe:
        env[CUTEDSL_FUSED_GROUPED_MLP_ENV] = (
            "1", "TE CuTeDSL fused grouped MLP of the experts (TE ops/fused/grouped_mlp.py; Bridge perf_plugins.py)")
        if f.overlap_moe_expert_parallel_comm:
            env["CUDNNFE_CLUSTER_OVERLAP_MARGIN"] = (
                "8", "what Bridge launches the fused grouped MLP with under EP A2A overlap (scripts/performance/"
                "perf_plugins.py: cuDNN-frontend kernels' cluster margin)")
    if f.optimizer_cpu_offload:
        env["NCCL_NET_GDR_C2C"] = ("1", "optimizer offload on Grace (NCCL >= 2.26) (S:off)")
    return env
