"""sweep.evidence reads the log summary's statistics (dicts) as their steady-window median."""

from __future__ import annotations

import dataclasses
import math

import moetune.evidence.steady as steady
import moetune.sweep.evidence as sweep_evidence
from conftest import DATA
from moetune.sweep.evidence import read_log_evidence

LOG = DATA / "logs" / "log_bridge_iteration_memory_1.txt"


def test_tflops_per_gpu_is_the_summary_median(shared_data):
    ev = read_log_evidence(LOG, (1, 10**6))
    summ = ev["summary"]["tflops_per_gpu"]
    assert isinstance(summ, dict) and {"median", "mean", "source"} <= set(summ)
    assert isinstance(ev["tflops_per_gpu"], float) and math.isclose(ev["tflops_per_gpu"], summ["median"])


def test_median_not_mean_and_missing_median_is_none(shared_data, monkeypatch):
    real = steady.summarize_run

    def fake(rec, **kw):
        return dataclasses.replace(real(rec, **kw), tflops_per_gpu={"median": 50.0, "mean": 60.0, "source": "x"})

    monkeypatch.setattr(sweep_evidence, "summarize_run", fake)
    assert read_log_evidence(LOG, (1, 10**6))["tflops_per_gpu"] == 50.0

    def fake_none(rec, **kw):
        return dataclasses.replace(real(rec, **kw), tflops_per_gpu={"median": None, "mean": None, "source": None})

    monkeypatch.setattr(sweep_evidence, "summarize_run", fake_none)
    assert read_log_evidence(LOG, (1, 10**6))["tflops_per_gpu"] is None
