"""Profiler-trace evidence: Kineto JSON / nsys SQLite + recipe readers, kernel taxonomy, interval analysis.

Public entry points (typed results, ``.model_dump()`` for JSON):
- ``analyze_paths(paths, taxonomy=None) -> TraceReport`` — files or per-rank directories of one job;
- ``diff_reports(a: TraceReport, b: TraceReport) -> TraceDiff`` — matched A/B, per iteration.
"""

from __future__ import annotations

from moetune.evidence.traces.analyze import analyze_paths, analyze_traces, read_traces
from moetune.evidence.traces.diff import TraceDiff, diff_reports
from moetune.evidence.traces.report import RankReport, TraceReport

__all__ = [
    "RankReport",
    "TraceDiff",
    "TraceReport",
    "analyze_paths",
    "analyze_traces",
    "diff_reports",
    "read_traces",
]
