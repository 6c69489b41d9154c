"""Vectorised interval algebra on half-open integer intervals ``[start, end)`` (numpy, no Python loops per interval).

A *set* is a pair ``(starts, ends)`` of sorted, disjoint, non-empty intervals, as returned by :func:`union`.
This is the method of the Megatron-Bridge nsys skill (docs/domain.md §7.2): build interval unions per class and
measure intersections, never add kernel durations.
"""

from __future__ import annotations

import numpy as np

IntervalSet = tuple[np.ndarray, np.ndarray]

_EMPTY = np.zeros(0, np.int64)


def empty() -> IntervalSet:
    return _EMPTY.copy(), _EMPTY.copy()


def union(starts: np.ndarray, ends: np.ndarray) -> IntervalSet:
    """Merge possibly overlapping intervals into a sorted disjoint set (touching intervals are merged)."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return empty()
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # a new block starts where the start is beyond every earlier end
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    last = np.r_[idx[1:] - 1, s.size - 1]
    out_e = run_end[last]
    return out_s, out_e


def total(a: IntervalSet) -> int:
    return int((a[1] - a[0]).sum())


def _boundary_sweep(sets: list[IntervalSet], need: int) -> IntervalSet:
    """Points covered by at least ``need`` of the given disjoint sets (sweep over +1/-1 events)."""
    starts = np.concatenate([s for s, _ in sets]) if sets else _EMPTY
    ends = np.concatenate([e for _, e in sets]) if sets else _EMPTY
    if starts.size == 0:
        return empty()
    t = np.concatenate([starts, ends])
    d = np.concatenate([np.ones(starts.size, np.int64), -np.ones(ends.size, np.int64)])
    order = np.lexsort((d, t))  # at equal times, ends (-1) first: half-open intervals
    t, d = t[order], d[order]
    level = np.cumsum(d)
    inside = level >= need
    # boundaries where coverage crosses the threshold
    prev = np.r_[False, inside[:-1]]
    open_idx = np.flatnonzero(inside & ~prev)
    close_idx = np.flatnonzero(~inside & prev)
    s, e = t[open_idx], t[close_idx]
    keep = e > s
    return s[keep], e[keep]


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """a ∩ b for two disjoint sets."""
    return _boundary_sweep([a, b], 2)


def merge(*sets: IntervalSet) -> IntervalSet:
    """Union of several disjoint sets."""
    sets = [s for s in sets if s[0].size]
    if not sets:
        return empty()
    return union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """a − b for two disjoint sets."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    inter = intersect(a, b)
    if inter[0].size == 0:
        return a
    # a − (a∩b): complement of inter within a, via the sweep with inter counted negatively
    t = np.concatenate([a[0], a[1], inter[0], inter[1]])
    d = np.concatenate(
        [
            np.ones(a[0].size, np.int64),
            -np.ones(a[1].size, np.int64),
            -np.ones(inter[0].size, np.int64),
            np.ones(inter[1].size, np.int64),
        ]
    )
    order = np.lexsort((d, t))
    t, d = t[order], d[order]
    level = np.cumsum(d)
    inside = level >= 1
    prev = np.r_[False, inside[:-1]]
    s = t[np.flatnonzero(inside & ~prev)]
    e = t[np.flatnonzero(~inside & prev)]
    keep = e > s
    return s[keep], e[keep]


def clip(a: IntervalSet, lo: int, hi: int) -> IntervalSet:
    s = np.clip(a[0], lo, hi)
    e = np.clip(a[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def complement(a: IntervalSet, lo: int, hi: int) -> IntervalSet:
    """[lo, hi) − a."""
    a = clip(a, lo, hi)
    if a[0].size == 0:
        return (np.array([lo], np.int64), np.array([hi], np.int64)) if hi > lo else empty()
    s = np.r_[lo, a[1]]
    e = np.r_[a[0], hi]
    keep = e > s
    return s[keep], e[keep]


def measure_in_windows(a: IntervalSet, w_start: np.ndarray, w_end: np.ndarray) -> np.ndarray:
    """Length of ``a ∩ [w_start[i], w_end[i])`` for every window i (vectorised with prefix sums)."""
    w_start = np.asarray(w_start, np.int64)
    w_end = np.asarray(w_end, np.int64)
    if a[0].size == 0 or w_start.size == 0:
        return np.zeros(w_start.size, np.int64)
    s, e = a
    cum = np.r_[0, np.cumsum(e - s)]

    def covered_before(x: np.ndarray) -> np.ndarray:
        # measure of a ∩ (-inf, x)
        k = np.searchsorted(s, x, side="right")  # intervals starting before x
        full = cum[np.maximum(k - 1, 0)] * (k > 0)
        last_s = s[np.maximum(k - 1, 0)]
        last_e = e[np.maximum(k - 1, 0)]
        part = np.where(k > 0, np.minimum(last_e, x) - last_s, 0)
        return full + np.maximum(part, 0)

    return covered_before(w_end) - covered_before(w_start)
