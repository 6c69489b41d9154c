"""The fast analysis paths give exactly the reference answers.

``summarize_run`` / ``diagnose_run`` use shortcuts that must not change a number: the loss-spike scan skips windows
whose minimum already rules a spike out (``loss_spikes(prefilter=False)`` computes every window), block medians are
taken per block length on a 2-D gather, the median CI takes two order statistics by ``np.partition`` instead of a
sort, packed columns decode in place (``decode_into``), counters skip ``np.nan_to_num`` when finite, a constant log
interval skips its median. Each is compared with its reference on random data, and the ``--json`` outputs of both
commands (the JSON bytes) with every shortcut replaced by its reference, on every log of data/ and on generated logs
with spikes, shifts, NaNs, skipped iterations and restarts.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA
from moetune.evidence import diagnose, steady
from moetune.evidence.logs import IterationTable, RunRecord, columns, read_run
from moetune.output import to_json_bytes

LOG_FILES = sorted((DATA / "logs").glob("*.txt")) + sorted((DATA / "megatron_golden").glob("*golden*.json"))


# ------------------------------------------------------------------------------------------ references
def _block_medians_ref(x, edges):
    return np.array([np.median(x[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)])


def _median_ci_sorted(x, confidence=steady.CONFIDENCE):
    """median_ci's order statistics taken from a full sort (the code before the partition shortcut)."""
    got = steady.median_ci(x, confidence)
    if got is None:
        return None
    s = np.sort(x)
    lo, hi = (int(np.searchsorted(s, v, side="left")) for v in got)
    return float(s[lo]), float(s[hi])


def _values_ref(self):
    out = np.empty(len(self))
    for j, t in enumerate(self._chunks):
        out[j * columns.CHUNK:(j + 1) * columns.CHUNK] = columns.decode(t)
    if self._tail:
        out[self._sealed:] = np.frombuffer(self._tail, dtype=np.float64)
    return out


def _log_interval_ref(rec, it=None):
    it = rec.iterations.col("iteration") if it is None else it
    if len(it) < 2:
        return int(rec.meta.get("log_interval", 1))
    d = np.diff(it)
    d = d[d > 0]
    return int(np.median(d)) if len(d) else 1


def _median_and_ci_ref(x):
    return float(np.median(x)), steady.median_ci(x)


def _last_finite_ref(x):
    fin = np.isfinite(x)
    return float(x[fin][-1]) if fin.any() else None


def _split_medians_ref(x):
    left, right = np.full(len(x), np.nan), np.full(len(x), np.nan)
    for j in range(1, len(x)):
        left[j], right[j] = np.median(x[:j]), np.median(x[j:])
    return left, right


def _reference_paths(monkeypatch) -> None:
    # every column decoded afresh on each access, nothing remembered between summary and diagnosis
    monkeypatch.setattr(IterationTable, "decoded", lambda self: contextlib.nullcontext(self))
    monkeypatch.setattr(IterationTable, "memo", lambda self, key, compute: compute())
    monkeypatch.setattr(steady, "median_and_ci", _median_and_ci_ref)
    monkeypatch.setattr(steady, "last_finite", _last_finite_ref)
    monkeypatch.setattr(steady, "split_medians", _split_medians_ref)
    monkeypatch.setattr(diagnose, "loss_spikes", functools.partial(diagnose.loss_spikes, prefilter=False))
    monkeypatch.setattr(steady, "block_medians", _block_medians_ref)
    monkeypatch.setattr(steady, "nan_as_zero", lambda x: np.nan_to_num(x, nan=0.0))
    monkeypatch.setattr(diagnose, "nan_as_zero", lambda x: np.nan_to_num(x, nan=0.0))
    monkeypatch.setattr(steady, "log_interval", _log_interval_ref)
    monkeypatch.setattr(columns.PackedColumn, "values", _values_ref)


def _outputs(path) -> tuple[bytes, bytes, bytes]:
    rec = read_run(path)
    logs = to_json_bytes({"runs": [steady.summarize_run(rec)], "without_iterations": []}) if rec.has_iterations \
        else b""
    findings = to_json_bytes({"findings": diagnose.diagnose_run(rec)})
    # diagnosis first, on a record of its own (what `moetune diagnose` does)
    alone = to_json_bytes({"findings": diagnose.diagnose_run(read_run(path))})
    return logs, findings, alone


def _same_outputs(path, monkeypatch) -> None:
    fast = _outputs(path)
    with monkeypatch.context() as m:
        _reference_paths(m)
        ref = _outputs(path)
    assert fast == ref


# ------------------------------------------------------------------------------------------ unit properties
@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(-5, 50, allow_nan=False), st.sampled_from([0.0, 1.0, 2.0, 2.5])),
                min_size=0, max_size=300), st.integers(0, 3))
def test_loss_spikes_prefilter_is_exact(vals, spike_every):
    v = np.array(vals, dtype=np.float64)
    if spike_every and len(v):
        v[:: 7 + spike_every] *= 3.0
    assert diagnose.loss_spikes(v) == diagnose.loss_spikes(v, prefilter=False)


def test_loss_spikes_stop_after_the_same_chunk():
    v = np.tile([1.0] * 19 + [5.0], 8000)  # a spike every 20 values: > 1000 in the first 65536 windows
    got = diagnose.loss_spikes(v)
    assert len(got) > 1000 and got == diagnose.loss_spikes(v, prefilter=False)


@settings(max_examples=40, deadline=None)
@given(st.integers(201, 5000), st.integers(0, 2**16), st.integers(0, 2))
def test_block_medians_are_the_slice_medians(n, seed, kind):
    rng = np.random.default_rng(seed)
    x = [rng.normal(5, 1, n), np.round(rng.exponential(1, n), 2), rng.integers(0, 4, n).astype(float)][kind]
    edges = np.linspace(0, n, steady.SHIFT_MAX_BLOCKS + 1).astype(np.int64)
    assert steady.block_medians(x, edges).tobytes() == _block_medians_ref(x, edges).tobytes()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=0, max_size=3000))
def test_median_ci_order_statistics(vals):
    x = np.array(vals)
    got = steady.median_ci(x)
    if len(x) < 3:
        assert got is None
        return
    assert got == _median_ci_sorted(x)
    s = np.sort(x)
    assert got[0] in s and got[1] in s and got[0] <= got[1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 3).map(float)),
                max_size=50))
def test_nan_as_zero_is_nan_to_num(vals):
    x = np.array(vals, dtype=np.float64)
    assert steady.nan_as_zero(x.copy()).tobytes() == np.nan_to_num(x, nan=0.0).tobytes()


def _chunks_of_every_encoding(rng) -> list[np.ndarray]:
    n = columns.CHUNK
    loss = np.array([float(f"{v:E}") for v in rng.uniform(1, 3, n)])
    ms = np.array([float(f"{v:.1f}") for v in rng.uniform(4000, 6000, n)]) * 1e-3
    with_nan = loss.copy()
    with_nan[rng.random(n) < 0.1] = np.nan
    return [np.full(n, 1.5), 7.0 + 3.0 * np.arange(n), 1000 + rng.integers(0, 60000, n).astype(float), loss, ms,
            with_nan, rng.normal(size=n), np.full(n, np.nan)]


@pytest.mark.parametrize("seed", range(3))
def test_packed_values_decode_in_place(seed):
    rng = np.random.default_rng(seed)
    for a in _chunks_of_every_encoding(rng):
        col = columns.PackedColumn()
        col.extend(np.concatenate([a, a[:100]]))
        kinds = {t[0] for t in col._chunks}
        assert col.values().tobytes() == _values_ref(col).tobytes(), kinds


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 100, allow_nan=False), st.sampled_from([1.0, 2.0, 2.5]),
                          st.sampled_from([np.nan, np.inf, -np.inf])), min_size=1, max_size=2500))
def test_median_and_ci_is_np_median_and_median_ci(vals):
    x = np.array(vals)
    med, ci = steady.median_and_ci(x)
    ref_med, ref_ci = _median_and_ci_ref(x)
    assert (math.isnan(med) and math.isnan(ref_med)) or med == ref_med
    assert np.float64(med).tobytes() == np.float64(ref_med).tobytes() or math.isnan(med)
    assert ci == ref_ci or (ci is not None and ref_ci is not None and
                            np.array(ci).tobytes() == np.array(ref_ci).tobytes())


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([0.0, 1.0, 2.5]),
                          st.sampled_from([np.nan, np.inf])), min_size=0, max_size=220))
def test_split_medians_are_the_prefix_and_suffix_medians(vals):
    x = np.array(vals, dtype=np.float64)
    got, ref = steady.split_medians(x), _split_medians_ref(x)
    assert got[0].tobytes() == ref[0].tobytes() and got[1].tobytes() == ref[1].tobytes()


@pytest.mark.parametrize("vals", [[0.0, -0.0], [-0.0, 0.0], [-0.0, -0.0], [-0.0, -0.0, -0.0, 1.0], [2.0, -0.0, 0.0]])
def test_split_medians_of_negative_zeros_are_np_median(vals):
    """np.median's mean starts from +0.0: a zero median is +0.0 even when the middle values are -0.0."""
    x = np.array(vals, dtype=np.float64)
    got, ref = steady.split_medians(x), _split_medians_ref(x)
    assert got[0].tobytes() == ref[0].tobytes() and got[1].tobytes() == ref[1].tobytes()
    med, ref_med = steady.median_and_ci(x)[0], _median_and_ci_ref(x)[0]
    assert np.float64(med).tobytes() == np.float64(ref_med).tobytes() == np.float64(np.median(x)).tobytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(np.nan)), max_size=60))
def test_last_finite(vals):
    x = np.array(vals, dtype=np.float64)
    assert steady.last_finite(x) == _last_finite_ref(x)


@pytest.mark.parametrize("seed", range(2))
def test_packed_constant_reads_the_headers(seed):
    rng = np.random.default_rng(seed)
    for a in [*_chunks_of_every_encoding(rng), np.full(columns.CHUNK, -0.0), np.zeros(3)]:
        for tail in (a[:0], a[:100], np.full(5, a[0]), np.array([a[0], 0.5])):
            col = columns.PackedColumn()
            col.extend(np.concatenate([a, a, tail]))
            bits = col.values().view(np.uint64)
            got = col.constant()
            if (bits == bits[0]).all():
                assert np.float64(got).tobytes() == col.values()[:1].tobytes()
            else:
                assert got is None
    assert columns.PackedColumn().constant() is None


def test_decoded_columns_are_shared_read_only_and_dropped_on_change():
    rec = read_run(DATA / "logs" / "log_iteration_1.txt")
    tab = rec.iterations
    with tab.decoded():
        t = tab.col("elapsed_s")
        flags = tab.col("segment")  # one value on every row: broadcast
        assert tab.col("elapsed_s") is t and not t.flags.writeable and not flags.flags.writeable
        assert flags.strides == (0,)
        with pytest.raises(ValueError):
            t[0] = 1.0
        assert t.tobytes() == tab._col("elapsed_s").tobytes()
        assert np.asarray(flags).tobytes() == tab._col("segment").tobytes()
        tab.set_col("elapsed_s", tab._col("elapsed_s") * 2)  # a change drops what was decoded
        assert tab.col("elapsed_s").tobytes() == (t * 2).tobytes()
    assert tab.col("elapsed_s").flags.writeable  # outside the block: a fresh copy


def test_memo_is_dropped_when_rows_change():
    rec = RunRecord(path="x")
    for i in range(1, 9):
        rec.iterations.append({"iteration": float(i), "elapsed_s": 1.0, "loss": 2.0, "loss_missing": 0.0})
    assert steady.loss_health(rec)["nan_iteration_count"] == 0
    h = steady.loss_health(rec)
    h["nan_iterations"].append(99)  # the caller's copy
    assert steady.loss_health(rec)["nan_iterations"] == []
    rec.iterations.append({"iteration": 9.0, "elapsed_s": 1.0, "loss": np.nan, "loss_missing": 0.0, "nan": 1.0})
    assert steady.loss_health(rec)["nan_iteration_count"] == 1


def test_log_interval_constant_step():
    from moetune.evidence.logs.model import RunRecord

    for it in ([1.0], [5.0, 10, 15, 20], [1.0, 2, 3, 10, 11, 12], [3.0, 1, 2, 4], [2.0, 2.0]):
        rec = RunRecord(path="x")
        for v in it:
            rec.iterations.append({"iteration": v})
        assert steady.log_interval(rec) == _log_interval_ref(rec)


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.name)
def test_json_outputs_on_data_logs(path, monkeypatch):
    _same_outputs(path, monkeypatch)


def _megatron_log(rnd: random.Random, n: int, spikes: float, shift_at: float | None, nan_share: float,
                  skip_share: float, restart: bool) -> str:
    lines = []
    it = 0
    loss = 2.5
    for i in range(n):
        it += 1
        if restart and i == n // 3:
            lines.append("[before the start of training step] datetime: 2024-04-06 02:59:36")
            it = max(1, it - 40)
        ms = 5400.0 * (1.3 if shift_at is not None and i >= shift_at * n else 1.0) + rnd.gauss(0, 60)
        loss = max(0.5, loss * 0.999 + rnd.gauss(0, 0.01))
        lv = loss * (3.0 if rnd.random() < spikes else 1.0)
        skipped = 1 if rnd.random() < skip_share else 0
        loss_field = "" if rnd.random() < nan_share else f" lm loss: {lv:E} |"
        lines.append(f" [2024-04-06 02:59:36] iteration {it:8d}/ 100000 | consumed samples: {it * 128:12d} | "
                     f"elapsed time per iteration (ms): {ms:.1f} | learning rate: {2e-4:E} | global batch size:   128 |"
                     f"{loss_field} loss scale: 1.0 | grad norm: {rnd.uniform(0.2, 2):.3f} | "
                     f"number of skipped iterations: {skipped:3d} | number of nan iterations:   0 |")
    return "\n".join(lines) + "\n"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(5, 1500), st.integers(0, 2**16), st.sampled_from([0.0, 0.01, 0.2]),
       st.sampled_from([None, 0.3, 0.6]), st.sampled_from([0.0, 0.02]), st.sampled_from([0.0, 0.05]), st.booleans())
def test_json_outputs_on_generated_logs(tmp_path, monkeypatch, n, seed, spikes, shift_at, nan_share, skip_share,
                                        restart):
    p = tmp_path / "gen.log"
    p.write_text(_megatron_log(random.Random(seed), n, spikes, shift_at, nan_share, skip_share, restart))
    _same_outputs(p, monkeypatch)
