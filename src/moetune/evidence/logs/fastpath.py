"""Bulk path for complete iteration lines of a layout seen before (the bulk of a training log).

Megatron formats every field of ``training_log`` with a fixed format string, so consecutive iteration lines of a run
share their key bytes exactly. Once the general parser (:meth:`.parser.Parser.parse_iteration`) has seen a complete
line of a layout, :class:`Layout` compiles that exact key sequence to one regex. Later lines carrying the literal
``nan iterations`` (the last key of every Megatron / Bridge iteration line) are set aside while no record or block
is open, with their layout guessed from their numbers of ``|`` and ``:``; batches of :data:`FLUSH_ROWS` are then
matched by one multi-line regex pass over the joined batch and their numbers converted column by column with numpy.

Exactness: a batch row equals what :meth:`~.parser.Parser.parse_iteration` gives for the same line (same columns,
same ``float`` conversion, same rank bookkeeping); a line the layout regex does not match goes back to the
recognisers (:meth:`~.parser.Parser.reparse`). ``tests/test_logs_fastpath.py`` checks it on every log in
``data/logs`` and on generated mixes.
"""

from __future__ import annotations

import re
from operator import itemgetter
from typing import Any

import numpy as np

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
    Parser,
)
from moetune.evidence.logs.values import num

#: queued rows converted per batch
FLUSH_ROWS = 8192
#: the literal every complete Megatron / Bridge iteration line carries (its last key)
COMPLETE_LITERAL = b"nan iterations"
#: columns the bulk path converts; other printed fields (energy, power, params norm, max attention logit …) are
#: matched but not converted (float parsing dominates the cost of an iteration line)
_BULK_COLUMNS = frozenset({"elapsed_s", "tflops", "gbs", "loss_scale", "grad_norm", "skipped", "nan", "lr",
                           "num_zeros", "consumed_samples"})
_IDX = IterationTable.INDEX


def parse_columns(groups: list[tuple[bytes, ...]], k: int, width: int) -> np.ndarray:
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


class Layout:
    """One iteration-line layout (its exact key sequence) compiled to a single regex.

    Groups: the iteration, the total, then the value of each converted key. Values and the text before
    ``iteration`` exclude ``\\r`` and ESC (lines with carriage returns or colour codes take the general path, which
    cleans them first).
    """

    __slots__ = ("rx_full", "rx_multi", "perm", "scale", "gn_idx", "has_primary", "extras")

    def __init__(self, keys: list[bytes], specs: dict[bytes, tuple[str, Any]]) -> None:
        parts, mparts = [], []
        cols: list[tuple[str, Any]] = []  # per value group: (kind, arg)
        for j, k in enumerate(keys):
            kind, arg = specs[k]
            needed = (kind == "col" and arg[0] in _BULK_COLUMNS) or kind in ("primary", "loss")
            last = j == len(keys) - 1
            parts.append(re.escape(k) + b":" + (rb"([^|\r\x1b]*)" if needed else rb"[^|\r\x1b]*") +
                         (rb"\|?[ \t]*\Z" if last else rb"\|"))
            mparts.append(re.escape(k) + b":" + (rb"([^|\n\r\x1b]*)" if needed else rb"[^|\n\r\x1b]*") +
                          (rb"\|?[ \t]*$" if last else rb"\|"))
            if needed:
                cols.append((kind, arg))
        head = rb"iteration\s+(\d+)\s*/\s*(\d+)\s*\|"
        self.rx_full = re.compile(rb"[^|\r\x1b]*?\b" + head + b"".join(parts), re.S)
        self.rx_multi = re.compile(rb"^[^|\n\r\x1b]*?\b" + head.replace(rb"\s", rb"[ \t]") + b"".join(mparts), re.M)
        nan_group = len(cols) + 2  # groups: iteration, total, then the needed fields; the NaN column is appended
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


class BulkIterations:
    """Complete iteration lines of known layouts, queued in line order and parsed in batches."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser
        self.layouts: list[Layout] = []
        #: (count of "|", count of ":") -> layout: a guess, verified when the batch is parsed
        self.hints: dict[tuple[int, int], Layout] = {}
        self.q_raw: list[bytes] = []
        self.q_lines: list[int] = []
        self.q_layout: list[Layout] = []
        parser.on_layout = self.add_layout
        parser.before_row = self.flush

    def add_layout(self, keys: list[bytes], specs: dict[bytes, tuple[str, Any]]) -> None:
        if any(COMPLETE_LITERAL in k for k in keys):  # only lines that carry the literal are ever queued
            self.layouts.append(Layout(keys, specs))

    def take(self, line_no: int, line: bytes) -> bool:
        """Queue a line holding :data:`COMPLETE_LITERAL`, seen while no record or block is open, when its ``|``/``:``
        counts name a known layout (or it matches one); False: the line takes the general path."""
        key = (line.count(b"|"), line.count(b":"))
        layout = self.hints.get(key)
        if layout is None:
            for cand in self.layouts:
                if cand.rx_full.match(line) is not None:
                    layout = self.hints[key] = cand
                    break
            else:
                return False
        self.q_raw.append(line)
        self.q_lines.append(line_no)
        self.q_layout.append(layout)
        self.parser.rows_seen += 1
        if len(self.q_raw) >= FLUSH_ROWS:
            self.flush()
        return True

    def flush(self) -> None:
        """Parse the queued lines, grouped by layout, and append them as one block in line order."""
        raw, lines, layouts = self.q_raw, self.q_lines, self.q_layout
        if not raw:
            return
        self.q_raw, self.q_lines, self.q_layout = [], [], []
        self.parser.sources.add("megatron")
        self._ranks(raw)
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
        self._append([pt for pt in parts if pt is not None])

    def _ranks(self, raw: list[bytes]) -> None:
        """Ranks named by line prefixes (as the general parser records them for lines not starting with a blank)."""
        ranks = self.parser.rec.ranks_seen
        for line in raw:
            if line[:1] != b" ":
                m = P.RANK_PREFIX.match(line)
                if m is not None:
                    ranks.add(int(m.group(1) or m.group(2)))

    def _append(self, parts: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> None:
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
            order = np.argsort(block[:, C_LINE], kind="stable")
            block = block[order]
            extras = {key: v[order] for key, v in extras.items()}
        self.parser.rec.iterations.extend_block(block, extras)

    def _parse(self, lay: Layout, raw: list[bytes], lines: list[int]) -> tuple[np.ndarray, dict] | None:
        """Lines of one layout in bulk (one multi-line regex pass, then the numbers column by column); lines that
        turn out not to be of this layout go back to the recognisers."""
        groups = lay.rx_multi.findall(b"\n".join(raw))
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
        self.parser.rec.recognised_lines += len(groups)
        k = len(groups)
        width = len(groups[0])
        try:
            arr = parse_columns(groups, k, width)
        except ValueError:  # a value with blanks inside or an unparsable value: convert one by one
            arr = np.array([[num(x) for x in g] for g in groups], dtype=np.float64)
        arr = np.concatenate([arr, np.full((k, 1), np.nan)], axis=1)
        block = arr[:, lay.perm]
        if lay.scale != 1.0:
            block[:, C_ELAPSED] *= lay.scale
        if lay.gn_idx >= 0:
            block[:, C_GN_BAD] = np.where(np.isfinite(arr[:, lay.gn_idx]), np.nan, 1.0)
        block[:, C_LOSS_MISSING] = 0.0 if lay.has_primary else 1.0
        block[:, C_LINE] = lines
        block[:, C_FLAGS] = 0.0
        block[:, C_SEGMENT] = 0.0
        return block, {name: arr[:, i] for name, i in lay.extras}
