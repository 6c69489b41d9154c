"""Planner vs published layouts: for each Megatron-Bridge performance row with a catalog model, is the published
layout feasible in moetune's search, where does it rank, and how far is moetune's top-1 prediction from its
prediction for the published layout?

Target: the published layout is in the top 10 or within 5 % of the top-1 prediction for >= 85 % of rows, under the
held-out folds too. Reads data/perf/mbridge_perf_calibration.csv (the repo's copy of the published table).

    python bench/plan_vs_published.py [--limit N] [--every K] [--match TEXT] [--folds system,model,release]

``--folds`` also plans every row with the efficiency parameters of the cross-validation fold that holds it out
(moetune.perfmodel.calibration.cross_validate: leave-one-system-out, -model-out, -release-out; each row is planned
once per fold kind, with the parameters fitted without its system / model / release) and prints the agreement per
fold kind. ``--every K`` keeps every K-th row and ``--match`` the rows whose model or system contains TEXT (quick
iteration; the search is ~1-2 s per row).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.commands import knobs
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


def _row_setup(r: dict):
    """(plan key, PlanRequest kwargs, published layout pins) of a table row, or a skip message."""
    try:
        model = get_model(r["model"])
        system = get_system(r["system"])
        prec = _precision(r["precision"])
    except MoetuneError as exc:
        return None, f"skipped: {exc}"
    gpus, gbs, seq = _int(r["num_gpus"]), _int(r["gbs"]), _int(r["seq_len"])
    pub = {"tp": _int(r["tp"], 1), "pp": _int(r["pp"], 1), "cp": _int(r["cp"], 1), "vpp": _int(r["vp"], 1),
           "ep": _int(r["ep"], 1), "mbs": _int(r["mbs"], 1)}
    if r.get("etp", "").strip():
        pub["etp"] = _int(r["etp"])
    if _int(r.get("fsdp", ""), 0):  # the table's fsdp column: Megatron-FSDP over that many ranks
        pub["fsdp"] = 1
    key = (model.name, system.name, gpus, gbs, seq, prec)
    kw = {"model": model, "system": system, "gpus": gpus, "global_batch_size": gbs, "seq_length": seq,
          "precisions": (prec,), "mbs_options": tuple(sorted({1, 2, 4, pub["mbs"]})), "top": 10,
          "workers": knobs.workers()}
    return (key, kw, pub), ""


def plan_rows(rows: list[dict], eff_for_row=None, tag: str = "") -> list[tuple]:
    """Plan every row (full search and the published layout pinned); ``eff_for_row(row)`` names the efficiency file
    to price it with (None: the shipped catalog). Full searches are shared by rows with the same request."""
    seen: dict[tuple, dict] = {}
    out = []
    for r in rows:
        setup, msg = _row_setup(r)
        if setup is None:
            out.append((r, None, msg))
            continue
        key, kw, pub = setup
        eff_path = eff_for_row(r) if eff_for_row else knobs.efficiency()
        skey = (key, eff_path)
        if skey not in seen:
            req = PlanRequest(**kw, efficiency=eff_path)
            seen[skey] = {"req": req, "res": plan(req)}
        full = seen[skey]["res"]
        fixed = plan(PlanRequest(**{**seen[skey]["req"].__dict__, "fix": pub, "top": 1}))
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
        print(f"progress{tag}: {len(out)} rows; last {r['model']} {r['system']} {kw['gpus']} {r['precision']} "
              f"rank {rank} gap {100 * within:.1f}%", file=sys.stderr, flush=True)
    return out


def agreement(out: list[tuple]) -> tuple[int, int, int]:
    """(rows evaluated, rows ok, rows whose published layout is infeasible)."""
    n = sum(1 for _, res, msg in out if res is not None or not msg.startswith("skipped"))
    ok = sum(1 for _, res, _ in out if res is not None and res["ok"])
    bad = sum(1 for _, res, msg in out if res is None and not msg.startswith("skipped"))
    return n, ok, bad


def fold_efficiencies(kinds: list[str], tmp: Path) -> dict[str, dict[str, str]]:
    """{kind: {fold key: efficiency file}}: the cross-validation fits of the step-time bench (same folds)."""
    from moetune.io.load import build_published_job
    from moetune.perfmodel.calibration import (
        RunPredictor,
        cross_validate,
        default_efficiency,
        read_measured_csv,
        save_efficiency,
    )

    runs, _ = read_measured_csv(CSV, job_builder=build_published_job)
    base = default_efficiency()
    pred = RunPredictor(runs, base)
    files: dict[str, dict[str, str]] = {}
    for kind in kinds:
        cv = cross_validate(pred, base, kind)
        files[kind] = {}
        for fold, e in cv.fits.items():
            path = tmp / f"{kind}_{abs(hash(fold))}.yaml"
            save_efficiency(e.with_values({}, origin=f"fold {kind}={fold}"), path)
            files[kind][fold] = str(path)
        print(f"fitted {len(cv.fits)} {kind} folds", file=sys.stderr, flush=True)
    return files


def _fold_key(kind: str, r: dict) -> str | None:
    if kind == "system":
        return r["system"].strip()
    if kind == "release":
        return r.get("release", "").strip() or "unknown"
    try:
        return get_model(r["model"]).name
    except MoetuneError:
        return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("limit", nargs="?", type=int, default=None, help="stop after N rows")
    ap.add_argument("--limit", dest="limit_opt", type=int, default=None)
    ap.add_argument("--every", type=int, default=1, help="keep every K-th row")
    ap.add_argument("--match", default="", help="keep rows whose model or system contains this text")
    ap.add_argument("--folds", default="", help="comma list of system, model, release")
    args = ap.parse_args(argv)
    limit = args.limit_opt or args.limit
    rows = list(csv.DictReader(CSV.open()))
    rows = [r for r in rows if args.match.lower() in (r["model"] + " " + r["system"]).lower()][::max(args.every, 1)]
    if limit:
        rows = rows[:limit]
    out = plan_rows(rows)
    print(f"{'model':<22} {'system':<10} {'GPUs':>5} {'prec':<7} {'published layout':<28} {'rank':>5} "
          f"{'gap to top-1':>12} {'ok':>3}  moetune top-1")
    for r, res, msg in out:
        lay = f"TP{r['tp']} PP{r['pp']} CP{r['cp']} VP{r['vp']} EP{r['ep']} MBS{r['mbs']}"
        if res is None:
            print(f"{r['model']:<22} {r['system']:<10} {r['num_gpus']:>5} {r['precision']:<7} {lay:<28} {msg}")
            continue
        print(f"{r['model']:<22} {r['system']:<10} {r['num_gpus']:>5} {r['precision']:<7} {lay:<28} "
              f"{res['rank']:>5} {100 * res['gap']:>11.1f}% {'yes' if res['ok'] else 'no':>3}  {res['top1']}")
    n, n_ok, bad = agreement(out)
    print(f"\nrows evaluated: {n}; published layout in top 10 or within 5 % of top-1: {n_ok} "
          f"({100 * n_ok / max(n, 1):.0f} %; target >= 85 %); published layout infeasible: {bad}")
    gaps = sorted(res["gap"] for _, res, _ in out if res is not None)
    if gaps:
        w10 = sum(1 for g in gaps if g <= 0.10)
        print(f"feasible: {len(gaps)} of {n}; gap to top-1: median {100 * gaps[len(gaps) // 2]:.1f} %, "
              f"within 10 %: {w10} ({100 * w10 / max(n, 1):.0f} % of rows)")
    kinds = [k for k in args.folds.split(",") if k]
    if not kinds:
        return
    with tempfile.TemporaryDirectory() as td:
        files = fold_efficiencies(kinds, Path(td))
        print("\n## Under held-out folds (each row planned with the parameters fitted without its fold)")
        print(f"{'fold kind':<10} {'rows':>5} {'ok':>5} {'ok %':>6} {'infeasible':>10} {'median gap %':>12}")
        print(f"{'in-sample':<10} {n:>5} {n_ok:>5} {100 * n_ok / max(n, 1):6.0f} {bad:>10} "
              f"{100 * gaps[len(gaps) // 2] if gaps else 0:12.1f}")
        for kind in kinds:
            fo = plan_rows(rows, lambda r, k=kind: files[k].get(_fold_key(k, r) or ""), tag=f" [{kind}]")
            fn, fok, fbad = agreement(fo)
            fg = sorted(res["gap"] for _, res, _ in fo if res is not None)
            print(f"{kind:<10} {fn:>5} {fok:>5} {100 * fok / max(fn, 1):6.0f} {fbad:>10} "
                  f"{100 * fg[len(fg) // 2] if fg else 0:12.1f}", flush=True)
            for r, res, _ in fo:
                if res is not None and not res["ok"]:
                    print(f"    miss: {r['model']} {r['system']} {r['num_gpus']} {r['precision']} rank {res['rank']} "
                          f"gap {100 * res['gap']:.1f}% top-1 {res['top1']}")


if __name__ == "__main__":
    main()
