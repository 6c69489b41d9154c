"""The reader's shortcuts give exactly the reference record, and the same ``logs`` / ``diagnose`` JSON bytes.

Shortcuts checked here (each compared with the reader that does without it, on every log of data/, on stress mixes
built like the bench's, on generated mixes and on hypothesis-picked real lines):

- a read's :class:`~moetune.evidence.logs.recognisers.LineRoutes` offers a line to the recognisers it remembered for
  that line's bytes, or (one search of the registry's alternation of all triggers finding none) only to the
  recognisers without triggers (``LineRoutes.offered_to``; the reference tries every trigger in turn);
- NCCL chatter lines seen before are known by a hash lookup (``MAX_CHATTER_LINES``; the reference searches both
  literals in every line);
- queued iteration lines of several lengths are parsed one run per length (``BulkIterations._by_length``).

The reference is the line path (``bulk=False``) without any of them.
"""

from __future__ import annotations

import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA
from moetune.evidence.diagnose import diagnose_run
from moetune.evidence.logs import fastpath, read_run, recognisers
from moetune.evidence.logs.reader import read_text_log
from moetune.evidence.steady import summarize_run
from moetune.output import to_json_bytes
from test_logs_fastpath import LOG_FILES, POOL, _mix, assert_same_record

sys.path.insert(0, str(DATA.parent / "bench"))
import logs_speed  # noqa: E402


def _without_shortcuts(m: pytest.MonkeyPatch) -> None:
    m.setattr(recognisers.LineRoutes, "offered_to", lambda self, line: None)
    m.setattr(fastpath, "MAX_CHATTER_LINES", 0)
    m.setattr(fastpath.BulkIterations, "_by_length", lambda self, lay, raw, lines: None)


def _json(rec) -> tuple[bytes, bytes]:
    logs = to_json_bytes({"runs": [summarize_run(rec)], "without_iterations": []}) if rec.has_iterations else b""
    return logs, to_json_bytes({"findings": diagnose_run(rec)})


def check(path, monkeypatch, *, twice: bool = False) -> None:
    """Fast reader == reference reader (``twice``: a second read starts with empty line memos again)."""
    fast = read_text_log(path)
    with monkeypatch.context() as m:
        _without_shortcuts(m)
        ref = read_text_log(path, bulk=False)
    assert_same_record(fast, ref)
    if twice:
        assert_same_record(read_text_log(path), ref)


@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.name)
def test_real_logs(path, monkeypatch):
    check(path, monkeypatch, twice=True)


@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.name)
def test_json_outputs_on_real_logs(path, monkeypatch):
    fast = _json(read_run(path))
    with monkeypatch.context() as m:
        _without_shortcuts(m)
        ref = _json(read_run(path))
    assert fast == ref


@pytest.mark.parametrize("seed", range(3))
def test_generated_mixes(tmp_path, monkeypatch, seed):
    p = tmp_path / "mix.log"
    p.write_text("\n".join(_mix(random.Random(seed), 3000)) + "\n")
    check(p, monkeypatch, twice=True)


def test_stress_mix_like_the_bench(tmp_path, monkeypatch):
    """The bench's stress mix (2 MB): NCCL chatter past its cap, interleaved templates queued, timer blocks,
    wrapped records, tracebacks of other ranks; the shortcuts take part."""
    p = tmp_path / "stress.log"
    logs_speed.build_log(p, 2)
    calls = []
    orig = fastpath.BulkIterations._by_length

    def by_length(self, lay, raw, lines):
        got = orig(self, lay, raw, lines)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(fastpath.BulkIterations, "_by_length", by_length)
    remembered = []
    orig_routes = recognisers.LineRoutes.offered_to

    def offered_to(self, line):
        got = orig_routes(self, line)
        remembered.append(len(self.memo))
        return got

    monkeypatch.setattr(recognisers.LineRoutes, "offered_to", offered_to)
    fast = read_text_log(p)
    assert any(calls) and max(remembered) > 0 and fast.signal_counts["nccl_connection_closed"] > 1000
    with monkeypatch.context() as m:
        _without_shortcuts(m)
        ref = read_text_log(p, bulk=False)
    assert_same_record(fast, ref)
    with monkeypatch.context() as m:
        _without_shortcuts(m)
        assert _json(fast) == _json(ref)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(POOL), min_size=1, max_size=60), st.integers(0, 2**16))
def test_property_repeated_real_lines(tmp_path, monkeypatch, picked, seed):
    """Lines repeated (so that the memos answer) with rank prefixes of several ranks."""
    rnd = random.Random(seed)
    lines = []
    for ln in picked * rnd.randint(2, 4):
        lines.append(f"[rank{rnd.randrange(3)}]: {ln}" if rnd.random() < 0.3 else ln)
    p = tmp_path / "rep.log"
    p.write_text("\n".join(lines) + "\n")
    check(p, monkeypatch)


def test_line_routes_follow_the_registry_they_were_built_from():
    reg = [recognisers.Recogniser("a", (b"alpha",), lambda p, n, line: True)]
    routes = recognisers.LineRoutes(reg)
    assert routes.any_trigger.search(b"x alpha") and not routes.any_trigger.search(b"beta")
    routes.offered_to(b"beta")
    routes.offered_to(b"beta")
    assert routes.memo
    reg += [recognisers.Recogniser("b", (b"beta",), lambda p, n, line: True)]
    routes = recognisers.LineRoutes(reg)  # a new read sees the changed list
    assert routes.any_trigger.search(b"beta")
    assert routes.offered_to(b"beta") is None and not routes.memo
    assert [r.name for r in routes.offered_to(b"beta")] == ["b"]
    assert [r.name for r in recognisers.candidates(reg, b"alpha beta")] == ["a", "b"]
    del reg[0]
    assert [r.name for r in recognisers.candidates(reg, b"alpha beta")] == ["b"]
