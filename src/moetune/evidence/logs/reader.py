"""Streaming reader for Megatron-LM / Megatron-Bridge / NeMo-Lightning training logs.

One pass over the file in binary mode (4 MiB chunks split into lines in C), in memory bounded by the number of
*iterations* (packed numeric columns, ~24 bytes per logged iteration, see :mod:`.columns`) and small capped lists of
evidence lines, never by the size of the text. Each line is first tested with cheap ``in`` checks on literals; only
candidate lines reach a regex, and only lines kept as evidence are decoded. Complete iteration lines of a layout
seen before skip the state machine: they are queued in line order and parsed in batches of 8192 (one compiled
regex per layout over the joined batch, then ``float`` column by column).

Handled: iteration lines with every field (BPN §3 order; Megatron-DeepSpeed/LLM forks' extra fields are ignored),
lines wrapped by a terminal at a fixed width (re-joined without a separator: the wrap either split a word or the
trailing blank was stripped, and field keys are compared with whitespace removed), ANSI colour codes, carriage-return
progress bars, rank prefixes (``[rank5]:``, ``[default3]:``, ``3: ``) of several ranks interleaved, restarts
(iteration numbers going back, a new ``[before the start of training step]`` after iterations), duplicated lines
from several ranks, truncated last lines, gzip-compressed logs.
"""

from __future__ import annotations

import gzip
import math
import re
from collections import deque
from operator import itemgetter
from pathlib import Path
from typing import IO, Any

import numpy as np

from moetune.errors import InputError
from moetune.evidence.logs import patterns as P
from moetune.evidence.logs.model import (
    FLAG_CHECKPOINT,
    FLAG_EVAL,
    FLAG_GRAPH_CAPTURE,
    FLAG_PROFILED,
    FLAG_SEGMENT_START,
    FLAG_TRUNCATED,
    NAN,
    Event,
    IterationTable,
    LineRef,
    MemoryReport,
    RunRecord,
    Signal,
    TheoreticalMemory,
    TimerStat,
)

#: evidence lines kept per signal kind (the count of all of them is kept in ``signal_counts``)
MAX_SIGNALS_PER_KIND = 50
MAX_EVENTS = 5000
MAX_MEMORY_REPORTS = 4096
MAX_CONFIG_LINES = 20000
#: physical lines a wrapped record may span
MAX_WRAP_LINES = 12
#: bytes read per chunk (lines are split from chunks in C)
CHUNK_BYTES = 1 << 22
#: a physical line shorter than this was not wrapped by a terminal
MIN_WRAP_WIDTH = 40
CONTEXT_LINES = 4
_RING_MASK = 7  # ring buffer of the last 8 lines (>= CONTEXT_LINES)

# canonical iteration-line keys: whitespace removed, lower case -> (column, scale)
_ITER_KEYS: dict[bytes, tuple[str, float]] = {
    b"consumedsamples": ("consumed_samples", 1.0),
    b"consumed_samples": ("consumed_samples", 1.0),
    b"elapsedtimeperiteration(ms)": ("elapsed_s", 1e-3),
    b"elapsedtimeperiteration(s)": ("elapsed_s", 1.0),
    b"train_step_timingins": ("elapsed_s", 1.0),
    b"throughputpergpu(tflop/s/gpu)": ("tflops", 1.0),
    b"tflops": ("tflops", 1.0),
    b"learningrate": ("lr", 1.0),
    b"lr": ("lr", 1.0),
    b"globalbatchsize": ("gbs", 1.0),
    b"global_batch_size": ("gbs", 1.0),
    b"lossscale": ("loss_scale", 1.0),
    b"gradnorm": ("grad_norm", 1.0),
    b"numzeros": ("num_zeros", 1.0),
    b"numberofskippediterations": ("skipped", 1.0),
    b"numberofnaniterations": ("nan", 1.0),
    b"global_step": ("global_step", 1.0),
}
_PRIMARY_LOSS = {b"lmloss", b"reduced_train_loss", b"loss", b"train_loss"}
_IGNORED_LOSS = {b"val_loss", b"validation_loss"}

_VERSION_NAMES = {
    "megatron-core": "megatron-core", "megatroncore": "megatron-core", "megatron_core": "megatron-core",
    "megatron core": "megatron-core", "mcore": "megatron-core", "megatron-bridge": "megatron-bridge",
    "megatronbridge": "megatron-bridge", "megatron_bridge": "megatron-bridge", "megatron bridge": "megatron-bridge",
    "megatron-lm": "megatron-lm", "megatronlm": "megatron-lm", "megatron_lm": "megatron-lm",
    "megatron lm": "megatron-lm", "transformer-engine": "transformer-engine",
    "transformerengine": "transformer-engine", "transformer_engine": "transformer-engine",
    "transformer engine": "transformer-engine", "pytorch": "torch", "torch": "torch", "nccl": "nccl",
    "nemo": "nemo", "cuda": "cuda", "cudnn": "cudnn", "deepep": "deepep", "nvshmem": "nvshmem",
    "container": "container", "apex": "apex",
}


def _num(v: bytes) -> float:
    try:
        return float(v)
    except ValueError:
        return NAN


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "replace").rstrip()


def _coerce(text: str) -> Any:
    t = text.strip()
    if t in ("None", "null", ""):
        return None
    if t in ("True", "true"):
        return True
    if t in ("False", "false"):
        return False
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out.update(_flatten(v, key))
            else:
                out[key] = v
    return out


_IDX = IterationTable.INDEX
_C_ITER, _C_TOTAL, _C_SEGMENT, _C_LINE = _IDX["iteration"], _IDX["train_iters"], _IDX["segment"], _IDX["line"]
_C_ELAPSED, _C_LOSS_MISSING, _C_GN_BAD, _C_FLAGS = (_IDX["elapsed_s"], _IDX["loss_missing"],
                                                    _IDX["grad_norm_nonfinite"], _IDX["flags"])
#: how lines that start another record begin (never the continuation of a wrapped one)
_NOT_CONTINUATION = (b"[", b">", b"Traceback", b"File ", b"(min", b"time (ms)", b"Step Time", b"Number of",
                     b"Theoretical", b"Training epoch")
#: distinct iteration-line layouts remembered for the fast path
MAX_SHAPES = 16
#: queued fast-path rows converted per batch
FLUSH_ROWS = 8192
#: marks kept for window flags (profiler, checkpoint, evaluation, graph capture, restart)
MAX_MARKS = 1_000_000
MARK_RESTART = -1
MARK_PROFILE_START = -2
MARK_PROFILE_STOP = -3


#: columns the fast path converts; other printed fields (energy, power, params norm, max attention logit …) are
#: matched but not converted (float parsing dominates the cost of an iteration line)
_FAST_COLUMNS = frozenset({"elapsed_s", "tflops", "gbs", "loss_scale", "grad_norm", "skipped", "nan", "lr",
                           "num_zeros", "consumed_samples"})


def _parse_columns(groups: list[tuple[bytes, ...]], k: int, width: int) -> np.ndarray:
    """float() of every captured value, column by column; a column whose values repeat (batch size, loss scale,
    skipped/NaN counters) converts each distinct value once. Raises ValueError on an unparsable value."""
    out = np.empty((k, width))
    for j, col in enumerate(zip(*groups, strict=True)):
        if len(set(col[::64])) <= 4:
            distinct = set(col)
            if len(distinct) <= 64:
                conv = {v: float(v) for v in distinct}
                out[:, j] = np.fromiter(map(conv.__getitem__, col), dtype=np.float64, count=k)
                continue
        out[:, j] = np.fromiter(map(float, col), dtype=np.float64, count=k)
    return out


class _Shape:
    """One iteration-line layout (its exact key sequence), compiled to a single regex for the fast path.

    Megatron formats every field with a fixed format string, so consecutive lines of a run share the key bytes
    exactly; lines of a known layout are matched by one regex each and their numbers converted in bulk.
    """

    __slots__ = ("rx_full", "rx_multi", "perm_full", "scale", "gn_idx", "has_primary", "extras", "total")

    def __init__(self, keys: list[bytes], cache: dict[bytes, tuple[str, Any]], total: float) -> None:
        parts, mparts = [], []
        cols: list[tuple[str, Any]] = []  # per capture group: (kind, arg)
        for j, k in enumerate(keys):
            kind, arg = cache[k]
            needed = (kind == "col" and arg[0] in _FAST_COLUMNS) or kind in ("primary", "loss")
            last = j == len(keys) - 1
            parts.append(re.escape(k) + b":" + (rb"([^|]*)" if needed else rb"[^|]*") +
                         (rb"\|?\s*\Z" if last else rb"\|"))
            mparts.append(re.escape(k) + b":" + (rb"([^|\n]*)" if needed else rb"[^|\n]*") +
                          (rb"\|?[ \t\r]*$" if last else rb"\|"))
            if needed:
                cols.append((kind, arg))
        self.rx_full = re.compile(rb"[^|]*?\biteration\s+(\d+)\s*/\s*\d+\s*\|" + b"".join(parts), re.S)
        self.rx_multi = re.compile(rb"^[^|\n]*?\biteration[ \t]+(\d+)[ \t]*/[ \t]*\d+[ \t]*\|" + b"".join(mparts),
                                   re.M)
        self.total = total
        g = len(cols) + 1  # groups: iteration, then the needed fields; index g is the NaN appended
        perm = [g] * IterationTable.NCOL
        perm[_C_ITER] = 0
        self.scale, self.gn_idx = 1.0, -1
        self.has_primary = False
        self.extras: list[tuple[str, int]] = []
        for i, (kind, arg) in enumerate(cols, start=1):
            if kind == "col":
                col, scale = arg
                perm[_IDX[col]] = i
                if col == "elapsed_s":
                    self.scale = scale
                elif col == "grad_norm":
                    self.gn_idx = i
            elif kind == "primary":
                perm[_IDX["loss"]] = i
                self.has_primary = True
            else:
                self.extras.append((arg, i))
        self.perm_full = np.array(perm, dtype=np.int64)


class _Parser:
    """Line-by-line state machine filling a :class:`RunRecord`."""

    def __init__(self, rec: RunRecord) -> None:
        self.rec = rec
        self.ring: list[bytes | None] = [None] * (_RING_MASK + 1)
        self.pending: list[bytes] | None = None  # open wrapped record (physical lines)
        self.pending_kind = ""
        self.pending_line = 0
        self.pending_rank: int | None = None
        self.pending_width = 0
        self.block = ""  # "args" | "config" | "timers"
        self.block_lines: list[bytes] = []
        self.block_start = 0
        self.marks: list[tuple[int, int]] = []  # (line, flag or MARK_*) resolved against rows in finish()
        self.rows_seen = 0
        self.step_flags = 0  # flags for the next Bridge "Step Time" record
        self.profiling = False
        self.frames: dict[int | None, deque[str]] = {}
        self.tb_open: dict[int | None, int] = {}
        self.key_cache: dict[bytes, tuple[str, Any]] = {}
        self.shapes: list[_Shape] = []
        # complete iteration lines of known layouts waiting for bulk parsing, in line order
        self.q_raw: list[bytes] = []
        self.q_lines: list[int] = []
        self.q_shape: list[_Shape] = []
        self.shape_keys: set[tuple] = set()
        self.shape_hint: dict[tuple[int, int], _Shape] = {}
        self.timer_names: dict[bytes, str] = {}
        self.sources: set[str] = set()

    # ---------------------------------------------------------------- helpers
    def _rank(self, line: bytes) -> tuple[bytes, int | None]:
        m = P.RANK_PREFIX.match(line)
        if m is None:
            return line, None
        r = m.group(1) or m.group(2)
        rank = int(r)
        self.rec.ranks_seen.add(rank)
        return line[m.end():], rank

    def _event(self, line_no: int, kind: str, text: bytes) -> None:
        rec = self.rec
        rec.recognised_lines += 1
        if len(rec.events) < MAX_EVENTS:
            rec.events.append(Event(line_no, kind, _dec(text).strip(), None))

    def _signal(self, line_no: int, kind: str, text: bytes, rank: int | None, *, frames: tuple[str, ...] = (),
                data: dict[str, Any] | None = None, context: bool = False) -> None:
        rec = self.rec
        rec.recognised_lines += 1
        n = rec.signal_counts.get(kind, 0)
        rec.signal_counts[kind] = n + 1
        if n >= MAX_SIGNALS_PER_KIND:
            return
        ctx: tuple[LineRef, ...] = ()
        if context:
            ctx = self._context(line_no)
        rec.signals.append(Signal(line_no, kind, _dec(text).strip(), rank, ctx, frames, data or {}))

    def _capped(self, line_no: int, kind: str, line: bytes) -> None:
        """A frequent signal: count it; keep its text only below the per-kind cap."""
        n = self.rec.signal_counts.get(kind, 0)
        if n >= MAX_SIGNALS_PER_KIND:
            self.rec.signal_counts[kind] = n + 1
            self.rec.recognised_lines += 1
            return
        if b"\x1b" in line:
            line = P.ANSI.sub(b"", line)
        body, rank = self._rank(line)
        self._signal(line_no, kind, body, rank)

    # ---------------------------------------------------------------- driver
    def _nccl_info(self, line_no: int, line: bytes) -> None:
        """NCCL_DEBUG=INFO chatter: only connection-closed and version lines matter."""
        if b"Connection closed by localRank" in line:
            self._capped(line_no, "nccl_connection_closed", line)
        elif b"NCCL version" in line:
            self._version(line_no, line)
        else:
            self.rec.recognised_lines += 1

    def feed(self, line_no: int, line: bytes) -> None:
        """One line without its ``\\n``."""
        if self.pending is None and not self.block:
            if b"NCCL INFO" in line:
                self._nccl_info(line_no, line)
                self.ring[line_no & _RING_MASK] = line
                return
            if b"nan iterations" in line and self.shapes and self._fast_iteration(line_no, line):
                self.ring[line_no & _RING_MASK] = line
                return
        elif self.block == "timers" and self.pending is None and line[:1] == b" " and b"\r" not in line and \
                b"\x1b" not in line:
            # a timer line of a "(min, max) time across ranks" block (the general path below, without its checks)
            m = P.TIMER_MINMAX.match(line)
            if m:
                self._timer_match(line_no, m)
                self.ring[line_no & _RING_MASK] = line
                return
        if b"\r" in line:  # CRLF endings; progress bars that overwrite themselves
            parts = [p for p in line.split(b"\r") if p.strip()]
            line = parts[-1] if parts else b""
        if b"\x1b" in line:
            line = P.ANSI.sub(b"", line)
        if self.pending is not None and self._continue_pending(line):
            pass
        elif self.block and self._continue_block(line_no, line):
            pass
        elif b"nan iterations" in line and self.shapes and self._fast_iteration(line_no, line):
            pass
        else:
            self._dispatch(line_no, line)
        self.ring[line_no & _RING_MASK] = line

    def _fast_iteration(self, line_no: int, line: bytes) -> bool:
        """A complete iteration line of a known layout: queue it for bulk parsing.

        The layout is guessed from the numbers of ``|`` and ``:`` (a hint, verified exactly when the batch is parsed:
        lines that do not match go through the general parser then); a line without a hint is matched against each
        known layout.
        """
        if b"nan iterations" not in line:  # possibly the first piece of a wrapped record: general path
            return False
        pipes = (line.count(b"|"), line.count(b":"))
        shape = self.shape_hint.get(pipes)
        if shape is None:
            for cand in self.shapes:
                if cand.rx_full.match(line) is not None:
                    shape = self.shape_hint[pipes] = cand
                    break
            else:
                return False
        self.q_raw.append(line)
        self.q_lines.append(line_no)
        self.q_shape.append(shape)
        self.rows_seen += 1
        if len(self.q_raw) >= FLUSH_ROWS:
            self._flush_queue()
        return True

    def _flush_queue(self) -> None:
        """Parse the queued iteration lines, grouped by layout, and append them as one block in line order (so the
        table rarely needs reordering at the end)."""
        raw, lines, shapes = self.q_raw, self.q_lines, self.q_shape
        if not raw:
            return
        self.q_raw, self.q_lines, self.q_shape = [], [], []
        first = shapes[0]
        if shapes.count(first) == len(shapes):
            parts = [self._parse_shape(first, raw, lines)]
        else:  # group by layout in C: shape index per line, then itemgetter picks each group's lines
            index = {sh: i for i, sh in enumerate(dict.fromkeys(shapes))}
            ids = np.fromiter(map(index.__getitem__, shapes), dtype=np.int64, count=len(shapes))
            parts = []
            for sh, i in index.items():
                ix = np.flatnonzero(ids == i).tolist()
                pick = itemgetter(*ix)
                sub_raw, sub_lines = (pick(raw), pick(lines)) if len(ix) > 1 else ((raw[ix[0]],), (lines[ix[0]],))
                parts.append(self._parse_shape(sh, list(sub_raw), list(sub_lines)))
        parts = [pt for pt in parts if pt is not None]
        if not parts:
            return
        if len(parts) == 1:
            block, extras = parts[0]
        else:
            block = np.concatenate([b for b, _ in parts])
            k = len(block)
            extras = {}
            off = 0
            for b, ex in parts:
                for key, v in ex.items():
                    col = extras.get(key)
                    if col is None:
                        col = extras[key] = np.full(k, np.nan)
                    col[off:off + len(b)] = v
                off += len(b)
            order = np.argsort(block[:, _C_LINE], kind="stable")
            block = block[order]
            extras = {key: v[order] for key, v in extras.items()}
        self.rec.iterations.extend_block(block, extras)

    def _parse_shape(self, shape: _Shape, raw: list[bytes], lines: list[int]) -> tuple[np.ndarray, dict] | None:
        """Parse lines of one layout in bulk (one multi-line regex pass, then the numbers column by column); lines
        that turn out not to be of this layout go through the general parser."""
        groups = shape.rx_multi.findall(b"\n".join(raw))
        if len(groups) != len(raw):  # some line is not of this layout: match one by one
            groups, ok_lines = [], []
            for ln, line in zip(lines, raw, strict=True):
                m = shape.rx_full.match(line)
                if m is not None:
                    groups.append(m.groups())
                    ok_lines.append(ln)
                else:
                    self._reparse(ln, line)
            lines = ok_lines
        if not groups:
            return None
        if not isinstance(groups[0], tuple):
            groups = [(g,) for g in groups]
        self.rec.recognised_lines += len(groups)
        k = len(groups)
        width = len(groups[0])
        try:
            arr = _parse_columns(groups, k, width)
        except ValueError:  # a value with blanks inside or an unparsable value: convert one by one
            arr = np.array([[_num(x) for x in g] for g in groups], dtype=np.float64)
        arr = np.concatenate([arr, np.full((k, 1), np.nan)], axis=1)
        block = arr[:, shape.perm_full]
        block[:, _C_TOTAL] = shape.total
        if shape.scale != 1.0:
            block[:, _C_ELAPSED] *= shape.scale
        if shape.gn_idx >= 0:
            gn = arr[:, shape.gn_idx]
            block[:, _C_GN_BAD] = np.where(np.isfinite(gn), np.nan, 1.0)
        block[:, _C_LOSS_MISSING] = 0.0 if shape.has_primary else 1.0
        block[:, _C_LINE] = lines
        block[:, _C_FLAGS] = 0.0
        block[:, _C_SEGMENT] = 0.0
        return block, {name: arr[:, i] for name, i in shape.extras}

    def _reparse(self, line_no: int, line: bytes) -> None:
        """A queued line that is not of its guessed layout: parse it with the general iteration parser."""
        self.rows_seen -= 1
        body, rank = self._rank(line)
        m = P.iter_head(body)
        if m is None:
            return
        self._finish_iteration(line_no, body[m.end():], int(m.group(1)), int(m.group(2)), rank,
                               complete=b"nan iterations" in line)

    def _context(self, line_no: int) -> tuple[LineRef, ...]:
        """The up to ``CONTEXT_LINES`` lines before ``line_no`` (from the ring buffer)."""
        out = []
        for ln in range(max(1, line_no - CONTEXT_LINES), line_no):
            t = self.ring[ln & _RING_MASK]
            if t is not None:
                out.append(LineRef(ln, _dec(t)))
        return tuple(out)

    def _dispatch(self, line_no: int, line: bytes) -> None:  # noqa: C901 - one flat switch on literals
        if b"iteration" in line:
            if self._iteration_line(line_no, line):
                return
            if b"(after" in line and b"memory" in line:
                self._memory_line(line_no, line)
                return
            if b"validation loss at iteration" in line or b"validation loss at the end" in line:
                self._mark(line_no, FLAG_EVAL)
                self._event(line_no, "evaluation", line)
                return
            if b"checkpoint" in line:
                self._checkpoint(line_no, line)
                return
        if b"NCCL INFO" in line:
            self._nccl_info(line_no, line)
            return
        if b"Step Time" in line:
            m = P.STEP_TIME.search(line)
            if m:
                self._step_time(line_no, line, m)
                return
        if b"memory" in line:
            if b"Theoretical memory" in line:
                self._theoretical(line_no, line)
                return
            if b"(after" in line:
                self._memory_line(line_no, line)
                return
        if b"time across ranks" in line:
            self.block = "timers"
            self.rec.recognised_lines += 1
            return
        if b"time (ms)" in line:
            self._single_line_timers(line_no, line)
            return
        if b"in billions" in line:
            m = P.PARAM_COUNT.search(line)
            if m:
                self.rec.parameter_counts[_dec(m.group(1)).strip()] = float(m.group(2))
                self.rec.recognised_lines += 1
                return
        if b"---" in line:
            if self._block_start(line_no, line):
                return
        if line.startswith(P.CONFIG_TARGET):  # a bare ConfigContainer.print_yaml() dump
            self.block = "config"
            self.block_lines = [line]
            self.block_start = line_no
            self.rec.recognised_lines += 1
            return
        if b"before the start of training step" in line:
            self.rec.recognised_lines += 1
            if self.rows_seen:
                self._mark(line_no, MARK_RESTART)
                self._event(line_no, "restart", line)
            return
        if b"ersion" in line:
            self._version(line_no, line)
        if b"using world size:" in line:
            self._world_line(line_no, line)
            return
        if b"NVIDIA " in line and "gpu" not in self.rec.meta:
            m = P.GPU_NAME.search(line)
            if m:
                self.rec.meta["gpu"] = m.group(1).decode("utf-8", "replace")
                self.rec.meta["gpu_name"] = _dec(m.group(0)).strip()
        self._signals(line_no, line)

    def _world_line(self, line_no: int, line: bytes) -> None:
        """Megatron's ``using world size: W, data-parallel size: D, ..., tensor-model-parallel size: T, ...``."""
        self.rec.recognised_lines += 1
        for m in P.WORLD_FIELD.finditer(line):
            name = m.group(1).decode("utf-8", "replace").strip().removeprefix("using").strip().replace("-", "_").replace(" ", "_")
            key = "world_size" if name == "world" else f"{name}_size"
            self.rec.config.setdefault(key, int(m.group(2)))
        self.rec.config_source = self.rec.config_source or "megatron-world-size-line"

    # ---------------------------------------------------------------- iteration lines
    def _iteration_line(self, line_no: int, line: bytes) -> bool:
        if b"Training epoch" in line:
            m2 = P.NEMO_HEAD.search(line)
            if m2:
                body, rank = self._rank(line)
                m2 = P.NEMO_HEAD.search(body)
                if self.pending is not None:
                    self._close_pending(truncated=False)
                self.sources.add("nemo")
                self._finish_iteration(line_no, body[m2.end():], int(m2.group(2)), int(m2.group(3)), rank,
                                       complete=True, nemo=True)
                return True
        body, rank = self._rank(line) if line[:1] != b" " else (line, None)
        m = P.iter_head(body)
        if m is None:
            return False
        if self.pending is not None:
            self._close_pending(truncated=False)
        if b"nan iterations" in line or len(line) < MIN_WRAP_WIDTH:
            self._finish_iteration(line_no, body[m.end():], int(m.group(1)), int(m.group(2)), rank, complete=True)
        else:
            self.pending = [body]
            self.pending_kind = "iteration"
            self.pending_line = line_no
            self.pending_rank = rank
            self.pending_width = len(line)
        return True

    def _continue_pending(self, line: bytes) -> bool:
        """Append ``line`` to the open wrapped record when it continues it (closing the record once complete); else
        close the record and return False. A continuation is a non-blank line with a ``|`` or ``:`` that does not
        start like another record, after a physical line at least :data:`MIN_WRAP_WIDTH` wide."""
        pending = self.pending
        if self.pending_width >= MIN_WRAP_WIDTH and len(pending) < MAX_WRAP_LINES and \
                (b"|" in line or b":" in line) and line.strip() and \
                not line.lstrip()[:12].startswith(_NOT_CONTINUATION) and \
                (b"iteration" not in line or P.iter_head(line) is None):  # type: ignore[arg-type]
            pending.append(line)  # type: ignore[union-attr]
            self.pending_width = len(line)
            if self.pending_kind == "iteration":
                done = b"nan iterations" in line and line.rstrip().endswith(b"|")
            else:
                done = b"max reserved" in line or b"max-reserved" in line or b"count" in line
            if done:
                self._close_pending(truncated=False)
            return True
        self._close_pending(truncated=False)
        return False

    def _close_pending(self, *, truncated: bool) -> None:
        parts, self.pending = self.pending, None
        if not parts:
            return
        text = b"".join(parts)
        if self.pending_kind == "iteration":
            if self.shapes and b"nan iterations" in text and self._fast_iteration(self.pending_line, text):
                return
            m = P.iter_head(text)
            complete = b"nan iterations" in text
            self._finish_iteration(self.pending_line, text[m.end():], int(m.group(1)), int(m.group(2)),
                                   self.pending_rank, complete=complete, truncated=truncated and not complete)
        else:
            self._memory_text(self.pending_line, text, self.pending_rank)

    def _finish_iteration(self, line_no: int, rest: bytes, iteration: int, total: int, rank: int | None, *,
                          complete: bool, truncated: bool = False, nemo: bool = False) -> None:
        self.rec.recognised_lines += 1
        self._slow_iteration(line_no, rest, iteration, total, rank, complete=complete, truncated=truncated, nemo=nemo)

    def _slow_iteration(self, line_no: int, rest: bytes, iteration: int, total: int, rank: int | None, *,
                        complete: bool, truncated: bool, nemo: bool) -> None:
        row: dict[str, float] = {"iteration": float(iteration), "train_iters": float(total)}
        extra: dict[str, float] | None = None
        has_primary = False
        has_loss_scale = False
        cache = self.key_cache
        keys: list[bytes] = []
        numeric = True
        for seg in rest.split(b"|"):
            k, sep, v = seg.partition(b":")
            if not sep:
                if seg.strip():
                    numeric = False
                continue
            keys.append(k)
            spec = cache.get(k)
            if spec is None:
                spec = cache[k] = self._key_spec(k)
            kind, arg = spec
            x = _num(v.strip())
            if x != x and v.strip().lower() not in (b"nan", b"-nan"):
                numeric = False
            if kind == "col":
                col, scale = arg
                if x == x or col == "grad_norm":
                    row[col] = x * scale if x == x else x
                if col == "loss_scale":
                    has_loss_scale = True
            elif kind == "primary":
                row["loss"] = x
                has_primary = True
            elif kind == "loss":
                if extra is None:
                    extra = {}
                extra[arg] = x
        if nemo:
            gs = row.pop("global_step", None)
            if gs is not None:
                row["iteration"] = gs
        else:
            row.pop("global_step", None)
            shape_key = (tuple(keys), total)
            if numeric and keys and complete and not truncated and len(self.shapes) < MAX_SHAPES and \
                    shape_key not in self.shape_keys:
                self.shape_keys.add(shape_key)
                self.shapes.append(_Shape(keys, cache, float(total)))
        gn = row.get("grad_norm", NAN)
        if "grad_norm" in row and not math.isfinite(gn):
            row["grad_norm_nonfinite"] = 1.0
        elif "grad_norm" in row and gn != gn:
            row.pop("grad_norm")
        row["loss_missing"] = 0.0 if has_primary or nemo or not (complete or has_loss_scale) else 1.0
        self._commit([row.get(name, NAN) for name in IterationTable.COLUMNS], extra, line_no, rank, truncated, nemo)

    def _commit(self, row: list[float], extra: dict[str, float] | None, line_no: int, rank: int | None,
                truncated: bool, nemo: bool) -> None:
        """Append one row; segments, duplicates and window flags are resolved in :meth:`finish`."""
        row[_C_FLAGS] = float(FLAG_TRUNCATED) if truncated else 0.0
        row[_C_SEGMENT] = 0.0
        row[_C_LINE] = float(line_no)
        if rank is not None:
            self.rec.ranks_seen.add(rank)
        self.rows_seen += 1
        if self.q_raw:  # keep rows in line order
            self._flush_queue()
        self.rec.iterations.append_values(row, extra)
        self.sources.add("nemo" if nemo else "megatron")

    def _key_spec(self, k: bytes) -> tuple[str, Any]:
        norm = b"".join(k.split()).lower()
        if norm in _ITER_KEYS:
            return "col", _ITER_KEYS[norm]
        if norm in _PRIMARY_LOSS:
            return "primary", None
        if norm.endswith(b"loss") and norm not in _IGNORED_LOSS:
            return "loss", " ".join(_dec(k).split())
        return "ignore", None

    def _mark(self, line_no: int, kind: int) -> None:
        if len(self.marks) < MAX_MARKS:
            self.marks.append((line_no, kind))

    # ---------------------------------------------------------------- Bridge step time
    def _step_time(self, line_no: int, line: bytes, m: Any) -> None:
        rec = self.rec
        rec.recognised_lines += 1
        self.sources.add("bridge")
        flags = self.step_flags | (FLAG_PROFILED if self.profiling else 0)
        self.step_flags = 0
        rec.step_time.append({"iteration": NAN, "line": float(line_no), "elapsed_s": float(m.group(1)),
                              "tflops": float(m.group(2)) if m.group(2) else NAN, "flags": float(flags),
                              "segment": NAN})

    # ---------------------------------------------------------------- memory
    def _memory_line(self, line_no: int, line: bytes) -> None:
        body, rank = self._rank(line)
        if P.MEMORY_HEAD.search(body) is None:
            self._signals(line_no, line)
            return
        if self.pending is not None:
            self._close_pending(truncated=False)
        done = b"max reserved" in body or b"max-reserved" in body or b"count" in body
        if done or len(line) < MIN_WRAP_WIDTH:
            self._memory_text(line_no, body, rank)
        else:
            self.pending = [body]
            self.pending_kind = "memory"
            self.pending_line = line_no
            self.pending_rank = rank
            self.pending_width = len(line)

    def _memory_text(self, line_no: int, text: bytes, prefix_rank: int | None) -> None:
        m = P.MEMORY_HEAD.search(text)
        if m is None:
            return
        rec = self.rec
        rec.recognised_lines += 1
        unit = m.group(3)
        scale = {b"MB": 2**20, b"MiB": 2**20, b"GB": 1e9, b"GiB": 2**30, b"bytes": 1.0}[unit]
        values: dict[str, float] = {}
        for fm in P.MEMORY_FIELD.finditer(text, m.end()):
            key = fm.group(1).decode("utf-8", "replace").strip().lower()
            if key.startswith("mem-"):
                key = key[4:]
            for suffix in ("-gigabytes", "-megabytes", "-bytes"):
                if key.endswith(suffix):
                    key = key[: -len(suffix)]
            key = key.replace("-", " ")
            x = _num(fm.group(2))
            values[key] = x if key in ("alloc retires", "allocated count") else x * scale
        if len(rec.memory_reports) < MAX_MEMORY_REPORTS:
            rec.memory_reports.append(MemoryReport(line_no, int(m.group(1)), int(m.group(2)), unit.decode("utf-8", "replace"), values))

    def _theoretical(self, line_no: int, line: bytes) -> None:
        m = P.THEORETICAL.search(line)
        if m is None:
            return
        self.rec.recognised_lines += 1
        self.rec.theoretical_memory.append(TheoreticalMemory(
            line_no, float(m.group(2)), float(m.group(3)) if m.group(3) else None,
            float(m.group(4)) if m.group(4) else None, "flagscale" if m.group(1) else "megatron"))

    # ---------------------------------------------------------------- timers
    def _timer(self, line_no: int, name: str, lo: float | None, hi: float) -> None:
        t = self.rec.timers.get(name)
        if t is None:
            self.rec.timers[name] = TimerStat(name, lo, hi, 1, hi, hi, line_no)
        else:
            t.last_min_ms, t.last_max_ms = lo, hi
            t.count += 1
            t.sum_max_ms += hi
            t.peak_max_ms = max(t.peak_max_ms, hi)

    def _single_line_timers(self, line_no: int, line: bytes) -> None:
        body, _ = self._rank(line)
        idx = body.find(b"time (ms)")
        self.rec.recognised_lines += 1
        for seg in body[idx + 9:].split(b"|"):
            m = P.TIMER_SINGLE_LINE.search(seg)
            if m:
                self._timer(line_no, m.group(1).decode("utf-8", "replace").strip(), None, float(m.group(2)))

    # ---------------------------------------------------------------- blocks (args, config, timers)
    def _block_start(self, line_no: int, line: bytes) -> bool:
        body, _ = self._rank(line)
        if P.ARGS_START.match(body):
            self.block = "args"
        elif P.CONFIG_START.search(body):
            self.block = "config"
        else:
            return False
        self.block_lines = []
        self.block_start = line_no
        self.rec.recognised_lines += 1
        return True

    def _timer_match(self, line_no: int, m) -> None:
        """Record a matched "(min, max) time across ranks" timer line (timer names decoded once per name)."""
        raw = m.group(1)
        name = self.timer_names.get(raw)
        if name is None:
            name = self.timer_names[raw] = raw.decode("utf-8", "replace").strip()
        self._timer(line_no, name, float(m.group(2)), float(m.group(3)))

    def _continue_block(self, line_no: int, line: bytes) -> bool:
        body, _ = self._rank(line) if line[:1] != b" " else (line, None)
        kind = self.block
        if kind == "timers":
            m = P.TIMER_MINMAX.match(body)
            if m:
                self._timer_match(line_no, m)
                return True
            self.block = ""
            return False
        if kind == "args":
            if P.ARGS_END.match(body):
                self._end_args()
                return True
            m = P.ARGS_ITEM.match(body)
            if m and len(self.block_lines) < MAX_CONFIG_LINES:
                self.block_lines.append(body)
                return True
            self._end_args()
            return False
        # config YAML: indented or "key: value" lines, until a dash line or something else
        stripped = body.strip()
        if P.DASH_LINE.match(body):
            self._end_config()
            return True
        looks_yaml = bool(stripped) and (P.YAML_TOP.match(body) is not None or P.YAML_NESTED.match(body) is not None)
        if looks_yaml and len(self.block_lines) < MAX_CONFIG_LINES:
            self.block_lines.append(body)
            return True
        self._end_config()
        return False

    def _end_args(self) -> None:
        args: dict[str, Any] = {}
        for b in self.block_lines:
            m = P.ARGS_ITEM.match(b)
            if m:
                args[m.group(1).decode("utf-8", "replace")] = _coerce(_dec(m.group(2)))
        self.block, self.block_lines = "", []
        if args:
            self.rec.config.update(args)
            self.rec.config_source = "megatron-arguments"
            self.rec.recognised_lines += len(args)

    def _end_config(self) -> None:
        text = b"\n".join(self.block_lines).decode("utf-8", "replace")
        self.block, self.block_lines = "", []
        doc = _load_yaml(text)
        flat = _flatten(doc) if isinstance(doc, dict) else {}
        if flat:
            self.rec.config.update(flat)
            self.rec.config_source = "bridge-config"
            self.sources.add("bridge")
            self.rec.recognised_lines += len(flat)

    # ---------------------------------------------------------------- versions, events, signals
    def _version(self, line_no: int, line: bytes) -> None:
        versions = self.rec.versions
        m = P.NCCL_VERSION.search(line)
        if m:
            versions.setdefault("nccl", m.group(1).decode("utf-8", "replace"))
            self.rec.recognised_lines += 1
            return
        for m in P.VERSION.finditer(line):
            name = _VERSION_NAMES.get(m.group(1).decode("utf-8", "replace").lower().replace("_", "-"),
                                      _VERSION_NAMES.get(m.group(1).decode("utf-8", "replace").lower()))
            if name:
                versions.setdefault(name, m.group(2).decode("utf-8", "replace"))
                self.rec.recognised_lines += 1

    def _checkpoint(self, line_no: int, line: bytes) -> None:
        low = line.lower()
        if b"saving checkpoint" in low or b"saved checkpoint" in low:
            self._mark(line_no, FLAG_CHECKPOINT)
            self._event(line_no, "checkpoint_save", line)
        elif b"loading checkpoint" in low or b"loaded checkpoint" in low:
            self._event(line_no, "checkpoint_load", line)
            if self.rows_seen:
                self._mark(line_no, MARK_RESTART)

    def _signals(self, line_no: int, line: bytes) -> None:  # noqa: C901 - flat switch on literals
        if b"Capture range" in line or b"nsys" in line or b"Profil" in line or b"profil" in line:
            if self._profiler(line_no, line):
                return
        if b"checkpoint" in line:
            self._checkpoint(line_no, line)
            return
        if b"raph" in line:
            low = line.lower()
            if b"cuda graph" in low or b"cudagraph" in low or b"cuda_graph" in low:
                if b"captur" in low or b"warmup" in low or b"warm up" in low:
                    self._mark(line_no, FLAG_GRAPH_CAPTURE)
                    self._event(line_no, "graph_capture", line)
                    return
        if b"Watchdog" in line or b"watchdog" in line:
            m = P.WATCHDOG.search(line)
            if m:
                body, rank = self._rank(line)
                mr = P.WATCHDOG_RANK.search(line)
                pg = P.PG_TAG.search(line)
                data = {"seq": int(m.group(1)), "op": m.group(2).decode("utf-8", "replace"),
                        "numel_in": int(m.group(3)) if m.group(3) else None,
                        "numel_out": int(m.group(4)) if m.group(4) else None,
                        "timeout_ms": int(m.group(5)) if m.group(5) else None, "ran_ms": int(m.group(6)),
                        "rank": int(mr.group(1)) if mr else rank,
                        "pg": int(pg.group(1)) if pg else None, "pg_name": pg.group(3).decode("utf-8", "replace") if pg and pg.group(3)
                        else None}
                self._signal(line_no, "nccl_watchdog", body, rank, data=data)
                return
            m = P.LAST_WORK.search(line)
            if m:
                body, rank = self._rank(line)
                pg = P.PG_TAG.search(line)
                data = {"work": int(m.group(1)), "last_enqueued": int(m.group(2)), "last_completed": int(m.group(3)),
                        "pg": int(pg.group(1)) if pg else None, "pg_rank": int(pg.group(4)) if pg else None,
                        "pg_name": pg.group(3).decode("utf-8", "replace") if pg and pg.group(3) else None}
                self._signal(line_no, "nccl_last_work", body, rank, data=data)
                return
        if b"out of memory" in line or b"OutOfMemory" in line:
            body, rank = self._rank(line)
            self._signal(line_no, "oom", body, rank, frames=self._take_frames(rank), data=_oom_data(body),
                         context=True)
            return
        if b"num_recv_tokens" in line or b"moe_recv_expert_counter" in line or b"DeepEP" in line or \
                b"deep_ep" in line or b"HybridEP" in line or b"hybrid_ep" in line:
            body, rank = self._rank(line)
            m = P.DEEPEP_RECV.search(body)
            data = {"num_recv_tokens": int(m.group(1))} if m else {}
            mr = P.RANK_PREFIX.match(body)
            if b"Global rank:" in body:
                try:
                    data["rank"] = int(body.split(b"Global rank:")[1].split(b",")[0])
                except ValueError:
                    pass
            if b'File "' not in body:
                self._signal(line_no, "deepep", body, rank if mr is None else rank, data=data)
                return
        if b"Traceback (most recent call last)" in line:
            body, rank = self._rank(line)
            self.frames[rank] = deque(maxlen=16)
            self.tb_open[rank] = line_no
            self.rec.recognised_lines += 1
            return
        if b'File "' in line:
            m = P.FRAME.search(line)
            if m:
                body, rank = self._rank(line)
                fr = self.frames.get(rank)
                if fr is None:
                    fr = self.frames[rank] = deque(maxlen=16)
                    self.tb_open[rank] = line_no
                fr.append(f"{m.group(1).decode('utf-8', 'replace')}:{int(m.group(2))} in {m.group(3).decode('utf-8', 'replace')}")
                self.rec.recognised_lines += 1
                return
        if b"Error" in line or b"Exception" in line or b"error" in line:
            body, rank = self._rank(line)
            m = P.EXCEPTION_LINE.match(body)
            if m:
                self._signal(line_no, "exception", body, rank, frames=self._take_frames(rank),
                             data={"type": m.group(1).decode("utf-8", "replace"), "message": _dec(m.group(2) or b"").strip()},
                             context=True)
                return
            if b"DistBackendError" in body or b"NCCL error" in body or b"ncclInternalError" in body or \
                    b"ncclSystemError" in body or b"ncclUnhandledCudaError" in body or b"ncclRemoteError" in body:
                self._signal(line_no, "nccl_error", body, rank, context=True)
                return
        if b"NCCL" in line:
            if b"NCCL WARN" in line:
                self._capped(line_no, "nccl_warn", line)
                return
            if b"ncclUniqueId" in line:
                body, rank = self._rank(line)
                self._signal(line_no, "nccl_unique_id", body, rank)
                return
        if b"exitcode" in line or b"exit code" in line or b"SIGKILL" in line or b"SIGTERM" in line or \
                b"Killed" in line or b"Signal 9" in line:
            m = P.EXITCODE.search(line)
            if m or b"Killed" in line:
                body, rank = self._rank(line)
                self._signal(line_no, "process_exit", body, rank)
                return
        if self.frames:
            self._traceback_code(line)

    def _traceback_code(self, line: bytes) -> None:
        """A source line printed under a traceback frame: appended to that frame (``frame :: code``)."""
        body, rank = self._rank(line)
        fr = self.frames.get(rank)
        if not fr:
            return
        code = body.strip()
        if not code or not code.strip(b"^~ ") or len(code) > 300:
            return
        if " :: " not in fr[-1]:
            fr[-1] = fr[-1] + " :: " + code.decode("utf-8", "replace")

    def _profiler(self, line_no: int, line: bytes) -> bool:
        low = line.lower()
        if b"capture range started" in low or b"profiler start" in low or b"start profil" in low or \
                b"cudaprofilerstart" in low or b"completed stage: warm up" in low:
            self.profiling = True
            self._mark(line_no, MARK_PROFILE_START)
            self._event(line_no, "profile_start", line)
            return True
        if b"capture range ended" in low or b"profiler stop" in low or b"stop profil" in low or \
                b"cudaprofilerstop" in low or b"completed stage: collection" in low:
            self.profiling = False
            self._mark(line_no, MARK_PROFILE_STOP)
            self.step_flags |= FLAG_PROFILED
            self._event(line_no, "profile_stop", line)
            return True
        if b"nsys-rep" in low or b"nsys-report" in low or b"qdstrm" in low:
            self.step_flags |= FLAG_PROFILED
            self._event(line_no, "profile_report", line)
            return True
        return False

    def _take_frames(self, rank: int | None) -> tuple[str, ...]:
        fr = self.frames.pop(rank, None)
        self.tb_open.pop(rank, None)
        if fr is None and rank is not None:
            fr = self.frames.pop(None, None)
            self.tb_open.pop(None, None)
        return tuple(fr) if fr else ()

    def finish(self, last_line_complete: bool) -> None:
        if self.pending is not None:
            self._close_pending(truncated=True)
        if self.block == "args":
            self._end_args()
        elif self.block == "config":
            self._end_config()
        self.block = ""
        # tracebacks that never reached their exception line (excerpt cut, or interleaved output)
        for rank, fr in list(self.frames.items()):
            if fr:
                start = self.tb_open.get(rank, 0)
                self._signal(start, "traceback_unterminated", f"traceback with {len(fr)} frames, no exception line"
                             .encode(), rank, frames=tuple(fr))
        self.frames.clear()
        if self.q_raw:
            self.sources.add("megatron")
        self._flush_queue()
        self._resolve_rows()
        rec = self.rec
        if "bridge" in self.sources:
            rec.source = "megatron-bridge"
        elif "nemo" in self.sources and "megatron" not in self.sources:
            rec.source = "nemo"
        else:
            rec.source = "megatron-lm"


    def _resolve_rows(self) -> None:
        """Order rows by line; drop repeats of the previous iteration (several ranks printing it); split segments at
        restarts (iteration number going back, a new training start or checkpoint load after iterations); set the window
        flags from the marks (the first row after a checkpoint save / evaluation / graph capture, and the rows of a
        profiler capture plus the first row after it)."""
        rec = self.rec
        tab = rec.iterations
        n = len(tab)
        if n:
            # one column at a time (the samples are packed; see IterationTable)
            line_col = tab.col("line")
            order = None if not (np.diff(line_col) < 0).any() else np.argsort(line_col, kind="stable")
            del line_col
            if order is not None and n < 2**31:
                order = order.astype(np.int32)
            it = tab.col("iteration")
            if order is not None:
                it = it[order]
            dup = it[1:] == it[:-1]  # the same iteration printed again (another rank, a tee'd copy): keep the first
            if dup.any():
                keep = np.ones(n, dtype=bool)
                keep[1:] = ~dup
                order = np.flatnonzero(keep) if order is None else order[keep]
                it = it[keep]
                n = len(it)
            tab.set_order(order)
            del order
            lines = tab.col("line")
            newseg = np.zeros(n, dtype=bool)
            newseg[1:] = it[1:] <= it[:-1]
            flags = tab.col("flags").astype(np.int64)
            prof_start = None
            for line_no, kind in self.marks:
                j = int(np.searchsorted(lines, line_no))
                if kind == MARK_RESTART:
                    if 0 < j < n:
                        newseg[j] = True
                elif kind == MARK_PROFILE_START:
                    prof_start = j
                elif kind == MARK_PROFILE_STOP:
                    lo = prof_start if prof_start is not None else j
                    flags[lo:min(j + 1, n)] |= FLAG_PROFILED
                    prof_start = None
                elif j < n:
                    flags[j] |= kind
            if prof_start is not None:
                flags[prof_start:] |= FLAG_PROFILED
            flags[0] |= FLAG_SEGMENT_START
            flags[newseg] |= FLAG_SEGMENT_START
            tab.set_col("flags", flags.astype(np.float64))
            del flags
            tab.set_col("segment", np.cumsum(newseg).astype(np.float64))
            rec.segments = int(newseg.sum()) + 1
            rec.restart_lines = [int(x) for x in lines[newseg]]
            for ln in rec.restart_lines[:100]:
                rec.events.append(Event(ln, "restart", "new run segment (restart)", None))
            rec.events.sort(key=lambda e: e.line)
            for e in rec.events:
                j = int(np.searchsorted(lines, e.line, side="right")) - 1
                e.iteration = int(it[j]) if j >= 0 else None
            if len(rec.step_time):
                st = rec.step_time
                sl = st.col("line")
                j = np.searchsorted(lines, sl, side="right") - 1
                sit = np.where(j >= 0, it[np.maximum(j, 0)], np.nan)
                st.set_col("iteration", sit)
                segs = np.cumsum(newseg)
                st.set_col("segment", np.where(j >= 0, segs[np.maximum(j, 0)], 0))


def _load_yaml(text: str) -> Any:
    import yaml

    try:
        from moetune.io.bridge import load_bridge_dict  # helper C's reader (handles Bridge's YAML tags)

        return load_bridge_dict(text, "log config dump")
    except Exception:  # noqa: BLE001 - fall back to our own tolerant loader below
        pass

    class Loader(yaml.SafeLoader):
        pass

    def _any(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            return loader.construct_scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node)
        return loader.construct_mapping(node)

    Loader.add_multi_constructor("", _any)
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError:
        out: dict[str, Any] = {}
        for ln in text.splitlines():
            k, sep, v = ln.strip().partition(":")
            if sep and k and " " not in k.strip():
                out[k.strip()] = _coerce(v)
        return out


def _oom_data(body: bytes) -> dict[str, Any]:
    """Numbers of a CUDA caching-allocator OOM message (c10/cuda/CUDACachingAllocator.cpp), in bytes."""
    u = P.UNITS
    d: dict[str, Any] = {}
    m = P.OOM_TRIED.search(body)
    if m:
        d["requested"] = float(m.group(1)) * u[m.group(2)]
    m = P.OOM_OLD.search(body)
    if m:
        d["gpu"] = int(m.group(1))
        d["capacity"] = float(m.group(2)) * u[m.group(3)]
        d["allocated"] = float(m.group(4)) * u[m.group(5)]
        d["free"] = float(m.group(6)) * u[m.group(7)]
        d["reserved"] = float(m.group(10)) * u[m.group(11)]
        d["reserved_unallocated"] = d["reserved"] - d["allocated"]
    m = P.OOM_NEW_TOTAL.search(body)
    if m:
        d["gpu"] = int(m.group(1))
        d["capacity"] = float(m.group(2)) * u[m.group(3)]
        d["free"] = float(m.group(4)) * u[m.group(5)]
    m = P.OOM_NEW_INUSE.search(body)
    if m:
        d["process_in_use"] = float(m.group(1)) * u[m.group(2)]
    m = P.OOM_NEW_ALLOC.search(body)
    if m:
        d["allocated"] = float(m.group(1)) * u[m.group(2)]
    m = P.OOM_NEW_RESERVED.search(body)
    if m:
        d["reserved_unallocated"] = float(m.group(1)) * u[m.group(2)]
        if "allocated" in d:
            d["reserved"] = d["allocated"] + d["reserved_unallocated"]
    return d


def _open(path: Path) -> IO[bytes]:
    f = open(path, "rb")  # noqa: SIM115 - closed by the caller
    head = f.read(2)
    f.seek(0)
    if head == b"\x1f\x8b":
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return f


def _check_path(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file", field="log", value=str(path), expected="a training log file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a training log file", field="log", value=str(path))
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})", field="log", value=str(path)) from None


def read_text_log(path: Path) -> RunRecord:
    """Parse one text log (see module docstring)."""
    rec = RunRecord(path=str(path))
    parser = _Parser(rec)
    n = 0
    nbytes = 0
    tail = b""
    try:
        with _open(path) as f:
            head = f.read(65536)
            if b"\x00" in head:
                raise InputError(f"{path}: binary data, expected a text training log", field="log",
                                 value=str(path), expected="Megatron-LM / Megatron-Bridge / NeMo log text")
            f.seek(0)
            feed = parser.feed
            hints = parser.shape_hint
            ring = parser.ring
            counts = rec.signal_counts
            closed_extra = 0
            # parser state, refreshed after every call into the parser: ``clean`` = no wrapped record or block open
            # (only then may a line skip the state machine); ``capped`` = clean and the NCCL "Connection closed"
            # chatter is past its evidence cap (those lines are then only counted)
            clean, capped = True, False
            q_raw, q_lines, q_shape = parser.q_raw, parser.q_lines, parser.q_shape
            tail = b""
            while True:
                chunk = f.read(CHUNK_BYTES)
                if not chunk:
                    break
                nbytes += len(chunk)
                lines = (tail + chunk).split(b"\n") if tail else chunk.split(b"\n")
                tail = lines.pop()
                first = n + 1
                for n, line in enumerate(lines, first):  # n: the running line number
                    # hot paths inlined (no method call): complete iteration lines of a known layout, and
                    # NCCL INFO "Connection closed" chatter beyond the evidence cap; everything else goes to feed
                    if b"nan iterations" in line:
                        if clean:
                            shape = hints.get((line.count(b"|"), line.count(b":")))
                            if shape is not None:
                                q_raw.append(line)
                                q_lines.append(n)
                                q_shape.append(shape)
                                parser.rows_seen += 1
                                if len(q_raw) >= FLUSH_ROWS:
                                    parser._flush_queue()
                                    q_raw, q_lines, q_shape = parser.q_raw, parser.q_lines, parser.q_shape
                                ring[n & _RING_MASK] = line
                                continue
                    elif capped and b"Connection closed by localRank" in line and b"NCCL INFO" in line:
                        closed_extra += 1
                        continue
                    feed(n, line)
                    q_raw, q_lines, q_shape = parser.q_raw, parser.q_lines, parser.q_shape
                    clean = parser.pending is None and not parser.block
                    capped = clean and counts.get("nccl_connection_closed", 0) >= MAX_SIGNALS_PER_KIND
            if tail:
                n += 1
                feed(n, tail)
    except OSError as exc:  # gzip errors, I/O errors
        raise InputError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})", field="log",
                         value=str(path)) from None
    complete = not tail
    rec.recognised_lines += closed_extra
    if closed_extra:
        rec.signal_counts["nccl_connection_closed"] += closed_extra
    parser.finish(complete)
    rec.lines = n
    rec.bytes = nbytes
    rec.truncated_last_line = not complete and n > 0
    return rec
