"""moetune vs Holistic Trace Analysis on a >= 1 GB multi-rank Kineto trace built from the real ones.

The job is built in a temporary directory from real Kineto traces in data/traces (default: four of HTA's
NCCL test traces in rotation across ranks): every rank file replicates its source's events K times with timestamps
shifted by one trace span per replica (step numbers and correlation ids renumbered so iterations stay distinct), sets
``distributedInfo.rank``/``world_size``, and adds a small per-rank clock offset. The directory is deleted afterwards.

Each tool runs in its own subprocess, wrapped by a tiny measuring process that reports wall time and
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` (the largest resident set among the tool's processes, HTA's
worker pool included):
  - moetune: ``python -m moetune trace DIR --json`` (full analysis, all ranks);
  - HTA: ``TraceAnalysis(trace_dir=DIR)`` + ``get_comm_comp_overlap()``.
Targets (issue 8): moetune >= 3x faster than HTA, moetune peak RSS < 1.5x the input size.

Usage: python bench/trace_speed.py [--gb 1.0] [--ranks 8] [--source FILE ...] [--skip-hta] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from conftest import DATA  # noqa: E402

#: real NCCL Kineto traces (HTA's test data), used in rotation across ranks
DEFAULT_SOURCES = (
    "hta_df_index_resolver_df_index_resolver.json.gz",
    "hta_trace_diff_control_control.json.gz",
    "hta_trace_diff_test_test.json.gz",
    "hta_negative_queue_length_values_check_rank0.json.gz",
)


def _load(path: Path) -> dict:
    op = gzip.open if path.name.endswith(".gz") else open
    with op(path, "rb") as fh:
        return json.load(fh)


def build_job(sources: list[Path], out: Path, ranks: int, target_bytes: int) -> int:
    """Rank r replicates sources[r % len(sources)] until it holds about target_bytes / ranks bytes."""
    total = 0
    per_rank = target_bytes // ranks
    for r in range(ranks):
        doc = _load(sources[r % len(sources)])
        events = doc.pop("traceEvents")
        xs = [e for e in events if isinstance(e.get("ts"), int | float)]
        t0 = min(e["ts"] for e in xs)
        span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 1000.0
        ev_bytes = sum(len(orjson.dumps(e)) + 2 for e in events)
        reps = max(1, -(-per_rank // ev_bytes))
        meta = dict(doc)
        meta["distributedInfo"] = dict(doc.get("distributedInfo") or {}, rank=r, world_size=ranks)
        # Kineto's own layout ('"rank": 0' with a space): HTA finds the rank with the regex '"rank":\\s+(\\d+)'
        head = json.dumps(meta).encode()[:-1] + b', "traceEvents": [\n'
        path = out / f"rank-{r}.json"
        skew = 3.0 * r  # µs: a per-host clock offset for the alignment step
        with open(path, "wb") as fh:
            fh.write(head)
            first = True
            for k in range(reps):
                shift = k * span + skew
                for e in events:
                    e2 = dict(e)
                    if "ts" in e2 and isinstance(e2["ts"], int | float):
                        e2["ts"] = e2["ts"] + shift
                    name = e2.get("name")
                    if k and isinstance(name, str) and name.startswith("ProfilerStep#"):
                        e2["name"] = f"ProfilerStep#{int(name[13:]) + 1000 * k}"
                    a = e2.get("args")
                    if k and isinstance(a, dict) and ("correlation" in a or "External id" in a):
                        a = dict(a)
                        for key in ("correlation", "External id"):
                            if isinstance(a.get(key), int):
                                a[key] += 100_000_000 * k
                        e2["args"] = a
                    if k and "id" in e2 and isinstance(e2["id"], int):
                        e2["id"] += 100_000_000 * k
                    fh.write((b"" if first else b",\n") + orjson.dumps(e2))
                    first = False
            fh.write(b'\n], "traceName": "' + path.name.encode() + b'"}\n')
        total += path.stat().st_size
        del events, xs, doc
    return total


def measure(cmd: list[str], out_path: Path) -> dict:
    """Run cmd in a child of a fresh measuring process (stdout to out_path); wall seconds, the children's max RSS."""
    code = (
        "import resource, subprocess, sys, time, json\n"
        f"fh = open({str(out_path)!r}, 'wb')\n"
        "t = time.perf_counter()\n"
        f"p = subprocess.run({cmd!r}, stdout=fh, stderr=subprocess.DEVNULL)\n"
        "w = time.perf_counter() - t\n"
        "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps({'rc': p.returncode, 'wall_s': w, 'maxrss_kb': ru.ru_maxrss, "
        "'cpu_s': ru.ru_utime + ru.ru_stime}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


HTA_CODE = (
    "import logging, json, sys\n"
    "logging.disable(logging.WARNING)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "ta = TraceAnalysis(trace_dir=sys.argv[1])\n"
    "df = ta.get_comm_comp_overlap(visualize=False)\n"
    "print(json.dumps({int(r['rank']): r['comp_comm_overlap_pctg'] for r in df.to_dict('records')}))\n"
)


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0, help="total input size to build (GB, 1e9 bytes)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--source", action="append", default=None, help="source trace(s); repeat for several")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--keep", default=None, help="build into this directory and keep it")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="moetune_trace_speed_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        sources = args.source or list(DEFAULT_SOURCES)
        size = build_job([DATA / "traces" / s for s in sources], work, args.ranks, int(args.gb * 1e9))
        print(f"built {args.ranks} rank files, {size / 1e9:.3f} GB total, from {', '.join(sources)} "
              f"in {time.perf_counter() - t:.1f} s ({work})")
        rows = []
        out_dir = Path(tempfile.mkdtemp(prefix="moetune_trace_speed_out_"))
        mt = measure([sys.executable, "-m", "moetune", "trace", str(work), "--json"], out_dir / "moetune.json")
        if mt["rc"] != 0:
            raise SystemExit(f"moetune failed rc={mt['rc']}")
        rows.append(("moetune trace", mt))
        doc = json.loads((out_dir / "moetune.json").read_bytes())
        mt_ov = {r["rank"]: r["comm_compute_overlap_pct"] for r in doc["ranks"]}
        hta_ov = {}
        if not args.skip_hta:
            ht = measure([sys.executable, "-c", HTA_CODE, str(work)], out_dir / "hta.txt")
            if ht["rc"] != 0:  # a failed HTA run has no time to compare with: say so instead of a ratio
                raise SystemExit(f"HTA failed rc={ht['rc']} (is it installed? pip install '.[test]'); "
                                 "rerun with --skip-hta to time moetune alone")
            rows.append(("HTA get_comm_comp_overlap", ht))
            try:
                hta_ov = {int(k): v for k, v in
                          json.loads((out_dir / "hta.txt").read_text().strip().splitlines()[-1]).items()}
            except Exception:  # noqa: BLE001 - reported as missing below
                hta_ov = {}
        shutil.rmtree(out_dir, ignore_errors=True)
        print()
        print(f"input: {size / 1e9:.3f} GB in {args.ranks} rank files; machine: {os.cpu_count()} CPUs")
        print(f"| {'tool':26} | {'wall s':>8} | {'cpu s':>8} | {'peak RSS MB':>11} | {'RSS / input':>11} | "
              f"{'speed-up':>8} |")
        print(f"|{'-' * 28}|{'-' * 10}|{'-' * 10}|{'-' * 13}|{'-' * 13}|{'-' * 10}|")
        base = rows[-1][1]["wall_s"]
        for name, m in rows:
            rss = m["maxrss_kb"] * 1024
            print(f"| {name:26} | {m['wall_s']:8.1f} | {m['cpu_s']:8.1f} | {rss / 1e6:11.0f} | {rss / size:11.2f} | "
                  f"{base / m['wall_s']:7.1f}x |")
        if len(rows) == 2:
            sp = rows[1][1]["wall_s"] / rows[0][1]["wall_s"]
            rr = rows[0][1]["maxrss_kb"] * 1024 / size
            print(f"targets: speed-up >= 3x: {'PASS' if sp >= 3 else 'FAIL'} ({sp:.1f}x); "
                  f"moetune RSS < 1.5x input: {'PASS' if rr < 1.5 else 'FAIL'} ({rr:.2f}x)")
        if hta_ov:
            diffs = [abs((mt_ov.get(r) or 0.0) - (v or 0.0)) for r, v in hta_ov.items()]
            print(f"overlap agreement on {len(hta_ov)} ranks (HTA ranks found: {sorted(hta_ov)}): "
                  f"max |moetune - HTA| = {max(diffs):.3f} pp")
            print("per rank (moetune / HTA %): " + ", ".join(
                f"{r}: {_f(mt_ov.get(r))}/{_f(v)}" for r, v in sorted(hta_ov.items())))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
