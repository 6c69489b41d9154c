"""``compare``: regression size on the two H100 goldens of one config, no change between two windows of one steady
run, contract violations, bootstrap interval properties."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DATA
from moetune.evidence.compare import MIN_EFFECT_PCT, bootstrap_ratio_ci, compare_runs
from moetune.evidence.contract import check_contract
from moetune.evidence.logs import read_run

GOLD = DATA / "megatron_golden"
CASE = "case_gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed_golden"


def _index_median(name: str) -> float:
    with open(GOLD / "index.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["file"] == name:
                return float(row["iter_time_median_s"])
    raise KeyError(name)


def test_h100_goldens_regression_of_the_right_size(shared_data):
    a = read_run(GOLD / f"{CASE}.json")
    b = read_run(GOLD / f"{CASE}_dev_dgxh100_dgxc.json")
    c = compare_runs(a, b)
    assert c.verdict == "regression" and c.contract["ok"]
    # the size: the ratio of the per-file median iteration times recorded in index.csv (~1.03 s vs ~7.95 s)
    expected = (_index_median(f"{CASE}_dev_dgxh100_dgxc.json") / _index_median(f"{CASE}.json") - 1) * 100
    assert c.delta_pct == pytest.approx(expected, rel=0.02)
    lo, hi = c.ci_pct
    assert 0 < lo < c.delta_pct < hi
    assert [d["field"] for d in c.contract["differences"]] == ["platform"]
    assert c.explanations[0].field == "platform" and "environment" in c.explanations[0].note
    # reversed: an improvement of the matching size
    r = compare_runs(b, a)
    assert r.verdict == "improvement"
    assert (1 + r.delta_pct / 100) * (1 + c.delta_pct / 100) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("wa,wb", [((10, 29), (30, 49)), ((8, 28), (29, 50))])
def test_two_windows_of_one_steady_run_no_change(shared_data, wa, wb):
    a = read_run(GOLD / f"{CASE}.json")
    c = compare_runs(a, a, window_a=wa, window_b=wb)
    assert c.verdict == "no_change" and c.contract["ok"]
    assert abs(c.delta_pct) < MIN_EFFECT_PCT
    assert c.ci_pct[0] <= c.delta_pct <= c.ci_pct[1]
    assert c.a["steady_window"][0] >= wa[0] and c.b["steady_window"][1] <= wb[1]


def test_slowdown_inside_one_run_is_a_regression(shared_data):
    rec = read_run(DATA / "logs" / "log_regression_slowdown_1.txt")
    c = compare_runs(rec, rec, window_a=(122, 125), window_b=(182, 185))
    assert c.verdict == "regression" and c.delta_pct == pytest.approx((127.3999 / 88.4734 - 1) * 100)


def test_broken_contract_is_not_comparable(shared_data):
    a = read_run(GOLD / f"{CASE}.json")
    other = read_run(GOLD / "case_gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel_golden.json")
    c = compare_runs(a, other)
    assert c.verdict == "not_comparable" and not c.contract["ok"]
    assert any("hidden_size" in v or "seq_length" in v for v in c.contract["violations"])
    assert c.delta_pct is not None  # the numbers are still reported


def test_too_few_samples_is_not_comparable(shared_data):
    rec = read_run(DATA / "logs" / "log_bridge_iteration_memory_1.txt")
    c = compare_runs(rec, rec)
    assert c.verdict == "not_comparable" and any("steady samples" in v for v in c.contract["violations"])


def test_contract_one_variable_at_a_time():
    base = {"tp": 2, "ep": 8, "precision": "bf16", "dispatcher": "alltoall", "global_batch_size": 256}
    one = dict(base, dispatcher="flex:deepep")
    two = dict(one, precision="fp8:mxfp8")
    assert check_contract(base, one, window_a=10, window_b=10).ok
    chk = check_contract(base, two, window_a=10, window_b=10)
    assert not chk.ok and "more than one variable" in chk.violations[0]
    chk = check_contract(base, dict(base, global_batch_size=512), window_a=10, window_b=10)
    assert not chk.ok and "global_batch_size" in chk.violations[0]
    chk = check_contract(base, dict(base, tp=None), window_a=10, window_b=10)
    assert chk.ok and chk.unknown


@settings(max_examples=30, deadline=None)
@given(n=st.integers(min_value=5, max_value=60), scale=st.floats(min_value=0.5, max_value=3.0),
       seed=st.integers(min_value=0, max_value=10_000))
def test_bootstrap_interval_brackets_the_point_estimate(n, scale, seed):
    rng = np.random.default_rng(seed)
    a = 1.0 + 0.05 * rng.standard_normal(n)
    b = scale * (1.0 + 0.05 * rng.standard_normal(n))
    lo, hi = bootstrap_ratio_ci(a, b)
    point = (np.median(b) / np.median(a) - 1) * 100
    assert lo <= point <= hi
    # and it is scale-equivariant: multiplying B by a constant shifts the ratio interval accordingly
    lo2, hi2 = bootstrap_ratio_ci(a, 2 * b)
    assert (1 + lo2 / 100) == pytest.approx(2 * (1 + lo / 100)) and (1 + hi2 / 100) == pytest.approx(2 * (1 + hi / 100))


def test_config_differences_ranked_by_predicted_effect(shared_data):
    pytest.importorskip("moetune.perfmodel.step")
    pytest.importorskip("moetune.io.config_to_job")
    a = read_run(GOLD / f"{CASE}.json")
    b = read_run(GOLD / f"{CASE}.json")
    b.config = dict(b.config)
    b.config["model.tensor_model_parallel_size"] = 1
    b.config["train.micro_batch_size"] = 2
    c = compare_runs(a, b, gpus=8)
    assert c.verdict == "not_comparable"  # two variables changed at once
    assert c.ranking.startswith("ranked by")
    effects = [abs(e.predicted_effect_pct) for e in c.explanations]
    assert {e.field for e in c.explanations} == {"tp", "micro_batch_size"}
    assert effects == sorted(effects, reverse=True) and all(x > 0 for x in effects)
    assert compare_runs(a, b).ranking.startswith("not ranked: GPU count unknown")
