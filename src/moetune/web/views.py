"""The page's charts, drawn by the report's chart code (:mod:`moetune.report.plots`) from the JSON the page already
holds: a plan candidate or an estimate (``memory`` + ``time`` sections), the plan's candidates, a trace analysis.
The same extraction (:mod:`moetune.report.data`) and the same SVG the static report embeds."""

from __future__ import annotations

from typing import Any

from moetune.report import plots
from moetune.report.data import layout_label, memory_stages, time_walls


def trace_charts(trace: dict[str, Any]) -> list[str]:
    """One hidden-vs-exposed-communication and host-gap chart per traced rank (at most 8)."""
    out = []
    for r in (trace.get("ranks") or [])[:8]:
        idle = r.get("idle") or {}
        svg = plots.comm_split(r.get("hidden_comm_s"), r.get("exposed_comm_s"), idle.get("host_bound_s"),
                               title=f"Rank {r.get('rank')}: communication and host gaps (trace window)")
        if svg:
            out.append(svg)
    return out


def charts_for(body: dict[str, Any]) -> dict[str, Any]:
    """``{"memory", "walls", "throughput": svg or None, "comm": [svg]}`` for ``{"result", "candidates", "trace",
    "label"}`` (``label`` prefixes the chart titles, e.g. ``"What-if: "``)."""
    res = body.get("result") or {}
    cands = body.get("candidates") or []
    prefix = str(body.get("label") or "")
    out: dict[str, Any] = {
        "memory": plots.memory_stacked(memory_stages(res.get("memory") or {}), title=prefix + "Memory per pipeline rank")
        if res else None,
        "walls": plots.walls_bar(time_walls(res.get("time") or {}), title=prefix + "Time per wall")
        if res and res.get("time") else None,
        "throughput": plots.throughput_vs_headroom(
            [{"index": i, "label": layout_label(c.get("layout") or {}), **c} for i, c in enumerate(cands)])
        if len(cands) > 1 else None,
        "comm": trace_charts(body["trace"]) if isinstance(body.get("trace"), dict) else [],
    }
    return out
