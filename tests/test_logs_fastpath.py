"""The reader's bulk path gives exactly the record the per-line recogniser path gives.

``read_text_log(path)`` sets complete iteration lines of known layouts aside for bulk parsing and only counts NCCL
chatter past its evidence cap; ``read_text_log(path, bulk=False)`` sends every line through the recognisers. Both
must produce the same RunRecord, bit for bit: on every real log in data/logs, on long repeats of them (so that batches
fill and layouts repeat) and on generated mixes of their lines with rank prefixes, colour codes, carriage returns,
terminal wrapping and truncation.
"""

from __future__ import annotations

import gzip
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA
from moetune.evidence.logs.fastpath import FLUSH_ROWS
from moetune.evidence.logs.reader import read_text_log
from moetune.evidence.logs.recognisers import RECORDS, SIGNALS

LOGS = DATA / "logs"
LOG_FILES = sorted(LOGS.glob("*.txt"))
POOL = [ln for p in LOG_FILES for ln in p.read_text(errors="replace").splitlines()]
_ITER = re.compile(r"iteration\s+\d+/")


def _bits(a: np.ndarray) -> bytes:
    a = np.asarray(a, dtype=np.float64).copy()
    a[np.isnan(a)] = np.nan  # one NaN payload
    return a.tobytes()


def assert_same_record(a, b) -> None:
    """Every field of two RunRecords, iteration and step-time columns compared bit for bit."""
    for name in ("source", "lines", "bytes", "recognised_lines", "segments", "truncated_last_line", "memory_reports",
                 "theoretical_memory", "parameter_counts", "timers", "config", "config_source", "versions", "events",
                 "signals", "signal_counts", "restart_lines", "ranks_seen", "meta"):
        va, vb = getattr(a, name), getattr(b, name)
        # a NaN value (a memory line whose number did not parse) is never == another NaN object: equal reprs then
        assert va == vb or repr(va) == repr(vb), name
    for tab in ("iterations", "step_time"):
        ta, tb = getattr(a, tab), getattr(b, tab)
        assert len(ta) == len(tb), tab
        assert sorted(ta.extra_losses) == sorted(tb.extra_losses), tab
        for c in (*ta.COLUMNS, *ta.extra_losses):
            assert _bits(ta.col(c)) == _bits(tb.col(c)), f"{tab}.{c}"


def check_both_paths(path) -> None:
    fast, ref = read_text_log(path), read_text_log(path, bulk=False)
    assert_same_record(fast, ref)


@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.name)
def test_real_logs(path):
    check_both_paths(path)


def _mix(rnd: random.Random, n_lines: int) -> list[str]:
    """Lines drawn from the real logs, renumbered, some with rank prefixes, colour codes, CRs or wrapped."""
    out = []
    it = 0
    for _ in range(n_lines):
        ln = rnd.choice(POOL)
        if _ITER.search(ln):
            it += rnd.choice((1, 1, 1, 0, -3))
            ln = _ITER.sub(f"iteration {max(it, 1):8d}/", ln)
        r = rnd.random()
        if r < 0.05:
            ln = f"[rank{rnd.randrange(8)}]: {ln}"
        elif r < 0.08:
            ln = f"\x1b[32m{ln}\x1b[0m"
        elif r < 0.10:
            ln += "\r"
        elif r < 0.13 and len(ln) > 50:
            k = rnd.randrange(40, len(ln))
            out.append(ln[:k])
            ln = ln[k:]
        out.append(ln)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_generated_mixes(tmp_path, seed):
    rnd = random.Random(seed)
    text = "\n".join(_mix(rnd, 4000)) + ("\n" if seed % 2 else "")
    p = tmp_path / "mix.log"
    if seed == 3:
        p = tmp_path / "mix.log.gz"
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)
    check_both_paths(p)


def test_long_repeats_fill_batches(tmp_path):
    """Several batches of iteration lines of a few layouts, NCCL chatter past its cap, timer blocks, restarts."""
    mlm = (LOGS / "log_iteration_1.txt").read_text().splitlines() + \
        (LOGS / "log_regression_slowdown_1.txt").read_text().splitlines()
    nccl = [ln for ln in (LOGS / "log_nccl_timeout_1.txt").read_text().splitlines() if "NCCL INFO" in ln]
    timers = (LOGS / "log_timers_minmax_1.txt").read_text().splitlines()[6:9]
    lines = []
    for it in range(1, 2 * FLUSH_ROWS + 500):
        lines.append(_ITER.sub(f"iteration {it % 9000 + 1:8d}/", mlm[it % len(mlm)]))
        lines.append(f"[rank{it % 16}]: " + nccl[it % len(nccl)])
        if it % 50 == 0:
            lines.extend(timers)
    p = tmp_path / "long.log"
    p.write_text("\n".join(lines) + "\n")
    fast = read_text_log(p)
    assert len(fast.iterations) > FLUSH_ROWS and fast.segments > 1
    assert_same_record(fast, read_text_log(p, bulk=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(POOL), min_size=1, max_size=80), st.integers(0, 2**16), st.booleans())
def test_property_any_mix_of_real_lines(tmp_path, picked, seed, final_newline):
    rnd = random.Random(seed)
    lines = [_ITER.sub(f"iteration {i + 1:8d}/", ln) if rnd.random() < 0.7 else ln for i, ln in enumerate(picked)]
    lines = lines * rnd.randint(1, 3)  # a layout is first seen by the general parser, then taken in bulk
    p = tmp_path / "prop.log"
    p.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    check_both_paths(p)


def test_registry_names_are_unique_and_triggered():
    names = [r.name for r in (*RECORDS, *SIGNALS)]
    assert len(names) == len(set(names))
    assert all(r.triggers for r in (*RECORDS, *SIGNALS) if r.name != "traceback_code")


def test_a_new_format_is_one_registration(tmp_path):
    """A recogniser registered for a made-up line kind takes those lines (and only those) in both paths."""
    from moetune.evidence.logs.recognisers import recogniser

    seen = []

    def handler(p, line_no, line):
        if not line.startswith(b"MYFMT step"):
            return False
        seen.append(line_no)
        p.rec.recognised_lines += 1
        return True

    n_before = len(RECORDS)
    recogniser(RECORDS, "test_myfmt", b"MYFMT")(handler)
    try:
        p = tmp_path / "my.log"
        p.write_text((LOGS / "log_iteration_1.txt").read_text() + "MYFMT step 1 took 3 s\nnot MYFMT\n")
        fast = read_text_log(p)
        assert seen == [fast.lines - 1]
        seen.clear()
        assert_same_record(fast, read_text_log(p, bulk=False))
        assert seen == [fast.lines - 1]
    finally:
        del RECORDS[n_before:]


# ------------------------------------------------------------------ runs (BulkIterations.scan_chunk)
@pytest.fixture
def small_runs(monkeypatch):
    """Runs from 2 lines on, layouts learned from the first line, chunks of a few kB: the run path on small logs.
    Returns the number of runs taken so far (a list, appended per parsed batch)."""
    from moetune.evidence.logs import fastpath, reader

    monkeypatch.setattr(fastpath, "MIN_RUN", 2)
    monkeypatch.setattr(fastpath, "LEARN_BYTES", 0)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 2500)
    return count_runs(monkeypatch)


def count_runs(monkeypatch) -> list[int]:
    """Record the line count of every run the bulk path parses (a list the test reads afterwards)."""
    from moetune.evidence.logs import fastpath

    taken = []
    orig = fastpath.Layout.run_columns

    def counting(self, text, n):
        cols = orig(self, text, n)
        if cols is not None:
            taken.append(n)
        return cols

    monkeypatch.setattr(fastpath.Layout, "run_columns", counting)
    return taken


def _run_log(rnd: random.Random, n: int) -> list[str]:
    """A Megatron-LM log: iteration lines of one layout (numbers varying), timer blocks and memory lines between
    stretches, perturbed lines inside stretches (other keys, text values, trailing blanks, another layout, NaN,
    a loss-scale change, restarts, a rank prefix, colour codes, a wrapped line)."""
    head = (LOGS / "log_iteration_1.txt").read_text().splitlines()[0]
    other = (LOGS / "log_regression_slowdown_1.txt").read_text().splitlines()[0]
    timers = (LOGS / "log_timers_minmax_1.txt").read_text().splitlines()[6:9]
    memory = next(ln for ln in (LOGS / "log_iteration_theoretical_memory_1.txt").read_text().splitlines()
                  if "(after" in ln)
    out = []
    it = 0
    scale = "1.0"
    for _ in range(n):
        it += 1 if rnd.random() > 0.01 else -5
        ln = _ITER.sub(f"iteration {max(it, 1):8d}/", head)
        ln = ln.replace("5444.9", f"{5000 + rnd.random() * 900:.1f}").replace("1.825991E+00", f"{rnd.random() + 1:E}")
        ln = ln.replace("loss scale: 1.0", f"loss scale: {scale}")
        r = rnd.random()
        if r < 0.02:
            ln = ln.replace("grad norm", "grad  norm")
        elif r < 0.04:
            ln = ln.replace("1.426", "n/a")
        elif r < 0.05:
            ln = ln.replace("1.426", "nan")
        elif r < 0.06:
            ln += "  "
        elif r < 0.07:
            ln = _ITER.sub(f"iteration {max(it, 1):8d}/", other)
        elif r < 0.08:
            scale = rnd.choice(("1.0", "2.0", "65536.0"))
        elif r < 0.09:
            ln = f"[rank{rnd.randrange(4)}]: {ln}"
        elif r < 0.10:
            ln = f"\x1b[32m{ln}\x1b[0m"
        elif r < 0.11:
            ln = ln.replace("lm loss", "lm loss2")
        elif r < 0.12:
            k = rnd.randrange(60, len(ln) - 10)
            out.append(ln[:k])
            ln = ln[k:]
        elif r < 0.13:
            ln = ln.replace(" [2024", "  [2024")
        out.append(ln)
        if rnd.random() < 0.03:
            out.extend(timers)
        if rnd.random() < 0.02:
            out.append(memory)
        if rnd.random() < 0.005:
            out.append("[before the start of training step] datetime: 2024-04-06 03:00:00")
    return out


@pytest.mark.parametrize("seed", range(6))
def test_runs_give_the_line_path_record(tmp_path, small_runs, seed):
    rnd = random.Random(seed)
    p = tmp_path / "runs.log"
    p.write_text("\n".join(_run_log(rnd, 1500)) + ("\n" if seed % 2 else ""))
    check_both_paths(p)
    assert sum(small_runs) > 100  # the run path took part of the log


@pytest.mark.parametrize("seed", range(2))
def test_generated_mixes_with_runs(tmp_path, small_runs, seed):
    rnd = random.Random(seed)
    p = tmp_path / "mix.log"
    p.write_text("\n".join(_mix(rnd, 4000)) + "\n")
    check_both_paths(p)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(POOL), min_size=1, max_size=80), st.integers(0, 2**16), st.booleans())
def test_property_any_mix_of_real_lines_with_runs(tmp_path, small_runs, picked, seed, final_newline):
    rnd = random.Random(seed)
    lines = [_ITER.sub(f"iteration {i + 1:8d}/", ln) if rnd.random() < 0.7 else ln for i, ln in enumerate(picked)]
    lines = [ln for ln in lines for _ in range(rnd.randint(1, 4))] * rnd.randint(1, 3)  # stretches of one line
    p = tmp_path / "prop.log"
    p.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    check_both_paths(p)


def test_realistic_bench_log_takes_runs(tmp_path, monkeypatch):
    """The bench's realistic input (a few MB): bulk record == line-path record, and most rows came from runs."""
    import sys


    sys.path.insert(0, str(DATA.parent / "bench"))
    import logs_speed

    taken = count_runs(monkeypatch)
    p = tmp_path / "realistic.log"
    logs_speed.build_realistic_log(p, 6)
    fast = read_text_log(p)
    assert sum(taken) > 0.9 * len(fast.iterations)
    assert_same_record(fast, read_text_log(p, bulk=False))


def test_lines_longer_than_a_chunk(tmp_path, small_runs, monkeypatch):
    """Chunks shorter than a line: lines spanning several chunks are put together before the run scan."""
    from moetune.evidence.logs import reader

    monkeypatch.setattr(reader, "CHUNK_BYTES", 97)
    p = tmp_path / "runs.log"
    p.write_text("\n".join(_run_log(random.Random(11), 300)) + "\n")
    check_both_paths(p)


def test_nan_memory_value_found_by_hypothesis(tmp_path):
    """The mix hypothesis found (a memory line cut short and joined to an exception line: a NaN value) reads the
    same on both paths."""
    lines = [ln for ln in POOL if "max allocated" in ln or "memory (MB)" in ln][:1]
    if not lines:
        pytest.skip("no memory line in the real logs")
    p = tmp_path / "cut.log"
    cut = lines[0][: lines[0].find("max alloca") + len("max alloca")]
    p.write_text(cut + "AssertionError: Expert data parallel size should be divisible by partial DistOpt shard factor\n")
    check_both_paths(p)
