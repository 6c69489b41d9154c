"""Start-up speed of the ``moetune`` command: ``--help``, ``plan --help`` and ``layout`` (issue 19: ``moetune --help``
<= 0.3 s), beside a bare ``python -c pass`` on the same interpreter as the floor nobody can go under.

A user's ``pip install`` byte-compiles the package (pip compiles ``.py`` to ``__pycache__`` at install time), so each
command here runs on a byte-compiled tree: the bench compiles ``src/moetune`` first (``compileall``; the
``__pycache__`` folders are git-ignored) and runs the children without ``PYTHONDONTWRITEBYTECODE``. Without that,
an uninstalled source tree recompiles every imported module on every run (about 0.07 s for ``--help`` and 0.2 s
for ``plan``) and the bench would time the compiler.

The machine is shared: next to wall time (best of N) it prints the child's CPU time (user + system, from
``os.wait4``), which does not depend on how busy the other cores are, and the load average. It also lists which of
the heavy modules (numpy, scipy, the planner, the step model, the model catalog) each command imported.

    python bench/startup_speed.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

#: (what, argv after ``python``, target seconds)
COMMANDS = [
    ("python -c pass (floor)", ["-c", "pass"], None),
    ("moetune --help", ["-m", "moetune", "--help"], 0.3),
    ("moetune plan --help", ["-m", "moetune", "plan", "--help"], None),
    ("moetune layout --gpus 64 --tp 2 --pp 4 --ep 8", ["-m", "moetune", "layout", "--gpus", "64", "--tp", "2", "--pp",
                                                       "4", "--ep", "8"], None),
]

HEAVY_PROBE = (
    "import sys\n"
    "from moetune.cli import main  # what ``python -m moetune`` runs, without its exit that skips the teardown\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    "heavy = sorted({m.split('.')[0] if m.split('.')[0] in ('numpy', 'scipy') else m for m in sys.modules\n"
    "                if m.split('.')[0] in ('numpy', 'scipy')\n"
    "                or m.startswith(('moetune.plan', 'moetune.perfmodel.step', 'moetune.catalog.models'))})\n"
    "sys.stderr.write('HEAVY ' + ' '.join(heavy) + '\\n')\n"
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall s, child CPU s) of one run."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                         cwd=ROOT)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}")
    return wall, ru.ru_utime + ru.ru_stime


def heavy_modules(argv: list[str]) -> str:
    if argv[:1] != ["-m"]:
        return ""
    p = subprocess.run([sys.executable, "-c", HEAVY_PROBE, *argv[2:]], capture_output=True, text=True, env=_env(),
                       cwd=ROOT)
    line = next((x for x in p.stderr.splitlines() if x.startswith("HEAVY")), "HEAVY ?")
    return line[6:].strip() or "none"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    compileall.compile_dir(str(SRC / "moetune"), quiet=1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; byte-compiled tree; "
          f"best of {args.repeat}")
    print(f"{'command':<48} {'wall s':>7} {'CPU s':>6} {'target':>7}  heavy modules imported")
    for what, argv, target in COMMANDS:
        runs = [run_once(argv) for _ in range(args.repeat)]
        wall = min(w for w, _ in runs)
        cpu = min(c for _, c in runs)
        tgt = f"<= {target}" if target else ""
        print(f"{what:<48} {wall:>7.3f} {cpu:>6.3f} {tgt:>7}  {heavy_modules(argv)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
