"""Model FLOPs per token vs Megatron-Bridge's published performance tables.

For every row of ``data/perf/mbridge_perf_calibration.csv`` whose model resolves in the catalog, the published
model TFLOP/s/GPU divided by the published tokens/s/GPU is the FLOPs per token Bridge used (see
``docs/bridge_perf_notes.md`` §2). It is compared with :func:`moetune.perfmodel.flops.flops_per_token` at the
row's sequence length and TP (vocab padding), with the Bridge definition of the row's release (legacy before 26.06).
Prints one line per row and a summary; exit code 1 if any row is off by more than the tolerance (1.5 %).

Two data caveats are handled explicitly and reported, never hidden:
* some releases print tokens/s coarsely rounded (most values multiples of 32/64, e.g. 26.04.01;
  ``docs/bridge_perf_notes.md`` §2: "treat those columns as roughly ±1 % precise"). A release is detected as
  rounded when more than half of its tokens/s values are multiples of 32; its rows carry q = 1 % (``±q%`` column).
  A row passes when |err| <= tolerance, or when |err| <= tolerance + q (counted separately in the summary);
* ``task == lora`` rows use Bridge's LoRA path (frozen FLOPs x 2/3 with packed-SQuAD sequence statistics that the
  table does not give), which is not the model-FLOPs definition; they are listed as skipped.

Usage: python bench/flops_vs_published.py [--csv PATH] [--tolerance 0.015] [--all]
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

from moetune.catalog.models import get_model
from moetune.errors import UnknownNameError
from moetune.perfmodel.flops import bridge_definition_for_release, flops_per_token

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "data" / "perf" / "mbridge_perf_calibration.csv"


def _first_number(v: str) -> float | None:
    """'1933 (1858)' -> 1933.0: the tables put an alternative quantization granularity in parentheses."""
    head = v.split("(")[0].strip()
    try:
        return float(head)
    except ValueError:
        return None


ROUNDED_TABLE_PRECISION = 0.01  # bridge_perf_notes.md §2


def _rounded_releases(rows: list[dict]) -> set[str]:
    """Releases whose tokens/s column is mostly multiples of 32 (coarse rounding, see module doc)."""
    seen: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        tok = _first_number(r["tokens_per_sec_per_gpu"])
        if tok:
            seen[r["release"]].append(tok % 32 == 0)
    return {rel for rel, flags in seen.items() if sum(flags) > len(flags) / 2}


def _int(v: str, default: int = 1) -> int:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return default


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--tolerance", type=float, default=0.015)
    args = ap.parse_args(argv)

    rows = list(csv.DictReader(args.csv.open()))
    rounded_releases = _rounded_releases(rows)
    skipped: dict[str, int] = defaultdict(int)
    per_model: dict[str, list[float]] = defaultdict(list)
    worst = (0.0, None)
    n_bad = 0
    n_rounding = 0
    print(f"{'release':8} {'model':26} {'system':11} {'prec':6} {'seq':>6} {'tp':>2} {'tok/s/GPU':>10} "
          f"{'TFLOP/s':>8} {'published/tok':>13} {'moetune/tok':>12} {'err%':>7} {'±q%':>5}")
    print("(published/tok = model TFLOP/s/GPU / tokens/s/GPU; releases before 26.06 use Bridge's legacy definition)")
    for r in rows:
        try:
            model = get_model(r["model"])
        except UnknownNameError:
            skipped[r["model"]] += 1
            continue
        tok, tfl = _first_number(r["tokens_per_sec_per_gpu"]), _first_number(r["model_tflops_per_gpu"])
        if r["task"] == "lora":
            skipped[f"{r['model']} (task=lora: Bridge LoRA path needs packed-data statistics)"] += 1
            continue
        if not tok or not tfl:
            skipped[f"{r['model']} (no numbers)"] += 1
            continue
        published = tfl * 1e12 / tok
        seq, tp = _int(r["seq_len"]), _int(r["tp"])
        definition = bridge_definition_for_release(r["release"])
        ours = flops_per_token(model, seq, tp, definition).total
        err = ours / published - 1
        per_model[model.name].append(err)
        if abs(err) > abs(worst[0]):
            worst = (err, f"{r['release']} {r['model']} {r['system']} {r['precision']}")
        quant = ROUNDED_TABLE_PRECISION if r["release"] in rounded_releases else 0.0
        bad = abs(err) > args.tolerance + quant
        n_bad += bad
        n_rounding += (not bad) and abs(err) > args.tolerance
        print(f"{r['release']:8} {r['model'][:26]:26} {r['system'][:11]:11} {r['precision'][:6]:6} {seq:6d} {tp:2d} "
              f"{tok:10.0f} {tfl:8.0f} {published:13.4e} {ours:12.4e} {100 * err:+7.2f} {100 * quant:5.2f}"
              f"{'  (legacy def.)' if definition == 'legacy' else ''}"
              f"{'  <-- over tolerance' if bad else ''}")

    print()
    print(f"{'catalog model':26} {'rows':>4} {'mean err%':>9} {'max |err|%':>10}")
    for name, errs in sorted(per_model.items()):
        print(f"{name:26} {len(errs):4d} {100 * sum(errs) / len(errs):+9.2f} {100 * max(map(abs, errs)):10.2f}")
    n = sum(len(e) for e in per_model.values())
    print()
    print(f"summary: {n} rows compared, {n - n_bad - n_rounding} within {100 * args.tolerance:.1f} %, "
          f"{n_rounding} within {100 * args.tolerance:.1f} % + the table's tokens/s rounding, {n_bad} over; "
          f"worst {100 * worst[0]:+.2f} % ({worst[1]})")
    print(f"releases with rounded tokens/s (q = {100 * ROUNDED_TABLE_PRECISION:.0f} %): "
          f"{', '.join(sorted(rounded_releases)) or 'none'}")
    if skipped:
        print("not in catalog (skipped): " + ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items())))
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
