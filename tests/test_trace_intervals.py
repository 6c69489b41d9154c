"""Interval algebra against a brute-force boolean timeline (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.evidence.traces import intervals as iv

T = 200
ivals = st.lists(st.tuples(st.integers(0, T), st.integers(0, 40)), max_size=25)


def _grid(pairs) -> np.ndarray:
    g = np.zeros(T + 50, bool)
    for s, d in pairs:
        g[s : s + d] = True
    return g


def _set(pairs) -> iv.IntervalSet:
    s = np.array([p[0] for p in pairs], np.int64)
    e = np.array([p[0] + p[1] for p in pairs], np.int64)
    return iv.union(s, e)


def _grid_of(a: iv.IntervalSet) -> np.ndarray:
    g = np.zeros(T + 50, bool)
    for s, e in zip(*a, strict=True):
        g[s:e] = True
    return g


@settings(max_examples=150, deadline=None)
@given(ivals, ivals)
def test_union_intersect_subtract_match_bruteforce(a, b):
    ga, gb = _grid(a), _grid(b)
    A, B = _set(a), _set(b)
    assert iv.total(A) == ga.sum()
    assert np.all(A[0][1:] > A[1][:-1])  # disjoint, sorted, not touching
    assert np.array_equal(_grid_of(iv.intersect(A, B)), ga & gb)
    assert np.array_equal(_grid_of(iv.subtract(A, B)), ga & ~gb)
    assert np.array_equal(_grid_of(iv.merge(A, B)), ga | gb)
    assert np.array_equal(_grid_of(iv.complement(A, 10, 150)), ~ga & (np.arange(T + 50) >= 10)
                          & (np.arange(T + 50) < 150))


@settings(max_examples=100, deadline=None)
@given(ivals, st.lists(st.tuples(st.integers(0, T), st.integers(0, 60)), min_size=1, max_size=6))
def test_measure_in_windows(a, wins):
    A = _set(a)
    ga = _grid(a)
    w0 = np.array([w[0] for w in wins], np.int64)
    w1 = np.array([w[0] + w[1] for w in wins], np.int64)
    got = iv.measure_in_windows(A, w0, w1)
    want = [ga[s:e].sum() for s, e in zip(w0, w1, strict=True)]
    assert list(got) == want


def test_never_sum_durations():
    # two fully overlapping kernels: the union is one kernel long
    a = iv.union(np.array([0, 0]), np.array([10, 10]))
    assert iv.total(a) == 10
