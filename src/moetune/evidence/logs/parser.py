"""The line state machine behind the text-log reader: open records and blocks, iteration parsing, evidence.

:meth:`Parser.feed` takes one physical line. A line first continues what is open — a terminal-wrapped record (an
iteration or memory line split over several physical lines) or a block (Megatron's ``arguments`` dump, a Bridge
YAML configuration dump, a ``(min, max) time across ranks`` timer block) — and otherwise is offered to the
recognisers of :mod:`.recognisers` (:data:`~.recognisers.RECORDS`, then :data:`~.recognisers.SIGNALS`).

Iteration lines are parsed field by field (:meth:`Parser.parse_iteration`); each complete layout seen (its exact key
sequence, see :class:`~.fastpath.Layout`) is remembered so that later lines of that layout can be parsed in bulk by
:mod:`.fastpath`, which gives the same rows.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from moetune.evidence.logs import patterns as P
from moetune.evidence.logs.model import (
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
    TimerStat,
)
from moetune.evidence.logs.recognisers import (
    MARK_PROFILE_START,
    MARK_PROFILE_STOP,
    MARK_RESTART,
    RECORDS,
    SIGNALS,
    LineRoutes,
    nccl_info,
    offer,
)
from moetune.evidence.logs.values import coerce, dec, flatten, num

#: evidence lines kept per signal kind (the count of all of them is kept in ``signal_counts``)
MAX_SIGNALS_PER_KIND = 50
MAX_EVENTS = 5000
MAX_MEMORY_REPORTS = 4096
MAX_CONFIG_LINES = 20000
#: physical lines a wrapped record may span
MAX_WRAP_LINES = 12
#: a physical line shorter than this was not wrapped by a terminal
MIN_WRAP_WIDTH = 40
CONTEXT_LINES = 4
RING_MASK = 7  # ring buffer of the last 8 lines (>= CONTEXT_LINES)
#: distinct iteration-line layouts remembered for the bulk path
MAX_LAYOUTS = 16
#: marks kept for window flags (profiler, checkpoint, evaluation, graph capture, restart)
MAX_MARKS = 1_000_000

# canonical iteration-line keys: whitespace removed, lower case -> (column, scale)
ITER_KEYS: dict[bytes, tuple[str, float]] = {
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
#: how lines that start another record begin (never the continuation of a wrapped one)
_NOT_CONTINUATION = (b"[", b">", b"Traceback", b"File ", b"(min", b"time (ms)", b"Step Time", b"Number of",
                     b"Theoretical", b"Training epoch")

_IDX = IterationTable.INDEX
C_ITER, C_TOTAL, C_SEGMENT, C_LINE = _IDX["iteration"], _IDX["train_iters"], _IDX["segment"], _IDX["line"]
C_ELAPSED, C_LOSS, C_LOSS_MISSING, C_GN, C_GN_BAD, C_FLAGS = (
    _IDX["elapsed_s"], _IDX["loss"], _IDX["loss_missing"], _IDX["grad_norm"], _IDX["grad_norm_nonfinite"],
    _IDX["flags"])


def key_spec(k: bytes) -> tuple[str, Any]:
    """What an iteration-line key holds: ("col", (column, scale)), ("primary", None), ("loss", name) or
    ("ignore", None)."""
    norm = b"".join(k.split()).lower()
    if norm in ITER_KEYS:
        return "col", ITER_KEYS[norm]
    if norm in _PRIMARY_LOSS:
        return "primary", None
    if norm.endswith(b"loss") and norm not in _IGNORED_LOSS:
        return "loss", " ".join(dec(k).split())
    return "ignore", None


def _load_yaml(text: str) -> Any:
    import yaml

    try:
        from moetune.io.bridge import load_bridge_dict  # Bridge's YAML tags

        return load_bridge_dict(text, "log config dump")
    except Exception:  # noqa: BLE001 - a dump that reader rejects: fall back to the tolerant loader below
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
                out[k.strip()] = coerce(v)
        return out


def _clean(line: bytes) -> bytes:
    """The line as displayed: the last carriage-return segment (CRLF endings, progress bars that overwrite
    themselves), without ANSI colour codes."""
    if b"\r" in line:
        parts = [p for p in line.split(b"\r") if p.strip()]
        line = parts[-1] if parts else b""
    if b"\x1b" in line:
        line = P.ANSI.sub(b"", line)
    return line


class _Fields:
    """What the fields of one iteration record said besides the row values."""

    __slots__ = ("keys", "extra", "numeric", "has_primary", "has_loss_scale")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.extra: dict[str, float] | None = None
        self.numeric = True
        self.has_primary = False
        self.has_loss_scale = False


class Parser:
    """Line-by-line state machine filling a :class:`RunRecord` (see module docstring).

    ``on_layout`` is called with ``(keys, key specs)`` for each new complete iteration-line layout (the bulk path
    compiles it); ``append_row(values, extra)`` appends a row parsed here (the bulk path queues it with its own rows,
    so that rows stay in line order), ``flush_rows()`` appends what is queued (called by :meth:`finish`) and
    ``take_joined(line_no, text, rank)`` / ``take_line(line_no, line)`` may take a re-joined wrapped iteration record
    / a complete iteration line for bulk parsing.
    """

    def __init__(self, rec: RunRecord) -> None:
        self.rec = rec
        self.ring: list[bytes | None] = [None] * (RING_MASK + 1)
        self.pending: list[bytes] | None = None  # open wrapped record (physical lines)
        self.pending_kind = ""
        self.pending_line = 0
        self.pending_rank: int | None = None
        self.pending_width = 0
        self.block = ""  # "args" | "config" | "timers"
        self.block_lines: list[bytes] = []
        self.marks: list[tuple[int, int]] = []  # (line, flag or MARK_*) resolved against rows in finish()
        self.rows_seen = 0
        self.step_flags = 0  # flags for the next Bridge "Step Time" record
        self.profiling = False
        self.frames: dict[int | None, deque[str]] = {}
        self.tb_open: dict[int | None, int] = {}
        self.key_cache: dict[bytes, tuple[str, Any]] = {}
        self.layout_keys: set[tuple[bytes, ...]] = set()
        self.timer_names: dict[bytes, str] = {}
        #: memory-report field key as printed -> its normalised name (see memory_text)
        self.memory_keys: dict[bytes, str] = {}
        #: what this read remembers of the lines it offered to each registry (recognisers.LineRoutes)
        self.record_routes = LineRoutes(RECORDS)
        self.signal_routes = LineRoutes(SIGNALS)
        self.sources: set[str] = set()
        self.on_layout: Any = None
        self.append_row: Any = rec.iterations.append_values
        self.flush_rows: Any = lambda: None
        self.take_joined: Any = lambda line_no, text, rank: False
        self.take_line: Any = lambda line_no, line: False

    @property
    def clean(self) -> bool:
        """No wrapped record or block open: the next line is offered to the recognisers as it is."""
        return self.pending is None and not self.block

    # ---------------------------------------------------------------- evidence helpers (used by recognisers)
    def rank(self, line: bytes) -> tuple[bytes, int | None]:
        """The line without its rank / launcher prefix, and the rank it names (recorded in ``ranks_seen``)."""
        m = P.RANK_PREFIX.match(line)
        if m is None:
            return line, None
        rank = int(m.group(1) or m.group(2))
        self.rec.ranks_seen.add(rank)
        return line[m.end():], rank

    def event(self, line_no: int, kind: str, text: bytes) -> None:
        rec = self.rec
        rec.recognised_lines += 1
        if len(rec.events) < MAX_EVENTS:
            rec.events.append(Event(line_no, kind, dec(text).strip(), None))

    def signal(self, line_no: int, kind: str, text: bytes, rank: int | None, *, frames: tuple[str, ...] = (),
               data: dict[str, Any] | None = None, context: bool = False) -> None:
        rec = self.rec
        rec.recognised_lines += 1
        n = rec.signal_counts.get(kind, 0)
        rec.signal_counts[kind] = n + 1
        if n >= MAX_SIGNALS_PER_KIND:
            return
        ctx = self.context(line_no) if context else ()
        rec.signals.append(Signal(line_no, kind, dec(text).strip(), rank, ctx, frames, data or {}))

    def capped(self, line_no: int, kind: str, line: bytes) -> None:
        """A frequent signal: count it; keep its text only below the per-kind cap."""
        n = self.rec.signal_counts.get(kind, 0)
        if n >= MAX_SIGNALS_PER_KIND:
            self.rec.signal_counts[kind] = n + 1
            self.rec.recognised_lines += 1
            return
        if b"\x1b" in line:
            line = P.ANSI.sub(b"", line)
        body, rank = self.rank(line)
        self.signal(line_no, kind, body, rank)

    def context(self, line_no: int) -> tuple[LineRef, ...]:
        """The up to ``CONTEXT_LINES`` lines before ``line_no`` as displayed (from the ring of raw lines)."""
        out = []
        for ln in range(max(1, line_no - CONTEXT_LINES), line_no):
            t = self.ring[ln & RING_MASK]
            if t is not None:
                out.append(LineRef(ln, dec(_clean(t))))
        return tuple(out)

    def mark(self, line_no: int, kind: int) -> None:
        if len(self.marks) < MAX_MARKS:
            self.marks.append((line_no, kind))

    def take_frames(self, rank: int | None) -> tuple[str, ...]:
        fr = self.frames.pop(rank, None)
        self.tb_open.pop(rank, None)
        if fr is None and rank is not None:
            fr = self.frames.pop(None, None)
            self.tb_open.pop(None, None)
        return tuple(fr) if fr else ()

    # ---------------------------------------------------------------- driver
    def feed(self, line_no: int, line: bytes) -> None:
        """One physical line without its ``\\n``."""
        self.ring[line_no & RING_MASK] = line
        if self.block == "timers" and self.pending is None and line[:1] == b" " and b"\r" not in line and \
                b"\x1b" not in line:
            m = P.TIMER_MINMAX.match(line)  # the common timer line (the general path below, without its checks)
            if m:
                self.timer_match(line_no, m)
                return
            self.block = ""  # the line that ends the block (_continue_block would match the same line again)
        elif self.pending is None and not self.block and b"NCCL INFO" in line:
            nccl_info(self, line_no, line)  # on the raw line: it strips what it keeps
            return
        if b"\r" in line or b"\x1b" in line:
            line = _clean(line)
        if self.pending is not None and self._continue_pending(line):
            return
        if self.block and self._continue_block(line_no, line):
            return
        if b"nan iterations" in line and self.take_line(line_no, line):
            return
        self.offer(line_no, line)

    def offer(self, line_no: int, line: bytes) -> None:
        """Offer a cleaned line to the recognisers (records, then signals)."""
        if not offer(RECORDS, self, line_no, line, self.record_routes):
            offer(SIGNALS, self, line_no, line, self.signal_routes)

    def reparse(self, line_no: int, line: bytes) -> None:
        """A line set aside for the bulk path that turned out not to be of its layout (seen while no record or
        block was open): offer it to the recognisers."""
        self.offer(line_no, _clean(line))

    # ---------------------------------------------------------------- iteration lines
    def iteration_line(self, line_no: int, line: bytes) -> bool:
        if b"Training epoch" in line and P.NEMO_HEAD.search(line):
            body, rank = self.rank(line)
            m2 = P.NEMO_HEAD.search(body)
            if self.pending is not None:
                self.close_pending(truncated=False)
            self.sources.add("nemo")
            self.parse_iteration(line_no, body[m2.end():], int(m2.group(2)), int(m2.group(3)), rank,
                                 complete=True, nemo=True)
            return True
        body, rank = self.rank(line) if line[:1] != b" " else (line, None)
        m = P.iter_head(body)
        if m is None:
            return False
        if self.pending is not None:
            self.close_pending(truncated=False)
        if b"nan iterations" in line or len(line) < MIN_WRAP_WIDTH:
            self.parse_iteration(line_no, body[m.end():], int(m.group(1)), int(m.group(2)), rank, complete=True)
        else:
            self._open_pending("iteration", line_no, body, rank, len(line))
        return True

    def _open_pending(self, kind: str, line_no: int, body: bytes, rank: int | None, width: int) -> None:
        self.pending = [body]
        self.pending_kind = kind
        self.pending_line = line_no
        self.pending_rank = rank
        self.pending_width = width

    def _continue_pending(self, line: bytes) -> bool:
        """Append ``line`` to the open wrapped record when it continues it (closing the record once complete); else
        close the record and return False. A continuation is a non-blank line with a ``|`` or ``:`` that does not
        start like another record, after a physical line at least :data:`MIN_WRAP_WIDTH` wide."""
        pending = self.pending
        assert pending is not None
        if self.pending_width >= MIN_WRAP_WIDTH and len(pending) < MAX_WRAP_LINES and \
                (b"|" in line or b":" in line) and line.strip() and \
                not line.lstrip()[:12].startswith(_NOT_CONTINUATION) and \
                (b"iteration" not in line or P.iter_head(line) is None):
            pending.append(line)
            self.pending_width = len(line)
            if self.pending_kind == "iteration":
                done = b"nan iterations" in line and line.rstrip().endswith(b"|")
            else:
                done = b"max reserved" in line or b"max-reserved" in line or b"count" in line
            if done:
                self.close_pending(truncated=False)
            return True
        self.close_pending(truncated=False)
        return False

    def close_pending(self, *, truncated: bool) -> None:
        parts, self.pending = self.pending, None
        if not parts:
            return
        text = b"".join(parts)
        if self.pending_kind == "iteration":
            if not truncated and self.take_joined(self.pending_line, text, self.pending_rank):
                return
            m = P.iter_head(text)
            assert m is not None  # the first part starts with an iteration head
            complete = b"nan iterations" in text
            self.parse_iteration(self.pending_line, text[m.end():], int(m.group(1)), int(m.group(2)),
                                 self.pending_rank, complete=complete, truncated=truncated and not complete)
        else:
            self.memory_text(self.pending_line, text, self.pending_rank)

    def parse_iteration(self, line_no: int, rest: bytes, iteration: int, total: int, rank: int | None, *,
                        complete: bool, truncated: bool = False, nemo: bool = False) -> None:
        """One iteration record (``rest``: the text after ``iteration N/ M |``), field by field."""
        self.rec.recognised_lines += 1
        row: dict[str, float] = {"iteration": float(iteration), "train_iters": float(total)}
        fields = _Fields()
        for seg in rest.split(b"|"):
            self._field(seg, row, fields)
        gs = row.pop("global_step", None)
        if nemo:
            if gs is not None:
                row["iteration"] = gs
        elif fields.numeric and fields.keys and complete and not truncated:
            self._learn_layout(fields.keys)
        if "grad_norm" in row and not math.isfinite(row["grad_norm"]):
            row["grad_norm_nonfinite"] = 1.0
        missing = not (fields.has_primary or nemo) and (complete or fields.has_loss_scale)
        row["loss_missing"] = 1.0 if missing else 0.0
        values = [row.get(name, NAN) for name in IterationTable.COLUMNS]
        values[C_FLAGS] = float(FLAG_TRUNCATED) if truncated else 0.0
        values[C_SEGMENT] = 0.0
        values[C_LINE] = float(line_no)
        if rank is not None:
            self.rec.ranks_seen.add(rank)
        self.rows_seen += 1
        self.append_row(values, fields.extra)
        self.sources.add("nemo" if nemo else "megatron")

    def _field(self, seg: bytes, row: dict[str, float], fields: _Fields) -> None:
        """One ``key: value`` segment of an iteration record into ``row`` (other losses into ``fields.extra``)."""
        k, sep, v = seg.partition(b":")
        if not sep:
            fields.numeric = fields.numeric and not seg.strip()
            return
        fields.keys.append(k)
        spec = self.key_cache.get(k)
        if spec is None:
            spec = self.key_cache[k] = key_spec(k)
        v = v.strip()
        x = num(v)
        if x != x and v.lower() not in (b"nan", b"-nan"):
            fields.numeric = False
        kind, arg = spec
        if kind == "col":
            col, scale = arg
            if x == x:
                row[col] = x * scale
            elif col == "grad_norm":
                row[col] = x
            fields.has_loss_scale = fields.has_loss_scale or col == "loss_scale"
        elif kind == "primary":
            row["loss"] = x
            fields.has_primary = True
        elif kind == "loss":
            if fields.extra is None:
                fields.extra = {}
            fields.extra[arg] = x

    def _learn_layout(self, keys: list[bytes]) -> None:
        """Hand a new complete, all-numeric layout to ``on_layout`` (at most :data:`MAX_LAYOUTS`)."""
        layout = tuple(keys)
        if self.on_layout is not None and len(self.layout_keys) < MAX_LAYOUTS and layout not in self.layout_keys:
            self.layout_keys.add(layout)
            self.on_layout(keys, self.key_cache)

    # ---------------------------------------------------------------- Bridge step time
    def step_time(self, line_no: int, elapsed_s: float, tflops: float | None) -> None:
        rec = self.rec
        rec.recognised_lines += 1
        self.sources.add("bridge")
        flags = self.step_flags | (FLAG_PROFILED if self.profiling else 0)
        self.step_flags = 0
        rec.step_time.append({"iteration": NAN, "line": float(line_no), "elapsed_s": elapsed_s,
                              "tflops": NAN if tflops is None else tflops, "flags": float(flags),
                              "segment": NAN})

    # ---------------------------------------------------------------- memory
    def memory_line(self, line_no: int, line: bytes) -> None:
        body, rank = self.rank(line)
        head = P.MEMORY_HEAD.search(body)
        if head is None:
            offer(SIGNALS, self, line_no, line, self.signal_routes)
            return
        if self.pending is not None:
            self.close_pending(truncated=False)
        done = b"max reserved" in body or b"max-reserved" in body or b"count" in body
        if done or len(line) < MIN_WRAP_WIDTH:
            self.memory_text(line_no, body, rank, head)
        else:
            self._open_pending("memory", line_no, body, rank, len(line))

    def memory_text(self, line_no: int, text: bytes, prefix_rank: int | None, m: Any = None) -> None:
        """One memory report (``m``: ``MEMORY_HEAD.search(text)`` when the caller has it already)."""
        if m is None:
            m = P.MEMORY_HEAD.search(text)
        if m is None:
            return
        rec = self.rec
        rec.recognised_lines += 1
        if len(rec.memory_reports) >= MAX_MEMORY_REPORTS:  # past the cap a report is counted, not kept
            return
        unit = m.group(3)
        scale = {b"MB": 2**20, b"MiB": 2**20, b"GB": 1e9, b"GiB": 2**30, b"bytes": 1.0}[unit]
        values: dict[str, float] = {}
        keys = self.memory_keys
        for raw, xs in P.MEMORY_FIELD.findall(text, m.end()):
            key = keys.get(raw)
            if key is None:
                key = raw.decode("utf-8", "replace").strip().lower()
                if key.startswith("mem-"):
                    key = key[4:]
                for suffix in ("-gigabytes", "-megabytes", "-bytes"):
                    if key.endswith(suffix):
                        key = key[: -len(suffix)]
                key = key.replace("-", " ")
                if len(keys) < 1024:  # bounded: a log prints a handful of memory keys
                    keys[raw] = key
            x = num(xs)
            values[key] = x if key in ("alloc retires", "allocated count") else x * scale
        rec.memory_reports.append(MemoryReport(line_no, int(m.group(1)), int(m.group(2)),
                                               unit.decode("utf-8", "replace"), values))

    # ---------------------------------------------------------------- timers
    def timer(self, line_no: int, name: str, lo: float | None, hi: float) -> None:
        t = self.rec.timers.get(name)
        if t is None:
            self.rec.timers[name] = TimerStat(name, lo, hi, 1, hi, hi, line_no)
        else:
            t.last_min_ms, t.last_max_ms = lo, hi
            t.count += 1
            t.sum_max_ms += hi
            t.peak_max_ms = max(t.peak_max_ms, hi)

    def timer_match(self, line_no: int, m: Any) -> None:
        """Record a matched "(min, max) time across ranks" timer line (timer names decoded once per name)."""
        raw = m.group(1)
        name = self.timer_names.get(raw)
        if name is None:
            name = self.timer_names[raw] = raw.decode("utf-8", "replace").strip()
        self.timer(line_no, name, float(m.group(2)), float(m.group(3)))

    # ---------------------------------------------------------------- blocks (args, config, timers)
    def open_block(self, kind: str, line_no: int, first: bytes | None = None) -> None:
        """Start a block of ``kind`` ("args", "config", "timers"); ``first``: its first content line."""
        self.block = kind
        self.block_lines = [] if first is None else [first]
        self.rec.recognised_lines += 1

    def _continue_block(self, line_no: int, line: bytes) -> bool:
        body, _ = self.rank(line) if line[:1] != b" " else (line, None)
        kind = self.block
        if kind == "timers":
            m = P.TIMER_MINMAX.match(body)
            if m:
                self.timer_match(line_no, m)
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
        if P.DASH_LINE.match(body):
            self._end_config()
            return True
        looks_yaml = bool(body.strip()) and (P.YAML_TOP.match(body) is not None or
                                             P.YAML_NESTED.match(body) is not None)
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
                args[m.group(1).decode("utf-8", "replace")] = coerce(dec(m.group(2)))
        self.block, self.block_lines = "", []
        if args:
            self.rec.config.update(args)
            self.rec.config_source = "megatron-arguments"
            self.rec.recognised_lines += len(args)

    def _end_config(self) -> None:
        text = b"\n".join(self.block_lines).decode("utf-8", "replace")
        self.block, self.block_lines = "", []
        doc = _load_yaml(text)
        flat = flatten(doc) if isinstance(doc, dict) else {}
        if flat:
            self.rec.config.update(flat)
            self.rec.config_source = "bridge-config"
            self.sources.add("bridge")
            self.rec.recognised_lines += len(flat)

    # ---------------------------------------------------------------- end of file
    def finish(self) -> None:
        """Close what is open, then resolve segments, duplicates and window flags over the rows."""
        if self.pending is not None:
            self.close_pending(truncated=True)
        if self.block == "args":
            self._end_args()
        elif self.block == "config":
            self._end_config()
        self.block = ""
        # tracebacks that never reached their exception line (excerpt cut, or interleaved output)
        for rank, fr in list(self.frames.items()):
            if fr:
                start = self.tb_open.get(rank, 0)
                self.signal(start, "traceback_unterminated", f"traceback with {len(fr)} frames, no exception line"
                            .encode(), rank, frames=tuple(fr))
        self.frames.clear()
        self.flush_rows()
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
        restarts (iteration number going back, a new training start or checkpoint load after iterations); set the
        window flags from the marks (the first row after a checkpoint save / evaluation / graph capture, and the rows
        of a profiler capture plus the first row after it)."""
        rec = self.rec
        tab = rec.iterations
        n = len(tab)
        if not n:
            return
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
        tab.set_col("flags", self._window_flags(lines, newseg, tab.col("flags").astype(np.int64)).astype(np.float64))
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
            j = np.searchsorted(lines, st.col("line"), side="right") - 1
            st.set_col("iteration", np.where(j >= 0, it[np.maximum(j, 0)], np.nan))
            st.set_col("segment", np.where(j >= 0, np.cumsum(newseg)[np.maximum(j, 0)], 0))

    def _window_flags(self, lines: np.ndarray, newseg: np.ndarray, flags: np.ndarray) -> np.ndarray:
        """Apply the marks to the row flags (``newseg`` gains restarts); returns the flags."""
        n = len(lines)
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
        return flags
