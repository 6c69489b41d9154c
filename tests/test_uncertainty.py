"""Prediction bands: built from cross-validated residuals, cover about their stated share of held-out runs, carried
by every estimate; plan ties are grouped."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import DATA, run_cli
from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.io.load import build_published_job
from moetune.perfmodel.calibration import (
    RunPredictor,
    cross_validate,
    default_efficiency,
    read_measured_csv,
)
from moetune.perfmodel.uncertainty import MIN_CLASS_RUNS, band_for, build_table, job_class, shipped_table


def test_table_quantiles_and_fallback():
    rng = np.random.default_rng(0)
    res = rng.normal(0.0, 0.1, 400)
    classes = ["hopper/moe"] * 200 + ["blackwell/dense"] * 195 + ["hopper/dense"] * 5
    doc = build_table(classes, res, coverage=0.8)
    hm = doc["classes"]["hopper/moe"]
    assert hm["q_lo"] == pytest.approx(np.quantile(res[:200], 0.1), abs=1e-4)
    assert hm["q_hi"] == pytest.approx(np.quantile(res[:200], 0.9), abs=1e-4)
    assert "hopper/dense" not in doc["classes"]  # 5 < MIN_CLASS_RUNS: falls back to the GPU family
    assert 5 < MIN_CLASS_RUNS
    b = band_for(get_model("Llama-3-8B"), get_system("DGX-H100"), 2.0, table=doc)
    assert b.cls == "hopper" and b.lo_s < 2.0 < b.hi_s
    assert b.contains(2.0) and not b.contains(b.hi_s * 1.01)


def test_every_estimate_carries_its_band_in_json():
    r = run_cli("estimate", "--model", "Qwen3-30B-A3B", "--system", "DGX-H100", "--gpus", "16", "--gbs", "1024",
                "--seq", "4096", "--ep", "16", "--json")
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["time"]
    band = t["band"]
    assert band["lo_s"] < t["step_time_s"] < band["hi_s"]
    assert band["cls"] == "hopper/moe" and band["coverage"] == shipped_table()["coverage"]
    human = run_cli("estimate", "--model", "Qwen3-30B-A3B", "--system", "DGX-H100", "--gpus", "16", "--gbs",
                    "1024", "--seq", "4096", "--ep", "16")
    assert "% band" in human.stdout


def test_bands_cover_about_their_share_of_held_out_runs():
    """Recompute the leave-one-system-out folds with the current model and fit, and check the shipped bands hold
    about their stated share of the held-out runs (the catalog must be rewritten when the model changes)."""
    runs, _ = read_measured_csv(DATA / "perf" / "mbridge_perf_calibration.csv", job_builder=build_published_job)
    base = default_efficiency()
    pred = RunPredictor(runs, base)
    cv = cross_validate(pred, base, "system")
    inside = []
    for i, r in enumerate(runs):
        meas_step = r.job.global_batch_size * r.job.seq_length / r.job.gpus * pred.fpt[i] / 1e12 / r.tflops
        pred_step = meas_step * r.tflops / cv.predicted[i]
        inside.append(band_for(r.job.model, r.job.system, pred_step).contains(meas_step))
    cover = float(np.mean(inside))
    stated = shipped_table()["coverage"]
    assert abs(cover - stated) <= 0.12, (cover, stated)
    # every class of the published rows has its own band (or its GPU family's)
    for c in {job_class(r.job.model, r.job.system) for r in runs}:
        assert c in shipped_table()["classes"] or c.split("/")[0] in shipped_table()["classes"]


def test_plan_groups_near_duplicates_and_ties():
    r = run_cli("plan", "--model", "Qwen3-30B-A3B", "--system", "DGX-H100", "--gpus", "16", "--gbs", "1024",
                "--seq", "4096", "--top", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    cands, groups = out["candidates"], out["groups"]
    # every candidate in exactly one group; a group is one distinct layout (VPP / MBS may differ)
    members = sorted(m for g in groups for m in g["members"])
    assert members == list(range(1, len(cands) + 1))
    keys = []
    for g in groups:
        lays = [(cands[m - 1]["layout"], cands[m - 1]["features"]) for m in g["members"]]
        # a distinct layout = meshes + Megatron-FSDP or not (plan.ties.layout_key)
        k = {(x["tp"], x["cp"], x["pp"], x["ep"], x["etp"], f["use_megatron_fsdp"]) for x, f in lays}
        assert len(k) == 1
        keys.append(k.pop())
        times = [cands[m - 1]["time"]["step_time_s"] for m in g["members"]]
        assert g["step_time_range_s"] == [min(times), max(times)]
    assert len(keys) == len(set(keys))
    # ties: a group ties with #1 iff some member's band overlaps #1's band
    b1 = cands[0]["time"]["band"]
    for g in groups:
        overlap = any(cands[m - 1]["time"]["band"]["lo_s"] <= b1["hi_s"] for m in g["members"])
        assert g["ties_with_first"] == overlap
    if len(cands) > 1:
        assert cands[0]["why"]["within_noise"] == (cands[1]["time"]["band"]["lo_s"] <= b1["hi_s"])
    human = run_cli("plan", "--model", "Qwen3-30B-A3B", "--system", "DGX-H100", "--gpus", "16", "--gbs", "1024",
                    "--seq", "4096", "--top", "8")
    if cands[0]["why"]["within_noise"]:
        assert "within noise" in human.stdout and "beats #2" not in human.stdout
    if any(len(g["members"]) > 1 for g in groups):
        assert "near-duplicate" in human.stdout


def test_sweep_runs_only_candidates_inside_the_band():
    from moetune.sweep.phases import worth_running
    from moetune.sweep.plan_input import Candidate

    def cand(i, lo, hi):
        return Candidate(index=i, layout={"tp": 1, "pp": 1, "cp": 1, "ep": 8}, mbs=1, features={},
                         time={"step_time_s": (lo + hi) / 2, "band": {"lo_s": lo, "hi_s": hi}})

    base, tie, slower, tie2 = cand(0, 1.0, 2.0), cand(1, 1.5, 3.0), cand(2, 2.5, 4.0), cand(3, 1.9, 3.5)
    picked = worth_running(base, [tie, slower, tie2], 3)
    assert [c.index for c, _ in picked] == [0, 1, 3]
    assert "overlaps" in picked[1][1]
    assert [c.index for c, _ in worth_running(base, [tie, slower, tie2], 1)] == [0, 1]
    nob = Candidate(index=4, layout={"tp": 1}, mbs=1, features={})
    assert [c.index for c, _ in worth_running(nob, [nob], 1)] == [4, 4]


def test_compare_reports_whether_the_run_lands_in_the_predicted_band(tmp_path):
    g = DATA / "megatron_golden" / "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed"
    est = run_cli("estimate", "--megatron-args", f"{g}_config.yaml", "--system", "DGX-H100", "--gpus", "8", "--json")
    assert est.returncode == 0, est.stderr
    pred = tmp_path / "pred.json"
    pred.write_text(est.stdout)
    r = run_cli("compare", f"{g}_golden.json", f"{g}_golden.json", "--predicted", str(pred), "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["prediction"]
    assert p["inside_band"] == (p["lo_s"] <= p["measured_s"] <= p["hi_s"])
    assert p["step_time_s"] == json.loads(est.stdout)["time"]["step_time_s"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = run_cli("compare", f"{g}_golden.json", f"{g}_golden.json", "--predicted", str(bad))
    assert r.returncode == 2 and "time.band" in r.stderr and "Traceback" not in r.stderr


def test_distinct_rank_folds_variants_like_plan_lines():
    """plan.ties.distinct_rank: VPP / MBS / pipeline-split variants of one TP CP PP EP ETP are one line; the rank is
    1 + the lines whose best beats the step time."""
    from moetune.plan.ties import distinct_rank

    best = {(1, 1, 2, 1, 8, 1, 1, ""): 1.0, (1, 1, 2, 4, 8, 1, 2, ""): 0.9,  # one line (VPP / MBS differ), best 0.9
            (1, 1, 4, 2, 8, 1, 1, "E|t|t|tL"): 1.2, (1, 1, 4, 1, 8, 1, 1, ""): 1.5,  # one line, best 1.2
            (2, 1, 1, 1, 8, 1, 1, ""): 1.1}
    assert distinct_rank(best, 0.85) == 1
    assert distinct_rank(best, 1.0) == 2  # the 0.9 line beats it; 1.0 is not below itself
    assert distinct_rank(best, 1.3) == 4
    assert distinct_rank(best, 1.6) == 4  # the 1.5 variant does not add a line


def test_plan_bench_distinct_rank_is_exact_under_pruning(monkeypatch):
    """bench/plan_vs_published.exact_ranks: with the planner's top-K pruning the line of a step time far down
    the list equals the line counted on a search that prices every layout (top large enough to prune nothing)."""
    from dataclasses import replace

    from moetune.plan.search import PlanRequest, plan
    from moetune.plan.ties import distinct_rank

    monkeypatch.syspath_prepend(str(DATA.parent / "bench"))
    import plan_vs_published as bench

    req = PlanRequest(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=16, global_batch_size=1024,
                      seq_length=4096, precisions=("bf16",), top=3, workers=1)
    small = plan(req)
    everything = plan(replace(req, top=100_000))
    times = sorted(everything.per_layout_best.values())
    assert len(times) > 40 and len(small.per_layout_best) < len(times)  # the small search pruned layouts
    for t in (times[5], times[25], times[-1] + 1.0):
        rank = 1 + sum(1 for x in times if x < t - 1e-12)
        assert bench.exact_ranks(req, small, t)[:2] == (rank, distinct_rank(everything.per_layout_best, t))
