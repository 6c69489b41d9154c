"""Planner vs published layouts: for each Megatron-Bridge performance row with a catalog model, is the published
layout feasible in moetune's search, where does it rank, and how far is moetune's top-1 prediction from its
prediction for the published layout?

Target: the published layout is in the top 10 or within 5 % of the top-1 prediction for >= 70 % of rows.
Reads data/perf/mbridge_perf_calibration.csv (the repo's copy of the published table).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.errors import MoetuneError
from moetune.plan.search import PlanRequest, plan
from moetune.spec.features import parse_precision

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "perf" / "mbridge_perf_calibration.csv"


def _int(x: str, default: int | None = None) -> int | None:
    """A table cell as int; '1 (2)' cells (the table's alternate-precision variant in brackets) give the first."""
    x = (x or "").strip().split("(")[0].strip()
    return int(float(x)) if x and x.lower() not in ("n/a", "na", "none", "-") else default


def _precision(label: str) -> str:
    """The row's primary precision: 'FP8-CS (FP8-MX)' is FP8-CS, its bracketed variant has bracketed cells."""
    label = label.strip().split("(")[0].strip()
    if not label:
        raise MoetuneError("precision not given in the table")
    return parse_precision(label)


def main(limit: int | None = None) -> None:
    rows = list(csv.DictReader(CSV.open()))
    seen: dict[tuple, dict] = {}
    out = []
    for r in rows:
        try:
            model = get_model(r["model"])
            system = get_system(r["system"])
            prec = _precision(r["precision"])
        except MoetuneError as exc:
            out.append((r, None, f"skipped: {exc}"))
            continue
        gpus, gbs, seq = _int(r["num_gpus"]), _int(r["gbs"]), _int(r["seq_len"])
        pub = {"tp": _int(r["tp"], 1), "pp": _int(r["pp"], 1), "cp": _int(r["cp"], 1), "vpp": _int(r["vp"], 1),
               "ep": _int(r["ep"], 1), "mbs": _int(r["mbs"], 1)}
        if r.get("etp", "").strip():
            pub["etp"] = _int(r["etp"])
        if _int(r.get("fsdp", ""), 0):  # the table's fsdp column: Megatron-FSDP over that many ranks
            pub["fsdp"] = 1
        key = (model.name, system.name, gpus, gbs, seq, prec)
        if key not in seen:
            req = PlanRequest(model=model, system=system, gpus=gpus, global_batch_size=gbs, seq_length=seq,
                              precisions=(prec,), mbs_options=tuple(sorted({1, 2, 4, pub["mbs"]})), top=10)
            seen[key] = {"req": req, "res": plan(req)}
        full = seen[key]["res"]
        fixed_req = PlanRequest(**{**seen[key]["req"].__dict__, "fix": pub, "top": 1})
        fixed = plan(fixed_req)
        if not fixed.candidates:
            out.append((r, None, "published layout NOT feasible in moetune"))
            continue
        pub_t = fixed.candidates[0].time.step_time_s
        best = full.candidates[0].time.step_time_s if full.candidates else pub_t
        times = sorted(full.per_layout_best.values())
        rank = 1 + sum(1 for t in times if t < pub_t - 1e-12)
        within = (pub_t - best) / pub_t if pub_t else 0.0
        ok = rank <= 10 or within <= 0.05
        out.append((r, {"rank": rank, "pub_t": pub_t, "best_t": best, "gap": within, "ok": ok,
                        "top1": full.candidates[0].job.layout.short() if full.candidates else "-"}, ""))
        print(f"progress: {len(out)} rows; last {r['model']} {r['system']} {gpus} {r['precision']} rank {rank} "
              f"gap {100 * within:.1f}%", file=sys.stderr, flush=True)
        if limit and len(out) >= limit:
            break
    print(f"{'model':<22} {'system':<10} {'GPUs':>5} {'prec':<7} {'published layout':<28} {'rank':>5} "
          f"{'gap to top-1':>12} {'ok':>3}  moetune top-1")
    n_ok = n = 0
    for r, res, msg in out:
        lay = f"TP{r['tp']} PP{r['pp']} CP{r['cp']} VP{r['vp']} EP{r['ep']} MBS{r['mbs']}"
        if res is None:
            print(f"{r['model']:<22} {r['system']:<10} {r['num_gpus']:>5} {r['precision']:<7} {lay:<28} {msg}")
            if not msg.startswith("skipped"):
                n += 1
            continue
        n += 1
        n_ok += res["ok"]
        print(f"{r['model']:<22} {r['system']:<10} {r['num_gpus']:>5} {r['precision']:<7} {lay:<28} "
              f"{res['rank']:>5} {100 * res['gap']:>11.1f}% {'yes' if res['ok'] else 'no':>3}  {res['top1']}")
    gaps = sorted(res["gap"] for _, res, _ in out if res is not None)
    print(f"\nrows evaluated: {n}; published layout in top 10 or within 5 % of top-1: {n_ok} "
          f"({100 * n_ok / max(n, 1):.0f} %; target >= 70 %)")
    if gaps:
        w10 = sum(1 for g in gaps if g <= 0.10)
        print(f"feasible: {len(gaps)} of {n}; gap to top-1: median {100 * gaps[len(gaps) // 2]:.1f} %, "
              f"within 10 %: {w10} ({100 * w10 / max(n, 1):.0f} % of rows)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else None)
