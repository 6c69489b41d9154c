"""Planner vs published layouts: for each Megatron-Bridge performance row with a catalog model, is the published
layout feasible in moetune's search, where does it rank, and how far is moetune's top-1 prediction from its
prediction for the published layout?

Target: the published layout is in the top 10 or within 5 % of the top-1 prediction for >= 85 % of rows, under the
held-out folds too. "Top 10" is the published layout's line in ``plan``'s list, whose lines are distinct layouts
(``plan.ties``: VPP / MBS / pipeline-split variants of one TP, CP, PP, EP, ETP folded into one line; the "line"
column, exact: :func:`exact_ranks`); the count with every variant ranked on its own (the "rank" column) is
printed beside it. Reads data/perf/mbridge_perf_calibration.csv (the repo's copy of the published table).

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
from dataclasses import replace
from pathlib import Path

from moetune.catalog.models import get_model
from moetune.catalog.release_configs import publishing_presets, run_preset
from moetune.catalog.systems import get_system
from moetune.commands import knobs
from moetune.errors import MoetuneError
from moetune.io.load import published_task
from moetune.plan.search import PlanRequest, plan
from moetune.plan.ties import distinct_rank
from moetune.spec.features import parse_precision
from moetune.spec.layout import bridge_default_etp
from moetune.spec.validate import world_size_violation

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
    key = (model.name, system.name, gpus, gbs, seq, prec, (r.get("task") or "").strip())
    pub, note = _possible_layout(r, model.name, system.name, prec, gpus, gbs, pub)
    if pub is None:
        return None, note
    # a fine-tuning row plans its own task (LoRA rank / targets of the release's preset), never pre-training
    task_up, _ = published_task(model.name, (r.get("task") or "").strip() or "pretrain",
                                r.get("release", "").strip() or None)
    task = tuple((k, v) for k, v in task_up.items() if k == "task" or k.startswith("lora_")) \
        if task_up["task"] != "pretrain" else ()
    kw = {"model": model, "system": system, "gpus": gpus, "global_batch_size": gbs, "seq_length": seq,
          "precisions": (prec,), "mbs_options": tuple(sorted({1, 2, 4, pub["mbs"]})), "top": 10,
          "workers": knobs.workers(), "task": task}
    return (key, kw, pub), note


def _possible_layout(r: dict, model: str, system: str, prec: str, gpus: int, gbs: int, pub: dict
                     ) -> tuple[dict | None, str]:
    """The layout to price as published, and a note. A table layout that cannot exist on the row's GPU count
    (Megatron-Core's world-size rules, ``spec.validate.world_size_violation``) is a fact about the table: the row is
    priced with the layout of the release's preset for the same model, GPU, precision, GPU count and batch
    (``catalog.release_configs.publishing_presets``), which is what NVIDIA's scripts ran, and says so; (None, why)
    when there is no such preset. A layout that can exist but whose VP / MBS match no preset of the release takes
    them from the publishing commit's preset with its parallelism, GPU count and batch
    (``catalog.release_configs.run_preset``, as ``build_published_job`` does)."""
    etp = pub.get("etp") or bridge_default_etp(pub["tp"], pub["ep"])
    why = world_size_violation(pub["tp"], pub["cp"], pub["pp"], pub["ep"], etp, gpus)
    pretrain = ((r.get("task") or "").strip() or "pretrain") == "pretrain"  # the release presets are pre-training
    if why is None:
        if not pretrain:
            return pub, ""
        ran = run_preset(model, system, prec, r.get("release", "").strip(), gpus=gpus, tp=pub["tp"], pp=pub["pp"],
                         cp=pub["cp"], vp=pub["vpp"], ep=pub["ep"], etp=pub.get("etp"), gbs=gbs, mbs=pub["mbs"])
        if ran is None:
            return pub, ""
        # the table's VP / MBS match no preset of the release: the publishing commit's preset with the row's
        # parallelism, GPU count and batch is what ran (the same rule as build_published_job)
        rvp, rmbs = ran.run_vp_mbs()
        return {**pub, "vpp": rvp, "mbs": rmbs}, ran.run_note(pub["vpp"], pub["mbs"])
    for p in publishing_presets(model, system, prec, r.get("release", "").strip(), gpus=gpus, gbs=gbs) \
            if pretrain else ():
        f = p.fields
        got = {"tp": f["tensor_model_parallel_size"], "pp": f["pipeline_model_parallel_size"],
               "cp": f["context_parallel_size"], "vpp": f["virtual_pipeline_model_parallel_size"] or 1,
               "ep": f["expert_model_parallel_size"], "mbs": f["micro_batch_size"]}
        p_etp = f["expert_tensor_parallel_size"] or bridge_default_etp(got["tp"], got["ep"])
        if world_size_violation(got["tp"], got["cp"], got["pp"], got["ep"], p_etp, gpus) is None:
            if f["expert_tensor_parallel_size"]:
                got["etp"] = f["expert_tensor_parallel_size"]
            lay = f"TP{got['tp']} PP{got['pp']} VP{got['vpp']} EP{got['ep']} MBS{got['mbs']}"
            return got, (f"table layout cannot exist ({why}); priced with {lay} of preset {p.name} "
                         f"(release {p.release}, commit {p.commit[:9]})")
    return None, f"table layout cannot exist ({why}) and the release has no preset for it"


def exact_ranks(req: PlanRequest, full, pub_t: float) -> tuple[int, int, PlanRequest, object]:
    """(rank among every layout variant, line among the distinct layouts ``plan`` lists) of a step time, both exact;
    the line is ``plan.ties.distinct_rank`` (VPP, MBS and pipeline-split variants of one TP/CP/PP/EP/ETP folded into
    one line), with the request and result of the search that decided them (reused by rows of the same request). The search prunes a layout only
    when its floor exceeds the K-th best distinct layout key recorded so far (K = ``top``), so when fewer than K
    recorded keys beat ``pub_t`` the K-th best is at least ``pub_t`` and every unrecorded layout is slower than the
    published one; otherwise the search is repeated with a larger K until that holds."""
    while True:
        faster = sum(1 for t in full.per_layout_best.values() if t < pub_t - 1e-12)
        if faster < req.top:
            return 1 + faster, distinct_rank(full.per_layout_best, pub_t), req, full
        req = replace(req, top=2 * faster + 10)
        full = plan(req)


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
        if msg:
            print(f"note: {r['release']} {r['model']} {r['system']} {r['num_gpus']} {r['precision']}: {msg}")
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
        if rank > 10:  # the search's top-10 bound leaves the rank of a layout below #10 a lower bound: count exactly
            rank, drank, seen[skey]["req"], seen[skey]["res"] = exact_ranks(seen[skey]["req"], full, pub_t)
        else:
            drank = distinct_rank(full.per_layout_best, pub_t)
        out.append((r, {"rank": rank, "pub_t": pub_t, "best_t": best, "gap": within, "ok": ok,
                        "rank_distinct": drank, "ok_distinct": ok or drank <= 10,
                        "top1": full.candidates[0].job.layout.short() if full.candidates else "-",
                        "pinned": fixed.candidates[0].job, "kw": kw, "pub": pub, "eff": eff_path}, msg))
        print(f"progress{tag}: {len(out)} rows; last {r['model']} {r['system']} {kw['gpus']} {r['precision']} "
              f"rank {rank} gap {100 * within:.1f}%", file=sys.stderr, flush=True)
    return out


_WATCHED = ("recompute_modules", "recompute_granularity", "moe_flex_dispatcher_backend", "moe_token_dispatcher_type",
            "cuda_graph_impl", "cuda_graph_scope", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
            "cpu_offloading_num_layers", "offload_modules", "use_megatron_fsdp")


def classify_miss(r: dict, res: dict) -> str:
    """Why a published layout missed: price the row as NVIDIA ran it (``build_published_job``: table layout, the
    release preset's / recipe's features) and compare with the planner's pinned price of the same layout.

    memory: the model says NVIDIA's own run does not fit (so the pinned plan had to choose other features);
    feature: it fits and is faster than anything the search found for the layout (a feature the search lacks);
    step-time: the pinned plan is as fast as NVIDIA's run or faster, so the miss is the ranking of unmeasured layouts
    (or, more than 3 % faster, of unmeasured features of the same layout) against a measured one (the recipe's error
    against the measured step is printed)."""
    from moetune.io.load import build_published_job
    from moetune.perfmodel.memory import estimate_memory
    from moetune.perfmodel.step import estimate_time

    kw, pub = res["kw"], res["pub"]
    job = build_published_job(model=kw["model"], system=kw["system"].name, gpus=kw["gpus"], precision=kw["precisions"][0],
                              gbs=kw["global_batch_size"], mbs=pub["mbs"], seq=kw["seq_length"], tp=pub["tp"],
                              pp=pub["pp"], cp=pub["cp"], vp=pub["vpp"], ep=pub["ep"], etp=pub.get("etp"),
                              fsdp=pub.get("fsdp", 0), release=r.get("release", "").strip() or None,
                              task=(r.get("task") or "").strip() or "pretrain")
    pinned = res["pinned"]
    split = ""
    try:
        t_rec, mem = estimate_time(job, res["eff"]).step_time_s, estimate_memory(job)
    except (MoetuneError, ValueError):
        # the table's PP x VP does not divide the layers and the recipe's split is for another PP: take the planner's
        # split of the same TP / PP / VP (Megatron needs one; the table does not give it)
        keys = ("pipeline_layout", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
        job = job.with_(layout=job.layout.model_copy(update={k: getattr(pinned.layout, k) for k in keys}))
        t_rec, mem = estimate_time(job, res["eff"]).step_time_s, estimate_memory(job)
        split = " (the planner's pipeline split)"
    tok = float(_int(r["tokens_per_sec_per_gpu"], 0) or 0)
    measured = kw["global_batch_size"] * kw["seq_length"] / (tok * kw["gpus"]) if tok else float("nan")
    err = 100 * (t_rec / measured - 1) if tok else float("nan")
    diff = {k: getattr(pinned.features, k) for k in _WATCHED
            if getattr(pinned.features, k) != getattr(job.features, k)}
    head = (f"recipe{split} {t_rec:.2f} s (measured {measured:.2f}, {err:+.1f} %), pinned plan {res['pub_t']:.2f} s, "
            f"#1 {res['best_t']:.2f} s")
    if not mem.fits:
        st = mem.stages[mem.binding_stage]
        top = sorted(((v, k) for k, v in st.components.items()), reverse=True)[:3]
        over = st.device_gib + mem.headroom_gib - mem.capacity_gib
        return (f"memory: recipe needs {st.device_gib:.1f} GiB of {mem.capacity_gib:.1f} (+{mem.headroom_gib:.1f} "
                f"headroom), {over:.1f} GiB over; largest " + ", ".join(f"{k} {v:.1f}" for v, k in top)
                + f"; {head}; pinned features differ: {diff}")
    if t_rec < res["pub_t"] * 0.99:
        return f"feature: {head}; pinned features differ: {diff}"
    if res["pub_t"] < t_rec * 0.97:
        # the same layout with the planner's features is predicted well below NVIDIA's measured run: unmeasured
        return f"step-time (pinned features, unmeasured): {head}; pinned features differ: {diff}"
    return f"step-time (other layouts, unmeasured): {head}"


def agreement(out: list[tuple]) -> tuple[int, int, int, int]:
    """(rows evaluated, rows ok, rows whose published layout is infeasible, rows ok among distinct layouts)."""
    n = sum(1 for _, res, msg in out if res is not None or not msg.startswith("skipped"))
    ok = sum(1 for _, res, _ in out if res is not None and res["ok"])
    bad = sum(1 for _, res, msg in out if res is None and not msg.startswith("skipped"))
    okd = sum(1 for _, res, _ in out if res is not None and res["ok_distinct"])
    return n, ok, bad, okd


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
    ap.add_argument("--classify", action="store_true", help="say why each miss misses (memory / feature / step-time)")
    args = ap.parse_args(argv)
    limit = args.limit_opt or args.limit
    rows = list(csv.DictReader(CSV.open()))
    rows = [r for r in rows if args.match.lower() in (r["model"] + " " + r["system"]).lower()][::max(args.every, 1)]
    if limit:
        rows = rows[:limit]
    out = plan_rows(rows)
    print(f"{'model':<22} {'system':<10} {'GPUs':>5} {'prec':<7} {'published layout':<28} {'rank':>5} {'line':>5} "
          f"{'gap to top-1':>12} {'ok':>3}  moetune top-1")
    for r, res, msg in out:
        lay = f"TP{r['tp']} PP{r['pp']} CP{r['cp']} VP{r['vp']} EP{r['ep']} MBS{r['mbs']}"
        if res is None:
            print(f"{r['model']:<22} {r['system']:<10} {r['num_gpus']:>5} {r['precision']:<7} {lay:<28} {msg}")
            continue
        print(f"{r['model']:<22} {r['system']:<10} {r['num_gpus']:>5} {r['precision']:<7} {lay:<28} "
              f"{res['rank']:>5} {res['rank_distinct']:>5} {100 * res['gap']:>11.1f}% "
              f"{'yes' if res['ok_distinct'] else 'no':>3}  {res['top1']}")
    n, n_ok, bad, n_okd = agreement(out)
    for r, res, msg in out:
        if res is not None and msg:
            print(f"{r['release']} {r['model']} {r['system']} {r['num_gpus']} {r['precision']}: {msg}")
    print(f"\nrows evaluated: {n}; published layout infeasible: {bad}\n"
          f"published layout within 5 % of top-1 or in the top 10 distinct layouts (plan's lines: VPP / MBS / split "
          f"variants folded): {n_okd} ({100 * n_okd / max(n, 1):.0f} %; target >= 85 %)\n"
          f"  the same with every VPP / MBS / split variant ranked on its own: {n_ok} ({100 * n_ok / max(n, 1):.0f} %)")
    gaps = sorted(res["gap"] for _, res, _ in out if res is not None)
    if gaps:
        w10 = sum(1 for g in gaps if g <= 0.10)
        print(f"feasible: {len(gaps)} of {n}; gap to top-1: median {100 * gaps[len(gaps) // 2]:.1f} %, "
              f"within 10 %: {w10} ({100 * w10 / max(n, 1):.0f} % of rows)")
    if args.classify:
        print("\n## Misses by cause (classify_miss)")
        counts: dict[str, int] = {}
        for r, res, _ in out:
            if res is not None and not res["ok_distinct"]:
                try:
                    why = classify_miss(r, res)
                except (MoetuneError, ValueError) as exc:  # a row NVIDIA's preset cannot be rebuilt for
                    why = f"unclassified: {exc}"
                task = (r.get("task") or "pretrain").strip()
                if task != "pretrain":  # planned and priced as its task (published_task)
                    why = f"task {task}: {why}"
                kind = why.split(":")[0]
                counts[kind] = counts.get(kind, 0) + 1
                print(f"{r['release']} {r['model']} {r['system']} {r['num_gpus']} {r['precision']} rank {res['rank']} "
                      f"(line {res['rank_distinct']}) gap {100 * res['gap']:.1f}%: {why}")
        print("misses by cause: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    kinds = [k for k in args.folds.split(",") if k]
    if not kinds:
        return
    with tempfile.TemporaryDirectory() as td:
        files = fold_efficiencies(kinds, Path(td))
        print("\n## Under held-out folds (each row planned with the parameters fitted without its fold)")
        print(f"{'fold kind':<10} {'rows':>5} {'ok':>5} {'ok %':>6} {'ok (variants apart)':>20} {'infeasible':>10} "
              f"{'median gap %':>12}")
        print(f"{'in-sample':<10} {n:>5} {n_okd:>5} {100 * n_okd / max(n, 1):6.0f} "
              f"{f'{n_ok} ({100 * n_ok / max(n, 1):.0f} %)':>20} {bad:>10} {100 * gaps[len(gaps) // 2] if gaps else 0:12.1f}")
        for kind in kinds:
            fo = plan_rows(rows, lambda r, k=kind: files[k].get(_fold_key(k, r) or ""), tag=f" [{kind}]")
            fn, fok, fbad, fokd = agreement(fo)
            fg = sorted(res["gap"] for _, res, _ in fo if res is not None)
            print(f"{kind:<10} {fn:>5} {fokd:>5} {100 * fokd / max(fn, 1):6.0f} "
                  f"{f'{fok} ({100 * fok / max(fn, 1):.0f} %)':>20} {fbad:>10} {100 * fg[len(fg) // 2] if fg else 0:12.1f}",
                  flush=True)
            for r, res, _ in fo:
                if res is not None and not res["ok_distinct"]:
                    print(f"    miss: {r['model']} {r['system']} {r['num_gpus']} {r['precision']} rank {res['rank']} "
                          f"(line {res['rank_distinct']}) gap {100 * res['gap']:.1f}% top-1 {res['top1']}")


if __name__ == "__main__":
    main()
