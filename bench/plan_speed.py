"""Planner speed: DeepSeek-V3 on 1,024 H100 and on 256 GB200, full search space; the README's default plan and
infeasible requests as a user runs them (``python -m moetune plan``, wall time including start-up).

Prints candidates evaluated, seconds and candidates/s on this machine, then the targets of issue 19 beside the
measured numbers. Requests of >= 64 GPUs run the exact search in min(2, CPUs) processes (``MOETUNE_WORKERS=1`` for
one); "evaluated" counts priced feature variants. The command-line rows run on a byte-compiled tree, as ``pip install``
leaves the package (``bench/startup_speed.py`` times start-up alone); "CPU s" is the user + system time of the command
and its forked shares, steadier than wall time on a shared machine.

    python bench/plan_speed.py [--quick]    # --quick: skip the in-process table, only the command-line rows
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.commands import knobs
from moetune.plan.search import PlanRequest, _workers, plan

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("DeepSeek-V3", "DGX-H100", 1024, 8192, 4096, ("bf16",)),
    ("DeepSeek-V3", "GB200-NVL72", 256, 4096, 4096, ("mxfp8",)),
    ("Qwen3-30B-A3B", "DGX-H100", 16, 1024, 4096, ("bf16",)),
]

DSV3_1024 = ["--model", "DeepSeek-V3", "--system", "DGX-H100", "--gpus", "1024", "--gbs", "8192", "--seq", "4096",
             "--precision", "bf16"]
#: (what, plan arguments, environment, target wall seconds, target search seconds)
COMMANDS = [
    ("DeepSeek-V3 on 1,024 H100, one process", DSV3_1024, {"MOETUNE_WORKERS": "1"}, 1.5, 1.0),
    ("DeepSeek-V3 on 1,024 H100, default processes", DSV3_1024, {}, None, None),
    ("default README plan (`moetune plan`)", [], {}, 1.0, None),
    ("infeasible: DeepSeek-V3 on 16 H100", ["--model", "DeepSeek-V3", "--system", "DGX-H100", "--gpus", "16",
                                            "--gbs", "256"], {}, 1.0, None),
    # fits since the perf-common start (BF16 gradient reduction): FSDP + optimizer and activation offload
    ("tight fit: Llama-4-Scout on 8 A100", ["--model", "Llama-4-Scout", "--system", "DGX-A100", "--gpus", "8",
                                            "--gbs", "256"], {}, None, None),
    ("infeasible: Llama-4-Scout FP8 on 8 A100", ["--model", "Llama-4-Scout", "--system", "DGX-A100", "--gpus", "8",
                                                 "--gbs", "256", "--precision", "fp8_cs"], {}, 1.0, None),
]


def table() -> None:
    print(f"{'model':<16} {'system':<12} {'GPUs':>5} {'procs':>5} {'layouts':>8} {'evaluated':>9} {'feasible':>8} "
          f"{'pruned(mem/bound/check)':>24} {'seconds':>8} {'cand/s':>8}  top-1")
    for model, system, gpus, gbs, seq, precs in CASES:
        req = PlanRequest(model=get_model(model), system=get_system(system), gpus=gpus, global_batch_size=gbs,
                          seq_length=seq, precisions=precs, top=5, workers=knobs.workers())
        t0 = time.perf_counter()
        res = plan(req)
        dt = time.perf_counter() - t0
        evaluated = res.searched
        top = res.candidates[0] if res.candidates else None
        desc = (f"{top.job.layout.short()} MBS{top.layout.mbs} {top.time.step_time_s:.2f}s "
                f"{top.time.model_tflops_per_gpu:.0f} TFLOP/s") if top else "none fits"
        pr = f"{res.pruned_memory}/{res.pruned_bound}/{res.rejected_by_check}"
        print(f"{model:<16} {system:<12} {gpus:>5} {_workers(req):>5} {res.layouts:>8} {evaluated:>9} {res.feasible:>8} "
              f"{pr:>24} {dt:>8.2f} {evaluated / max(dt, 1e-9):>8.0f}  {desc}")


def command_rows() -> None:
    """Each request as a user runs it: ``python -m moetune plan ... --json`` in a fresh process."""
    print(f"\n{'what':<46} {'wall s':>7} {'target':>7} {'search s':>9} {'target':>7} {'CPU s':>6}  answer")
    # as a ``pip install`` leaves it: byte-compiled (else every run recompiles every imported module, ~0.2 s)
    compileall.compile_dir(str(ROOT / "src" / "moetune"), quiet=1)
    env0 = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env0["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    for what, args, env, wall_target, search_target in COMMANDS:
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([sys.executable, "-m", "moetune", "plan", *args, "--json"], capture_output=True, text=True,
                           env={**env0, **env}, cwd=ROOT)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # user + system seconds of the command and its forked shares (less noisy than wall time on a shared machine)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        search, answer = "", ""
        try:
            out = json.loads(p.stdout)
            search = f"{out['seconds']:.2f}"
            if out["candidates"]:
                c = out["candidates"][0]
                answer = f"top-1 {c['time']['step_time_s']:.2f} s"
            else:
                answer = out.get("impossible", {}).get("summary", "")[:60]
        except (json.JSONDecodeError, KeyError):
            answer = (p.stderr.strip().splitlines() or [""])[-1][:60]
        wt = f"<= {wall_target:g}" if wall_target else ""
        st = f"<= {search_target:g}" if search_target else ""
        print(f"{what:<46} {wall:>7.2f} {wt:>7} {search:>9} {st:>7} {cpu:>6.2f}  {answer}  (exit {p.returncode})")


def main() -> None:
    if "--quick" not in sys.argv:
        table()
    command_rows()


if __name__ == "__main__":
    main()
