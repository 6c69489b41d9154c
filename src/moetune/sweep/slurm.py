"""One self-contained Slurm batch script for a single planned Job (the planner's ``launch.slurm_script``).

Same template as the sweep's runs (``templates/batch.sbatch``): one task per GPU started by ``srun``, RANK /
WORLD_SIZE / LOCAL_RANK from Slurm, MASTER_ADDR = first node, the features' environment, Megatron-Bridge's
``scripts/training/run_recipe.py`` with the recipe and Hydra overrides. Container image, mounts, account and
partition come from an optional :class:`moetune.sweep.launcher.Launcher`. Only the launcher module is imported,
not the sweep's contract models.
"""

from __future__ import annotations

import shlex
from typing import Any

from moetune.sweep.launcher import Launcher, render, sbatch_lines, srun_args


def render_bridge_script(*, job: Any, recipe: str | None, overrides: list[str], env: dict[str, str], nodes: int,
                         launcher: Launcher | None = None) -> str:
    lc = launcher or Launcher()
    gpn = min(job.system.gpus_per_node, job.gpus)
    name = f"moetune-{job.model.name.lower().replace(' ', '-')}"
    extra = [f"#SBATCH --gpus-per-node={gpn}", "#SBATCH --exclusive", *sbatch_lines(lc)]
    srun = srun_args(lc, gpn)
    cmd = ["python", "scripts/training/run_recipe.py", "--recipe", recipe or "<recipe>_pretrain_config", *overrides]
    rank = ("export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID; "
            f"cd {shlex.quote(lc.workdir)} && exec " + " ".join(shlex.quote(a) for a in cmd))
    payload = "\n".join([
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
        "export MASTER_PORT=29500",
        f"srun {' '.join(shlex.quote(a) for a in srun)} bash -c {shlex.quote(rank)} \\",
        '  > "$RUN_DIR/logs/train.log" 2>&1',
    ])
    return render("batch.sbatch", {
        "SWEEP": "moetune plan", "RUN": name, "PHASE": "single", "DESCRIPTION": f"{job.gpus} x {job.system.name}",
        "JOB_NAME": name[:64], "NODES": str(nodes), "TASKS_PER_NODE": str(gpn), "TIME_LIMIT": lc.time_limit,
        "OUTPUT": "moetune-%x-%j.out", "RUN_DIR_Q": '"${SLURM_SUBMIT_DIR:-$PWD}/moetune-run-${SLURM_JOB_ID:-0}"',
        "SBATCH_EXTRA": "\n".join(extra),
        "ENV_EXPORTS": "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())) or "# (none)",
        "PAYLOAD": payload})
