"""``moetune sweep status``: where each submitted job is, from ``squeue`` (pending/running), then ``sacct`` (finished,
when accounting is enabled), then ``scontrol show job`` (finished jobs the controller still remembers, MinJobAge)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from moetune.errors import InputError
from moetune.sweep.sweepdir import load_sweep

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE"}


def _run(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return p.stdout if p.returncode == 0 else None


def job_states(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """job id -> {state, reason/exit, source}."""
    out: dict[str, dict[str, str]] = {}
    if not job_ids:
        return out
    ids = ",".join(job_ids)
    q = _run(["squeue", "-h", "-j", ids, "-o", "%i|%T|%r"])
    for line in (q or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            out[parts[0]] = {"state": parts[1], "detail": parts[2], "source": "squeue"}
    rest = [j for j in job_ids if j not in out]
    if rest:
        s = _run(["sacct", "-n", "-P", "-X", "-j", ",".join(rest), "-o", "JobID,State,ExitCode"])
        for line in (s or "").splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0] in rest:
                out[parts[0]] = {"state": parts[1].split()[0], "detail": f"exit {parts[2]}", "source": "sacct"}
    for j in [j for j in job_ids if j not in out]:
        s = _run(["scontrol", "show", "job", "-o", j])
        if s:
            fields = dict(tok.split("=", 1) for tok in s.split() if "=" in tok)
            out[j] = {"state": fields.get("JobState", "UNKNOWN"), "detail": f"exit {fields.get('ExitCode', '?')}",
                      "source": "scontrol"}
        else:
            out[j] = {"state": "UNKNOWN", "detail": "not in squeue/sacct/scontrol", "source": "none"}
    return out


def sweep_status(d: Path) -> dict[str, Any]:
    sweep, _ = load_sweep(d)
    jobs_path = d / "jobs.json"
    if not jobs_path.is_file():
        raise InputError(f"{d}: nothing submitted yet (run `moetune sweep submit {d}`)")
    from moetune.sweep.sweepdir import read_jobs

    jobs = read_jobs(d)
    states = job_states(list(jobs.values()))
    rows = []
    for r in sweep["runs"]:
        j = jobs.get(r["name"])
        st = states.get(j, {}) if j else {}
        has_log = any((d / r["dir"] / "logs").glob("*")) if (d / r["dir"] / "logs").is_dir() else False
        rows.append({"run": r["name"], "phase": r["phase"], "job_id": j, "state": st.get("state", "NOT_SUBMITTED"),
                     "detail": st.get("detail", ""), "source": st.get("source", ""), "has_output": has_log})
    done = all(row["state"] in FINAL_STATES for row in rows if row["job_id"])
    return {"runs": rows, "all_finished": done}
