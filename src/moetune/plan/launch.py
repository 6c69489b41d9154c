"""Launchable output for a planned Job: Megatron-Bridge overrides (with the recipe when a published one applies),
Megatron-LM flags, environment variables, node count and a Slurm batch script."""

from __future__ import annotations

import math
import shlex
from typing import Any

from moetune.io.env import feature_env
from moetune.spec.job import Job


def launch_for(job: Job) -> dict[str, Any]:
    """Everything needed to launch ``job`` on Slurm (see module docstring)."""
    from moetune.io.config_to_job import config_to_bridge_overrides, config_to_megatron_args, job_to_config

    cfg = job_to_config(job)
    recipe = _recipe_name(job)
    overrides = config_to_bridge_overrides(cfg)
    args = config_to_megatron_args(cfg)
    env = feature_env(job)
    nodes = math.ceil(job.gpus / job.system.gpus_per_node)
    return {
        "recipe": recipe,
        "bridge_overrides": overrides,
        "megatron_args": args,
        "env": env,
        "nodes": nodes,
        "gpus_per_node": job.system.gpus_per_node,
        "slurm_script": slurm_script(job, recipe, overrides, env, nodes),
    }


def _recipe_name(job: Job) -> str | None:
    try:
        from moetune.catalog.recipes import find_recipe
    except ImportError:
        return None
    r = find_recipe(job.model.name, job.system.name, gpus=job.gpus, precision=job.features.precision)
    if r is None:
        return None
    return r if isinstance(r, str) else getattr(r, "name", None) or r.get("name")


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
