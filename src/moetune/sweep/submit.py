"""``moetune sweep submit``: sbatch every run in phase order with ``--dependency`` on the previous phase.

Job ids go to ``jobs.json`` (run -> job id). ``sbatch --parsable`` prints ``jobid[;cluster]``. A dependency of type
``afterok`` gates scale on fit (the layout must fit); later phases use ``afterany`` because acceptance is decided by
``sweep collect``, not by exit codes. ``--kill-on-invalid-dep=yes`` removes jobs whose dependency can never be met.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from moetune.errors import InputError, MoetuneError
from moetune.sweep.sweepdir import load_sweep


class SchedulerError(MoetuneError):
    """The scheduler refused or is unreachable (one line, exit 2)."""


def _sbatch() -> str:
    exe = shutil.which("sbatch")
    if not exe:
        raise SchedulerError("sbatch not found on PATH (run on a Slurm login node, or install slurm-client)")
    return exe


def submit_sweep(d: Path, *, phases: list[str] | None = None, runs: list[str] | None = None,
                 dry_run: bool = False) -> dict[str, Any]:
    sweep, _contract = load_sweep(d)
    jobs_path = d / "jobs.json"
    from moetune.sweep.sweepdir import read_jobs

    jobs = read_jobs(d)
    selected = [r for r in sweep["runs"] if (not phases or r["phase"] in phases) and (not runs or r["name"] in runs)]
    if not selected:
        raise InputError(f"{d}: no runs match phases={phases} runs={runs}")
    sbatch = "sbatch" if dry_run else _sbatch()
    submitted: dict[str, str] = {}
    commands = []
    for r in selected:
        cmd = [sbatch, "--parsable", "--kill-on-invalid-dep=yes"]
        dep_ids = [jobs.get(n) or submitted.get(n) for n in r["depends"]["on"]]
        dep_ids = [j for j in dep_ids if j]
        if dep_ids:
            cmd.append(f"--dependency={r['depends']['type']}:{':'.join(dep_ids)}")
        cmd.append(str((d / r["dir"] / "run.sbatch").resolve()))
        commands.append(cmd)
        if dry_run:
            submitted[r["name"]] = f"<{r['name']}>"
            continue
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            jobs.update(submitted)
            jobs_path.write_text(json.dumps(jobs, indent=1))
            raise SchedulerError(f"sbatch {r['name']} failed: {' '.join(proc.stderr.split()) or proc.returncode}")
        submitted[r["name"]] = proc.stdout.strip().split(";")[0]
    if not dry_run:
        jobs.update(submitted)
        jobs_path.write_text(json.dumps(jobs, indent=1))
    return {"submitted": submitted, "commands": [" ".join(c) for c in commands], "dry_run": dry_run}
