"""Launchable output for a planned Job: Megatron-Bridge overrides (with the recipe when a published one applies),
Megatron-LM flags, environment variables, node count and a Slurm batch script."""

from __future__ import annotations

import math
import shlex
from typing import Any

from moetune.io.env import feature_env
from moetune.spec.features import BRIDGE_MIXED_PRECISION
from moetune.spec.job import Job

#: overrides printed in the short launch line even at their default values (the layout and batch shape)
ALWAYS_SHOWN = frozenset({
    "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size", "model.context_parallel_size", "model.expert_model_parallel_size",
    "model.expert_tensor_parallel_size", "model.sequence_parallel", "model.seq_length", "train.global_batch_size",
    "train.micro_batch_size", "model.moe_token_dispatcher_type",
})
#: field-name prefixes of the tuning knobs shown when set (recompute, offload, dispatcher, overlap, graphs, ...)
TUNING_PREFIXES = ("pipeline_model_parallel_layout", "account_for_", "num_layers_in_", "recompute", "fine_grained_activation_offloading",
                   "offload_modules", "cpu_offloading", "moe_flex", "moe_router_force", "cuda_graph",
                   "moe_expert_rank_capacity_factor", "moe_paged_stash", "use_transformer_engine_op_fuser",
                   "use_te_rng_tracker", "overlap_", "delay_wgrad", "tp_comm_overlap", "moe_shared_expert_overlap",
                   "use_distributed_optimizer", "optimizer_cpu_offload", "optimizer_offload_fraction",
                   "num_distributed_optimizer_instances", "use_precision_aware_optimizer", "use_megatron_fsdp",
                   "data_parallel_sharding_strategy")


def launch_for(job: Job) -> dict[str, Any]:
    """Everything needed to launch ``job`` on Slurm (see module docstring)."""
    from moetune.io.config_to_job import config_to_bridge_overrides, config_to_megatron_args, job_to_config
    from moetune.spec.model_fields import arch_to_model_fields

    cfg = job_to_config(job)
    recipe = _recipe_name(job)
    overrides = config_to_bridge_overrides(cfg)
    arch_keys = {f"model.{k}" for k in arch_to_model_fields(job.model)}
    tuning = [f"mixed_precision={BRIDGE_MIXED_PRECISION[job.features.precision]}"]
    for o in overrides:
        key, _, val = o.partition("=")
        if key in arch_keys or key.startswith("mixed_precision.") or key.startswith("env_vars."):
            continue
        if key in ALWAYS_SHOWN or (key.split(".", 1)[-1].startswith(TUNING_PREFIXES)
                                   and val not in ("false", "null", "[]", "0", "0.0", "none")):
            tuning.append(o)
    args = config_to_megatron_args(cfg)
    env = feature_env(job)
    nodes = math.ceil(job.gpus / job.system.gpus_per_node)
    notes = []
    if job.features.task == "lora":
        # Megatron-LM's pretrain_gpt.py has no PEFT: LoRA lives in Megatron-Bridge (megatron/bridge/peft/lora.py)
        notes.append("Megatron-LM has no LoRA (PEFT is Megatron-Bridge's peft/lora.py): megatron_args would train "
                     "every weight, not this job; launch it with Megatron-Bridge (the peft.* overrides)")
    if tuning and job.features.task == "lora":
        tuning += [o for o in overrides if o.startswith("peft.")]
    return {
        "recipe": recipe,
        "notes": notes,
        "bridge_overrides": overrides,
        "bridge_overrides_tuning": tuning,
        "megatron_args": args,
        "env": env,
        "nodes": nodes,
        "gpus_per_node": job.system.gpus_per_node,
        "slurm_script": slurm_script(job, recipe, overrides, env, nodes),
    }


def _recipe_name(job: Job) -> str | None:
    try:
        from moetune.catalog.recipes import find_recipe_name
    except ImportError:
        return None
    return find_recipe_name(job.model.name, job.system.name, gpus=job.gpus, precision=job.features.precision)


def slurm_script(job: Job, recipe: str | None, overrides: list[str], env: dict[str, str], nodes: int) -> str:
    """A Slurm batch script that launches Megatron-Bridge's ``scripts/training/run_recipe.py`` with srun."""
    try:
        from moetune.sweep.slurm import render_bridge_script  # the sweep's configurable template, when present
    except ImportError:
        render_bridge_script = None
    if render_bridge_script is not None:
        return render_bridge_script(job=job, recipe=recipe, overrides=overrides, env=env, nodes=nodes)
    gpn = job.system.gpus_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=moetune-{job.model.name.lower().replace(' ', '-')}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={gpn}",
        f"#SBATCH --gpus-per-node={gpn}",
        "#SBATCH --exclusive",
        "#SBATCH --time=01:00:00",
        "set -euo pipefail",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    recipe_arg = f"--recipe {shlex.quote(recipe)} " if recipe else ""
    ov = " ".join(shlex.quote(o) for o in overrides)
    lines.append(
        f"srun --ntasks-per-node={gpn} python scripts/training/run_recipe.py {recipe_arg}{ov}".rstrip()
    )
    return "\n".join(lines) + "\n"
