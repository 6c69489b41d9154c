"""Steady-state window and per-run summary (docs/domain.md §7.1 "Windows").

Window rules, applied per run segment (a restart starts a new segment):

1. Warm-up: the first logged iteration of a segment is dropped when it covers the start of training (its iteration
   number is within one log interval of the start) or follows a restart — it includes step 1 (allocator growth,
   NCCL communicator setup, kernel autotuning, graph capture). Then leading iterations slower than
   ``1 + WARMUP_TOLERANCE`` times the segment median are dropped (at most ``WARMUP_MAX_FRACTION`` of it).
2. Intervals that held an nsys/torch-profiler capture, a checkpoint save, an evaluation or CUDA-graph capture are
   dropped (one nsys capture inflated a Bridge step from 14.26 to 16.85 s, data/logs), as are intervals with skipped
   (fp16 loss-scale overflow: no optimizer step) or NaN iterations, and lines without a timing.
3. A level shift inside the remaining samples (best single split, both sides >= ``SHIFT_MIN_SIDE`` samples, median
   ratio >= ``SHIFT_MIN_RATIO``, Mann-Whitney U p < ``SHIFT_MAX_P`` after a Bonferroni correction for the number of
   split points scanned) means the run is not steady across it: the
   window is the longer side (the later one on a tie), and the shift is reported.

A declared window (``A-B``, inclusive iteration numbers) replaces rules 1 and 3; rule 2 still applies.

Statistics: median and mean of the per-iteration elapsed time (Megatron averages it over the log interval), a
distribution-free 95 % confidence interval of the median from binomial order statistics, and a 95 % bootstrap
interval of the mean (``numpy``, fixed seed).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from moetune.errors import InputError, MoetuneError
from moetune.evidence.contract import contract_fields
from moetune.evidence.logs.model import (
    FLAG_CHECKPOINT,
    FLAG_EVAL,
    FLAG_GRAPH_CAPTURE,
    FLAG_PROFILED,
    FLAG_SEGMENT_START,
    FLAG_TRUNCATED,
    RunRecord,
)

WARMUP_TOLERANCE = 0.25
WARMUP_MAX_FRACTION = 0.2
SHIFT_MIN_SIDE = 4
SHIFT_MIN_RATIO = 1.15
SHIFT_MAX_P = 0.05
SHIFT_MAX_BLOCKS = 200
MAX_EXCLUDED_LISTED = 100
MAX_LISTED = 1000
BOOTSTRAP_MAX_N = 2000
MEDIAN_CI_EXACT_MAX = 1000
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240501
GIB = 2**30

_EXCLUDE_FLAGS = (
    (FLAG_PROFILED, "profiler capture"),
    (FLAG_CHECKPOINT, "checkpoint save"),
    (FLAG_EVAL, "evaluation"),
    (FLAG_GRAPH_CAPTURE, "CUDA-graph capture"),
    (FLAG_TRUNCATED, "truncated line"),
)


def parse_window(text: str | None) -> tuple[int, int] | None:
    """``"41-50"`` -> (41, 50); None passes through. Bad text -> InputError."""
    if text is None or text == "":
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[-:]\s*(\d+)\s*", str(text))
    if not m or int(m.group(1)) > int(m.group(2)):
        raise InputError.bad_value("--window", text, "FIRST-LAST iteration numbers, e.g. 41-50")
    return int(m.group(1)), int(m.group(2))


@dataclass
class Window:
    """The steady samples of a run: indices into the iteration table plus why others were dropped."""

    indices: np.ndarray
    iterations: np.ndarray
    times_s: np.ndarray
    source: str  # "declared" | "detected"
    excluded: list[dict[str, Any]] = field(default_factory=list)
    level_shift: dict[str, Any] | None = None
    excluded_counts: dict[str, int] = field(default_factory=dict)

    @property
    def bounds(self) -> tuple[int, int] | None:
        if len(self.iterations) == 0:
            return None
        return int(self.iterations.min()), int(self.iterations.max())


def nan_as_zero(x: np.ndarray) -> np.ndarray:
    """``np.nan_to_num(x, nan=0.0)`` (NaN -> 0, ±inf -> the largest finite values) of a fresh column; an all-finite
    column is returned as it is, one without infinities takes one ``where``."""
    fin = np.isfinite(x)
    if fin.all():
        return x
    if not np.isinf(x).any():
        return np.where(fin, x, 0.0)
    return np.nan_to_num(x, nan=0.0)


def log_interval(rec: RunRecord, it: np.ndarray | None = None) -> int:
    """The log interval: the median of the positive steps between logged iterations (``it``: the iteration column
    when the caller has it)."""
    if it is None:
        it = rec.iterations.col("iteration")
    if len(it) < 2:
        return int(rec.meta.get("log_interval", 1))
    d = np.diff(it)
    pos = d > 0
    if not pos.all():
        d = d[pos]
    if not len(d):
        return 1
    lo = d.min()
    return int(lo) if lo == d.max() else int(np.median(d))  # (a constant step is its own median)


def block_medians(x: np.ndarray, edges: np.ndarray, group: int = 32) -> np.ndarray:
    """``np.median(x[a:b])`` for each block ``[a, b)`` of consecutive ``edges``, up to ``group`` blocks of one length
    at a time (``np.median`` along the rows of a 2-D copy partitions each row as it partitions the slice's copy, and
    averages the same two middle values); the copies hold at most ``group`` blocks."""
    lo, hi = edges[:-1], edges[1:]
    size = hi - lo
    out = np.empty(len(lo))
    for m in np.unique(size).tolist():
        sel = np.flatnonzero(size == m)
        if not m:
            out[sel] = np.nan
            continue
        windows = np.lib.stride_tricks.sliding_window_view(x, m)
        for a in range(0, len(sel), group):
            part = sel[a:a + group]
            out[part] = np.median(windows[lo[part]], axis=1, overwrite_input=True)
    return out


def split_medians(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(left, right)`` with ``left[j] = np.median(x[:j])`` and ``right[j] = np.median(x[j:])`` for ``0 < j <
    len(x)`` (index 0 unused), for a short ``x`` (the <= ``SHIFT_MAX_BLOCKS`` values :func:`_shift` scans): every
    prefix sorted at once (one row per prefix, padded with +inf) and its middle order statistics taken as
    ``np.median`` takes them (the middle one for an odd count, ``(a + b) / 2`` of the two middle ones for an even
    count); suffixes the same on the reversed values. Non-finite data: one ``np.median`` per split."""
    m = len(x)
    left, right = np.full(m, np.nan), np.full(m, np.nan)
    if m < 2:
        return left, right
    if not np.isfinite(x).all():
        for j in range(1, m):
            left[j], right[j] = np.median(x[:j]), np.median(x[j:])
        return left, right
    cols = np.arange(m)
    for out, vals, size in ((left, x, cols[1:]), (right, x[::-1], m - cols[1:])):
        s = np.sort(np.where(cols[None, :] < size[:, None], vals[None, :], np.inf), axis=1)
        rows = np.arange(m - 1)
        a, b = s[rows, (size - 1) // 2], s[rows, size // 2]
        # + 0.0: np.median's mean starts from +0.0, so a zero median is +0.0 even where the middle values are -0.0
        out[1:] = np.where(size % 2 == 1, a, (a + b) / 2) + 0.0
    return left, right


def _shift(times: np.ndarray) -> tuple[int, float, float] | None:
    """Best single split of ``times`` by median ratio; returns (split index, ratio, p) when significant.

    Split points are scanned on at most ``SHIFT_MAX_BLOCKS`` consecutive blocks (block medians), so the scan is
    linear in the number of samples; the Mann-Whitney test then uses every sample on each side.
    """
    n = len(times)
    if n < 2 * SHIFT_MIN_SIDE:
        return None
    if n > SHIFT_MAX_BLOCKS:
        edges = np.linspace(0, n, SHIFT_MAX_BLOCKS + 1).astype(np.int64)
        cand = [int(e) for e in edges[1:-1] if SHIFT_MIN_SIDE <= e <= n - SHIFT_MIN_SIDE]
        bmed = block_medians(times, edges)
        pos = {int(e): i + 1 for i, e in enumerate(edges[1:-1])}
    else:
        cand = list(range(SHIFT_MIN_SIDE, n - SHIFT_MIN_SIDE + 1))
        bmed, pos = None, None
    best: tuple[int, float] | None = None
    sides = split_medians(bmed if bmed is not None else times)
    for k in cand:
        j = pos[k] if pos is not None else k
        left, right = sides[0][j], sides[1][j]
        if left <= 0 or right <= 0:
            continue
        score = abs(math.log(right / left))
        if best is None or score > best[1]:
            best = (k, score)
    if best is None or math.exp(best[1]) < SHIFT_MIN_RATIO:
        return None
    k = best[0]
    ratio = float(np.median(times[k:]) / np.median(times[:k]))
    if max(ratio, 1 / ratio) < SHIFT_MIN_RATIO:
        return None
    from scipy.stats import mannwhitneyu  # imported only when a candidate shift passed the ratio test

    p = float(mannwhitneyu(times[:k], times[k:], alternative="two-sided").pvalue)
    p = min(1.0, p * len(cand))  # Bonferroni over the candidate split points scanned
    if p >= SHIFT_MAX_P:
        return None
    return k, ratio, p


_REASONS = (
    "no step time",
    "warm-up (first logged iteration of the run)",
    "warm-up after restart",
    "profiler capture",
    "checkpoint save",
    "evaluation",
    "CUDA-graph capture",
    "truncated line",
    "skipped iteration(s) in the interval (no optimizer step)",
    "NaN iteration(s) in the interval",
    "warm-up (slow leading iteration)",
    "other side of a level shift",
)


def steady_window(rec: RunRecord, window: tuple[int, int] | None = None, *, strict: bool = True) -> Window:
    """Select the steady samples of ``rec`` (module docstring). Vectorised: linear in the number of rows.

    A declared ``window`` that holds no iteration of the log is an :class:`InputError` unless ``strict`` is False
    (``sweep collect`` judges runs that stopped before their window as not reaching it)."""
    tab = rec.iterations
    n = len(tab)
    it = tab.col("iteration")
    t = tab.col("elapsed_s")
    flags = tab.col("flags").astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    skipped = nan_as_zero(tab.col("skipped"))
    nans = nan_as_zero(tab.col("nan"))
    seg = tab.col("segment")
    keep = np.ones(n, dtype=bool)
    reason = np.full(n, -1, dtype=np.int16)

    def drop(mask: np.ndarray, code: int) -> None:
        hit = mask & keep
        if hit.any():
            reason[hit] = code
            keep[hit] = False

    if window is not None:
        keep &= (it >= window[0]) & (it <= window[1])
        if strict and n and not keep.any():
            lo, hi = int(np.nanmin(it)), int(np.nanmax(it))
            raise InputError(f"{rec.path}: --window {window[0]}-{window[1]} is outside the log (it has iterations "
                             f"{lo}-{hi}); expected FIRST-LAST within {lo}-{hi}", field="window",
                             value=f"{window[0]}-{window[1]}", expected=f"iterations within {lo}-{hi}")
    drop(~np.isfinite(t), 0)
    if window is None and n:
        interval = log_interval(rec, it)
        start_iter = float(np.nanmin(it))
        segstart = (flags & FLAG_SEGMENT_START) != 0
        first = segstart & (seg == 0) & (it <= max(interval, 1) + (1 if rec.source == "nemo" else 0)) & \
            (it <= start_iter + interval)
        drop(first, 1)
        drop(segstart & (seg > 0), 2)
    for code, (bit, _name) in enumerate(_EXCLUDE_FLAGS, start=3):
        drop((flags & bit) != 0, code)
    drop(skipped > 0, 8)
    drop(nans > 0, 9)
    shift = None
    if window is None and n:
        # leading slow iterations of each segment (segments are contiguous row ranges)
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(seg)) + 1, [n]])
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            idx = a + np.flatnonzero(keep[a:b])
            if len(idx) < 3:
                continue
            med = float(np.median(t[idx]))
            limit = max(1, int(WARMUP_MAX_FRACTION * len(idx)))
            slow = t[idx[:limit]] > med * (1 + WARMUP_TOLERANCE)
            stop = int(np.argmin(slow)) if not slow.all() else len(slow)
            if stop:
                m = np.zeros(n, dtype=bool)
                m[idx[:stop]] = True
                drop(m, 10)
        idx = np.flatnonzero(keep)
        found = _shift(t[idx]) if len(idx) else None
        if found:
            k, ratio, p = found
            left, right = idx[:k], idx[k:]
            chosen, other = (right, left) if len(right) >= len(left) else (left, right)
            shift = {"at_iteration": int(it[right[0]]), "before_s": float(np.median(t[left])),
                     "after_s": float(np.median(t[right])), "ratio": ratio, "p_value": p,
                     "window_side": "after" if chosen is right else "before"}
            m = np.zeros(n, dtype=bool)
            m[other] = True
            drop(m, 11)
    if window is None:
        tab.memo(("level_shift", rec.source), lambda: dict(shift) if shift else None)
    dropped = np.flatnonzero(reason >= 0)
    excluded = [{"iteration": int(it[i]), "reason": _REASONS[reason[i]]} for i in dropped[:MAX_EXCLUDED_LISTED]]
    codes, counts = np.unique(reason[dropped], return_counts=True)
    idx = np.flatnonzero(keep)
    w = Window(idx, it[idx], t[idx], "declared" if window else "detected", excluded, shift)
    w.excluded_counts = {_REASONS[c]: int(k) for c, k in zip(codes, counts, strict=True)}
    return w


def detected_level_shift(rec: RunRecord) -> dict[str, Any] | None:
    """The level shift :func:`steady_window` detects in ``rec`` (no declared window), or None; remembered on the
    iteration table until its rows change, so the summary and the diagnosis of one record scan once."""
    ls = rec.iterations.memo(("level_shift", rec.source), lambda: steady_window(rec).level_shift)
    return dict(ls) if ls else None


def _binom_half_cdf(n: int) -> np.ndarray:
    """CDF of Binomial(n, 1/2) at 0..n (exact, via math.comb; n <= MEDIAN_CI_EXACT_MAX)."""
    pmf = np.array([math.comb(n, k) for k in range(n + 1)], dtype=np.float64) / float(2**n)
    return np.cumsum(pmf)


def median_ci(x: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free CI of the median from binomial order statistics (None below 3 samples).

    The interval is [x_(l), x_(u)] with l the α/2 quantile of Binomial(n, ½) (0-based index l-1) and u its upper
    counterpart (exact for n <= ``MEDIAN_CI_EXACT_MAX``, normal approximation n/2 ± z·√n/2 above).
    """
    ranks = _median_ci_ranks(len(x), confidence)
    if ranks is None:
        return None
    lo, hi = ranks
    s = np.partition(x, [lo, hi])  # the two order statistics, as a full sort places them
    return float(s[lo]), float(s[hi])


def _median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """The 0-based ranks of the order statistics that bound :func:`median_ci` (None below 3 samples)."""
    if n < 3:
        return None
    alpha = 1 - confidence
    if n <= MEDIAN_CI_EXACT_MAX:
        cdf = _binom_half_cdf(n)
        lo = int(np.searchsorted(cdf, alpha / 2 - 1e-12))  # smallest k with CDF(k) >= alpha/2
        hi = int(np.flatnonzero(1.0 - cdf <= alpha / 2 + 1e-12)[0])  # smallest k with P(X > k) <= alpha/2
    else:
        z = NormalDist().inv_cdf(1 - alpha / 2)
        lo = int(math.floor(n / 2 - z * math.sqrt(n) / 2))
        hi = int(math.ceil(n / 2 + z * math.sqrt(n) / 2))
    return max(lo - 1, 0), min(hi, n - 1)


def median_and_ci(x: np.ndarray) -> tuple[float, tuple[float, float] | None]:
    """``(np.median(x), median_ci(x))`` from one ``np.partition`` of ``x``: the order statistics ``np.median``
    averages (``(a + b) / 2`` for an even count, as its mean of the two middle values), the two that bound the CI and
    the largest (NaN sorts last: ``np.median`` of data with a NaN is NaN). Order statistics are values of the data,
    the same whichever partition places them."""
    n = len(x)
    ranks = _median_ci_ranks(n)
    mid = [n // 2 - 1, n // 2] if n % 2 == 0 else [n // 2]
    s = np.partition(x, sorted({*mid, *(ranks or ()), n - 1}))
    if np.isnan(s[n - 1]):
        med = math.nan
    else:
        # + 0.0: np.median's mean starts from +0.0 (a zero median is +0.0 even where the middle values are -0.0)
        med = float(s[mid[0]]) + 0.0 if len(mid) == 1 else float((s[mid[0]] + s[mid[1]]) / 2) + 0.0
    return med, (float(s[ranks[0]]), float(s[ranks[1]])) if ranks else None


def bootstrap_ci(x: np.ndarray, stat=np.mean, confidence: float = CONFIDENCE,
                 resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:
    """Percentile bootstrap CI of ``stat``; above ``BOOTSTRAP_MAX_N`` samples of the mean, the normal
    approximation (mean ± z·sd/√n), which the bootstrap converges to. Resamples are drawn in chunks (bounded memory).
    """
    n = len(x)
    if n < 3:
        return None
    a = (1 - confidence) / 2
    if stat is np.mean and n > BOOTSTRAP_MAX_N:
        half = NormalDist().inv_cdf(1 - a) * float(np.std(x, ddof=1)) / math.sqrt(n)
        m = float(np.mean(x))
        return m - half, m + half
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    chunk = max(1, min(resamples, 2_000_000 // n))
    vals = []
    for start in range(0, resamples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        vals.append(stat(x[idx], axis=1))
    v = np.concatenate(vals)
    return float(np.quantile(v, a)), float(np.quantile(v, 1 - a))


@dataclass
class RunSummary:
    """What ``moetune logs`` reports for one run (JSON keys as in the issue)."""

    file: str
    source: str
    iterations: int
    iteration_range: list[int] | None
    segments: int
    steady_window: list[int] | None
    window_source: str
    samples: int
    step_time_s: dict[str, Any]
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: dict[str, Any]
    loss: dict[str, Any]
    memory: dict[str, Any]
    config: dict[str, Any]
    layout: dict[str, Any]
    versions: dict[str, str]
    timers_ms: dict[str, Any]
    excluded: list[dict[str, Any]]
    excluded_counts: dict[str, int]
    level_shift: dict[str, Any] | None
    bridge_step_time_s: dict[str, Any] | None
    notes: list[str]


def _stats(x: np.ndarray) -> dict[str, Any]:
    if len(x) == 0:
        return {"median": None, "mean": None, "ci": None, "mean_ci": None, "min": None, "max": None, "n": 0,
                "cv": None}
    med, ci = median_and_ci(x)
    mci = bootstrap_ci(x)
    mean = float(np.mean(x))
    return {"median": med, "mean": mean, "ci": list(ci) if ci else None,
            "mean_ci": list(mci) if mci else None, "min": float(np.min(x)), "max": float(np.max(x)), "n": int(len(x)),
            "cv": float(np.std(x) / mean) if len(x) > 1 and mean > 0 else None}


def loss_health(rec: RunRecord) -> dict[str, Any]:
    """Finite loss, NaN iterations (also from missing loss fields or a non-finite grad norm when Megatron's counters
    stay 0: ``training_log`` prints a loss key only when its interval average is > 0, which NaN is not) and skipped
    iterations (the per-interval counter summed). Remembered on the iteration table until its rows change (a copy is
    returned)."""
    return copy.deepcopy(rec.iterations.memo(("loss_health", rec.source), lambda: _loss_health(rec)))


def _loss_health(rec: RunRecord) -> dict[str, Any]:
    tab = rec.iterations
    if not len(tab):
        return {"finite": None, "nan_iterations": [], "skipped_iterations": 0}
    it = tab.col("iteration")
    loss = tab.col("loss")
    skipped = nan_as_zero(tab.col("skipped"))
    nanc = nan_as_zero(tab.col("nan"))
    missing = tab.col("loss_missing") == 1
    gn_bad = tab.col("grad_norm_nonfinite") == 1
    printed_nonfinite = np.isfinite(loss) == False  # noqa: E712 - elementwise
    printed_nonfinite &= ~missing
    # loss printed as nan/inf, or omitted while no iteration of the interval was skipped, or grad norm nan/inf
    nan_mask = (nanc > 0) | (missing & (skipped == 0)) | gn_bad
    if rec.source != "megatron-golden":
        nan_mask |= printed_nonfinite & np.isfinite(tab.col("elapsed_s")) & ~missing & (skipped == 0) & \
            ~np.isnan(tab.col("loss_scale"))
    nan_iters = [int(x) for x in it[nan_mask][:MAX_LISTED]]
    nan_total = int(nan_mask.sum())
    finite = np.isfinite(loss) & ~missing
    reasons = []
    if (nanc > 0).any():
        reasons.append("Megatron's nan-iteration counter")
    if (missing & (skipped == 0)).any():
        reasons.append("loss field missing with no skipped iteration (Megatron omits NaN losses)")
    if gn_bad.any():
        reasons.append("grad norm nan/inf")
    fl = loss if finite.all() else loss[finite]
    return {
        "finite": not nan_iters,
        "nan_iterations": nan_iters,
        "nan_iteration_count": nan_total,
        "nan_counter_total": int(nanc.sum()),
        "nan_detected_by": reasons,
        "skipped_iterations": int(skipped.sum()),
        "skipped_at": [int(x) for x in it[skipped > 0][:MAX_LISTED]],
        "first": float(fl[0]) if len(fl) else None,
        "last": float(fl[-1]) if len(fl) else None,
        "min": float(fl.min()) if len(fl) else None,
        "loss_scale_last": float(tab.last("loss_scale")) if math.isfinite(tab.last("loss_scale")) else None,
        "extra_losses": {k: v for k, v in ((k, last_finite(tab.col(k))) for k in tab.extra_losses) if v is not None},
    }


def last_finite(x: np.ndarray) -> float | None:
    """The last finite value of ``x`` (``x[np.isfinite(x)][-1]`` without the copy: ``argmax`` of the reversed
    finite mask stops at its first True), None when there is none."""
    fin = np.isfinite(x)
    if not fin.any():
        return None
    return float(x[len(x) - 1 - int(np.argmax(fin[::-1]))])


def memory_summary(rec: RunRecord) -> dict[str, Any]:
    peaks = rec.memory_peaks()
    per_rank = {r: {k.replace(" ", "_") + ("_gib" if k not in ("alloc retires", "allocated count") else ""):
                    (v / GIB if k not in ("alloc retires", "allocated count") else v) for k, v in vals.items()}
                for r, vals in peaks.items()}
    out: dict[str, Any] = {"per_rank": per_rank}
    for key in ("max allocated", "max reserved", "allocated", "reserved"):
        vals = [v[key] for v in peaks.values() if key in v]
        if vals:
            out[f"peak_{key.replace(' ', '_')}_gib"] = max(vals) / GIB
    if rec.memory_reports:
        out["report_unit"] = rec.memory_reports[0].unit
    if rec.meta.get("memory_rank"):
        out["rank_note"] = rec.meta["memory_rank"]
    if rec.theoretical_memory:
        th = rec.theoretical_memory[0]
        out["theoretical_mib"] = {"weight_and_optimizer": th.weight_and_optimizer_mib, "activation": th.activation_mib,
                                  "total": th.total_mib, "source": th.source}
    if rec.parameter_counts:
        out["parameters_billions"] = dict(rec.parameter_counts)
    return out


def model_tflops(rec: RunRecord, tokens_per_s_per_gpu: float, gpus: int) -> tuple[float, str] | None:
    """Model TFLOP/s/GPU = tokens/s/GPU × FLOPs/token (Megatron-Bridge definition, BPN §1) when the log does not print
    it: FLOPs/token from :func:`moetune.perfmodel.flops.flops_per_token` on the model the printed configuration
    describes (:func:`moetune.io.config_to_job.job_from_config`). None when either is unavailable."""
    if not rec.config:
        return None
    from moetune.evidence.record_job import job_for
    from moetune.perfmodel.flops import flops_per_token

    try:
        job = job_for(rec.config, rec, gpus)
    except (MoetuneError, ValueError):  # logs rarely print a complete model (ValueError: pydantic validation)
        return None
    fpt = flops_per_token(job.model, job.seq_length, job.layout.tp).total
    return tokens_per_s_per_gpu * fpt / 1e12, "computed: tokens/s/GPU x model FLOPs/token (Bridge definition)"


def summarize_run(rec: RunRecord, window: tuple[int, int] | str | None = None, *, gpus: int | None = None,
                  seq_length: int | None = None, strict_window: bool = True) -> RunSummary:
    """Summarise one run over its steady window (declared ``window`` or detected; see :func:`steady_window`)."""
    if isinstance(window, str):
        window = parse_window(window)
    with rec.iterations.decoded(), rec.step_time.decoded():
        return _summarize(rec, window, gpus, seq_length, strict_window)


def _summarize(rec: RunRecord, window: tuple[int, int] | None, gpus: int | None, seq_length: int | None,
               strict_window: bool) -> RunSummary:
    w = steady_window(rec, window, strict=strict_window)
    tab = rec.iterations
    notes: list[str] = []
    fields = contract_fields(rec)
    it_all = tab.col("iteration")
    st = _stats(w.times_s)
    tfl = tab.col("tflops")[w.indices] if len(w.indices) else np.zeros(0)
    tfl = tfl[np.isfinite(tfl)]
    tflops = {"median": float(np.median(tfl)) if len(tfl) else None,
              "mean": float(np.mean(tfl)) if len(tfl) else None, "source": "iteration lines" if len(tfl) else None}
    bridge = None
    if len(rec.step_time):
        sflags = rec.step_time.col("flags").astype(np.int64)
        sel = (sflags & FLAG_PROFILED) == 0
        sv = rec.step_time.col("elapsed_s")
        bridge = _stats(sv[sel])
        bridge["excluded_profiled"] = [float(x) for x in sv[~sel]]
        stf = rec.step_time.col("tflops")[sel]
        stf = stf[np.isfinite(stf)]
        bridge["tflops_median"] = float(np.median(stf)) if len(stf) else None
        if tflops["median"] is None and len(stf):
            tflops = {"median": float(np.median(stf)), "mean": float(np.mean(stf)),
                      "source": "Step Time … GPU utilization lines (rank 0)"}
    gbs = fields.get("global_batch_size")
    seq = seq_length or fields.get("seq_length")
    ngpu = gpus or fields.get("gpus")
    tokens = None
    if st["median"] and gbs and seq and ngpu:
        tokens = float(gbs) * float(seq) / st["median"] / float(ngpu)
    elif st["median"]:
        missing = [n for n, v in (("sequence length", seq), ("GPU count", ngpu), ("global batch size", gbs)) if not v]
        notes.append("tokens/s/GPU needs " + ", ".join(missing) + " (not printed in the log; pass --seq-length/--gpus)")
    if tflops["median"] is None and tokens:
        tf = model_tflops(rec, tokens, int(ngpu))
        if tf is not None:
            tflops = {"median": tf[0], "mean": None, "source": tf[1]}
    if w.level_shift:
        ls = w.level_shift
        notes.append(f"step time shifts at iteration {ls['at_iteration']}: {ls['before_s']:.4g} s -> "
                     f"{ls['after_s']:.4g} s (x{ls['ratio']:.3g}); window uses the {ls['window_side']} side")
    if 0 < len(w.indices) < 6:
        notes.append(f"only {len(w.indices)} steady samples (screens use 6-12, acceptance >= 50 steps)")
    if rec.truncated_last_line:
        notes.append("last line of the file is truncated")
    if rec.segments > 1:
        notes.append(f"{rec.segments - 1} restart(s) at line(s) {rec.restart_lines[:10]}")
    layout = {k: fields.get(k) for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "pipeline_layout", "micro_batch_size",
                                         "global_batch_size", "seq_length", "gpus", "precision", "dispatcher")
              if fields.get(k) is not None}
    timers = {name: {"last_min": t.last_min_ms, "last_max": t.last_max_ms, "mean_max": t.mean_max_ms,
                     "count": t.count} for name, t in rec.timers.items()}
    return RunSummary(
        file=rec.path,
        source=rec.source,
        iterations=len(tab),
        iteration_range=[int(it_all.min()), int(it_all.max())] if len(tab) else None,
        segments=rec.segments,
        steady_window=list(w.bounds) if w.bounds else None,
        window_source=w.source,
        samples=len(w.indices),
        step_time_s=st,
        tokens_per_s_per_gpu=tokens,
        tflops_per_gpu=tflops,
        loss=loss_health(rec),
        memory=memory_summary(rec),
        config={k: v for k, v in rec.config.items()} | ({"config_source": rec.config_source} if rec.config_source
                                                       else {}),
        layout=layout,
        versions=dict(rec.versions),
        timers_ms=timers,
        excluded=w.excluded,
        excluded_counts=w.excluded_counts,
        level_shift=w.level_shift,
        bridge_step_time_s=bridge,
        notes=notes,
    )
