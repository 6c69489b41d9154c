"""Long calls: progress reported through the service's one hook arrives as MCP progress notifications, and a call
past the server's time limit stops at its next report with a tool error (the server keeps serving).

The planner's progress module (``moetune.progress``) is stood in for by a minimal module with the same shape
(``reporting(callback)`` scope, ``report(done, total)``) so the forwarding path is tested on its own."""

from __future__ import annotations

import contextlib
import sys
import types

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402

from moetune.mcp.server import MoetuneMCP  # noqa: E402

Q = {"model": "Qwen3-30B-A3B", "system": "DGX-H100", "gpus": 8, "gbs": 64, "seq": 1024, "top": 1}


@pytest.fixture
def reporting_planner(monkeypatch):
    """A progress module, and a planner that reports 4 steps through it before planning."""
    mod = types.ModuleType("moetune.progress")
    mod.callbacks = []

    @contextlib.contextmanager
    def reporting(cb):
        mod.callbacks.append(cb)
        try:
            yield
        finally:
            mod.callbacks.pop()

    def report(done, total=None, message=None):
        for cb in mod.callbacks:
            cb(done, total, message)

    mod.reporting, mod.report = reporting, report
    monkeypatch.setitem(sys.modules, "moetune.progress", mod)
    import moetune
    import moetune.plan.search as search

    monkeypatch.setattr(moetune, "progress", mod, raising=False)
    real = search.plan

    def plan(req):
        for i in range(1, 5):
            report(i, 4, f"share {i}")
        return real(req)

    monkeypatch.setattr(search, "plan", plan)
    return mod


def test_progress_notifications_reach_the_client(reporting_planner, tmp_path):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total))

    async def go():
        async with Client(MoetuneMCP(tmp_path).server) as c:
            r = await c.call_tool("plan", Q, progress_callback=on_progress)
            assert not r.is_error, r.content[0].text
            return r

    anyio.run(go)
    # the stand-in's four steps arrive; the real planner (moetune.plan.search) may report its own progress too
    stub = [s for s in seen if s[1] == 4.0]
    assert stub and stub[-1] == (4.0, 4.0)
    assert all(0 <= p <= t for p, t in seen)


def test_time_limit_stops_a_long_call(reporting_planner, tmp_path):
    async def go():
        async with Client(MoetuneMCP(tmp_path, timeout_s=1e-6).server) as c:
            r = await c.call_tool("plan", Q)
            ok = await c.call_tool("layout", {"gpus": 16, "ep": 8})
            return r, ok

    r, ok = anyio.run(go)
    assert r.is_error and "time limit" in r.content[0].text
    assert not ok.is_error


def test_the_real_planner_reports_progress(tmp_path):
    """No stand-in: moetune.plan.search reports through moetune.progress and the client gets notifications."""
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total))

    async def go():
        async with Client(MoetuneMCP(tmp_path).server) as c:
            r = await c.call_tool("plan", {**Q, "gpus": 16, "gbs": 1024, "seq": 4096}, progress_callback=on_progress)
            assert not r.is_error, r.content[0].text

    anyio.run(go)
    assert seen and all(t and 0 <= p <= t for p, t in seen)
