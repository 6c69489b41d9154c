"""The few efficiency parameters of the step-time model, and their least-squares fit to measured runs.

Parameters are physical fractions or costs (achievable GEMM fraction of a precision's peak per GPU architecture,
GEMM tile knee, attention-kernel fraction, HBM fraction, NVLink / scale-out bus-bandwidth fractions, host launch
cost per CPU family, EP-overlap hiding share). Shipped defaults live in ``catalog/efficiency.yaml`` with their
sources; :func:`fit` refits them by minimising the log-ratio of predicted to measured throughput
(``scipy.optimize.least_squares``, soft-L1 loss) plus a weak prior pulling each parameter to its documented prior,
so that parameters the data do not constrain stay at physically sensible values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from moetune.errors import InputError
from moetune.files import load_yaml
from moetune.memo import FrozenMap, memo

FORMAT = "moetune-efficiency/1"


@dataclass(frozen=True)
class ParamSpec:
    """One named efficiency parameter."""

    name: str
    value: float
    prior: float
    lo: float
    hi: float
    source: str = ""
    fixed: bool = False  #: kept at its value by default fits (set from sources, not identifiable from throughput)


@dataclass
class Efficiency:
    """A full parameter set: fitted values + fixed constants (kernel counts, buffer sizes)."""

    specs: dict[str, ParamSpec]
    constants: dict[str, Any]
    prior_weight: float = 0.15
    fit_info: dict[str, Any] | None = None
    origin: str = "catalog"
    values: dict[str, float] = field(default_factory=dict)
    #: ``constants["kernels_per_layer"]`` as a hashable mapping (an argument of the step model's memoised layer work)
    kernels: FrozenMap = field(init=False, repr=False, compare=False)
    #: ``values`` as a hashable mapping: the hash of the set (:meth:`__hash__`)
    frozen_values: FrozenMap = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.values:
            self.values = {k: s.value for k, s in self.specs.items()}
        self.kernels = FrozenMap(self.constants.get("kernels_per_layer") or {})
        self.frozen_values = FrozenMap(self.values)

    def __hash__(self) -> int:
        """Hash of the parameter values (computed once; the dataclass equality compares every field), so that a set
        can be part of a memo key (the step model's rates, :func:`moetune.perfmodel.step._rates_of`). A set is
        immutable once built: :meth:`with_values` and the loaders make new ones."""
        return hash(self.frozen_values)

    def __getitem__(self, name: str) -> float:
        """The value of a parameter; one that the set lacks is an error naming it (no silent default)."""
        try:
            return self.values[name]
        except KeyError:
            raise InputError(f"{self.origin}: efficiency parameter {name!r} missing (the shipped "
                             "catalog/efficiency.yaml defines every parameter the step-time model reads)",
                             field="efficiency") from None

    def get(self, name: str, default: float) -> float:
        return self.values.get(name, default)

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    @property
    def fit_names(self) -> list[str]:
        """Parameters a default fit adjusts (all but the ``fixed`` ones)."""
        return [k for k, s in self.specs.items() if not s.fixed]

    def with_values(self, values: dict[str, float], *, origin: str | None = None,
                    fit_info: dict[str, Any] | None = None) -> Efficiency:
        new = dict(self.values)
        new.update(values)
        return Efficiency(self.specs, self.constants, self.prior_weight, fit_info if fit_info is not None
                          else self.fit_info, origin or self.origin, new)

    def to_yaml_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "params": {
                k: {"value": float(round(self.values[k], 6)), "prior": s.prior, "bounds": [s.lo, s.hi],
                    "source": s.source, **({"fixed": True} if s.fixed else {})}
                for k, s in self.specs.items()
            },
            "constants": self.constants,
            "prior_weight": self.prior_weight,
            "fit": self.fit_info,
        }

    def cache_key(self) -> tuple:
        return tuple(sorted(self.values.items()))


def _parse(data: Any, origin: str) -> Efficiency:
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise InputError(f"{origin}: expected a mapping with 'params' (moetune efficiency file)", field="efficiency")
    base = default_efficiency() if origin != "catalog" else None
    specs: dict[str, ParamSpec] = dict(base.specs) if base else {}
    values: dict[str, float] = dict(base.values) if base else {}
    for name, p in data["params"].items():
        try:
            if isinstance(p, dict):
                val = float(p["value"])
                prior = float(p.get("prior", val))
                lo, hi = (float(x) for x in p.get("bounds", [val * 0.1, val * 10]))
                src = str(p.get("source", ""))
                fixed = bool(p.get("fixed", False))
            else:
                val = float(p)
                old = specs.get(name)
                prior, lo, hi, src = (old.prior, old.lo, old.hi, old.source) if old else (val, val / 10, val * 10, "")
                fixed = old.fixed if old else False
        except (KeyError, TypeError, ValueError):
            raise InputError.bad_value(f"efficiency.params.{name}", p, "a number or {value, prior, bounds}") from None
        if base is not None and name not in base.specs:
            raise InputError.bad_value("efficiency.params", name, f"one of {', '.join(base.specs)}")
        if not (math.isfinite(val) and val > 0):
            raise InputError.bad_value(f"efficiency.params.{name}", val, "a positive number")
        specs[name] = ParamSpec(name, val, prior, lo, hi, src, fixed)
        values[name] = val
    constants = dict(base.constants) if base else {}
    constants.update(data.get("constants") or {})
    return Efficiency(specs, constants, float(data.get("prior_weight", base.prior_weight if base else 0.15)),
                      data.get("fit"), origin, values)


@memo(maxsize=256)
def default_efficiency() -> Efficiency:
    """The shipped parameter set (``moetune/catalog/efficiency.yaml``)."""
    text = (resources.files("moetune.catalog") / "efficiency.yaml").read_text()
    return _parse(load_yaml(text), "catalog")


def load_efficiency(path: str | Path | None = None) -> Efficiency:
    """The shipped parameters, or a user file written by ``moetune calibrate`` (missing names keep defaults)."""
    if path is None:
        return default_efficiency()
    from moetune.files import read_text

    p = Path(path)
    text = read_text(p, "an efficiency YAML (from moetune calibrate)")
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{p}: not valid YAML ({exc.__class__.__name__})", field="efficiency") from None
    return _parse(data, str(p))


_HEADER = """\
# Efficiency parameters of the moetune step-time model (moetune.perfmodel.calibration).
#
# Each parameter is a physical fraction or cost, named for what it is: the step-time model divides work (FLOPs,
# bytes, kernel launches) by peak rates from the system catalog times these fractions. `value` is what the model
# uses; `prior` is the documented starting point the fit is weakly pulled to (weight `prior_weight`), with its
# `source`; `bounds` are hard limits. `constants` are counts and sizes read from sources (not fitted).
# `fit` says how the values were fitted (moetune calibrate / bench/steptime_accuracy.py --refit --write-catalog).
# Pass a file of this format with `moetune estimate ... --efficiency FILE` or MOETUNE_EFFICIENCY=FILE.
"""


def save_efficiency(eff: Efficiency, path: str | Path) -> None:
    """Write ``eff`` in the catalog format (readable by :func:`load_efficiency`)."""
    from moetune.files import write_atomic

    write_atomic(path, _HEADER + yaml.safe_dump(eff.to_yaml_dict(), sort_keys=False, width=120))


# --------------------------------------------------------------------------------------------------------------
# fitting
# --------------------------------------------------------------------------------------------------------------


@dataclass
class FitResult:
    efficiency: Efficiency
    fitted: list[str]
    residuals: np.ndarray  # log(pred / measured) per row
    cost: float
    nfev: int


def fit(
    predict: Callable[[Efficiency], np.ndarray],
    measured: Sequence[float],
    base: Efficiency,
    names: Sequence[str] | None = None,
    *,
    max_nfev: int = 200,
    start: str = "values",
) -> FitResult:
    """Least-squares fit of ``names`` (default: all) so that ``predict(eff)`` ≈ ``measured``.

    Residuals are ``log(pred/measured)`` (scale-free, symmetric in over/under-prediction) with a soft-L1 loss
    (robust to a few rows whose recipe features are unknown), plus ``prior_weight · log(value/prior)`` per
    parameter. Parameters are optimised in log space within their bounds, starting from ``base``'s values
    (``start="values"``) or from the documented priors (``start="prior"``: the result then does not depend on what
    was fitted before, which makes the shipped catalog reproducible). Source: scipy.optimize.least_squares.
    """
    from scipy.optimize import least_squares

    names = list(names or base.fit_names)
    meas = np.asarray(measured, dtype=float)
    specs = [base.specs[n] for n in names]
    x_init = [s.prior if start == "prior" else base.values[n] for n, s in zip(names, specs, strict=True)]
    x0 = np.log([min(max(v, s.lo * 1.0001), s.hi * 0.9999) for v, s in zip(x_init, specs, strict=True)])
    lo = np.log([s.lo for s in specs])
    hi = np.log([s.hi for s in specs])
    prior = np.log([s.prior for s in specs])
    w = base.prior_weight

    def resid(x: np.ndarray) -> np.ndarray:
        eff = base.with_values(dict(zip(names, np.exp(x), strict=True)))
        pred = predict(eff)
        r = np.log(np.maximum(pred, 1e-9) / meas)
        return np.concatenate([r, w * (x - prior)])

    res = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.15, max_nfev=max_nfev,
                        diff_step=1e-3, x_scale=1.0, ftol=1e-5, xtol=1e-5, gtol=1e-6)
    vals = dict(zip(names, (float(v) for v in np.exp(res.x)), strict=True))
    eff = base.with_values(vals)
    r = resid(res.x)[: len(meas)]
    return FitResult(eff, names, r, float(res.cost), int(res.nfev))


#: fit budget of :func:`fit_runs` (model evaluations per fitted parameter); enough for the fit to converge from the
#: priors on the shipped table, so ``moetune calibrate`` reproduces the shipped catalog
NFEV_PER_PARAM = 40


class RunPredictor:
    """Model TFLOP/s/GPU of measured runs under any efficiency set (work profiles built once; hot path of fits).

    TFLOP/s use the Megatron-Bridge FLOPs definition of each run's release and task
    (:func:`flops.task_flops_per_token`: LoRA rows count the frozen layers' forward + dgrad, as Bridge does)."""

    def __init__(self, runs: Sequence[MeasuredRun], base: Efficiency | None = None) -> None:
        from moetune.perfmodel.flops import task_flops_per_token
        from moetune.perfmodel.step import build_profile

        self.runs = list(runs)
        self.profiles = [build_profile(r.job, base) for r in self.runs]
        self.fpt = [task_flops_per_token(r.job.model, r.job.seq_length, r.job.layout.tp, r.job.features.task,
                                         r.definition) for r in self.runs]
        self.measured = np.array([r.tflops for r in self.runs], dtype=float)

    def __call__(self, eff: Efficiency, idx: Sequence[int] | None = None) -> np.ndarray:
        from moetune.perfmodel.step import evaluate

        out = []
        for i in (range(len(self.runs)) if idx is None else idx):
            job = self.runs[i].job
            step = evaluate(self.profiles[i], eff).step
            out.append(job.global_batch_size * job.seq_length / (step * job.gpus) * self.fpt[i] / 1e12)
        return np.asarray(out)


def fit_runs(pred: RunPredictor, base: Efficiency, idx: Sequence[int] | None = None,
             names: Sequence[str] | None = None, *, nfev_per_param: int = NFEV_PER_PARAM) -> FitResult:
    """The one fit of the efficiency parameters to measured runs (``moetune calibrate``, the accuracy bench, every
    cross-validation fold): :func:`fit` from the documented priors on the rows ``idx`` (default all)."""
    idx = list(range(len(pred.runs))) if idx is None else list(idx)
    names = list(names or base.fit_names)
    return fit(lambda e: pred(e, idx), pred.measured[idx], base, names, max_nfev=nfev_per_param * len(names),
               start="prior")


#: held-out fold kinds of the cross-validation: the key that groups runs into folds
FOLD_KINDS: dict[str, Callable[[MeasuredRun], str]] = {
    "system": lambda r: r.system,
    "model": lambda r: r.model_name,
    "release": lambda r: r.release or "unknown",
}


@dataclass
class CrossValidation:
    """Held-out predictions of one fold kind: every run predicted by the fit on the runs of the other folds."""

    kind: str
    predicted: np.ndarray  # model TFLOP/s/GPU, held-out
    folds: dict[str, list[int]]
    fits: dict[str, Efficiency]

    def log_residuals(self, measured: np.ndarray) -> np.ndarray:
        return np.log(self.predicted / measured)


def cross_validate(pred: RunPredictor, base: Efficiency, kind: str, *,
                   nfev_per_param: int = NFEV_PER_PARAM) -> CrossValidation:
    """Leave-one-``kind``-out (``system``, ``model`` or ``release``): fit on the other folds from the priors
    (:func:`fit_runs`), predict the held-out one. Parameters no training run constrains stay at their priors."""
    key = FOLD_KINDS[kind]
    folds: dict[str, list[int]] = {}
    for i, r in enumerate(pred.runs):
        folds.setdefault(key(r), []).append(i)
    out = np.zeros(len(pred.runs))
    fits: dict[str, Efficiency] = {}
    for name, test in sorted(folds.items()):
        held = set(test)
        train = [i for i in range(len(pred.runs)) if i not in held]
        res = fit_runs(pred, base, train, nfev_per_param=nfev_per_param)
        fits[name] = res.efficiency
        out[test] = pred(res.efficiency, test)
    return CrossValidation(kind, out, folds, fits)


# --------------------------------------------------------------------------------------------------------------
# measured runs (columns of data/perf/mbridge_perf_calibration.csv)
# --------------------------------------------------------------------------------------------------------------

REQUIRED_COLUMNS = ("model", "system", "num_gpus", "precision", "gbs", "mbs", "seq_len", "tp", "pp", "cp", "vp", "ep",
                    "model_tflops_per_gpu")


@dataclass
class MeasuredRun:
    """One measured (or published) run and the job moetune builds for it."""

    label: str
    model_name: str
    system: str
    gpus: int
    precision_label: str
    tflops: float
    job: Any  # moetune.spec.job.Job
    release: str = ""
    status: str = ""
    definition: str = "current"


def _first(value: str, alt: bool = False) -> str:
    """'3986 (3546)' -> '3986' (or '3546' with alt); plain values unchanged."""
    v = (value or "").strip()
    if "(" in v:
        head, _, tail = v.partition("(")
        return (tail.rstrip(")").strip() if alt else head.strip()) or head.strip()
    return v


def _int(value: str, field_name: str, default: int | None = None, *, alt: bool = False) -> int | None:
    v = _first(value, alt)
    if v.lower() in ("", "n/a", "na", "none", "-"):
        return default
    try:
        return int(float(v))
    except ValueError:
        raise InputError.bad_value(field_name, value, "an integer or n/a") from None


#: CSV size columns that must be positive when given (counts of GPUs, sequences, tokens, ranks)
POSITIVE_COLUMNS = ("num_gpus", "gbs", "mbs", "seq_len", "tp", "pp", "cp", "vp", "ep", "etp")


def _check_row_values(path: Path, line: int, row: dict) -> None:
    """Impossible values are errors, not skipped rows: non-positive sizes, non-finite or non-positive TFLOP/s."""
    for col in (*POSITIVE_COLUMNS, "model_tflops_per_gpu"):
        cell = row.get(col)
        if not isinstance(cell, str):
            continue
        for alt in (False, True):
            v = _first(cell, alt)
            try:
                x = float(v)
            except ValueError:
                continue  # non-numeric cells (n/a, text) are judged per row below
            if not math.isfinite(x) or x <= 0 or (col != "model_tflops_per_gpu" and not x.is_integer()):
                what = "a positive number" if col == "model_tflops_per_gpu" else "a positive integer"
                raise InputError(f"{path}: line {line}: {col}={cell.strip()!r}: expected {what}", field=col,
                                 value=cell, expected=what)


def precision_variants(label: str) -> list[str]:
    """Precision labels of a table cell: 'FP8-CS (FP8-MX)' -> ['FP8-CS', 'FP8-MX'] (the table's two runs)."""
    lab = (label or "").strip()
    if "(" in lab:
        head, _, tail = lab.partition("(")
        return [head.strip(), tail.rstrip(")").strip()]
    return [lab] if lab else []


def read_measured_csv(path: str | Path, *, job_builder: Callable[..., Any]) -> tuple[list[MeasuredRun], list[str]]:
    """Rows of a measured-throughput CSV as jobs; returns (runs, skipped-row descriptions).

    ``job_builder(model, system, gpus, precision, gbs, mbs, seq, tp, pp, cp, vp, ep, etp, fsdp, release, task)``
    (``task``: the row's ``task`` column, pretrain when empty) makes
    the Job (features from the Bridge recipe, or the release's workload preset, when one exists). A cell such as ``FP8-CS (FP8-MX)`` with numbers
    ``37556 (36108)`` is two runs. Rows whose model is not in the catalog, or whose precision is not given, are
    skipped with the reason.
    """
    import csv
    import io

    from moetune.catalog.models import get_model
    from moetune.errors import UnknownNameError
    from moetune.files import read_text
    from moetune.spec.features import parse_precision

    p = Path(path)
    text = read_text(p, "a measured-runs CSV (columns of mbridge_perf_calibration.csv)")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"{p}: missing column(s) {', '.join(missing)}; expected the columns of "
                             "mbridge_perf_calibration.csv", field="csv")
        rows = list(reader)
    except csv.Error as exc:  # e.g. a field over csv.field_size_limit(), a NUL byte
        raise InputError(f"{p}: line {reader.line_num + 1}: malformed CSV ({exc}); expected one run per line",
                         field="csv") from None
    for n, row in enumerate(rows, start=2):
        _check_row_values(p, n, row)
    runs: list[MeasuredRun] = []
    skipped: list[str] = []
    for n, row in enumerate(rows, start=2):
        name = row["model"].strip()
        desc = f"line {n}: {name} {row['system']} {row['num_gpus']} GPUs {row.get('release', '')}".strip()
        variants = precision_variants(row["precision"])
        if not variants:
            skipped.append(f"{desc}: precision not given")
            continue
        try:
            model = get_model(name)
        except UnknownNameError:
            base = name.split("(")[0].strip()
            tag = name[len(base):].strip().lower()
            if tag in ("(dropless)", "(w/ mtp)"):
                model = get_model(base)
            else:
                skipped.append(f"{desc}: model not in the catalog")
                continue
        for vi, plab in enumerate(variants):
            alt = vi == 1
            try:
                prec = parse_precision(plab)
                tfl = float(_first(row["model_tflops_per_gpu"], alt))
                job = job_builder(
                    model=model, system=row["system"].strip(), gpus=_int(row["num_gpus"], "num_gpus", alt=alt),
                    precision=prec, gbs=_int(row["gbs"], "gbs", alt=alt), mbs=_int(row["mbs"], "mbs", 1, alt=alt),
                    seq=_int(row["seq_len"], "seq_len", alt=alt), tp=_int(row["tp"], "tp", 1, alt=alt),
                    pp=_int(row["pp"], "pp", 1, alt=alt), cp=_int(row["cp"], "cp", 1, alt=alt),
                    vp=_int(row["vp"], "vp", None, alt=alt), ep=_int(row["ep"], "ep", 1, alt=alt),
                    etp=_int(row.get("etp", ""), "etp", None, alt=alt),
                    fsdp=_int(row.get("fsdp", ""), "fsdp", 0, alt=alt) or 0,
                    release=row.get("release", "").strip() or None,
                    task=(row.get("task") or "").strip() or "pretrain",
                )
            except InputError as exc:
                skipped.append(f"{desc} [{plab}]: {exc}")
                continue
            except ValueError as exc:  # the Job's own validation (pydantic): an impossible row is an error
                from moetune.errors import validation_message

                raise InputError(f"{p}: line {n}: {validation_message(exc)}", field="csv") from None
            lay = job.layout
            if job.gpus % (lay.tp * lay.cp * lay.pp) or job.gpus % (lay.expert_tp * lay.ep * lay.pp):
                skipped.append(f"{desc} [{plab}]: layout {lay.short()} PP{lay.pp} does not divide {job.gpus} GPUs")
                continue
            definition = "current"
            rel = row.get("release", "").strip()
            if rel:
                try:
                    from moetune.perfmodel.flops import bridge_definition_for_release

                    definition = bridge_definition_for_release(rel)
                except (ImportError, InputError, ValueError):
                    definition = "current"
            runs.append(MeasuredRun(f"{desc} [{plab}]", model.name, row["system"].strip(), job.gpus, plab, tfl, job,
                                    rel, row.get("status", ""), definition))
    return runs, skipped

