"""Prediction intervals of the step-time model from its cross-validated residuals.

Every step-time prediction carries a band: the range the measured step time fell in, relative to the prediction,
for ``coverage`` (80 %) of the held-out published runs of the same class of system and model. The residuals are
``r = log(measured step / predicted step)`` (= log(predicted / measured TFLOP/s)) of the leave-one-system-out,
leave-one-model-out and leave-one-release-out folds of :func:`moetune.perfmodel.calibration.cross_validate`
(every run predicted by parameters fitted without its system, its model or its release), pooled; the band of a
prediction ``t`` is ``[t · exp(q_lo), t · exp(q_hi)]`` with ``q_lo``/``q_hi`` the empirical
``(1 − coverage)/2`` and ``(1 + coverage)/2`` quantiles of the class's residuals (Hyndman & Fan type 7, numpy's
default). Classes are the GPU family (``hopper``, ``blackwell``, ``blackwell_ultra`` for B300/GB300; Ampere falls
back to ``all``) × ``dense``/``moe``; a class with fewer than :data:`MIN_CLASS_RUNS` residuals falls back to its
GPU family, then to all runs.

The numbers live in ``catalog/uncertainty.yaml``, written by ``bench/steptime_accuracy.py --write-catalog`` with
its provenance (data, folds, fit). A split-conformal view of the same idea: Vovk et al., "Algorithmic Learning in
a Random World" (2005); Lei et al., "Distribution-free predictive inference for regression" (JASA 2018).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, Field

from moetune.errors import InputError
from moetune.files import load_yaml
from moetune.memo import memo

FORMAT = "moetune-uncertainty/1"
COVERAGE = 0.8
#: fewest held-out residuals a class needs for its own band (else its GPU family, then all runs)
MIN_CLASS_RUNS = 12


class Band(BaseModel):
    """A step-time prediction interval."""

    lo_s: float = Field(description="lower end of the band, seconds per step")
    hi_s: float = Field(description="upper end of the band, seconds per step")
    coverage: float = Field(description="share of held-out published runs of this class whose measured step time "
                                        "fell inside such a band")
    cls: str = Field(description="class of system and model whose cross-validated residuals set the band")
    runs: int = Field(description="held-out residuals of that class")
    source: str = Field(description="catalog file and how its residuals were made")

    def contains(self, seconds: float) -> bool:
        return self.lo_s <= seconds <= self.hi_s

    def overlaps(self, other: Band) -> bool:
        return self.lo_s <= other.hi_s and other.lo_s <= self.hi_s


def gpu_family(system: Any) -> str:
    """``hopper``, ``blackwell`` or ``blackwell_ultra`` (B300 / GB300) for a system; ``other`` for the rest."""
    gpu = system.gpu
    if gpu.arch == "blackwell":
        return "blackwell_ultra" if "B300" in gpu.name.upper() else "blackwell"
    return gpu.arch if gpu.arch == "hopper" else "other"


def job_class(model: Any, system: Any) -> str:
    return f"{gpu_family(system)}/{'moe' if model.is_moe else 'dense'}"


def quantile_band(residuals: Sequence[float], coverage: float = COVERAGE) -> tuple[float, float]:
    """(q_lo, q_hi) of log residuals for a central ``coverage`` band (numpy's type-7 quantiles)."""
    r = np.asarray(residuals, dtype=float)
    if r.size == 0:
        raise ValueError("no residuals")
    return float(np.quantile(r, (1 - coverage) / 2)), float(np.quantile(r, (1 + coverage) / 2))


def build_table(classes: Sequence[str], residuals: Sequence[float], *, coverage: float = COVERAGE,
                provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The catalog document from per-run classes and log residuals (the bench writes it): one band per class with
    at least :data:`MIN_CLASS_RUNS` residuals, per GPU family, and ``all``."""
    groups: dict[str, list[float]] = {"all": []}
    for c, r in zip(classes, residuals, strict=True):
        if not math.isfinite(r):
            continue
        for key in (c, c.split("/")[0], "all"):
            groups.setdefault(key, []).append(float(r))
    bands = {}
    for key, rs in sorted(groups.items()):
        if len(rs) < MIN_CLASS_RUNS and key != "all":
            continue
        lo, hi = quantile_band(rs, coverage)
        bands[key] = {"q_lo": round(lo, 5), "q_hi": round(hi, 5), "runs": len(rs),
                      "median_abs_pct": round(100 * float(np.median(np.abs(np.expm1(rs)))), 2)}
    return {"format": FORMAT, "coverage": coverage, "provenance": provenance or {}, "classes": bands}


_HEADER = """\
# Step-time prediction bands of moetune (moetune.perfmodel.uncertainty), from the cross-validated residuals
# log(measured step / predicted step) of the published Megatron-Bridge rows (leave-one-system-out,
# leave-one-model-out, leave-one-release-out, pooled). q_lo / q_hi are the quantiles of a central `coverage` band.
# Written by: python bench/steptime_accuracy.py --write-catalog
"""


def save_table(doc: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(_HEADER + yaml.safe_dump(doc, sort_keys=False, width=120))


def _parse(doc: Any, origin: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("classes"), dict) \
            or "all" not in doc["classes"]:
        raise InputError(f"{origin}: expected a {FORMAT} document with classes (including 'all')",
                         field="uncertainty")
    for name, b in doc["classes"].items():
        try:
            lo, hi = float(b["q_lo"]), float(b["q_hi"])
        except (KeyError, TypeError, ValueError):
            raise InputError.bad_value(f"{origin}: classes.{name}", b, "{q_lo, q_hi, runs}") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise InputError.bad_value(f"{origin}: classes.{name}", b, "finite q_lo <= q_hi")
    return doc


@memo(maxsize=256)
def shipped_table() -> dict[str, Any]:
    """``catalog/uncertainty.yaml``."""
    text = (resources.files("moetune.catalog") / "uncertainty.yaml").read_text()
    return _parse(load_yaml(text), "catalog/uncertainty.yaml")


def band_for(model: Any, system: Any, step_s: float, table: dict[str, Any] | None = None) -> Band:
    """The band of a step-time prediction ``step_s`` for a job of ``model`` on ``system`` (module doc)."""
    doc = table or shipped_table()
    cls = job_class(model, system)
    classes = doc["classes"]
    key = next(k for k in (cls, cls.split("/")[0], "all") if k in classes)
    b = classes[key]
    prov = doc.get("provenance") or {}
    return Band(lo_s=step_s * math.exp(b["q_lo"]), hi_s=step_s * math.exp(b["q_hi"]),
                coverage=float(doc["coverage"]), cls=key, runs=int(b.get("runs", 0)),
                source=f"catalog/uncertainty.yaml ({prov.get('residuals', 'cross-validated residuals')})")


def predicted_band_from_file(path: str | Path) -> dict[str, Any]:
    """{step_time_s, lo_s, hi_s, coverage, cls, source} of a saved prediction: the JSON of ``moetune estimate
    --json`` (``time``) or ``moetune plan --json`` (the first candidate's ``time``)."""
    import orjson

    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such prediction file (expected the JSON of `moetune estimate --json` or "
                         "`moetune plan --json`)", field="predicted")
    try:
        doc = orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError:
        raise InputError(f"{p}: not valid JSON (expected the output of `moetune estimate --json`)",
                         field="predicted") from None
    t = doc.get("time") if isinstance(doc, dict) else None
    if t is None and isinstance(doc, dict) and isinstance(doc.get("candidates"), list) and doc["candidates"]:
        t = doc["candidates"][0].get("time") if isinstance(doc["candidates"][0], dict) else None
    band = t.get("band") if isinstance(t, dict) else None
    if not isinstance(band, dict) or not all(isinstance(band.get(k), int | float) for k in ("lo_s", "hi_s")) \
            or not isinstance(t.get("step_time_s"), int | float):
        raise InputError(f"{p}: no time.step_time_s and time.band (expected the output of `moetune estimate --json` "
                         "or `moetune plan --json`)", field="predicted")
    return {"step_time_s": float(t["step_time_s"]), "lo_s": float(band["lo_s"]), "hi_s": float(band["hi_s"]),
            "coverage": band.get("coverage"), "cls": band.get("cls"), "source": str(p)}
