"""A/B comparison of two runs: is B slower or faster than A, by how much, and is that beyond noise?

Method:

* Each run's steady window (:func:`moetune.evidence.steady.steady_window`, or a declared window) gives
  per-iteration step-time samples.
* ``delta_pct = 100 · (median_B / median_A − 1)`` (positive = B slower).
* ``ci_pct``: percentile bootstrap of the same statistic, resampling the two sample sets independently
  (``BOOTSTRAP_RESAMPLES`` resamples, fixed seed; at most ``MAX_SAMPLES`` most recent samples per run).
* The measurement contract (:mod:`moetune.evidence.contract`) is checked first; a broken contract gives
  ``not_comparable`` (the numbers are still reported).
* Verdict: ``regression`` when the whole interval lies above 0 and ``delta_pct >= MIN_EFFECT_PCT``;
  ``improvement`` when it lies below 0 and ``delta_pct <= -MIN_EFFECT_PCT``; else ``no_change``.
* Explanations: the configuration differences that can explain the change, ranked by moetune's own predicted effect
  (``moetune.perfmodel.step.estimate_time`` on both configurations, one difference at a time) when the step-time
  model and a config-to-Job reader are available; otherwise listed in contract order with
  ``predicted_effect_pct = null`` and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moetune.errors import MoetuneError
from moetune.evidence.contract import ContractCheck, check_contract, contract_fields, field_of_leaf
from moetune.evidence.logs import RunRecord
from moetune.evidence.record_job import job_for
from moetune.evidence.steady import BOOTSTRAP_SEED, CONFIDENCE, steady_window
from moetune.perfmodel.step import estimate_time

BOOTSTRAP_RESAMPLES = 2000
MAX_SAMPLES = 5000
#: smallest |delta| (percent) reported as a regression/improvement; smaller significant changes are "no_change"
#: (practically equivalent: well inside the ±5 % tolerance of Megatron-Bridge's golden-value checks, BPN §3)
MIN_EFFECT_PCT = 2.0


@dataclass
class Explanation:
    field: str
    a: Any
    b: Any
    predicted_effect_pct: float | None
    note: str


@dataclass
class Comparison:
    """Result of :func:`compare_runs` (JSON keys as in the issue)."""

    verdict: str
    delta_pct: float | None
    ci_pct: list[float] | None
    contract: dict[str, Any]
    explanations: list[Explanation]
    a: dict[str, Any]
    b: dict[str, Any]
    method: str
    ranking: str
    notes: list[str] = field(default_factory=list)


def bootstrap_ratio_ci(a: np.ndarray, b: np.ndarray, *, resamples: int = BOOTSTRAP_RESAMPLES,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile-bootstrap CI of ``median(b) / median(a) − 1`` in percent."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    out = []
    chunk = max(1, min(resamples, 2_000_000 // max(len(a), len(b))))  # bounded memory
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        ma = np.median(a[rng.integers(0, len(a), size=(k, len(a)))], axis=1)
        mb = np.median(b[rng.integers(0, len(b), size=(k, len(b)))], axis=1)
        out.append((mb / ma - 1.0) * 100.0)
    r = np.concatenate(out)
    q = (1 - confidence) / 2
    return float(np.quantile(r, q)), float(np.quantile(r, 1 - q))


def _side(rec: RunRecord, w) -> dict[str, Any]:
    t = w.times_s
    return {"file": rec.path, "source": rec.source, "steady_window": list(w.bounds) if w.bounds else None,
            "window_source": w.source, "samples": int(len(t)),
            "median_s": float(np.median(t)) if len(t) else None, "mean_s": float(np.mean(t)) if len(t) else None,
            "platform": rec.meta.get("platform"), "gpu": rec.meta.get("gpu")}


def _predict(rec_a: RunRecord, rec_b: RunRecord, diffs: list[str], gpus: int | None, efficiency: Any = None
             ) -> tuple[dict[str, float], str]:
    """Predicted step-time change (percent) of each differing field alone, from moetune's step-time model
    (``moetune.perfmodel.step.estimate_time`` on the Job built by ``moetune.io.config_to_job.job_from_config``)."""
    n = gpus or contract_fields(rec_a).get("gpus")
    if not n:
        return {}, "not ranked: GPU count unknown (pass --gpus to rank by predicted effect)"
    try:
        base = estimate_time(job_for(rec_a.config, rec_a, int(n)), efficiency).step_time_s
        out: dict[str, float] = {}
        for key in rec_b.config:
            name = field_of_leaf(key.rsplit(".", 1)[-1])
            if name not in diffs or rec_a.config.get(key) == rec_b.config[key]:
                continue
            t = estimate_time(job_for({**rec_a.config, key: rec_b.config[key]}, rec_a, int(n)), efficiency).step_time_s
            out[name] = out.get(name, 0.0) + (t / base - 1.0) * 100.0
        return out, "ranked by moetune's predicted step-time change of each difference alone"
    except (MoetuneError, ValueError) as exc:  # logs rarely carry everything a Job needs (ValueError: pydantic)
        return {}, f"not ranked: could not build a Job from the printed configuration ({exc})"[:240]


def _explain(rec_a: RunRecord, rec_b: RunRecord, chk: ContractCheck, verdict: str, gpus: int | None,
             efficiency: Any = None) -> tuple[list[Explanation], str]:
    diffs = [d.field for d in chk.differences]
    config_diffs = [d for d in diffs if d != "platform" and not d.startswith("version:")]
    pred, ranking = _predict(rec_a, rec_b, config_diffs, gpus, efficiency) if config_diffs else \
        ({}, "no configuration differences to rank")
    out = []
    for d in chk.differences:
        note = ""
        if d.field == "platform":
            note = ("same configuration on another platform/cluster: the change comes from the environment (network, "
                    "clocks, node health, software stack), not the model; compare per-rank timers or traces")
        elif d.field.startswith("version:"):
            note = "software version changed: check its release notes for the kernels on the critical path"
        elif d.cls == "hard":
            note = "changes the work per step: compare tokens/s/GPU or TFLOP/s/GPU instead of step time"
        out.append(Explanation(d.field, d.a, d.b, pred.get(d.field), note))
    if pred:
        out.sort(key=lambda e: -abs(e.predicted_effect_pct) if e.predicted_effect_pct is not None else 0.0)
    if not out and verdict in ("regression", "improvement"):
        out.append(Explanation("environment", None, None, None,
                               "no configuration difference is printed in either log: the environment (hardware "
                               "health, network, software not printed) is the likely cause"))
    return out, ranking


def compare_runs(a: RunRecord, b: RunRecord, *, window_a: tuple[int, int] | None = None,
                 window_b: tuple[int, int] | None = None, gpus: int | None = None,
                 efficiency: Any = None) -> Comparison:
    """Compare the steady step time of run B against run A (module docstring). ``efficiency``: the time model's
    parameters that rank the differences (:func:`moetune.perfmodel.step.estimate_time`; None = the catalog's)."""
    wa, wb = steady_window(a, window_a), steady_window(b, window_b)
    ta, tb = wa.times_s[-MAX_SAMPLES:], wb.times_s[-MAX_SAMPLES:]
    fa, fb = contract_fields(a), contract_fields(b)
    chk = check_contract(fa, fb, window_a=len(ta), window_b=len(tb))
    notes = []
    if window_a and window_b and a.path == b.path:
        lo, hi = sorted([window_a, window_b])
        if lo[1] >= hi[0]:
            notes.append("the two windows of the same run overlap")
    delta = ci = None
    if len(ta) and len(tb):
        delta = (float(np.median(tb)) / float(np.median(ta)) - 1.0) * 100.0
        if len(ta) >= 2 and len(tb) >= 2:
            ci = list(bootstrap_ratio_ci(ta, tb))
    if not chk.ok or ci is None:
        verdict = "not_comparable"
    elif ci[0] > 0 and delta >= MIN_EFFECT_PCT:
        verdict = "regression"
    elif ci[1] < 0 and delta <= -MIN_EFFECT_PCT:
        verdict = "improvement"
    else:
        verdict = "no_change"
    expl, ranking = _explain(a, b, chk, verdict, gpus, efficiency)
    method = (f"median step time over each steady window; {int(CONFIDENCE * 100)}% percentile bootstrap "
              f"({BOOTSTRAP_RESAMPLES} resamples) of median(B)/median(A) - 1; verdict needs the interval to exclude 0 "
              f"and |delta| >= {MIN_EFFECT_PCT}%")
    return Comparison(verdict, delta, ci, chk.as_dict(), expl, _side(a, wa), _side(b, wb), method, ranking, notes)
