"""Step-time model accuracy on the published Megatron-Bridge performance rows.

For every row of data/perf/mbridge_perf_calibration.csv whose model is in the catalog (table's own system,
GPU count, precision label, GBS, MBS, sequence, TP/PP/CP/VP/EP; MoE rows force-balanced and dropless), prints the
predicted vs published model TFLOP/s/GPU, the median and p90 absolute error per system, model and release, and the measured one-variable changes of docs/domain.md
(EP overlap on Qwen3-30B-A3B 16×H100, TP 4→8 and `mlp` recompute on Llama-3-70B), and the CLI path
(:func:`cli_path`: every pretrain row typed as ``moetune estimate`` flags exactly as the table prints it, coverage
and error next to the recipe path).

    python bench/steptime_accuracy.py [--csv FILE] [--refit] [--write-catalog] [--folds system,model,release] [--rows]

Next to the in-sample error it prints the held-out error of three cross-validation kinds, per system, per model
and per release: leave-one-system-out (LOSO), leave-one-model-out (LOMO) and leave-one-release-out (LORO). Each
fold refits the efficiency parameters from their documented priors on the other folds with the library's fit
(moetune.perfmodel.calibration.fit_runs, the fit of ``moetune calibrate``) and predicts the held-out rows.
``--refit`` shows the in-sample figures of a fresh full-data fit (else the shipped catalog values);
``--write-catalog`` stores that fit in src/moetune/catalog/efficiency.yaml.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from moetune.io.load import build_published_job
from moetune.perfmodel.calibration import (
    FOLD_KINDS,
    RunPredictor,
    cross_validate,
    default_efficiency,
    fit_runs,
    read_measured_csv,
    save_efficiency,
)
from moetune.perfmodel.step import estimate_time
from moetune.perfmodel.uncertainty import build_table, job_class, save_table

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CSV = REPO / "data" / "perf" / "mbridge_perf_calibration.csv"
FOLD_LABEL = {"system": "LOSO", "model": "LOMO", "release": "LORO"}


def pct(a, b):
    return 100.0 * (a - b) / b


def summary(errs):
    a = np.abs(errs)
    return float(np.median(a)), float(np.percentile(a, 90)), len(a)


def _cell(errs) -> str:
    if len(errs) == 0:
        return f"{'-':>13}"
    md, p9, _ = summary(np.asarray(errs))
    return f"{md:6.1f} {p9:6.1f}"


def fold_table(title: str, groups: dict[str, list[int]], columns: dict[str, np.ndarray]) -> None:
    """One line per group: n, then median / p90 |error| % of each column (in-sample and each held-out kind)."""
    print(f"\n## {title}: |error| of model TFLOP/s/GPU, median and p90 %")
    head = " ".join(f"{c:>13}" for c in columns)
    print(f"{'':<26} {'n':>4} {head}")
    print(f"{'':<26} {'':>4} " + " ".join(f"{'med':>6} {'p90':>6}" for _ in columns))
    for g in sorted(groups):
        idx = groups[g]
        print(f"{g[:26]:<26} {len(idx):>4} " + " ".join(_cell(col[idx]) for col in columns.values()))
    n = len(next(iter(columns.values())))
    print(f"{'overall':<26} {n:>4} " + " ".join(_cell(col) for col in columns.values()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--refit", action="store_true", help="in-sample figures of a fresh fit (else the shipped values)")
    ap.add_argument("--write-catalog", action="store_true",
                    help="store the full-data fit in catalog/efficiency.yaml (implies --refit)")
    ap.add_argument("--folds", default="system,model,release",
                    help="held-out fold kinds to run (comma list of system, model, release; '' for none)")
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    runs, skipped = read_measured_csv(args.csv, job_builder=build_published_job)
    base = default_efficiency()
    pred = RunPredictor(runs, base)
    meas = pred.measured
    eff = base
    if args.refit or args.write_catalog:
        eff = fit_runs(pred, base).efficiency
    p_in = pred(eff)
    err = pct(p_in, meas)
    print(f"# Step-time accuracy on {Path(args.csv).name}: {len(runs)} runs, {len(skipped)} rows skipped")
    print(f"# in-sample efficiency: {eff.origin}{' (refit on all rows from the priors)' if eff is not base else ''}")
    print("# held-out folds: fit from the priors on the other folds (perfmodel.calibration.cross_validate), "
          "predict the fold")
    cols: dict[str, np.ndarray] = {"in-sample": err}
    cvs = {}
    for kind in [k for k in args.folds.split(",") if k]:
        cv = cross_validate(pred, base, kind)
        cvs[kind] = cv
        cols[FOLD_LABEL[kind]] = pct(cv.predicted, meas)
    if args.rows:
        print()
        print(f"{'row':<64} {'prec':<7} {'layout':<26} {'pub':>7} {'pred':>7} {'err%':>7} " +
              " ".join(f"{c:>6}" for c in list(cols)[1:]) + "  wall")
        for i, r in enumerate(runs):
            lay = r.job.layout
            ls = f"TP{lay.tp} PP{lay.pp} VP{lay.vpp or 1} CP{lay.cp} EP{lay.ep} MBS{r.job.micro_batch_size}"
            dom = estimate_time(r.job, eff).dominant_wall
            print(f"{r.label[:64]:<64} {r.precision_label[:7]:<7} {ls:<26} {r.tflops:7.0f} {p_in[i]:7.0f} "
                  f"{err[i]:+7.1f} " + " ".join(f"{c[i]:+6.1f}" for c in list(cols.values())[1:]) + f"  {dom}")
    groups = {k: {} for k in FOLD_KINDS}
    for i, r in enumerate(runs):
        for k, key in FOLD_KINDS.items():
            groups[k].setdefault(key(r), []).append(i)
    fold_table("Per system", groups["system"], cols)
    fold_table("Per model", groups["model"], cols)
    fold_table("Per release", groups["release"], cols)
    cur = [i for i, r in enumerate(runs) if r.status == "current"]
    print(f"{'current rows only':<26} {len(cur):>4} " + " ".join(_cell(c[cur]) for c in cols.values()))
    if cvs:
        worst = max(cvs, key=lambda k: summary(cols[FOLD_LABEL[k]])[1])
        md, p9, _ = summary(cols[FOLD_LABEL[worst]])
        print(f"\nworst held-out kind: {FOLD_LABEL[worst]} median {md:.1f} % p90 {p9:.1f} % "
              "(target on every fold kind: median <= 8 %, p90 <= 20 %)")
    if cvs:
        doc = bands_table(runs, meas, cvs, args.csv)
        print(f"\n## Prediction bands ({100 * doc['coverage']:.0f} % of held-out runs, pooled folds): "
              "measured step / predicted step")
        print(f"{'class':<22} {'runs':>5} {'low':>7} {'high':>7}  " + " ".join(
            f"{'in ' + FOLD_LABEL[k]:>8}" for k in cvs))
        classes = [job_class(r.job.model, r.job.system) for r in runs]
        for key, b in doc["classes"].items():
            members = [i for i, c in enumerate(classes) if key == "all" or c == key or c.split("/")[0] == key]
            cover = []
            for cv in cvs.values():
                res = cv.log_residuals(meas)[members]
                cover.append(float(np.mean((res >= b["q_lo"]) & (res <= b["q_hi"]))))
            print(f"{key:<22} {b['runs']:>5} {np.exp(b['q_lo']):7.3f} {np.exp(b['q_hi']):7.3f}  " +
                  " ".join(f"{100 * c:7.0f}%" for c in cover))
    print("\nSkipped rows:")
    for s in skipped:
        print(f"  {s}")

    release_inconsistencies(args.csv)
    card_checks(eff)
    golden_checks(eff)
    one_variable_checks(eff)
    cli_path(args.csv, {r.label: float(e) for r, e in zip(runs, err, strict=True)})
    t1 = time.perf_counter()
    for r in runs:
        estimate_time(r.job, eff)
    print(f"\nestimate_time speed: {1e3 * (time.perf_counter() - t1) / len(runs):.2f} ms/job "
          f"(warm per-model caches, {len(runs)} published jobs)")
    if args.write_catalog:
        info = {
            "method": "moetune.perfmodel.calibration.fit_runs: scipy.optimize.least_squares on log(pred/published) "
                      "from the documented priors, soft-L1, weak prior (the fit of `moetune calibrate`)",
            "data": f"{Path(args.csv).name}: {len(runs)} runs (all rows whose model is in the catalog)",
            "median_abs_err_pct": round(summary(err)[0], 2), "p90_abs_err_pct": round(summary(err)[1], 2),
        }
        for kind in cvs:
            md, p9, _ = summary(cols[FOLD_LABEL[kind]])
            info[f"{FOLD_LABEL[kind].lower()}_median_abs_err_pct"] = round(md, 2)
            info[f"{FOLD_LABEL[kind].lower()}_p90_abs_err_pct"] = round(p9, 2)
        save_efficiency(eff.with_values({}, fit_info=info), REPO / "src" / "moetune" / "catalog" / "efficiency.yaml")
        print("\nwrote src/moetune/catalog/efficiency.yaml")
        if cvs:
            doc = bands_table(runs, meas, cvs, args.csv)
            save_table(doc, REPO / "src" / "moetune" / "catalog" / "uncertainty.yaml")
            print("wrote src/moetune/catalog/uncertainty.yaml")
    print(f"\n(bench ran in {time.perf_counter() - t0:.1f} s)")
    return 0


def bands_table(runs, meas, cvs, csv_path) -> dict:
    """catalog/uncertainty.yaml's document: held-out log residuals of every fold kind pooled, per class."""
    classes, resid = [], []
    for cv in cvs.values():
        classes += [job_class(r.job.model, r.job.system) for r in runs]
        resid += list(cv.log_residuals(meas))
    prov = {"residuals": "held-out " + "+".join(FOLD_LABEL[k] for k in cvs) + " folds of bench/steptime_accuracy.py",
            "data": f"{Path(csv_path).name}: {len(runs)} runs", "fit": "perfmodel.calibration.fit_runs per fold"}
    return build_table(classes, resid, provenance=prov)


def release_inconsistencies(csv_path, ratio: float = 1.6) -> None:
    """Outliers no step-time model can fit: the same published configuration (model, system, GPUs, GBS, sequence,
    layout, MBS) measured in two releases with TFLOP/s/GPU differing by more than ``ratio`` (software regressions or
    fixes between releases; precision-less rows included, as the layout fixes the run)."""
    import csv

    def num(x):
        try:
            return float((x or "").split("(")[0])
        except ValueError:
            return None

    groups: dict[tuple, list[tuple[str, float, str]]] = {}
    for r in csv.DictReader(open(csv_path)):
        t = num(r["model_tflops_per_gpu"])
        if t is None:
            continue
        key = (r["model"].split("(")[0].strip(), r["system"], r["num_gpus"], r["gbs"], r["seq_len"], r["tp"], r["pp"],
               r["cp"], (r["vp"] or "").replace("n/a", "1"), r["ep"], r["mbs"])
        groups.setdefault(key, []).append((r["release"], t, r["precision"]))
    print(f"\n## Release-inconsistent configurations (same layout, TFLOP/s/GPU apart by > {ratio}x across releases)")
    found = 0
    for key, all_rows in sorted(groups.items()):
        precs = {p.split("(")[0].strip() for _, _, p in all_rows if p} or {""}
        for prec in sorted(precs):  # a row without a precision joins every precision of its layout
            rows = [x for x in all_rows if not x[2] or x[2].split("(")[0].strip() == prec]
            lo, hi = min(rows, key=lambda x: x[1]), max(rows, key=lambda x: x[1])
            if hi[1] <= ratio * lo[1]:
                continue
            found += 1
            print(f"{' '.join(key[:3])} TP{key[5]} PP{key[6]} VP{key[8]} EP{key[9]} MBS{key[10]}: " + ", ".join(
                f"{rel} {t:.0f}{(' ' + p) if p else ''}" for rel, t, p in sorted(set(rows))))
    if not found:
        print("none")


def golden_measurements() -> list[tuple[dict, float, str]]:
    """(row of bench/memory_accuracy.golden_rows with its job, measured median iteration time in s, note) of every
    Megatron-LM functional-test golden in data/megatron_golden that records ``iteration-time``: the median after
    warm-up (steps > 5; the first steps include compilation and allocator growth). Megatron-LM ``training.py``
    ``training_log`` writes ``iteration-time`` as the ``interval-time`` timer over the last ``--log-interval``
    steps divided by their count: the whole loop body (forward-backward, optimizer step, logging). A batch-size
    schedule (``--step-batch-size-schedule`` / ``--rampup-batch-size``) is read at the recorded steps: the job
    is rebuilt with the global batch size in force there (the memory bench uses the final value)."""
    import json

    from memory_accuracy import golden_rows

    out = []
    for row in golden_rows(REPO / "data"):
        gpath = row.get("path")
        if gpath is None or "job" not in row:
            continue
        doc = json.loads(Path(gpath).read_text())
        if "iteration-time" not in doc:
            continue
        vals = [(int(k), float(v)) for k, v in doc["iteration-time"]["values"].items() if v not in ("nan", None)]
        steady = [(k, v) for k, v in vals if k > 5] or vals
        if not steady:
            continue
        meas = float(np.median([v for _, v in steady]))
        note = row.get("note", "")
        gbs = _scheduled_gbs(row["config"], int(np.median([k for k, _ in steady])), row["job"].seq_length)
        if gbs is not None and gbs != row["job"].global_batch_size:
            row = dict(row, job=row["job"].model_copy(update={"global_batch_size": gbs}))
            note = (note + "; " if note else "") + f"GBS {gbs} at the recorded steps"
        out.append((row, meas, note))
    return out


def _scheduled_gbs(cfg_path: Path, step: int, seq: int) -> int | None:
    """Global batch size at ``step`` of a ``--step-batch-size-schedule "0:384 200B:768"`` (thresholds in consumed
    tokens with K/M/B/T suffixes; the recorded steps of the shipped cases stay below the first threshold in tokens
    and in samples alike) or ``--rampup-batch-size START INCR SAMPLES``; None without a schedule."""
    import yaml

    args = (yaml.safe_load(Path(cfg_path).read_text()) or {}).get("MODEL_ARGS") or {}
    sched = args.get("--step-batch-size-schedule")
    if sched:
        mult = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
        entries = []
        for part in str(sched).split():
            at, val = part.split(":")
            scale = mult.get(at[-1:].upper(), 1.0)
            entries.append((float(at[:-1] if scale != 1.0 else at) * scale, int(val)))
        tokens = 0.0
        gbs = entries[0][1]
        for _ in range(step):
            tokens += gbs * seq
            gbs = [v for t, v in entries if t <= tokens][-1]
        return gbs
    ramp = args.get("--rampup-batch-size")
    if ramp:
        start, incr, samples = (int(x) for x in str(ramp).split()[:3])
        final = int(args.get("--global-batch-size") or start)
        gbs, consumed = start, 0
        per_incr = samples / max((final - start) // max(incr, 1), 1)
        for _ in range(step):
            consumed += gbs
            gbs = min(final, start + incr * int(consumed / per_incr))
        return gbs
    return None


def golden_checks(eff) -> list[float]:
    """Small, host-bound jobs: predicted step time vs each golden's measured iteration time
    (:func:`golden_measurements`; jobs as bench/memory_accuracy.py builds them: the case's config, 8 GPUs of the
    golden's platform; release cases with the world size inferred from the steady memory). Not used in the Bridge
    fit. The host launch cost per CPU family is set from this class (:func:`host_fit`; the Bridge rows' layers are
    GPU-bound and do not constrain it), so its held-out figure is the leave-one-case-out column: every golden of a
    case predicted with the launch costs refitted on the other cases."""
    from moetune.errors import MoetuneError

    print("\n## Small, host-bound jobs: Megatron-LM functional-test goldens, iteration time")
    rows = golden_measurements()
    loco = host_fit_loco(rows, eff)
    print(f"{'case':<66} {'platform':<13} {'GPUs':>4} {'meas s':>7} {'pred s':>7} {'err%':>7} {'LOCO%':>7}  wall")
    errs, held = [], []
    for (row, meas, note), lo in zip(rows, loco, strict=True):
        try:
            est = estimate_time(row["job"], eff)
        except MoetuneError as exc:
            print(f"{row['case'][:66]:<66} {row['platform']:<13} skipped: {exc}")
            continue
        e = pct(est.step_time_s, meas)
        errs.append(e)
        held.append(pct(lo, meas))
        print(f"{row['case'][:66]:<66} {row['platform']:<13} {row['gpus']:>4} {meas:7.3f} {est.step_time_s:7.3f} "
              f"{e:+7.1f} {held[-1]:+7.1f}  {est.dominant_wall}{'  (' + note + ')' if note else ''}")
    if errs:
        md, p9, n = summary(np.array(errs))
        hm, hp, _ = summary(np.array(held))
        print(f"{'goldens overall':<66} {'n=' + str(n):<13} in-sample median {md:.1f}% p90 {p9:.1f}%; "
              f"leave-one-case-out median {hm:.1f}% p90 {hp:.1f}%  (target median <= 15 %)")
    return errs


#: host parameters set from the goldens (the Bridge rows do not constrain them: their layers are GPU-bound)
HOST_PARAMS = ("launch_us.x86", "launch_us.grace")


def host_fit(rows, eff, idx=None):
    """Least-squares fit of the per-kernel host cost of each CPU family (``HOST_PARAMS``) to the goldens'
    iteration times (:func:`moetune.perfmodel.calibration.fit`: log ratio, soft-L1, weak prior, from the priors)."""
    from moetune.perfmodel.calibration import fit

    use = list(range(len(rows))) if idx is None else list(idx)
    jobs = [rows[i][0]["job"] for i in use]
    meas = [rows[i][1] for i in use]

    def predict(e):
        return np.array([estimate_time(j, e).step_time_s for j in jobs])

    return fit(predict, meas, eff, names=list(HOST_PARAMS), start="prior").efficiency


def host_fit_loco(rows, eff) -> list[float]:
    """Held-out step time of each golden: the host parameters refitted without every golden of its case."""
    out = [0.0] * len(rows)
    for c in sorted({r["case"] for r, _, _ in rows}):
        e = host_fit(rows, eff, [i for i, (r, _, _) in enumerate(rows) if r["case"] != c])
        for i, (r, _, _) in enumerate(rows):
            if r["case"] == c:
                out[i] = estimate_time(r["job"], e).step_time_s
    return out


def card_checks(eff) -> None:
    """Out-of-sample: Megatron-Bridge model-verification cards (pretraining rows with a full layout), features from
    the card's own recipe when the recipe catalog has it; routing as that recipe sets it."""
    import csv
    import re

    from moetune.catalog.models import get_model
    from moetune.errors import MoetuneError

    path = REPO / "data" / "measured" / "bridge_cards" / "bridge_cards_step_metrics.csv"
    if not path.is_file():
        return
    print("\n## Out-of-sample: Megatron-Bridge verification cards (not used in any fit)")
    print(f"{'card':<58} {'layout':<26} {'pub':>7} {'pred':>7} {'err%':>7}")
    errs = []
    for row in csv.DictReader(path.open()):
        if "pretrain" not in row["recipe"] or not (row["gbs"] and row["mbs"] and row["seq"] and row["layout_text"]):
            continue
        dims = dict(re.findall(r"(TP|PP|VP|CP|EP|ETP)(\d+)", row["layout_text"]))
        try:
            model = get_model(row["model"])
        except MoetuneError:
            continue
        sysname = {"H100": "DGX-H100", "B200": "DGX-B200", "GB200": "GB200-NVL72", "GB300": "GB300-NVL72"}.get(
            row["gpu_type"], row["gpu_type"])
        try:
            from moetune.spec.features import parse_precision

            job = build_published_job(
                model=model, system=sysname, gpus=int(row["gpus"]), precision=parse_precision(row["precision"]),
                gbs=int(row["gbs"]), mbs=int(row["mbs"]), seq=int(row["seq"]), tp=int(dims.get("TP", 1)),
                pp=int(dims.get("PP", 1)), cp=int(dims.get("CP", 1)), vp=int(dims["VP"]) if "VP" in dims else None,
                ep=int(dims.get("EP", 1)), etp=int(dims["ETP"]) if "ETP" in dims else None)
            if "_perf" not in row["recipe"] and "gpu" not in row["recipe"]:
                # a plain (non-perf) recipe trains with natural routing
                job = job.with_(features=job.features.model_copy(update={"moe_router_force_load_balancing": False}))
            pred = estimate_time(job, eff).model_tflops_per_gpu
        except MoetuneError as exc:
            print(f"{row['model'] + ' ' + row['item']:<58} skipped: {exc}")
            continue
        pub = float(row["model_tflops_per_gpu"])
        e = pct(pred, pub)
        errs.append(e)
        lay = job.layout
        ls = f"TP{lay.tp} PP{lay.pp} VP{lay.vpp or 1} CP{lay.cp} EP{lay.ep} MBS{job.micro_batch_size}"
        print(f"{(row['model'] + ' ' + row['item'])[:58]:<58} {ls:<26} {pub:7.0f} {pred:7.0f} {e:+7.1f}")
    if errs:
        md, p9, n = summary(np.array(errs))
        print(f"{'cards overall':<58} {'n=' + str(n):<26} {'':>7} {'':>7}  median {md:.1f}%  p90 {p9:.1f}%")


def one_variable_checks(eff) -> None:
    """Direction and rough size (within half of the measured change) of domain.md §3.4/§4.4 A/B pairs."""
    from moetune.catalog.models import get_model

    print("\n## One-variable changes (docs/domain.md §3.4, §4.4)")
    print(f"{'change':<58} {'measured':>9} {'predicted':>10} {'ok':>4}")
    qwen = get_model("Qwen3-30B-A3B")
    base = build_published_job(model=qwen, system="DGX-H100", gpus=16, precision="bf16", gbs=1024, mbs=1, seq=4096,
                               tp=1, pp=1, cp=1, vp=None, ep=16)
    f = base.features.model_copy(update={
        "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
        "cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ("moe_router", "moe_preprocess"),
        "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False})
    a = estimate_time(base.with_(features=f), eff)
    b = estimate_time(base.with_(features=f.model_copy(update={"overlap_moe_expert_parallel_comm": True})), eff)
    _check("EP overlap, Qwen3-30B-A3B 16xH100 HybridEP (244 -> 287)", 287.305 / 244.039 - 1,
           b.model_tflops_per_gpu / a.model_tflops_per_gpu - 1, extra=f"  [{a.model_tflops_per_gpu:.0f} -> "
           f"{b.model_tflops_per_gpu:.0f}]")
    # the same shape with the alltoall dispatcher, no CUDA graphs and no permute fusion (S:epo: 41.25 -> 31.31 s)
    g = base.features.model_copy(update={
        "moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None, "cuda_graph_impl": "none",
        "cuda_graph_scope": (), "moe_permute_fusion": False, "overlap_moe_expert_parallel_comm": False,
        "delay_wgrad_compute": False})
    c = estimate_time(base.with_(features=g), eff)
    d = estimate_time(base.with_(features=g.model_copy(update={"overlap_moe_expert_parallel_comm": True})), eff)
    _check("EP overlap, Qwen3-30B-A3B 16xH100 alltoall (41.25 -> 31.31 s)", 41.25 / 31.31 - 1,
           c.step_time_s / d.step_time_s - 1, extra=f"  [{c.step_time_s:.2f} -> {d.step_time_s:.2f} s]")
    llama = get_model("Llama-3-70B")
    l4 = build_published_job(model=llama, system="DGX-H100", gpus=32, precision="fp8_cs", gbs=32, mbs=1, seq=4096,
                             tp=4, pp=4, cp=1, vp=5, ep=1)
    l8 = build_published_job(model=llama, system="DGX-H100", gpus=32, precision="fp8_cs", gbs=32, mbs=1, seq=4096,
                             tp=8, pp=4, cp=1, vp=5, ep=1)
    t4, t8 = estimate_time(l4, eff), estimate_time(l8, eff)
    _check("TP 4 -> 8, Llama-3-70B 32xH100 FP8-CS (709.9 -> 508.7)", 508.7 / 709.93 - 1,
           t8.model_tflops_per_gpu / t4.model_tflops_per_gpu - 1,
           extra=f"  [{t4.model_tflops_per_gpu:.0f} -> {t8.model_tflops_per_gpu:.0f}]")
    lr = l4.with_(features=l4.features.model_copy(update={"recompute_granularity": "selective",
                                                          "recompute_modules": ("mlp",)}))
    tr = estimate_time(lr, eff)
    _check("`mlp` recompute, Llama-3-70B 32xH100 (709.9 -> 593.6)", 593.6 / 709.93 - 1,
           tr.model_tflops_per_gpu / t4.model_tflops_per_gpu - 1,
           extra=f"  [{t4.model_tflops_per_gpu:.0f} -> {tr.model_tflops_per_gpu:.0f}]")


def _check(name: str, measured: float, predicted: float, extra: str = "") -> None:
    ok = (measured > 0) == (predicted > 0) and abs(predicted - measured) <= 0.5 * abs(measured)
    print(f"{name:<58} {measured * 100:+8.1f}% {predicted * 100:+9.1f}% {'yes' if ok else 'NO':>4}{extra}")


def _cell_value(value: str, alt: bool) -> str:
    """A table cell as printed: '3986 (3546)' is two runs (the second in parentheses)."""
    v = (value or "").strip()
    if "(" in v:
        head, _, tail = v.partition("(")
        return (tail.rstrip(")").strip() if alt else head.strip()) or head.strip()
    return v


def cli_path_flags(row: dict, alt: bool) -> list[str]:
    """A published pretrain row typed as ``moetune estimate`` flags exactly as the table prints it: the table's model
    and system names, GPUs, batch, sequence, precision label, TP/PP/CP/VP/EP(/ETP) and the FSDP column; no recipe,
    split or feature flag (the CLI picks the Bridge perf recipe's features and Megatron's pipeline split itself)."""
    def val(col: str) -> str:
        return _cell_value(row.get(col, ""), alt)

    args = ["estimate", "--model", row["model"].strip(), "--system", row["system"].strip(), "--gpus", val("num_gpus"),
            "--gbs", val("gbs"), "--mbs", val("mbs") or "1", "--seq", val("seq_len"),
            "--precision", _cell_value(row["precision"], alt)]
    for col, flag in (("tp", "--tp"), ("pp", "--pp"), ("cp", "--cp"), ("vp", "--vpp"), ("ep", "--ep"),
                      ("etp", "--etp")):
        v = val(col)
        if v.lower() not in ("", "n/a", "na", "none", "-"):
            args += [flag, str(int(float(v)))]
    if val("fsdp").lower() in ("1", "yes", "true", "y"):
        args.append("--fsdp")
    return args


def cli_path(csv_path: str, recipe_err: dict[str, float]) -> None:
    """The CLI path next to the recipe path: every pretrain row of the published table typed as flags
    (:func:`cli_path_flags`) and run through ``moetune estimate --json`` in-process (typer's CliRunner on the app),
    model TFLOP/s/GPU from its step time with the row's release FLOPs definition (as the recipe path). Coverage =
    rows the CLI estimates / pretrain rows whose model is in the catalog (target >= 98 %)."""
    import csv
    import json

    from typer.testing import CliRunner

    from moetune.catalog.models import get_model
    from moetune.cli import app
    from moetune.errors import MoetuneError
    from moetune.perfmodel.calibration import precision_variants
    from moetune.perfmodel.flops import bridge_definition_for_release, flops_per_token

    runner = CliRunner()
    rows = list(csv.DictReader(open(csv_path, newline="")))
    by_sys: dict[str, dict[str, list]] = defaultdict(lambda: {"n": [], "cli": [], "recipe": []})
    failures: list[str] = []
    for n, row in enumerate(rows, start=2):
        if row.get("task", "pretrain").strip() != "pretrain":
            continue
        name = row["model"].strip()
        try:
            model = get_model(name)
        except MoetuneError:
            try:
                model = get_model(name.split("(")[0].strip())
            except MoetuneError:
                continue  # model not in the catalog: outside the coverage target
        desc = f"line {n}: {name} {row['system']} {row['num_gpus']} GPUs {row.get('release', '')}".strip()
        for vi, plab in enumerate(precision_variants(row["precision"])):
            sysname = row["system"].strip()
            key = f"{desc} [{plab}]"
            by_sys[sysname]["n"].append(key)
            args = cli_path_flags(row, vi == 1)
            res = runner.invoke(app, [*args, "--json"])
            if res.exit_code != 0 or res.exception is not None:
                failures.append(f"{key}: {res.exception or res.output.strip()[-200:]}")
                continue
            out = json.loads(res.stdout)
            job, step = out["job"], out["time"]["step_time_s"]
            try:
                definition = bridge_definition_for_release(row.get("release", "").strip())
            except (MoetuneError, ValueError):
                definition = "current"
            fpt = flops_per_token(model, job["seq_length"], job["layout"]["tp"], definition).total
            pred = job["global_batch_size"] * job["seq_length"] / (step * job["gpus"]) * fpt / 1e12
            pub = float(_cell_value(row["model_tflops_per_gpu"], vi == 1))
            by_sys[sysname]["cli"].append(pct(pred, pub))
            if key in recipe_err:
                by_sys[sysname]["recipe"].append(recipe_err[key])
    print("\n## CLI path: every pretrain row typed as `moetune estimate` flags exactly as the table prints it")
    print("#  (model/system names, GPUs, GBS, MBS, seq, precision label, TP/PP/CP/VP/EP/ETP, FSDP column); "
          "recipe path = build_published_job")
    print(f"{'system':<12} {'rows':>5} {'CLI ok':>7} {'cover %':>8} {'CLI med %':>10} {'CLI p90 %':>10} "
          f"{'recipe med %':>13} {'recipe p90 %':>13}")
    tot_n = tot_ok = 0
    all_cli: list[float] = []
    all_rec: list[float] = []
    for s in sorted(by_sys):
        d = by_sys[s]
        n_rows, ok = len(d["n"]), len(d["cli"])
        tot_n, tot_ok = tot_n + n_rows, tot_ok + ok
        all_cli += d["cli"]
        all_rec += d["recipe"]
        cm, c9, _ = summary(np.array(d["cli"])) if d["cli"] else (float("nan"),) * 3
        rm, r9, _ = summary(np.array(d["recipe"])) if d["recipe"] else (float("nan"),) * 3
        print(f"{s:<12} {n_rows:>5} {ok:>7} {100 * ok / max(n_rows, 1):8.1f} {cm:10.1f} {c9:10.1f} {rm:13.1f} "
              f"{r9:13.1f}")
    cm, c9, _ = summary(np.array(all_cli)) if all_cli else (float("nan"),) * 3
    rm, r9, _ = summary(np.array(all_rec)) if all_rec else (float("nan"),) * 3
    print(f"{'overall':<12} {tot_n:>5} {tot_ok:>7} {100 * tot_ok / max(tot_n, 1):8.1f} {cm:10.1f} {c9:10.1f} "
          f"{rm:13.1f} {r9:13.1f}")
    for f in failures:
        print(f"  CLI path failed: {f}")


if __name__ == "__main__":
    sys.exit(main())
