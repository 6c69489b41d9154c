"""Packed per-iteration columns (moetune.evidence.logs.columns): lossless, compact."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moetune.evidence.logs.columns import CHUNK, PackedColumn, decode, encode
from moetune.evidence.logs.model import IterationTable

_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**40), 2**40).map(float),
    st.decimals(min_value=-1e6, max_value=1e6, places=3, allow_nan=False, allow_infinity=False).map(float),
    st.sampled_from([0.0, -0.0, 1.0, float("nan")]),
)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    # bit-identical except NaN payloads
    return a.shape == b.shape and bool((np.isnan(a) == np.isnan(b)).all()) and bool(
        (a.view(np.uint64) == b.view(np.uint64))[~np.isnan(a)].all())


@settings(max_examples=60, deadline=None)
@given(st.lists(_values, min_size=1, max_size=300), st.integers(1, 40))
def test_encode_roundtrip_bit_exact(vals, reps):
    a = np.array((vals * reps)[:CHUNK], dtype=np.float64)
    assert _same(decode(encode(a.copy())), a)


def test_formatted_columns_are_compact_and_exact():
    rng = np.random.default_rng(1)
    n = CHUNK
    cols = {
        "ms_as_s": np.array([float(f"{x:.1f}") for x in rng.uniform(100, 2e5, n)]) * 1e-3,
        "loss": np.array([float(f"{x:.6E}") for x in rng.uniform(0.5, 12, n)]),
        "lr": np.array([float(f"{x:.6E}") for x in rng.uniform(1e-6, 3e-4, n)]),
        "line": np.cumsum(rng.integers(2, 9, n)).astype(float),
        "iteration": np.arange(10.0, 10.0 + 5 * n, 5.0),
    }
    for name, a in cols.items():
        t = encode(a.copy())
        assert _same(decode(t), a), name
        assert t[0] != "r", name  # not stored raw


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3 * CHUNK), _values), min_size=1, max_size=6))
def test_packed_column_appends_extends_and_sets(ops):
    col, ref = PackedColumn(), []
    for k, x in ops:
        if k % 3 == 0:
            col.append(x)
            ref.append(x)
        else:
            v = np.full(k, x)
            v[::7] = np.arange(len(v[::7]), dtype=float)
            col.extend(v)
            ref.extend(v.tolist())
    assert len(col) == len(ref)
    assert _same(col.values(), np.array(ref, dtype=np.float64))
    col.set(len(ref) - 1, -1.5)
    col.set(0, 42.0)
    ref[-1] = -1.5
    ref[0] = 42.0
    assert col.get(0) == 42.0 and col.get(-1) == ref[-1]
    assert _same(col.values(), np.array(ref, dtype=np.float64))


def test_iteration_table_order_and_extras():
    tab = IterationTable()
    n = CHUNK + 100
    block = np.zeros((n, tab.NCOL))
    block[:, tab.INDEX["iteration"]] = np.arange(n)
    block[:, tab.INDEX["line"]] = np.arange(n) * 3 + 1
    tab.extend_block(block, {"mtp_1 loss": np.linspace(1, 2, n)})
    tab.append({"iteration": 5.5, "line": 2.0})  # a general-path row out of line order
    assert len(tab) == n + 1
    assert np.isnan(tab.col("mtp_1 loss")[-1])
    order = np.argsort(tab.col("line"), kind="stable")
    tab.set_order(order)
    assert tab.col("iteration")[1] == 5.5 and tab.col("line")[1] == 2.0
    assert tab.col("mtp_1 loss")[0] == 1.0 and np.isnan(tab.col("mtp_1 loss")[1])
    tab.set_flag(n, 4)
    assert tab.col("flags")[n] == 4 and tab.last("iteration") == n - 1
    assert tab.nbytes < n * 24  # 19 columns would be 152 B/row unpacked; the linspace extra stays raw (8 B)
