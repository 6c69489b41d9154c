"""Perf-harness (``scripts/performance/run_script.py``) flags for a layout + features. Bridge overrides and
Megatron-LM flags (precision included) of a full config come from ``moetune.io.config_to_job``; environment
variables from ``moetune.io.env`` (one implementation each).

Field names follow docs/domain.md §8 (Bridge ``ConfigContainer`` paths / Megatron-LM ``arguments.py`` flags), checked
against Megatron-Bridge ``scripts/performance/argument_parser.py`` for the harness flags. Environment variables follow
docs/domain.md §6.5 (S:hw, S:slurm) and §6.3 (``CUDA_DEVICE_MAX_CONNECTIONS`` = 1 for TP overlap on H100, 32 with EP
overlap + graphs).
"""

from __future__ import annotations

import shlex
from typing import Any

from moetune.io.overrides import format_override

#: layout key -> (Bridge override path, Megatron-LM flag, run_script flag)
LAYOUT_KEYS: dict[str, tuple[str, str, str | None]] = {
    "tp": ("model.tensor_model_parallel_size", "--tensor-model-parallel-size", "-tp"),
    "pp": ("model.pipeline_model_parallel_size", "--pipeline-model-parallel-size", "-pp"),
    "vpp": ("model.virtual_pipeline_model_parallel_size", "--num-virtual-stages-per-pipeline-rank", "-vp"),
    "cp": ("model.context_parallel_size", "--context-parallel-size", "-cp"),
    "ep": ("model.expert_model_parallel_size", "--expert-model-parallel-size", "-ep"),
    "etp": ("model.expert_tensor_parallel_size", "--expert-tensor-parallel-size", "-et"),
    "pipeline_layout": ("model.pipeline_model_parallel_layout", "--pipeline-model-parallel-layout", None),
}

#: Features field -> (Bridge override path, Megatron-LM flag). Booleans become ``true/false`` overrides and
#: presence flags in Megatron-LM (omitted when false); lists become ``[a,b]`` / space-separated values.
FEATURE_KEYS: dict[str, tuple[str | None, str | None]] = {
    "moe_token_dispatcher_type": ("model.moe_token_dispatcher_type", "--moe-token-dispatcher-type"),
    "moe_flex_dispatcher_backend": ("model.moe_flex_dispatcher_backend", "--moe-flex-dispatcher-backend"),
    "moe_flex_dispatcher_num_sms": ("model.moe_flex_dispatcher_num_sms", "--moe-flex-dispatcher-num-sms"),
    "moe_grouped_gemm": ("model.moe_grouped_gemm", "--moe-grouped-gemm"),
    "moe_permute_fusion": ("model.moe_permute_fusion", "--moe-permute-fusion"),
    "moe_router_fusion": ("model.moe_router_fusion", "--moe-router-fusion"),
    "moe_router_force_load_balancing": ("model.moe_router_force_load_balancing", "--moe-router-force-load-balancing"),
    "moe_expert_capacity_factor": ("model.moe_expert_capacity_factor", "--moe-expert-capacity-factor"),
    "moe_pad_expert_input_to_capacity": ("model.moe_pad_expert_input_to_capacity",
                                         "--moe-pad-expert-input-to-capacity"),
    "sequence_parallel": ("model.sequence_parallel", "--sequence-parallel"),
    # EP overlap lives under comm_overlap: model-level values are reset by CommOverlapConfig (docs/domain.md §8)
    "overlap_moe_expert_parallel_comm": ("comm_overlap.overlap_moe_expert_parallel_comm",
                                         "--overlap-moe-expert-parallel-comm"),
    "delay_wgrad_compute": ("comm_overlap.delay_wgrad_compute", "--delay-wgrad-compute"),
    "moe_shared_expert_overlap": ("model.moe_shared_expert_overlap", "--moe-shared-expert-overlap"),
    "tp_comm_overlap": ("comm_overlap.tp_comm_overlap", "--tp-comm-overlap"),
    "overlap_grad_reduce": ("ddp.overlap_grad_reduce", "--overlap-grad-reduce"),
    "overlap_param_gather": ("ddp.overlap_param_gather", "--overlap-param-gather"),
    "cp_comm_type": ("model.cp_comm_type", "--cp-comm-type"),
    "recompute_granularity": ("model.recompute_granularity", "--recompute-granularity"),
    "recompute_method": ("model.recompute_method", "--recompute-method"),
    "recompute_num_layers": ("model.recompute_num_layers", "--recompute-num-layers"),
    "recompute_modules": ("model.recompute_modules", "--recompute-modules"),
    "fine_grained_activation_offloading": ("model.fine_grained_activation_offloading",
                                           "--fine-grained-activation-offloading"),
    "offload_modules": ("model.offload_modules", "--offload-modules"),
    "optimizer_cpu_offload": ("optimizer.optimizer_cpu_offload", "--optimizer-cpu-offload"),
    "optimizer_offload_fraction": ("optimizer.optimizer_offload_fraction", "--optimizer-offload-fraction"),
    "cuda_graph_impl": ("model.cuda_graph_impl", "--cuda-graph-impl"),
    "cuda_graph_scope": ("model.cuda_graph_scope", "--cuda-graph-modules"),
    "use_distributed_optimizer": ("optimizer.use_distributed_optimizer", "--use-distributed-optimizer"),
    "num_distributed_optimizer_instances": ("ddp.num_distributed_optimizer_instances",
                                            "--num-distributed-optimizer-instances"),
    "use_precision_aware_optimizer": ("optimizer.use_precision_aware_optimizer", "--use-precision-aware-optimizer"),
    "fp8_param_gather": ("mixed_precision.fp8_param_gather", "--fp8-param-gather"),
    "first_last_layers_bf16": ("mixed_precision.first_last_layers_bf16", "--first-last-layers-bf16"),
    "manual_gc": ("train.manual_gc", "--manual-gc"),
}

#: perf-harness ``-c`` value per canonical precision (argument_parser.py: bf16, fp8_cs, fp8_mx, fp8_sc, nvfp4)
HARNESS_DTYPE: dict[str, str] = {"bf16": "bf16", "fp8_cs": "fp8_cs", "mxfp8": "fp8_mx", "fp8_blockwise": "fp8_sc",
                                 "nvfp4": "nvfp4"}


def harness_flags(layout: dict[str, Any], features: dict[str, Any], *, precision: str, gbs: int, mbs: int,
                  seq: int, steps: int, gpus: int, gpus_per_node: int, gpu: str, family: str,
                  recipe: str) -> list[str]:
    """``scripts/performance/run_script.py`` flags (argument_parser.py names)."""
    out = ["-m", family, "-mr", recipe, "-ng", str(gpus), "-gn", str(gpus_per_node), "-g", gpu,
           "-c", HARNESS_DTYPE.get(precision, "bf16"), "-gb", str(gbs), "-mb", str(mbs), "-sl", str(seq),
           "-ms", str(steps)]
    for key, (_path, _flag, hflag) in LAYOUT_KEYS.items():
        v = layout.get(key)
        if hflag is None:
            continue
        if key == "vpp":
            out += [hflag, "None" if v is None else str(v)]
        elif v is not None:
            out += [hflag, str(v)]
    if layout.get("pipeline_layout"):
        out += ["--pipeline_model_parallel_layout", str(layout["pipeline_layout"])]
    disp = features.get("moe_token_dispatcher_type")
    out += ["--moe_flex_dispatcher_backend",
            str(features.get("moe_flex_dispatcher_backend")) if disp == "flex" else "None"]
    if features.get("cuda_graph_impl") not in (None, "none"):
        out += ["--cuda_graph_impl", str(features["cuda_graph_impl"])]
        if features.get("cuda_graph_scope"):
            out += ["--cuda_graph_scope", ",".join(features["cuda_graph_scope"])]
    if features.get("recompute_modules"):
        out += ["--recompute_modules", ",".join(features["recompute_modules"])]
    if "overlap_moe_expert_parallel_comm" in features:
        out += ["--moe_a2a_overlap", "true" if features["overlap_moe_expert_parallel_comm"] else "false"]
    # fields without a harness flag travel as Hydra overrides after the flags
    extra = [format_override(FEATURE_KEYS[k][0], v) for k, v in features.items()
             if k in _NO_HARNESS_FLAG and FEATURE_KEYS.get(k, (None,))[0] and v not in (None, [], ())]
    return out + extra


_NO_HARNESS_FLAG = {"delay_wgrad_compute", "moe_shared_expert_overlap", "moe_flex_dispatcher_num_sms",
                    "recompute_granularity", "recompute_method", "moe_router_force_load_balancing",
                    "fine_grained_activation_offloading", "offload_modules"}
def shell_join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
