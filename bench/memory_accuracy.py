"""Memory estimate vs measured peaks: Megatron-LM functional-test goldens and the measured-memory calibration table.

For every ``case_*_golden*.json`` in data/megatron_golden (metric ``mem-max-allocated-bytes``, the
cumulative torch allocated peak on the LAST rank, 8 GPUs for functional tests) and every row of
data/measured/measured_memory_calibration.csv (its ``mem_metric`` column says what was measured), print
moetune's prediction of the same quantity and the Megatron-Bridge theoretical formula (bridge_perf_notes.md §4, the
most-loaded GPU) with relative errors, then median / worst absolute error.

Release cases (``mixtral_*_release*``, ``gpt3_15b_8t_release_sm``) have no GPU count in the repository: the world size
is taken as the power-of-two multiple of the layout's minimum world size whose predicted model state (weights +
grads + optimizer, which depend on W through the optimizer shards) is closest to the golden's steady-state
``mem-allocated-bytes``; the chosen W is printed. Rows whose model or recipe is not in the catalogs are listed as
skipped. An upper-bound row (``UPPER BOUND``) is checked as a bound and kept out of the error statistics.

Run: python bench/memory_accuracy.py [--data PATH]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

from moetune.errors import MoetuneError
from moetune.io.config_to_job import job_from_config
from moetune.io.megatron_args import read_megatron_args
from moetune.perfmodel.bridge_baseline import bridge_theoretical_memory
from moetune.perfmodel.memory import estimate_memory

GIB = float(1 << 30)
PLATFORM_SYSTEM = {"dgx_h100": "DGX-H100", "dgxh100_dgxc": "DGX-H100", "dgx_a100": "DGX-A100",
                   "dgx_gb200": "GB200-NVL72", "H100": "DGX-H100", "A100": "DGX-A100", "GB200": "GB200-NVL72"}
#: measured_memory_calibration.csv rows from Bridge cards -> (recipe, overrides, note)
CARD_RECIPES = {
    "Qwen3-30B-A3B pretrain perf recipe": ("qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", {}, ""),
    # the card ran the convergence recipe nemotron_3_5_lightning_pretrain_config (Bridge recipes/nemotronh/h100/
    # nemotron_3_nano.py): FP32 Adam state without the precision-aware optimizer, recompute moe + layernorm +
    # core_attn, native cross entropy, where the perf recipe has BF16 moments, moe_act + layernorm and TE's
    "Nemotron-3.5-Lightning (hybrid Mamba-MoE) pretrain|H100": (
        "nemotron_3_5_lightning_pretrain_16gpu_h100_bf16_config",
        {"cp": 2, "graphs": ("mamba",), "natural_routing": True,
         "features": {"use_precision_aware_optimizer": False, "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32",
                      "recompute_modules": ("moe", "layernorm", "core_attn"), "cross_entropy_fusion_impl": "native"}},
        "layout from the 16-GPU H100 perf recipe; card: CP2, TE graphs scope mamba, natural routing, the convergence "
        "recipe's FP32 optimizer state, recompute and native cross entropy"),
    "Nemotron-3.5-Lightning (hybrid Mamba-MoE) pretrain|GB200": (
        "nemotron_3_5_lightning_pretrain_8gpu_gb200_bf16_config", {"graphs": False, "natural_routing": True},
        "8-GPU GB200 perf recipe; card: CUDA graphs off, natural routing"),
    "Nemotron-3.5-Lightning (hybrid Mamba-MoE) pretrain FSDP|GB200": (
        "nemotron_3_5_lightning_pretrain_8gpu_gb200_fp8mx_fsdp_config", {"graphs": False}, "card: no CUDA graphs"),
}


def _golden_peak(path: Path, metric: str) -> float | None:
    g = json.loads(path.read_text())
    if metric not in g:
        return None
    vals = [float(v) for v in g[metric]["values"].values() if v not in ("nan", None)]
    return max(vals) / GIB if metric == "mem-max-allocated-bytes" else vals[-1] / GIB


def _static_gib(stage) -> float:
    c = stage.components
    return sum(c.get(k, 0.0) for k in ("weights", "main_grads", "optimizer_state", "fp8_weight_cache",
                                       "library_workspaces"))


def _golden_job(cfg_path: Path, system: str, steady: float | None, release: bool):
    cfg = read_megatron_args(cfg_path)
    if not release:
        return job_from_config(cfg, system=system, gpus=8), 8, ""
    from moetune.spec.validate import min_world_size

    probe = job_from_config(cfg, system=system, gpus=1 << 12)
    base = min_world_size(probe.layout)
    best = None
    for k in range(0, 8):
        w = base << k
        try:
            job = job_from_config(cfg, system=system, gpus=w)
            if job.num_microbatches < 1:
                continue
            st = _static_gib(estimate_memory(job).stages[-1])
        except MoetuneError:
            continue
        d = abs(st - steady) if steady is not None else w
        if best is None or d < best[0]:
            best = (d, job, w)
    if best is None:
        raise MoetuneError(f"{cfg_path.name}: no valid world size")
    return best[1], best[2], "W inferred"


def golden_rows(data: Path) -> list[dict]:
    rows = []
    gdir = data / "megatron_golden"
    for cfg_path in sorted(gdir.glob("case_*_config.yaml")):
        case = cfg_path.name[len("case_"):-len("_config.yaml")]
        for gpath in sorted(gdir.glob(f"case_{case}_golden*.json")):
            suffix = gpath.name[len(f"case_{case}_golden"):-len(".json")].lstrip("_")
            platform = re.sub(r"^(dev|lts)_", "", suffix) if suffix else "dgx_h100"
            if suffix == "" and case == "gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4":
                platform = "dgx_a100"  # README: primary golden of this case is lts_dgx_a100
            system = PLATFORM_SYSTEM.get(platform, "DGX-H100")
            measured = _golden_peak(gpath, "mem-max-allocated-bytes")
            steady = _golden_peak(gpath, "mem-allocated-bytes")
            release = "release" in case
            row = {"source": "golden", "case": case, "platform": platform, "measured": measured, "kind": "peak",
                   "path": gpath, "config": cfg_path}
            try:
                job, w, note = _golden_job(cfg_path, system, steady, release)
            except MoetuneError as e:
                row.update(error=str(e))
                rows.append(row)
                continue
            row.update(job=job, gpus=w, note=note)
            rows.append(row)
    return rows


def _row_job(r: dict, data: Path, golden_cfgs: dict[str, Path]):
    """Job for one measured_memory_calibration.csv row, or (None, reason)."""
    from moetune.catalog.recipes import recipe_config

    model = r["model"]
    m = re.match(r"megatron-functional:(\S+)", model)
    if m:
        case = m.group(1)
        cfg_path = golden_cfgs.get(case)
        if cfg_path is None:
            return None, "config not found", ""
        system = PLATFORM_SYSTEM.get(r["gpu_type"], "DGX-H100")
        gpath = data / "megatron_golden" / f"case_{case}_golden.json"
        steady = _golden_peak(gpath, "mem-allocated-bytes") if gpath.exists() else None
        job, w, note = _golden_job(cfg_path, system, steady, not r["gpus"])
        return job, note, case
    key = model if model in CARD_RECIPES else f"{model}|{r['gpu_type']}"
    if key not in CARD_RECIPES:
        return None, "model/recipe not in the catalogs", model
    recipe, ov, note = CARD_RECIPES[key]
    cfg = recipe_config(recipe)
    job = job_from_config(cfg)
    upd_lay = {k: v for k, v in ov.items() if k in ("cp", "tp", "pp", "ep")}
    feats: dict = {}
    if ov.get("graphs") is False:
        feats = {"cuda_graph_impl": "none", "cuda_graph_scope": ()}
    elif isinstance(ov.get("graphs"), tuple):
        feats = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ov["graphs"]}
    if ov.get("natural_routing"):
        feats["moe_router_force_load_balancing"] = False
    feats.update(ov.get("features", {}))
    changes = {}
    for fld, col in (("micro_batch_size", "mbs"), ("global_batch_size", "gbs"), ("seq_length", "seq")):
        if r.get(col):
            changes[fld] = int(r[col])
    if r.get("gpus"):
        changes["gpus"] = int(r["gpus"])
    if upd_lay:
        changes["layout"] = job.layout.model_copy(update=upd_lay)
    if feats:
        changes["features"] = job.features.model_copy(update=feats)
    return job.with_(**changes), f"recipe {recipe}" + (f"; {note}" if note else ""), model


def csv_rows(data: Path) -> list[dict]:
    golden_cfgs = {p.name[len("case_"):-len("_config.yaml")]: p
                   for p in (data / "megatron_golden").glob("case_*_config.yaml")}
    out = []
    with (data / "measured" / "measured_memory_calibration.csv").open() as f:
        for r in csv.DictReader(f):
            metric = r["mem_metric"]
            kind = "bound" if "UPPER BOUND" in metric else ("max_over_ranks" if "max across ranks" in metric
                                                            else ("last_rank" if "world_size-1" in metric else "peak"))
            row = {"source": "csv", "case": r["model"][:70], "platform": r["gpu_type"], "measured": float(
                r["peak_mem_gb"]), "kind": kind}
            mres = re.search(r"reserved ([\d.]+) GiB", metric)
            if mres:
                row["measured_reserved"] = float(mres.group(1))
            try:
                job, note, _ = _row_job(r, data, golden_cfgs)
            except MoetuneError as e:
                job, note = None, f"error: {e}"
            if job is None:
                row.update(skipped=note)
            else:
                row.update(job=job, gpus=job.gpus, note=note)
            out.append(row)
    return out


def evaluate(rows: list[dict]) -> None:
    for row in rows:
        job = row.get("job")
        if job is None:
            continue
        est = estimate_memory(job)
        # what was measured: last rank (Megatron goldens) or the most-loaded rank (cards)
        row["pred"] = est.last_stage_peak_allocated_gib if row["kind"] in ("last_rank", "peak") and \
            row["source"] == "golden" or row["kind"] == "last_rank" else est.peak_allocated_gib
        row["bridge"] = bridge_theoretical_memory(job).total_gib
        row["pred_reserved"] = est.stages[est.binding_stage].reserved_gib


def _fmt(x: float | None, spec: str = "7.2f") -> str:
    return format(x, spec) if x is not None else "   n/a"


def print_table(title: str, rows: list[dict]) -> tuple[list[float], list[float]]:
    print(f"\n## {title}\n")
    print(f"| {'case':70s} | platform     |    W | measured | moetune |   err  | Bridge |   err  | note")
    print(f"|{'-' * 72}|--------------|------|----------|---------|--------|--------|--------|-----")
    errs, berrs = [], []
    for r in rows:
        name = r["case"][:70]
        if "pred" not in r:
            why = r.get("skipped") or r.get("error") or "?"
            print(f"| {name:70s} | {r['platform']:12s} |    - | {r['measured']:8.2f} |       - |      - |      - |"
                  f"      - | skipped: {why}")
            continue
        m, p, b = r["measured"], r["pred"], r["bridge"]
        if r["kind"] == "bound":
            ok = "within" if p <= m else "ABOVE"
            print(f"| {name:70s} | {r['platform']:12s} | {r['gpus']:4d} | <{m:7.2f} | {p:7.2f} | {ok:>6s} | {b:6.2f} |"
                  f" {'within' if b <= m else 'ABOVE':>6s} | upper bound; {r.get('note', '')}")
            continue
        e, be = (p - m) / m, (b - m) / m
        errs.append(abs(e))
        berrs.append(abs(be))
        print(f"| {name:70s} | {r['platform']:12s} | {r['gpus']:4d} | {m:8.2f} | {p:7.2f} | {e:+6.1%} | {b:6.2f} |"
              f" {be:+6.1%} | {r.get('note', '')}")
    return errs, berrs


def _summary(label: str, errs: list[float], berrs: list[float]) -> None:
    if not errs:
        return
    print(f"{label}: n={len(errs)}  moetune median |err| {statistics.median(errs):.1%}, worst {max(errs):.1%}  |  "
          f"Bridge formula median {statistics.median(berrs):.1%}, worst {max(berrs):.1%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "data")
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: data folder {args.data} not found", file=sys.stderr)
        return 2
    g = golden_rows(args.data)
    c = csv_rows(args.data)
    evaluate(g)
    evaluate(c)
    ge, gb = print_table("Megatron-LM functional-test goldens (mem-max-allocated-bytes, last rank)", g)
    ce, cb = print_table("measured_memory_calibration.csv (per mem_metric)", c)
    print()
    _summary("goldens", ge, gb)
    _summary("calibration csv", ce, cb)
    _summary("all rows", ge + ce, gb + cb)
    res = [r for r in c if "measured_reserved" in r and "pred" in r]
    if res:
        print("\nreserved (allocator) where the source gives it:")
        for r in res:
            e = (r["pred_reserved"] - r["measured_reserved"]) / r["measured_reserved"]
            print(f"  {r['case'][:60]:60s} {r['platform']:6s} measured {r['measured_reserved']:7.2f}  "
                  f"moetune {r['pred_reserved']:7.2f}  {e:+.1%}")
    _recompute_deltas()
    _speed([r["job"] for r in g + c if r.get("job") is not None])
    return 0


#: docs/domain.md §3.4 (S:rcp): Moonlight-16B-A3B, 8xH100, TP2 EP8, seq 4096, GBS 4, BF16; peak GB relative to no
#: recompute (36.618 GB)
MOONLIGHT_DELTAS = {("core_attn",): -0.0001, ("mla_up_proj",): -0.0196, ("moe_act",): -0.0185,
                    ("mla_up_proj", "mlp"): (35.917 - 36.618) / 36.618, ("layernorm", "moe_act"): (35.949 - 36.618)
                    / 36.618}


def _recompute_deltas() -> None:
    """Relative peak change per selective-recompute module list vs the published Moonlight sweep (MBS 1 assumed)."""
    from moetune.catalog.models import get_model
    from moetune.catalog.systems import get_system
    from moetune.spec.features import Features
    from moetune.spec.job import Job
    from moetune.spec.layout import Layout

    def peak(mods: tuple[str, ...]) -> float:
        f = Features(hidden_dropout=0.0, attention_dropout=0.0, recompute_granularity="selective" if mods else None,
                     recompute_modules=mods)
        j = Job(model=get_model("Moonlight-16B-A3B"), system=get_system("DGX-H100"), gpus=8, global_batch_size=4,
                micro_batch_size=1, seq_length=4096, layout=Layout(tp=2, ep=8, etp=1), features=f)
        return estimate_memory(j).peak_allocated_gib

    base = peak(())
    print("\nselective recompute, relative peak change (Moonlight-16B-A3B TP2 EP8, docs/domain.md §3.4 S:rcp):")
    for mods, want in MOONLIGHT_DELTAS.items():
        got = peak(mods) / base - 1
        print(f"  {'+'.join(mods):22s} measured {want:+.2%}  moetune {got:+.2%}")


def _speed(jobs: list) -> None:
    """Time per estimate_memory call (the planner calls it for thousands of candidates; target < 1 ms). Layout
    variants are generated so that per-layout caches are exercised, not only per-job repeats."""
    import time

    variants = []
    for j in jobs:
        for ep in (1, 2):
            lay = j.layout.model_copy(update={"ep": j.layout.ep * ep}) if j.model.is_moe else j.layout
            variants.append(j.with_(layout=lay, gpus=j.gpus * ep))
    ok = []
    t0 = time.perf_counter()
    for j in variants:
        try:
            estimate_memory(j)
            ok.append(j)
        except MoetuneError:
            continue
    cold = (time.perf_counter() - t0) / max(len(variants), 1)
    t0 = time.perf_counter()
    n = 0
    for _ in range(5):
        for j in ok:
            estimate_memory(j)
            n += 1
    dt = (time.perf_counter() - t0) / max(n, 1)
    print(f"speed: {dt * 1e3:.3f} ms per estimate_memory call with warm caches ({n} calls over {len(ok)} jobs); "
          f"{cold * 1e3:.3f} ms on first sight of a job (cold per-layout caches)")


if __name__ == "__main__":
    raise SystemExit(main())
