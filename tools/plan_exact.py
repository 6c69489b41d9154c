"""Planner exactness across a speed change: save ``moetune plan --json`` for a fixed set of requests, then diff a later
tree's answers against them field by field (everything but the search's own wall time).

    python tools/plan_exact.py save DIR      # before the change (one process, MOETUNE_WORKERS=1)
    python tools/plan_exact.py diff DIR      # after: prints each differing JSON path; exit 1 when any differs

``--ignore KEY`` (repeatable) skips a top-level counter the change meant to move (e.g. ``searched``). The plans run in
one process unless ``MOETUNE_WORKERS`` says otherwise (then the work counters depend on the shares' timing: ignore
``searched``, ``feasible`` and ``pruned``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (file stem, plan arguments)
REQUESTS = [
    ("dsv3_1024_h100_bf16", ["--model", "DeepSeek-V3", "--system", "DGX-H100", "--gpus", "1024", "--gbs", "8192",
                             "--seq", "4096", "--precision", "bf16"]),
    ("default", []),
    ("qwen3_30b_16_h100", ["--model", "Qwen3-30B-A3B", "--system", "DGX-H100", "--gpus", "16", "--gbs", "1024",
                           "--seq", "4096"]),
    ("dsv3_256_gb200_mxfp8", ["--model", "DeepSeek-V3", "--system", "GB200-NVL72", "--gpus", "256", "--gbs", "4096",
                              "--seq", "4096", "--precision", "mxfp8"]),
    ("gptoss120b_64_b200", ["--model", "GPT-OSS-120B", "--system", "DGX-B200", "--gpus", "64", "--gbs", "1280",
                            "--seq", "4096"]),
    ("qwen3_235b_256_h100_fp8cs", ["--model", "Qwen3-235B-A22B", "--system", "DGX-H100", "--gpus", "256", "--gbs",
                                   "2048", "--seq", "4096", "--precision", "fp8_cs"]),
    ("llama3_70b_64_gb200_mxfp8", ["--model", "Llama-3-70B", "--system", "GB200-NVL72", "--gpus", "64", "--gbs",
                                   "128", "--seq", "8192", "--precision", "mxfp8"]),
    ("infeasible_dsv3_16_h100", ["--model", "DeepSeek-V3", "--system", "DGX-H100", "--gpus", "16", "--gbs", "256"]),
]
#: top-level fields that are wall time, not the answer
VOLATILE = {"seconds"}


def run(args: list[str]) -> tuple[int, dict]:
    env = {**os.environ, "MOETUNE_WORKERS": os.environ.get("MOETUNE_WORKERS", "1"), "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-m", "moetune", "plan", *args, "--top", "20", "--json"], capture_output=True,
                       text=True, env=env, cwd=ROOT)
    try:
        return p.returncode, json.loads(p.stdout)
    except json.JSONDecodeError:
        return p.returncode, {"stderr": p.stderr.strip().splitlines()[-1:] if p.stderr else []}


def diffs(a, b, path: str = "") -> list[str]:
    """JSON paths where ``a`` and ``b`` differ (floats compared exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'before' if k in a else 'after'}")
            else:
                out += diffs(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} -> {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in diffs(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in ("save", "diff"):
        print(__doc__.strip().splitlines()[-4], file=sys.stderr)
        return 2
    mode, folder = sys.argv[1], Path(sys.argv[2])
    ignore = VOLATILE | {sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--ignore" and i + 1 < len(sys.argv)}
    folder.mkdir(parents=True, exist_ok=True)
    bad = 0
    for stem, args in REQUESTS:
        rc, out = run(args)
        out = {"exit": rc, **{k: v for k, v in out.items() if k not in VOLATILE}}
        f = folder / f"{stem}.json"
        if mode == "save":
            f.write_text(json.dumps(out, indent=1, sort_keys=True))
            print(f"saved {f} (exit {rc})")
            continue
        before = json.loads(f.read_text())
        d = diffs({k: v for k, v in before.items() if k not in ignore}, {k: v for k, v in out.items() if k not in ignore})
        bad += bool(d)
        print(f"{stem}: {'identical' if not d else f'{len(d)} differences'}")
        for line in d[:20]:
            print(f"  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
