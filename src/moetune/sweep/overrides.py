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

from moetune.overrides import format_override

#: layout key -> run_script flag (argument_parser.py); the pipeline layout has a long option only
HARNESS_LAYOUT_FLAGS: dict[str, str] = {"tp": "-tp", "pp": "-pp", "vpp": "-vp", "cp": "-cp", "ep": "-ep", "etp": "-et"}

#: Features without a run_script flag -> the Bridge ``ConfigContainer`` path they travel as (a Hydra override after
#: the flags; the EP-overlap pair lives under ``comm_overlap``, whose setup resets the model-level values,
#: docs/domain.md §8). Full configs (every field) come from ``moetune.io.config_to_job``.
NO_HARNESS_FLAG_PATHS: dict[str, str] = {
    "delay_wgrad_compute": "comm_overlap.delay_wgrad_compute",
    "moe_shared_expert_overlap": "model.moe_shared_expert_overlap",
    "moe_flex_dispatcher_num_sms": "model.moe_flex_dispatcher_num_sms",
    "recompute_granularity": "model.recompute_granularity",
    "recompute_method": "model.recompute_method",
    "moe_router_force_load_balancing": "model.moe_router_force_load_balancing",
    "fine_grained_activation_offloading": "model.fine_grained_activation_offloading",
    "offload_modules": "model.offload_modules",
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
    for key, hflag in HARNESS_LAYOUT_FLAGS.items():
        v = layout.get(key)
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
    extra = [format_override(NO_HARNESS_FLAG_PATHS[k], v) for k, v in features.items()
             if k in NO_HARNESS_FLAG_PATHS and v not in (None, [], ())]
    cap = features.get("moe_expert_rank_capacity_factor")
    if cap is not None:
        # HybridEP's static budget with its paged stash and the TE op fuser it needs (rule MOE-044), as
        # moetune.io.config_to_job.job_to_config writes them
        extra += [format_override("model.moe_expert_rank_capacity_factor", cap),
                  format_override("model.moe_paged_stash", bool(features.get("moe_paged_stash"))),
                  format_override("model.use_transformer_engine_op_fuser", True)]
    return out + extra


def shell_join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
