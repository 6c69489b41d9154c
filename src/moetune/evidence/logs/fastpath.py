"""Bulk path for complete iteration lines of a layout seen before (the bulk of a training log).

Megatron formats every field of ``training_log`` with a fixed format string, so consecutive iteration lines of a run
share their key bytes exactly. Once the general parser (:meth:`.parser.Parser.parse_iteration`) has seen a complete
line of a layout, :class:`Layout` compiles that exact key sequence to regexes.

Runs (:meth:`BulkIterations.scan_chunk`, the common case): in each chunk of the file, numpy finds the lines; stretches
of :data:`MIN_RUN` or more consecutive lines that start with a blank and end with ``|`` are joined and matched by one
``findall`` of the layout's regex (each match is one whole line, so as many matches as lines proves every line is of
the layout), or, when every line is of the template the run's first line sets (the common case), without any regex:
:func:`template_columns` checks the lines and converts the numbers on the raw bytes with numpy (:mod:`.bulknum`,
exact; lines of one length that equal the template but for digits, the common case, are checked per column by
their smallest and largest byte and converted all together, :func:`_shape_columns`); fields that had one value on every line of an earlier run (total, batch size, loss scale, counters) are
matched as literals and converted once (:meth:`Layout.learn_constants`); the other captured fields are converted column
by column. No Python object is made per line.

Line path (:meth:`BulkIterations.scan`): elsewhere, while no record or block is open, lines carrying the literal
``nan iterations`` (the last key of every Megatron / Bridge iteration line) are set aside, their layout guessed from
their numbers of ``|`` and ``:``; at the end of a chunk holding :data:`FLUSH_ROWS` or more of them, each layout's lines
are matched by one regex pass over the joined lines. NCCL ``Connection closed`` chatter past its evidence cap is only
counted.

Exactness: a bulk row equals what :meth:`~.parser.Parser.parse_iteration` gives for the same line (same columns,
same ``float`` conversion, same rank bookkeeping); a run that is not exactly of a layout takes the line path in its
place, and a queued line the layout regexes do not match goes back to the recognisers
(:meth:`~.parser.Parser.reparse`). ``tests/test_logs_fastpath.py`` checks it on every log in ``data/logs``, on long
repeats, on generated mixes, on perturbed runs and on the bench's realistic log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from moetune.evidence.logs import bulknum
from moetune.evidence.logs import patterns as P
from moetune.evidence.logs.model import IterationTable
from moetune.evidence.logs.parser import (
    C_ELAPSED,
    C_FLAGS,
    C_GN_BAD,
    C_ITER,
    C_LINE,
    C_LOSS_MISSING,
    C_SEGMENT,
    C_TOTAL,
    MAX_SIGNALS_PER_KIND,
    RING_MASK,
    Parser,
)
from moetune.evidence.logs.values import num

#: queued rows converted per batch
FLUSH_ROWS = 8192
#: the literal every complete Megatron / Bridge iteration line carries (its last key)
COMPLETE_LITERAL = b"nan iterations"
#: a stretch of at least this many consecutive lines that look like iteration lines of one known layout is parsed as
#: one run (:meth:`BulkIterations.scan_chunk`); shorter stretches take the line path
MIN_RUN = 32
#: bytes at the start of a log that always take the line path (where the general parser learns the layouts)
LEARN_BYTES = 1 << 16
_NCCL_INFO = b"NCCL INFO"
_CLOSED = b"Connection closed by localRank"
#: distinct NCCL chatter lines remembered by :meth:`BulkIterations.scan` (NCCL repeats the same few lines per rank)
MAX_CHATTER_LINES = 4096
#: columns the bulk path converts; other printed fields (energy, power, params norm, max attention logit …) are
#: matched but not converted (float parsing dominates the cost of an iteration line)
_BULK_COLUMNS = frozenset({"elapsed_s", "tflops", "gbs", "loss_scale", "grad_norm", "skipped", "nan", "lr",
                           "num_zeros", "consumed_samples"})
_IDX = IterationTable.INDEX
#: templates whose bulknum.Shape a layout remembers (cleared when full)
MAX_SHAPES = 256
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")


class Const(tuple):
    """A captured column whose ``k`` values are all one value (``Const.of(value, k)``; converted once)."""

    __slots__ = ()

    @staticmethod
    def of(value: bytes, k: int) -> Const:
        return Const((value,) * k)


def parse_columns(cols: list[Sequence[bytes]], k: int) -> np.ndarray:
    """float() of every captured value, column by column (``k`` values each); a column whose values repeat (batch
    size, loss scale, skipped/NaN counters) converts each distinct value once; a :class:`Const` column is converted
    once and a float64 array is taken as it is. Raises ValueError on an unparsable value. The (k, columns) result
    is column-major (each column contiguous: it is written, and later stored, column by column)."""
    out = np.empty((len(cols), k)).T
    for j, col in enumerate(cols):
        if type(col) is Const:
            out[:, j] = float(col[0])
            continue
        if type(col) is np.ndarray:  # converted already
            out[:, j] = col
            continue
        if len(set(col[::64])) <= 4:
            distinct = set(col)
            if len(distinct) <= 64:
                conv = {v: float(v) for v in distinct}
                out[:, j] = np.fromiter(map(conv.__getitem__, col), dtype=np.float64, count=k)
                continue
        out[:, j] = np.fromiter(map(float, col), dtype=np.float64, count=k)
    return out


class Layout:
    """One iteration-line layout (its exact key sequence) compiled to a single regex.

    Groups: the iteration, the total, then the value of each converted key. Values and the text before
    ``iteration`` exclude ``\\r`` and ESC (lines with carriage returns or colour codes take the general path, which
    cleans them first).
    """

    __slots__ = ("rx_full", "rx_multi", "rx_bulk", "perm", "scale", "gn_idx", "has_primary", "extras", "bkeys",
                 "ngroups", "const", "rx_const", "keys", "shapes")

    def __init__(self, keys: list[bytes], specs: dict[bytes, tuple[str, Any]]) -> None:
        parts, mparts, bparts = [], [], []
        self.bkeys: list[tuple[bytes, bool, bool]] = []  # per key: escaped, converted, last
        self.keys: list[tuple[bytes, bool]] = []  # per key: the key and ":", converted
        #: groups of ``rx_bulk`` whose value was the same on every line of the last run (group -> value), and
        #: ``rx_bulk`` with those values matched literally (see :meth:`learn_constants`)
        self.const: dict[int, bytes] = {}
        self.rx_const: re.Pattern[bytes] | None = None
        #: the bulknum.Shape of each template seen (False: none), see _shape_columns
        self.shapes: dict[tuple, bulknum.Shape | bool] = {}
        cols: list[tuple[str, Any]] = []  # per value group: (kind, arg)
        for j, k in enumerate(keys):
            kind, arg = specs[k]
            needed = (kind == "col" and arg[0] in _BULK_COLUMNS) or kind in ("primary", "loss")
            last = j == len(keys) - 1
            self.bkeys.append((re.escape(k), needed, last))
            self.keys.append((k + b":", needed))
            parts.append(re.escape(k) + b":" + (rb"([^|\r\x1b]*)" if needed else rb"[^|\r\x1b]*") +
                         (rb"\|?[ \t]*\Z" if last else rb"\|"))
            mparts.append(re.escape(k) + b":" + (rb"([^|\n\r\x1b]*)" if needed else rb"[^|\n\r\x1b]*") +
                          (rb"\|?[ \t]*$" if last else rb"\|"))
            bparts.append(re.escape(k) + b":" + (rb"([^|]*)" if needed else rb"[^|]*") + (rb"\|?[ \t]*$" if last else rb"\|"))
            if needed:
                cols.append((kind, arg))
        # "iteration" at the start or after a blank, "]" or "|" (as patterns.iter_head); not a NeMo line
        before = rb"(?<![^\s\]|])iteration"
        self.rx_full = re.compile(rb"(?![^|]*Training epoch)[^|\r\x1b]*?" + before +
                                  rb"\s+(\d+)\s*/\s*(\d+)\s*\|" + b"".join(parts), re.S)
        self.rx_multi = re.compile(rb"^(?![^|\n]*Training epoch)[^|\n\r\x1b]*?" + before +
                                   rb"[ \t]+(\d+)[ \t]*/[ \t]*(\d+)[ \t]*\|" + b"".join(mparts), re.M)
        # the common case, faster: a blank, an optional "[timestamp] ", the head; applied to "\n" + the batch joined
        # by "\n" with no CR / ESC in it (a value cannot span lines: each match starts a line, and all must match)
        self.rx_bulk = re.compile(rb"\n (?:\[[^\]\n|\r\x1b]*\] )?iteration[ \t]+(\d+)[ \t]*/[ \t]*(\d+)[ \t]*\|" +
                                  b"".join(bparts), re.M)
        nan_group = self.ngroups = len(cols) + 2  # groups: iteration, total, then the needed fields; NaN column appended
        perm = [nan_group] * IterationTable.NCOL
        perm[C_ITER], perm[C_TOTAL] = 0, 1
        self.scale, self.gn_idx = 1.0, -1
        self.has_primary = False
        self.extras: list[tuple[str, int]] = []
        for i, (kind, arg) in enumerate(cols, start=2):
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
        self.perm = np.array(perm, dtype=np.int64)


    def learn_constants(self, cols: list[Sequence[bytes]]) -> None:
        """Remember which groups had one value on every line of a run (the train-iterations total, batch size, loss
        scale, the counters) and compile ``rx_const``: ``rx_bulk`` with those values as literals, so that later runs
        capture (and convert) only what changes. A line ``rx_const`` matches is matched by ``rx_bulk`` with the same
        values (a value is the text between ``key:`` and the next ``|``; on the last field, surrounding blanks may
        differ, which ``float`` ignores)."""
        const = {g: col[0] for g, col in enumerate(cols) if g and col.count(col[0]) == len(col)}
        if const == self.const:
            return
        self.const = const
        if not const:
            self.rx_const = None
            return
        total = re.escape(const[1]) if 1 in const else rb"(\d+)"
        g = 2
        parts = []
        for k, needed, last in self.bkeys:
            if needed:
                v = re.escape(const[g]) if g in const else rb"([^|]*)"
                g += 1
            else:
                v = rb"[^|]*"
            parts.append(k + b":" + v + (rb"\|?[ \t]*$" if last else rb"\|"))
        self.rx_const = re.compile(rb"\n (?:\[[^\]\n|\r\x1b]*\] )?iteration[ \t]+(\d+)[ \t]*/[ \t]*" + total +
                                   rb"[ \t]*\|" + b"".join(parts), re.M)

    def run_columns(self, text: bytes, n: int) -> list[Sequence[bytes]] | None:
        """The groups of ``rx_bulk`` (iteration, total, then each converted key) column by column, for ``text``: ``n``
        lines each after a ``\\n``, none with CR or ESC; None unless every line is a complete line of this layout
        (each match starts at a line's ``\\n`` and ends at its end, so ``n`` matches cover all lines). Runs of one
        template (:func:`template_columns`) are parsed on the bytes with numpy; others by the regexes."""
        cols = template_columns(self, text, n)
        if cols is not None:
            return cols
        if self.rx_const is not None:
            groups = self.rx_const.findall(text)
            if len(groups) == n:
                try:  # float() of every captured value, in C (numpy calls float on each bytes object)
                    mat = np.array(groups, dtype=np.float64).reshape(n, -1)
                    it = iter(mat.T)
                except ValueError:  # an unparsable value: column by column (parse_columns, then num)
                    it = iter([groups] if self.ngroups - len(self.const) == 1 else zip(*groups, strict=True))
                return [Const.of(self.const[g], n) if g in self.const else next(it) for g in range(self.ngroups)]
        groups = self.rx_bulk.findall(text)
        if len(groups) != n:
            return None
        cols = list(zip(*groups, strict=True))
        if n >= MIN_RUN:
            self.learn_constants(cols)
        return cols


def template_columns(lay: Layout, text: bytes, n: int) -> list[np.ndarray] | None:
    """The columns of :meth:`Layout.run_columns` (float64 arrays) when all ``n`` lines of ``text`` are of the template
    its first line sets (:mod:`.bulknum`, exact checks on the bytes), else None."""
    if text[:1] != b"\n" or text[-1:] != b"|":
        return None
    end0 = text.find(b"\n", 1)
    end0 = len(text) if end0 < 0 else end0
    m = lay.rx_bulk.match(text)
    if m is None or m.end() != end0:
        return None
    line0 = text[1:end0]
    keys = lay.keys
    npipe = len(keys) + 1
    if line0.count(b"|") != npipe:
        return None
    a = np.frombuffer(text, dtype=np.uint8)
    if len(text) == n * len(line0) + n and n > 1:  # every line as long as the first (the common case)
        got = _shape_columns(lay, text, n, line0, m)
        if got is not None:
            return got
        got = _fixed_columns(lay, text, n, line0, m)
        if got is not None:
            return got
    nl = np.flatnonzero(a == 10)
    if len(nl) != n or nl[0] != 0:
        return None
    pipes = np.flatnonzero(a == 124)
    if len(pipes) != n * npipe:
        return None
    pipes = pipes.reshape(n, npipe)
    starts = nl + 1
    ends = np.empty(n, dtype=np.int64)
    ends[:-1] = nl[1:]
    ends[-1] = len(text)
    if not (pipes[:, -1] == ends - 1).all():  # exactly npipe "|" on each line, the last its last byte
        return None
    # the head: the template's length and bytes; timestamp digits any digits; iteration / total right-aligned integers
    h, lit, digit, numeric = _head_template(line0, m)
    if not (pipes[:, 0] - starts == h).all():
        return None
    it0 = numeric[0][0]
    tmpl = np.frombuffer(line0[:h], dtype=np.uint8)
    head = bulknum.windows(text, h)[starts]
    if not (head[:, lit] == tmpl[lit]).all() or not ((head[:, digit] - 48) < 10).all():
        return None
    if not (head[:, it0] == 32).all():  # "iteration" then [ \t]+
        return None
    out = []
    for lo, hi in numeric:
        try:
            fmt = bulknum.NumberFormat(line0[lo:hi], signed=False)
        except ValueError:
            return None
        v, ok = bulknum.parse_shaped(text, starts + lo, starts + hi, fmt)
        if not ok.all():
            return None
        out.append(v)
    # each key and its ":" right after the "|" before it; the converted values
    tp = np.flatnonzero(np.frombuffer(line0, dtype=np.uint8) == 124).tolist()  # the template's "|"
    for j, (key, needed) in enumerate(keys):
        pos = pipes[:, j] + 1
        if not (bulknum.windows(text, len(key))[pos] == np.frombuffer(key, dtype=np.uint8)).all():
            return None
        if needed:
            try:
                fmt = bulknum.NumberFormat(line0[tp[j] + 1 + len(key):tp[j + 1]])
            except ValueError:
                return None
            st, en = pos + len(key), pipes[:, j + 1]
            value = line0[tp[j] + 1 + len(key):tp[j + 1]]
            if (en - st == len(value)).all() and (bulknum.windows(text, len(value))[st] ==
                                                  np.frombuffer(value, dtype=np.uint8)).all():
                out.append(np.full(n, num(value)))  # one value on every line (batch size, loss scale, counters)
            else:
                out.append(bulknum.parse_numbers(text, st, en, fmt))
    return out


def _head_template(line0: bytes, m: re.Match[bytes]) -> tuple[int, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """The head of the template line (the text before its first ``|``): its length, its literal columns, its
    timestamp digit columns (any digit) and the column ranges of the iteration and the total (right-aligned
    integers; the iteration's first column a blank, as the regex's ``[ \t]+``)."""
    h = line0.index(b"|")
    g1, e1 = m.start(1) - 1, m.end(1) - 1
    e2 = m.end(2) - 1
    it0 = line0.rfind(b"iteration", 0, g1) + len(b"iteration")
    slash = line0.index(b"/", e1)
    tmpl = np.frombuffer(line0[:h], dtype=np.uint8)
    col = np.arange(h)
    numeric = ((col >= it0) & (col < e1)) | ((col > slash) & (col < e2))
    digit = (col < it0 - len(b"iteration")) & ((tmpl - 48) < 10)
    return h, np.flatnonzero(~numeric & ~digit), np.flatnonzero(digit), [(it0, e1), (slash + 1, e2)]


def _shape_columns(lay: Layout, text: bytes, n: int, line0: bytes, m: re.Match[bytes], splits: int = 4) \
        -> list[np.ndarray] | None:
    """:func:`template_columns` for a run whose lines all have the template's shape (the common case): each line
    equals the template byte for byte except that digits of the timestamp and of the values may be any digits (and
    an exponent's sign either sign); then every value is at the template's columns in the template's format, and all
    are converted together (:class:`.bulknum.Shape`). When a later line is not of that shape (a counter that gains a
    digit: consumed samples, the iteration), the lines before it are taken and the rest is a run of its own
    (:func:`template_columns`, its first line its template), at most ``splits`` times. None when neither applies."""
    width = len(line0)
    a = np.frombuffer(text, dtype=np.uint8)
    if not (a[::width + 1] == 10).all():  # the n lines (each after a "\n", as the caller gives them) are the rows
        return None
    tp = np.flatnonzero(np.frombuffer(line0, dtype=np.uint8) == 124).tolist()
    if len(tp) != len(lay.keys) + 1:
        return None
    h, _lit, _digit, numeric = _head_template(line0, m)
    it0 = numeric[0][0]
    spans = list(numeric)
    free = [(0, max(it0 - len(b"iteration"), 0))]
    for j, (key, needed) in enumerate(lay.keys):
        if line0[tp[j] + 1:tp[j] + 1 + len(key)] != key:
            return None
        (spans if needed else free).append((tp[j] + 1 + len(key), tp[j + 1]))
    # A Shape depends on the template's bytes with the digits of its spans and free ranges masked, and on those
    # ranges; the only other digits of a line of this layout are in its keys (checked equal above), so within the
    # layout the template with every digit masked names its Shape (runs of one log mostly share a few).
    key = (line0.translate(_DIGITS_TO_ZERO), tuple(spans), tuple(free))
    shape = lay.shapes.get(key)
    if shape is None:
        try:
            shape = bulknum.Shape(line0, spans, free)
        except ValueError:
            shape = False
        if len(lay.shapes) >= MAX_SHAPES:
            lay.shapes.clear()
        lay.shapes[key] = shape
    if shape is False:
        return None
    rows = np.ndarray((n, width), dtype=np.uint8, buffer=text, offset=1, strides=(width + 1, 1))
    got = shape.columns(rows)
    rest = None
    if got is None:
        if splits <= 0:
            return None
        bad = ((rows < shape.lo) | (rows > shape.hi)).any(axis=1)
        b = int(np.argmax(bad)) if bad.any() else 0
        if b < 1:  # (also: an exponent sign that is neither "+" nor "-")
            return None
        got = shape.columns(rows[:b])
        if got is None:
            return None
        tail = text[b * (width + 1):]
        t0 = tail[1:width + 1]
        m1 = lay.rx_bulk.match(tail)
        if m1 is None or m1.end() != width + 1:
            return None
        rest = _shape_columns(lay, tail, n - b, t0, m1, splits - 1) if n - b > 1 else None
        if rest is None:
            rest = template_columns(lay, tail, n - b)
            if rest is None:
                return None
    vals, ok = got
    for i in np.flatnonzero(~ok).tolist():  # exponent out of the exact range: float() of those values
        p = 1 + i * (width + 1)
        for c, (lo, hi) in enumerate(spans):
            vals[i, c] = num(text[p + lo:p + hi])
    if rest is not None:
        return [np.concatenate([v, r]) for v, r in zip(vals.T, rest, strict=True)]
    return list(vals.T)


def _fixed_columns(lay: Layout, text: bytes, n: int, line0: bytes, m: re.Match[bytes]) -> list[np.ndarray] | None:
    """:func:`template_columns` for a run whose lines all have the template's length: the lines are the rows of one
    (n, length) view of the text (no copy); a line is of the template when its ``|`` are at the template's columns
    (and it has no other), its keys, the literal bytes of its head and its timestamp digits are the template's, and
    its iteration / total are right-aligned integers. Values at fixed columns that equal the template's on every line
    are converted once."""
    width = len(line0)
    a = np.frombuffer(text, dtype=np.uint8)
    if not (a[::width + 1] == 10).all():  # the n lines (each after a "\n", as the caller gives them) are the rows
        return None
    rows = np.ndarray((n, width), dtype=np.uint8, buffer=text, offset=1, strides=(width + 1, 1))
    tp = np.flatnonzero(np.frombuffer(line0, dtype=np.uint8) == 124)
    if np.count_nonzero(a == 124) != n * len(tp) or not (rows[:, tp] == 124).all():
        return None
    tmpl = np.frombuffer(line0, dtype=np.uint8)
    h, lit, digit, numeric = _head_template(line0, m)
    mask = np.zeros(width, dtype=np.uint8)
    mask[lit] = 0xFF
    for j, (key, _) in enumerate(lay.keys):
        mask[tp[j] + 1:tp[j] + 1 + len(key)] = 0xFF
    if not all(line0[tp[j] + 1:tp[j] + 1 + len(key)] == key for j, (key, _) in enumerate(lay.keys)):
        return None
    last = int(np.flatnonzero(mask)[-1]) + 1
    diff = np.bitwise_xor(rows[:, :last], tmpl[:last])
    diff &= mask[:last]
    if diff.any() or not ((rows[:, digit] - 48) < 10).all() or not (rows[:, numeric[0][0]] == 32).all():
        return None
    out = []
    for lo, hi in numeric:
        value = line0[lo:hi]
        if (rows[:, lo:hi] == tmpl[lo:hi]).all():
            out.append(np.full(n, num(value)))
            continue
        try:
            fmt = bulknum.NumberFormat(value, signed=False)
        except ValueError:
            return None
        got = bulknum.shaped_fixed(text, 1, width + 1, n, lo, hi, fmt)
        if got is None or not got[1].all():
            return None
        out.append(got[0])
    for j, (key, needed) in enumerate(lay.keys):
        if not needed:
            continue
        lo, hi = tp[j] + 1 + len(key), tp[j + 1]
        value = line0[lo:hi]
        mid, end = n // 2 * (width + 1) + 1, (n - 1) * (width + 1) + 1
        far = text[mid + lo:mid + hi], text[end + lo:end + hi]
        if far == (value, value) and (rows[:, lo:hi] == tmpl[lo:hi]).all():
            out.append(np.full(n, num(value)))  # one value on every line (batch size, loss scale, counters)
            continue
        try:
            fmt = bulknum.NumberFormat(value)
        except ValueError:
            return None
        out.append(bulknum.parse_fixed(text, 1, width + 1, n, lo, hi, fmt))
    return out


class BulkIterations:
    """Complete iteration lines of known layouts, queued in line order and parsed in batches."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser
        self.layouts: list[Layout] = []
        #: (count of "|", count of ":") -> layout: a guess, verified when the batch is parsed
        self.hints: dict[tuple[int, int], Layout] = {}
        #: runs parsed by scan_chunk, not yet appended (rows, extras), and their row count
        self.blocks: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
        self.block_rows = 0
        self.q_raw: list[bytes] = []
        self.q_lines: list[int] = []
        self.q_layout: list[Layout] = []
        # rows the general parser made meanwhile (wrapped records, other layouts): merged by line when flushed
        self.rows: list[list[float]] = []
        self.row_extras: list[tuple[int, dict[str, float]]] = []
        self.hold = False  # no flush while a chunk is scanned (its bulk lines are queued at its end)
        #: NCCL chatter lines seen (without the iteration literal, with both NCCL literals): a repeat is recognised by
        #: one hash lookup instead of two searches (at most MAX_CHATTER_LINES kept)
        self.chatter: set[bytes] = set()
        parser.on_layout = self.add_layout
        parser.append_row = self.add_row
        parser.flush_rows = self.flush
        parser.take_joined = self.take_joined
        parser.take_line = self.take

    def add_layout(self, keys: list[bytes], specs: dict[bytes, tuple[str, Any]]) -> None:
        if any(COMPLETE_LITERAL in k for k in keys):  # only lines that carry the literal are ever queued
            self.layouts.append(Layout(keys, specs))

    def scan_chunk(self, buf: bytes, first: int, end: int | None = None, start: int = 0) -> int:
        """Process ``buf[start:end]``, whole lines each ending with ``\\n`` (numbered from ``first``; ``start`` is 0 or
        follows a ``\\n``); returns their number.

        The lines are never all split into Python objects. numpy finds the newlines; a stretch of at least
        :data:`MIN_RUN` consecutive lines that start with a blank and end with ``|`` (as a complete Megatron / Bridge
        iteration line does) is a candidate run. The chunk's candidate runs are checked and converted together by
        :meth:`_parse_runs` (one regex pass over their joined text; when they are not all exactly of one known layout,
        each run is tried alone, and a run that is not takes the line path). Then, in line order, the other lines go
        through :meth:`scan` (the line path) and each run is taken while no record or block is open (when one is, the
        run's first line takes the line path and closes it, as it would there).
        """
        end = len(buf) if end is None else end
        if not self.layouts and first == 1 and end - start > LEARN_BYTES:  # learn the layouts on the first lines
            cut = buf.find(b"\n", start + LEARN_BYTES, end) + 1
            n = self._lines(buf[start:cut], first)
            return n + self.scan_chunk(buf, first + n, end, cut)
        if not self.layouts or end - start < 64 * MIN_RUN:
            return self._lines(buf[start:end], first)
        a = np.frombuffer(buf, dtype=np.uint8, count=end)
        nl = np.flatnonzero(a[start:] == 10) + start
        k = len(nl)
        starts = np.empty(k, dtype=np.int64)
        starts[0] = start
        starts[1:] = nl[:-1] + 1
        cand = (a[starts] == 32) & (a[nl - 1] == 124)  # starts with a blank, ends with "|"
        change = np.flatnonzero(cand[1:] != cand[:-1]) + 1
        rs = np.concatenate(([0], change))
        rend = np.concatenate((change, [k]))
        sel = np.flatnonzero(cand[rs] & (rend - rs >= MIN_RUN))
        if not len(sel):
            return self._lines(buf[start:end], first)
        runs = list(zip(rs[sel].tolist(), rend[sel].tolist(), strict=True))
        sb, nb = starts, nl  # indexed per run only
        # each run's text: its lines, each after a "\n"
        view = memoryview(buf)  # (slices of it are not copies: _parse_runs joins them in one copy)
        texts = [view[sb[lo] - 1:nb[hi - 1]] if sb[lo] else b"\n" + buf[:nb[hi - 1]] for lo, hi in runs]
        # per run: (batch, offset of its first row in the batch) or None (the line path)
        where: list[tuple[int, int] | None] = [None] * len(runs)
        batches: list[tuple[Layout, list, list[tuple[int, int]], list[tuple[int, int]]]] = []
        got = self._parse_runs(texts, [hi - lo for lo, hi in runs])
        if got is not None:
            off = 0
            for i, (lo, hi) in enumerate(runs):
                where[i] = (0, off)
                off += hi - lo
            batches.append((*got, [], []))
        elif len(runs) > 1:  # not all of one layout: each run alone
            for i, (lo, hi) in enumerate(runs):
                one = self._parse_runs([texts[i]], [hi - lo])
                if one is not None:
                    where[i] = (len(batches), 0)
                    batches.append((*one, [], []))
        del texts
        parser = self.parser
        ring = parser.ring
        pos = 0
        for (lo, hi), w in zip(runs, where, strict=True):
            if lo > pos:
                self._lines(buf[sb[pos]:nb[lo - 1] + 1], first + pos)
            pos = hi
            if w is None:
                self._lines(buf[sb[lo]:nb[hi - 1] + 1], first + lo)
                continue
            bi, off = w
            if not parser.clean:  # the first line closes what is open (as on the line path); the rest is clean
                self._lines(buf[sb[lo]:nb[lo] + 1], first + lo)
                lo += 1
                off += 1
                if not parser.clean:
                    if hi > lo:
                        self._lines(buf[sb[lo]:nb[hi - 1] + 1], first + lo)
                    continue
            n = hi - lo
            if not n:
                continue
            batches[bi][2].append((first + lo, first + hi))
            batches[bi][3].append((off, off + n))
            parser.rows_seen += n
            parser.rec.recognised_lines += n
            parser.sources.add("megatron")
            last = max(lo, hi - RING_MASK - 1)
            for ln, line in enumerate(buf[sb[last]:nb[hi - 1]].split(b"\n"), first + last):
                ring[ln & RING_MASK] = line
        if pos < k:
            self._lines(buf[sb[pos]:end], first + pos)
        for lay, cols, line_ranges, kept in batches:
            if not kept:
                continue
            lines = np.concatenate([np.arange(x, y, dtype=np.float64) for x, y in line_ranges])
            block, extras = self._block(lay, cols, lines if len(lines) == len(cols[0]) else np.zeros(len(cols[0])))
            if len(lines) < len(block):
                ix = np.concatenate([np.arange(x, y) for x, y in kept])
                block = np.take(block.T, ix, axis=1).T  # (those rows, column-major kept)
                block[:, C_LINE] = lines
                extras = {name: v[ix] for name, v in extras.items()}
            self.blocks.append((block, extras))
            self.block_rows += len(block)
        if self.block_rows >= FLUSH_ROWS:
            self.flush()
        return k

    def _lines(self, text: bytes, first: int) -> int:
        """The line path for ``text`` (whole lines, each ending with ``\\n``); returns the number of lines."""
        lines = text.split(b"\n")
        lines.pop()
        self.scan(lines, first)
        return len(lines)

    def _parse_runs(self, texts: list[bytes | memoryview], sizes: list[int]) -> tuple[Layout, list] | None:
        """The first known layout all the runs (``texts``: each line after a ``\\n``) are exactly of (the last one
        that matched is tried first), and their captured columns (:meth:`Layout.run_columns`); None when there is
        none."""
        text = b"".join(texts)  # bytes (texts may be memoryviews of the chunk)
        if b"\r" in text or b"\x1b" in text:
            return None
        n = sum(sizes)
        for i, lay in enumerate(self.layouts):
            cols = lay.run_columns(text, n)
            if cols is not None:
                if i:
                    self.layouts.insert(0, self.layouts.pop(i))
                return lay, cols
        return None

    def add_row(self, values: list[float], extra: dict[str, float] | None) -> None:
        """A row from the general parser (see :meth:`.parser.Parser.parse_iteration`)."""
        if extra:
            self.row_extras.append((len(self.rows), extra))
        self.rows.append(values)
        if len(self.rows) >= FLUSH_ROWS and not self.hold:
            self.flush()

    def scan(self, lines: list[bytes], first: int) -> None:
        """Process one chunk of lines (numbered from ``first``).

        While no record or block is open, complete iteration lines (the literal) whose ``|``/``:`` counts name a
        known layout and that have no rank prefix are queued, and NCCL ``Connection closed`` chatter past its
        evidence cap is only counted (a line seen before is known by one hash lookup); every other line goes to :meth:`.parser.Parser.feed` (which may still queue a
        complete iteration line, see ``take_line``). The queue is parsed at the end of the chunk.
        """
        parser = self.parser
        feed, ring, hints, counts = parser.feed, parser.ring, self.hints, parser.rec.signal_counts
        q_raw, q_lines, q_layout = self.q_raw.append, self.q_lines.append, self.q_layout.append
        chatter = self.chatter
        self.hold = True
        clean = parser.clean
        capped = clean and counts.get("nccl_connection_closed", 0) >= MAX_SIGNALS_PER_KIND
        closed = 0
        for n, line in enumerate(lines, first):
            if capped and line in chatter:  # (no chatter line holds the literal)
                closed += 1
                ring[n & RING_MASK] = line
                continue
            if COMPLETE_LITERAL in line:
                if clean:
                    layout = hints.get((line.count(b"|"), line.count(b":")))
                    if layout is not None and line[:1] == b" ":
                        q_raw(line)
                        q_lines(n)
                        q_layout(layout)
                        parser.rows_seen += 1
                        ring[n & RING_MASK] = line
                        continue
            elif capped and _CLOSED in line and _NCCL_INFO in line:
                if len(chatter) < MAX_CHATTER_LINES:
                    chatter.add(line)
                closed += 1
                ring[n & RING_MASK] = line
                continue
            feed(n, line)
            clean = parser.pending is None and not parser.block
            capped = clean and counts.get("nccl_connection_closed", 0) >= MAX_SIGNALS_PER_KIND
        self.hold = False
        if closed:
            parser.rec.recognised_lines += closed
            counts["nccl_connection_closed"] += closed
        if len(self.q_raw) >= FLUSH_ROWS or len(self.rows) >= FLUSH_ROWS:
            self.flush()

    def layout_of(self, line: bytes) -> Layout | None:
        """The known layout a line holding :data:`COMPLETE_LITERAL` seems to have: guessed from its ``|`` and ``:``
        counts (verified when the batch is parsed), else the first layout whose regex matches it."""
        key = (line.count(b"|"), line.count(b":"))
        layout = self.hints.get(key)
        if layout is None:
            for cand in self.layouts:
                if cand.rx_full.match(line) is not None:
                    layout = self.hints[key] = cand
                    break
        return layout

    def take(self, line_no: int, line: bytes) -> bool:
        """Queue a line holding :data:`COMPLETE_LITERAL`, seen while no record or block is open, when it has a known
        layout; False: the line takes the general path."""
        layout = self.layout_of(line)
        if layout is None:
            return False
        if line[:1] != b" ":  # a rank prefix, recorded as the general parser records it
            m = P.RANK_PREFIX.match(line)
            if m is not None:
                self.parser.rec.ranks_seen.add(int(m.group(1) or m.group(2)))
        self._queue(line_no, line, layout)
        return True

    def take_joined(self, line_no: int, text: bytes, rank: int | None) -> bool:
        """Queue a re-joined terminal-wrapped iteration record (cleaned, rank prefix removed) when it holds
        :data:`COMPLETE_LITERAL` and has a known layout; False: the general parser takes it."""
        layout = self.layout_of(text) if COMPLETE_LITERAL in text else None
        if layout is None:
            return False
        if rank is not None:
            self.parser.rec.ranks_seen.add(rank)
        self._queue(line_no, text, layout)
        return True

    def _queue(self, line_no: int, line: bytes, layout: Layout) -> None:
        self.q_raw.append(line)
        self.q_lines.append(line_no)
        self.q_layout.append(layout)
        self.parser.rows_seen += 1
        if len(self.q_raw) >= FLUSH_ROWS and not self.hold:
            self.flush()

    def flush(self) -> None:
        """Parse the queued lines, grouped by layout, and append them with the general parser's rows as one block in
        line order (lines that go back to the recognisers may add rows meanwhile: those follow)."""
        while self.q_raw or self.rows or self.blocks:
            self._flush_once()

    def _flush_once(self) -> None:
        raw, lines, layouts = self.q_raw, self.q_lines, self.q_layout
        rows, row_extras = self.rows, self.row_extras
        self.q_raw, self.q_lines, self.q_layout = [], [], []
        self.rows, self.row_extras = [], []
        parts = [self._general_rows(rows, row_extras)] if rows else []
        parts.extend(self.blocks)
        self.blocks, self.block_rows = [], 0
        if raw:
            self.parser.sources.add("megatron")
            parts.extend(self._parse_queue(raw, lines, layouts))
        self._append([pt for pt in parts if pt is not None])

    @staticmethod
    def _general_rows(rows: list[list[float]], row_extras: list[tuple[int, dict[str, float]]]) \
            -> tuple[np.ndarray, dict[str, np.ndarray]]:
        block = np.array(rows, dtype=np.float64)
        extras: dict[str, np.ndarray] = {}
        for i, extra in row_extras:
            for key, v in extra.items():
                col = extras.get(key)
                if col is None:
                    col = extras[key] = np.full(len(rows), np.nan)
                col[i] = v
        return block, extras

    def _parse_queue(self, raw: list[bytes], lines: list[int], layouts: list[Layout]) -> list:
        """The queued lines, grouped by layout."""
        first = layouts[0]
        if layouts.count(first) == len(layouts):
            parts = [self._parse(first, raw, lines)]
        else:  # group by layout in C: layout index per line, then itemgetter picks each group's lines
            index = {lay: i for i, lay in enumerate(dict.fromkeys(layouts))}
            ids = np.fromiter(map(index.__getitem__, layouts), dtype=np.int64, count=len(layouts))
            parts = []
            for lay, i in index.items():
                ix = np.flatnonzero(ids == i).tolist()
                if len(ix) == 1:
                    parts.append(self._parse(lay, [raw[ix[0]]], [lines[ix[0]]]))
                else:
                    pick = itemgetter(*ix)
                    parts.append(self._parse(lay, list(pick(raw)), list(pick(lines))))
        return parts

    def _append(self, parts: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> None:
        if not parts:
            return
        if len(parts) == 1 and not (np.diff(parts[0][0][:, C_LINE]) < 0).any():
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
            at = block[:, C_LINE]
            if (at[1:] < at[:-1]).any():  # not in line order already (a stable sort of sorted rows is the identity)
                order = np.argsort(at, kind="stable")
                block = np.take(block.T, order, axis=1).T  # (the rows reordered, column-major kept)
                extras = {key: v[order] for key, v in extras.items()}
        self.parser.rec.iterations.extend_block(block, extras)

    def _parse(self, lay: Layout, raw: list[bytes], lines: list[int]) -> tuple[np.ndarray, dict] | None:
        """Lines guessed to have one layout, in bulk (one regex pass over the joined lines, then the numbers column by
        column); lines that turn out not to be of this layout go back to the recognisers."""
        text = b"\n".join(raw)
        if b"\r" not in text and b"\x1b" not in text:  # all of the layout: as a run (numpy when of one template)
            got = self._by_length(lay, raw, lines)
            if got is not None:
                self.parser.rec.recognised_lines += len(lines)
                return got
            cols = lay.run_columns(b"\n" + text, len(raw))
            if cols is not None:
                self.parser.rec.recognised_lines += len(lines)
                return self._block(lay, cols, lines)
        groups = lay.rx_multi.findall(text)
        if len(groups) != len(raw):  # some line is not of this layout: match one by one
            groups, ok_lines = [], []
            for ln, line in zip(lines, raw, strict=True):
                m = lay.rx_full.match(line)
                if m is not None:
                    groups.append(m.groups())
                    ok_lines.append(ln)
                else:
                    self.parser.rows_seen -= 1
                    self.parser.reparse(ln, line)
            lines = ok_lines
        if not groups:
            return None
        self.parser.rec.recognised_lines += len(lines)
        return self._block(lay, list(zip(*groups, strict=True)), lines)

    def _by_length(self, lay: Layout, raw: list[bytes], lines: list[int]) -> tuple[np.ndarray, dict] | None:
        """Queued lines of several lengths (interleaved templates, values of several widths), one run per length
        (lines of one length are mostly of one template: :func:`_shape_columns` converts them at once), each row with
        its line number (:meth:`_append` puts the rows in line order). None, with nothing done, when the lines have
        one length, when the runs would average fewer than :data:`MIN_RUN` lines, or when some run is not exactly of
        the layout (the caller then parses them all together and sends the lines that are not of it back to the
        recognisers in their order)."""
        k = len(raw)
        size = np.fromiter(map(len, raw), dtype=np.int64, count=k)
        if k < 2 * MIN_RUN or size.min() == size.max():
            return None
        order = np.argsort(size, kind="stable")
        cut = np.flatnonzero(np.diff(size[order])) + 1
        if (len(cut) + 1) * MIN_RUN > k:
            return None
        parts = []
        for ix in np.split(order, cut):
            ix_l = ix.tolist()
            cols = lay.run_columns(b"\n" + b"\n".join([raw[i] for i in ix_l]), len(ix_l))
            if cols is None:
                return None
            parts.append(self._block(lay, cols, [lines[i] for i in ix_l]))
        block = np.concatenate([b for b, _ in parts])  # (in line order once appended: see _append)
        extras = {name: np.concatenate([ex[name] for _, ex in parts]) for name in parts[0][1]}
        return block, extras

    @staticmethod
    def _block(lay: Layout, cols: list[Sequence[bytes]], lines: Any) -> tuple[np.ndarray, dict]:
        """Rows of ``lay`` from its captured values, column by column (iteration, total, then each converted key)."""
        k = len(lines)
        try:
            arr = parse_columns(cols, k)
        except ValueError:  # a value with blanks inside or an unparsable value: convert one by one
            arr = np.array([[num(x) for x in col] for col in cols], dtype=np.float64).T.reshape(k, len(cols))
        arr_t = np.concatenate([arr.T, np.full((1, k), np.nan)])  # column-major: one row per column
        block = arr_t[lay.perm].T  # (k, NCOL), column-major (IterationTable stores it column by column)
        arr = arr_t.T
        if lay.scale != 1.0:
            block[:, C_ELAPSED] *= lay.scale
        if lay.gn_idx >= 0:
            block[:, C_GN_BAD] = np.where(np.isfinite(arr[:, lay.gn_idx]), np.nan, 1.0)
        block[:, C_LOSS_MISSING] = 0.0 if lay.has_primary else 1.0
        block[:, C_LINE] = lines
        block[:, C_FLAGS] = 0.0
        block[:, C_SEGMENT] = 0.0
        return block, {name: arr[:, i] for name, i in lay.extras}
