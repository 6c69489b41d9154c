"""Training-log readers: Megatron-LM, Megatron-Bridge, NeMo/Lightning text logs and Megatron golden-values JSON.

Public API (also importable from here; the last three are defined in their own modules)::

    read_run(path) -> RunRecord                                   # streaming, memory bounded by iterations
    summarize_run(record, window=None, *, gpus=None, seq_length=None) -> RunSummary   # moetune.evidence.steady
    diagnose_paths(paths) -> list[Finding]                        # moetune.evidence.diagnose (diagnose_run(record))
    compare_runs(a, b, *, window_a=None, window_b=None, gpus=None) -> Comparison      # moetune.evidence.compare
"""

from __future__ import annotations

from pathlib import Path

from moetune.errors import InputError
from moetune.evidence.logs.alloc import settle_thresholds
from moetune.evidence.logs.golden import read_golden_path
from moetune.evidence.logs.model import (
    FLAG_NAMES,
    Event,
    IterationTable,
    LineRef,
    MemoryReport,
    RunRecord,
    Signal,
    TheoreticalMemory,
    TimerStat,
)
from moetune.evidence.logs.reader import check_path, read_text_log

__all__ = [
    "FLAG_NAMES",
    "Event",
    "IterationTable",
    "LineRef",
    "MemoryReport",
    "RunRecord",
    "Signal",
    "TheoreticalMemory",
    "TimerStat",
    "compare_runs",
    "diagnose_paths",
    "read_run",
    "summarize_run",
]

_LAZY = {"summarize_run": "moetune.evidence.steady", "diagnose_paths": "moetune.evidence.diagnose",
         "compare_runs": "moetune.evidence.compare"}


def __getattr__(name: str):
    """Lazy re-exports (those modules import this package)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


def read_run(path: str | Path) -> RunRecord:
    """Read one training log or golden-values JSON into a :class:`RunRecord`.

    Raises :class:`~moetune.errors.InputError` (one line, exit code 2) for a missing, unreadable, binary or
    unrecognisable file. A log with no iteration lines is *not* an error here (it may still hold a failure to
    diagnose); check :attr:`RunRecord.has_iterations`.
    """
    p = Path(path)
    check_path(p)
    with open(p, "rb") as f:
        head = f.read(256).lstrip()
    if p.suffix.lower() == ".json" or head.startswith(b"{"):
        return read_golden_path(p)
    settle_thresholds()  # the C allocator keeps the chunks' temporaries instead of faulting fresh pages (alloc.py)
    rec = read_text_log(p)
    if rec.recognised_lines == 0:
        raise InputError(f"{p}: no training-log lines recognised (expected Megatron-LM / Megatron-Bridge / NeMo log "
                         "text or a Megatron golden-values JSON)", field="log", value=str(p))
    return rec
