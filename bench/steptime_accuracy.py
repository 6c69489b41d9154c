"""Step-time model accuracy on the published Megatron-Bridge performance rows.

For every row of data/perf/mbridge_perf_calibration.csv whose model is in the catalog (table's own system,
GPU count, precision label, GBS, MBS, sequence, TP/PP/CP/VP/EP; MoE rows force-balanced and dropless), prints the
predicted vs published model TFLOP/s/GPU, the median and p90 absolute error per system and overall, a
leave-one-model-out run (fit without a model, predict it), and the measured one-variable changes of docs/domain.md
(EP overlap on Qwen3-30B-A3B 16×H100, TP 4→8 and `mlp` recompute on Llama-3-70B).

    python bench/steptime_accuracy.py [--csv FILE] [--refit] [--write-catalog] [--quick]

``--refit`` fits the efficiency parameters on all rows first (else the shipped catalog values are used);
``--write-catalog`` stores the full-data fit in src/moetune/catalog/efficiency.yaml.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from moetune.perfmodel.calibration import (
    build_published_job,
    default_efficiency,
    fit,
    read_measured_csv,
    save_efficiency,
)
from moetune.perfmodel.flops import flops_per_token
from moetune.perfmodel.step import build_profile, estimate_time, evaluate

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CSV = REPO / "data" / "perf" / "mbridge_perf_calibration.csv"


def predictor(runs):
    profiles = [build_profile(r.job) for r in runs]
    fpt = [flops_per_token(r.job.model, r.job.seq_length, r.job.layout.tp, r.definition).total for r in runs]

    def predict(eff, idx=None):
        out = []
        for i in (range(len(runs)) if idx is None else idx):
            job = runs[i].job
            step = evaluate(profiles[i], eff)["step"]
            out.append(job.global_batch_size * job.seq_length / (step * job.gpus) * fpt[i] / 1e12)
        return np.asarray(out)

    return predict


def pct(a, b):
    return 100.0 * (a - b) / b


def summary(errs):
    a = np.abs(errs)
    return float(np.median(a)), float(np.percentile(a, 90)), len(a)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--refit", action="store_true")
    ap.add_argument("--write-catalog", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer fit iterations")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    runs, skipped = read_measured_csv(args.csv, job_builder=build_published_job)
    meas = np.array([r.tflops for r in runs])
    predict = predictor(runs)
    eff = default_efficiency()
    nfev = 25 if args.quick else 80
    if args.refit:
        res = fit(lambda e: predict(e), meas, eff, max_nfev=nfev)
        eff = res.efficiency
    pred = predict(eff)
    err = pct(pred, meas)
    print(f"# Step-time accuracy on {Path(args.csv).name}: {len(runs)} runs, {len(skipped)} rows skipped")
    print(f"# efficiency: {eff.origin}{' (refit on all rows)' if args.refit else ''}")
    print()
    print(f"{'row':<64} {'status':<10} {'prec':<7} {'layout':<26} {'pub':>7} {'pred':>7} {'err%':>7}  wall")
    for r, p, e in zip(runs, pred, err, strict=True):
        lay = r.job.layout
        ls = f"TP{lay.tp} PP{lay.pp} VP{lay.vpp or 1} CP{lay.cp} EP{lay.ep} MBS{r.job.micro_batch_size}"
        dom = estimate_time(r.job, eff).dominant_wall
        st = "current" if r.status == "current" else "supersed."
        print(f"{r.label[:64]:<64} {st:<10} {r.precision_label[:7]:<7} {ls:<26} {r.tflops:7.0f} {p:7.0f} {e:+7.1f}  "
              f"{dom}")
    print()
    print("## Absolute error of model TFLOP/s/GPU")
    print(f"{'system':<12} {'n':>4} {'median %':>9} {'p90 %':>8}")
    by_sys = defaultdict(list)
    for r, e in zip(runs, err, strict=True):
        by_sys[r.system].append(e)
    for s in sorted(by_sys):
        md, p9, n = summary(np.array(by_sys[s]))
        print(f"{s:<12} {n:>4} {md:9.1f} {p9:8.1f}")
    md, p9, n = summary(err)
    print(f"{'overall':<12} {n:>4} {md:9.1f} {p9:8.1f}")
    cur = np.array([e for r, e in zip(runs, err, strict=True) if r.status == "current"])
    if cur.size:
        md_c, p9_c, n_c = summary(cur)
        print(f"{'current only':<12} {n_c:>4} {md_c:9.1f} {p9_c:8.1f}")
    print("\nSkipped rows:")
    for s in skipped:
        print(f"  {s}")

    # leave-one-model-out: fit on the other models, predict the held-out one
    print("\n## Leave-one-model-out (fit without the model, predict it)")
    print(f"{'held-out model':<26} {'n':>4} {'median %':>9} {'p90 %':>8}")
    lomo_err = np.zeros(len(runs))
    for mname in sorted({r.model_name for r in runs}):
        test = [i for i, r in enumerate(runs) if r.model_name == mname]
        train = [i for i, r in enumerate(runs) if r.model_name != mname]
        # start from the documented priors (not the full-data fit, which has seen the held-out model)
        start = default_efficiency()
        start = start.with_values({k: sp.prior for k, sp in start.specs.items()})
        res = fit(lambda e, tr=train: predict(e, tr), meas[train], start, max_nfev=nfev)
        p = predict(res.efficiency, test)
        e = pct(p, meas[test])
        lomo_err[test] = e
        md_m, p9_m, n_m = summary(e)
        print(f"{mname:<26} {n_m:>4} {md_m:9.1f} {p9_m:8.1f}")
    md, p9, n = summary(lomo_err)
    print(f"{'overall (LOMO)':<26} {n:>4} {md:9.1f} {p9:8.1f}")

    card_checks(eff)
    one_variable_checks(eff)
    t1 = time.perf_counter()
    for r in runs:
        estimate_time(r.job, eff)
    print(f"\nestimate_time speed: {1e3 * (time.perf_counter() - t1) / len(runs):.2f} ms/job "
          f"(warm per-model caches, {len(runs)} published jobs)")
    if args.write_catalog and args.refit:
        eff = eff.with_values({}, fit_info={
            "method": "scipy.optimize.least_squares on log(pred/published), soft-L1, weak prior to documented priors",
            "data": f"{Path(args.csv).name}: {len(runs)} runs (all rows whose model is in the catalog)",
            "median_abs_err_pct": round(summary(err)[0], 2), "p90_abs_err_pct": round(summary(err)[1], 2),
            "lomo_median_abs_err_pct": round(md, 2), "lomo_p90_abs_err_pct": round(p9, 2),
        })
        save_efficiency(eff, REPO / "src" / "moetune" / "catalog" / "efficiency.yaml")
        print("\nwrote src/moetune/catalog/efficiency.yaml")
    print(f"\n(bench ran in {time.perf_counter() - t0:.1f} s)")
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
