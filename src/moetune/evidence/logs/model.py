"""Typed run records produced by the log readers.

A :class:`RunRecord` is what one training log (or one Megatron-LM golden-values JSON) says about one run:
per-iteration samples kept as compact numeric columns (packed float64 chunks, a few bytes per value, independent
of how much text the log holds), plus the few structured things a log prints once (memory reports, theoretical memory,
timer blocks, configuration dumps, version banners) and the lines that signal failures (with line numbers).

Field meanings follow Megatron's ``training_log`` (megatron/training/training.py and
megatron/bridge/training/utils/train_utils.py, see docs/bridge_perf_notes.md §3).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moetune.evidence.logs.columns import CHUNK, PackedColumn

#: iteration flags (bit mask in :attr:`IterationTable.flags`)
FLAG_PROFILED = 1  # inside an nsys capture range / torch-profiler window
FLAG_CHECKPOINT = 2  # interval contains a checkpoint save
FLAG_EVAL = 4  # interval contains an evaluation pass
FLAG_GRAPH_CAPTURE = 8  # interval contains CUDA-graph capture
FLAG_TRUNCATED = 16  # the iteration line was cut off (last line of an excerpt)
FLAG_SEGMENT_START = 32  # first logged iteration of a run segment (start or restart)
FLAG_NAMES = {
    FLAG_PROFILED: "profiled",
    FLAG_CHECKPOINT: "checkpoint",
    FLAG_EVAL: "evaluation",
    FLAG_GRAPH_CAPTURE: "graph_capture",
    FLAG_TRUNCATED: "truncated",
    FLAG_SEGMENT_START: "segment_start",
}

NAN = math.nan


class IterationTable:
    """Per-iteration samples (one row per logged iteration line), one packed float64 column per field.

    Columns (float64, NaN = not printed): ``iteration``, ``train_iters``, ``segment``, ``line``, ``elapsed_s``
    (elapsed time per iteration, averaged by Megatron over the log interval), ``tflops`` (model TFLOP/s/GPU),
    ``lr``, ``gbs``, ``consumed_samples``, ``loss`` (the primary loss: ``lm loss`` or NeMo's ``reduced_train_loss``),
    ``loss_scale``, ``grad_norm``, ``num_zeros``, ``skipped`` and ``nan`` (Megatron's per-interval counters),
    ``loss_missing`` (1 when the line printed no primary loss; Megatron omits a loss key whose interval average is
    not > 0, which is the case for NaN), ``grad_norm_nonfinite`` and ``flags``. Other loss keys (MoE
    ``load_balancing_loss``, ``mtp_1 loss`` …) live in :attr:`extra_losses`, NaN-padded on access.

    Storage (:mod:`moetune.evidence.logs.columns`): rows appended one at a time wait in a row-major ``array('d')``
    of at most 8192 rows; columns are sealed in lossless encoded chunks of 8192 values (a few bytes per value:
    constants and counters cost ~nothing, line numbers 2 B, ``%.6E`` losses ~4 B). :attr:`nbytes` is the total.

    Analysis: inside :meth:`decoded` each column is decoded once and handed out read-only (the analysis of one run
    reads the same few columns many times); :meth:`memo` keeps small results derived from the rows (loss health, the
    detected level shift) so that ``moetune logs`` and ``moetune diagnose`` work on one record computes each once.
    Every change of the rows drops both.
    """

    COLUMNS = (
        "iteration",
        "train_iters",
        "segment",
        "line",
        "elapsed_s",
        "tflops",
        "lr",
        "gbs",
        "consumed_samples",
        "loss",
        "loss_scale",
        "grad_norm",
        "num_zeros",
        "skipped",
        "nan",
        "loss_missing",
        "grad_norm_nonfinite",
        "flags",
    )
    INDEX = {name: i for i, name in enumerate(COLUMNS)}
    NCOL = len(COLUMNS)

    def __init__(self) -> None:
        self._cols = [PackedColumn() for _ in self.COLUMNS]
        self._rows = array("d")  # pending rows, row-major
        self._n = 0  # rows, pending included
        self.extra_losses: dict[str, PackedColumn] = {}
        self._memo: dict[Any, Any] = {}  # small results derived from the rows (see memo)
        self._decoded: dict[str, np.ndarray] | None = None  # decoded columns while a decoded() block is open

    def _changed(self) -> None:
        """The rows changed: drop what was derived from them."""
        if self._memo:
            self._memo.clear()
        if self._decoded:
            self._decoded.clear()

    @contextmanager
    def decoded(self) -> Iterator[IterationTable]:
        """Within the block, :meth:`col` decodes each column once and returns that array, read-only (nested
        blocks share the outer one's columns); the arrays are released when the outermost block ends."""
        outer = self._decoded is None
        if outer:
            self._decoded = {}
        try:
            yield self
        finally:
            if outer:
                self._decoded = None

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, remembered under ``key`` until the rows change (for small results only)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def __len__(self) -> int:
        return self._n

    def _flush_rows(self) -> None:
        if not self._rows:
            return
        block = np.frombuffer(self._rows, dtype=np.float64).reshape(-1, self.NCOL).copy()
        self._rows = array("d")
        for j, col in enumerate(self._cols):
            col.extend(block[:, j])

    def _extra(self, key: str, n: int) -> PackedColumn:
        col = self.extra_losses.get(key)
        if col is None:
            col = self.extra_losses[key] = PackedColumn()
        col.pad(n)
        return col

    def append_values(self, values: list[float], extra: dict[str, float] | None = None) -> None:
        """Append one row given in :attr:`COLUMNS` order (the reader's general path)."""
        self._changed()
        self._rows.extend(values)
        if extra:
            for key, value in extra.items():
                self._extra(key, self._n).append(value)
        self._n += 1
        if len(self._rows) >= CHUNK * self.NCOL:
            self._flush_rows()

    def append(self, row: dict[str, float], extra: dict[str, float] | None = None) -> None:
        """Append one row given as ``{column: value}`` (missing columns are NaN)."""
        self.append_values([row.get(name, NAN) for name in self.COLUMNS], extra)

    def extend_block(self, block: np.ndarray, extras: dict[str, np.ndarray] | None = None) -> None:
        """Append ``k`` rows at once (``block`` has shape (k, NCOL), columns in :attr:`COLUMNS` order)."""
        self._changed()
        self._flush_rows()
        for key, values in (extras or {}).items():
            self._extra(key, self._n).extend(values)
        for j, col in enumerate(self._cols):
            col.extend(block[:, j])
        self._n += len(block)

    def set_order(self, order: np.ndarray | None) -> None:
        """Reorder the rows: row ``i`` becomes old row ``order[i]`` (rows left out are dropped, e.g. duplicates)."""
        if order is None:
            return
        order = np.asarray(order)
        self._flush_rows()
        for col in self._cols:
            col.assign(col.values()[order])
        for key in list(self.extra_losses):
            self.extra_losses[key].assign(self._col(key)[order])
        self._n = len(order)
        self._changed()

    def matrix(self) -> np.ndarray:
        """All rows as an (n, NCOL) array (a copy)."""
        if not self._n:
            return np.zeros((0, self.NCOL))
        return np.column_stack([self.col(name) for name in self.COLUMNS])

    def set_col(self, name: str, values: np.ndarray) -> None:
        self._changed()
        self._flush_rows()
        self._cols[self.INDEX[name]].assign(np.asarray(values, dtype=np.float64))

    def set_flag(self, index: int, flag: int) -> None:
        self._changed()
        self._flush_rows()
        col = self._cols[self.INDEX["flags"]]
        col.set(index, float(int(col.get(index)) | flag))

    def col(self, name: str) -> np.ndarray:
        """One column as a numpy array (a copy; inside :meth:`decoded`, the block's read-only array, which for a
        column of one value is that value broadcast, without memory per row)."""
        cache = self._decoded
        if cache is None:
            return self._col(name)
        v = cache.get(name)
        if v is None:
            self._flush_rows()
            packed = self.extra_losses.get(name) if name in self.extra_losses else self._cols[self.INDEX[name]]
            value = packed.constant() if len(packed) == self._n else None
            if value is not None:
                v = np.broadcast_to(np.float64(value), (self._n,))
            else:
                v = self._col(name)
                v.flags.writeable = False
            cache[name] = v
        return v

    def _col(self, name: str) -> np.ndarray:
        if name in self.extra_losses:
            v = self.extra_losses[name].values()
            if len(v) == self._n:
                return v
            out = np.full(self._n, np.nan)
            out[: len(v)] = v
            return out
        self._flush_rows()
        return self._cols[self.INDEX[name]].values()

    def last(self, name: str) -> float:
        if not self._n:
            return NAN
        self._flush_rows()
        return self._cols[self.INDEX[name]].get(-1)

    def row(self, index: int) -> dict[str, float]:
        self._flush_rows()
        out = {name: self._cols[i].get(index) for i, name in enumerate(self.COLUMNS)}
        for key, col in self.extra_losses.items():
            out[key] = col.get(index) if index < len(col) else NAN
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held by the samples (packed columns, pending rows, extra losses)."""
        return (sum(c.nbytes for c in self._cols) + len(self._rows) * 8 +
                sum(c.nbytes for c in self.extra_losses.values()))


@dataclass(slots=True)
class LineRef:
    """One log line kept as evidence: 1-based line number, rank (when a prefix names it) and text."""

    line: int
    text: str
    rank: int | None = None


@dataclass(slots=True)
class MemoryReport:
    """A ``[Rank r] (after N iterations) memory (MB|GB) | …`` line, values converted to bytes.

    Megatron's older form prints MiB (``torch.cuda.memory_allocated() / 1024 / 1024``); Bridge's ``mem-…-gigabytes``
    form prints decimal GB (bytes / 1e9), BPN §3.
    """

    line: int
    rank: int | None
    after_iteration: int | None
    unit: str
    values_bytes: dict[str, float]


@dataclass(slots=True)
class TheoreticalMemory:
    """``Theoretical memory footprints: weight and optimizer=… MB[, activation=… MB, total=… MB]`` (MB = MiB)."""

    line: int
    weight_and_optimizer_mib: float
    activation_mib: float | None = None
    total_mib: float | None = None
    source: str = "megatron"


@dataclass(slots=True)
class TimerStat:
    """One named timer across all blocks seen: last (min, max) over ranks and running aggregates of the max."""

    name: str
    last_min_ms: float | None
    last_max_ms: float
    count: int = 1
    sum_max_ms: float = 0.0
    peak_max_ms: float = 0.0
    first_line: int = 0

    @property
    def mean_max_ms(self) -> float:
        return self.sum_max_ms / self.count if self.count else NAN


@dataclass(slots=True)
class Event:
    """A non-iteration event that affects timing windows (profiler, checkpoint, evaluation, graph capture, restart)."""

    line: int
    kind: str
    text: str
    iteration: int | None = None


@dataclass(slots=True)
class Signal:
    """A line that signals a failure or an anomaly, kept for diagnosis (capped per kind)."""

    line: int
    kind: str
    text: str
    rank: int | None = None
    context: tuple[LineRef, ...] = ()
    frames: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunRecord:
    """Everything one log file says about one run (see module docstring)."""

    path: str
    source: str = "megatron-lm"  # megatron-lm | megatron-bridge | nemo | megatron-golden
    lines: int = 0
    bytes: int = 0
    recognised_lines: int = 0
    iterations: IterationTable = field(default_factory=IterationTable)
    step_time: IterationTable = field(default_factory=IterationTable)  # Bridge rank-0 "Step Time" lines
    memory_reports: list[MemoryReport] = field(default_factory=list)
    theoretical_memory: list[TheoreticalMemory] = field(default_factory=list)
    parameter_counts: dict[str, float] = field(default_factory=dict)
    timers: dict[str, TimerStat] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    config_source: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)
    signal_counts: dict[str, int] = field(default_factory=dict)
    segments: int = 1
    restart_lines: list[int] = field(default_factory=list)
    ranks_seen: set[int] = field(default_factory=set)
    truncated_last_line: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def has_iterations(self) -> bool:
        return len(self.iterations) > 0

    def signals_of(self, kind: str) -> list[Signal]:
        return [s for s in self.signals if s.kind == kind]

    def memory_peaks(self) -> dict[str, dict[str, float]]:
        """Per rank: the max of each memory statistic over all reports, in bytes."""
        out: dict[str, dict[str, float]] = {}
        for rep in self.memory_reports:
            key = "last" if rep.rank is None and self.source == "megatron-golden" else str(rep.rank)
            cur = out.setdefault(key, {})
            for k, v in rep.values_bytes.items():
                if v == v and (k not in cur or v > cur[k]):
                    cur[k] = v
        return out
