"""Calibration: efficiency file round trip, least-squares fit, measured-CSV reader and `moetune calibrate`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA, run_cli
from moetune.errors import InputError
from moetune.io.load import build_published_job
from moetune.perfmodel.calibration import (
    default_efficiency,
    fit,
    load_efficiency,
    read_measured_csv,
    save_efficiency,
)
from moetune.perfmodel.step import build_profile, evaluate

FIX = Path(__file__).parent / "fixtures" / "perf_calibration_small.csv"


def test_shipped_parameters_are_physical():
    eff = default_efficiency()
    for name, spec in eff.specs.items():
        assert spec.lo <= eff[name] <= spec.hi, name
        assert spec.source, name
    for name in eff.names:
        if name.startswith(("gemm_eff.", "attn_eff.", "hbm_eff", "nvlink_eff", "scaleout_eff")):
            assert 0 < eff[name] < 1, name
    assert eff.fit_info, "shipped values must say how they were fitted"


def test_round_trip_and_partial_file(tmp_path):
    eff = default_efficiency().with_values({"hbm_eff": 0.5})
    p = tmp_path / "e.yaml"
    save_efficiency(eff, p)
    back = load_efficiency(p)
    assert back["hbm_eff"] == 0.5 and back.names == eff.names
    q = tmp_path / "partial.yaml"
    q.write_text("params:\n  nvlink_eff: 0.5\n")
    part = load_efficiency(q)
    assert part["nvlink_eff"] == 0.5 and part["hbm_eff"] == default_efficiency()["hbm_eff"]


@pytest.mark.parametrize("text", ["just text", "params:\n  nope: 0.5\n", "params:\n  hbm_eff: -1\n",
                                  "params:\n  hbm_eff: abc\n", "params: [1, 2\n"])
def test_bad_efficiency_files_are_one_line_errors(tmp_path, text):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(InputError):
        load_efficiency(p)
    with pytest.raises(InputError):
        load_efficiency(tmp_path / "missing.yaml")


def test_fit_recovers_a_known_parameter():
    runs, skipped = read_measured_csv(FIX, job_builder=build_published_job)
    profs = [build_profile(r.job) for r in runs]
    true = default_efficiency().with_values({"hbm_eff": 0.55})

    def predict(eff):
        return np.array([1.0 / evaluate(p, eff).step for p in profs])

    target = predict(true)
    base = default_efficiency().with_values({"hbm_eff": 0.8}).with_values({})
    base.prior_weight = 0.0
    res = fit(predict, target, base, ["hbm_eff"], max_nfev=50)
    assert res.efficiency["hbm_eff"] == pytest.approx(0.55, rel=1e-3)


def test_reader_handles_published_cells_and_skips():
    runs, skipped = read_measured_csv(FIX, job_builder=build_published_job)
    assert any("model not in the catalog" in s for s in skipped)  # DeepSeek-V4-Flash
    labels = [r.precision_label for r in runs]
    assert "FP8-CS" in labels and "FP8-MX" in labels  # 'FP8-CS (FP8-MX)' is two runs
    mx = [r for r in runs if r.precision_label == "FP8-MX"][0]
    assert mx.tflops == 1858 and mx.job.features.precision == "mxfp8"
    moe = [r for r in runs if r.job.model.is_moe]
    assert moe and all(r.job.features.moe_router_force_load_balancing for r in moe)


def test_reader_rejects_wrong_columns(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="missing column"):
        read_measured_csv(p, job_builder=build_published_job)


def test_calibrate_cli(tmp_path):
    out = tmp_path / "fitted.yaml"
    r = run_cli("calibrate", str(FIX), "--params", "hbm_eff,gemm_eff.blackwell.mxfp8", "--max-evals", "8",
                "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["runs"] >= 5 and data["out"] == str(out)
    assert set(data["fit"]["fitted"]) == {"hbm_eff", "gemm_eff.blackwell.mxfp8"}
    assert load_efficiency(out)["hbm_eff"] == pytest.approx(data["params"]["hbm_eff"], rel=1e-5)


def test_calibrate_cli_errors(tmp_path):
    r = run_cli("calibrate", str(tmp_path / "none.csv"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("calibrate", str(FIX), "--params", "bogus")
    assert r.returncode == 2 and "bogus" in r.stderr


def test_shared_calibration_csv_reads(shared_data):
    runs, skipped = read_measured_csv(DATA / "perf" / "mbridge_perf_calibration.csv", job_builder=build_published_job)
    assert len(runs) > 150
    assert all(r.tflops > 0 for r in runs)


def test_calibrate_on_shipped_data_reproduces_shipped_catalog(tmp_path):
    """`moetune calibrate` on the shipped published table gives the shipped efficiency catalog (the fit starts from
    the documented priors, so it does not depend on the values it replaces); tolerant to float noise."""
    out = tmp_path / "refit.yaml"
    r = run_cli("calibrate", str(DATA / "perf" / "mbridge_perf_calibration.csv"), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    refit, shipped = load_efficiency(out), default_efficiency()
    assert refit.names == shipped.names
    for name in shipped.names:
        assert refit[name] == pytest.approx(shipped[name], rel=2e-3, abs=1e-4), name
    assert json.loads(r.stdout)["runs"] == int(shipped.fit_info["data"].split(": ")[1].split()[0])
