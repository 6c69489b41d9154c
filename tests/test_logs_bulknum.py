"""The numpy run parser (moetune.evidence.logs.bulknum, fastpath.template_columns) gives exactly what the regexes and
``float`` give: every number bit for bit equal to ``values.num`` of its text, every accepted run's columns equal to
the layout regex's captures converted one by one, and runs it does not accept left to the regex path."""

from __future__ import annotations

import random
import re
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DATA
from moetune.evidence.logs import bulknum, fastpath
from moetune.evidence.logs.model import RunRecord
from moetune.evidence.logs.parser import Parser
from moetune.evidence.logs.values import num

FORMATS = ["{:.1f}", "{:.3f}", "{:E}", "{:12d}", "{:5d}", "{:3d}", "{:.2e}", "{:.0f}", "{:.10f}", "{:.8f}"]
_JUNK = b" -+.0123456789eEn/a_\t"


def _same(a: float, b: float) -> bool:
    return struct.pack("d", a) == struct.pack("d", b) or (a != a and b != b)


def _values_buffer(vals: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``vals`` as ``key:value|`` fields after a 24-byte prefix, with the start / end of each value."""
    buf = b"x" * 24 + b"".join(b" k:" + v + b"|" for v in vals)
    starts, ends, p = [], [], 24
    for v in vals:
        starts.append(p + 3)
        ends.append(p + 3 + len(v))
        p += len(v) + 4
    return buf, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)


def _check_numbers(template: bytes, vals: list[bytes], signed: bool = True) -> float:
    buf, s, e = _values_buffer(vals)
    fmt = bulknum.NumberFormat(template, signed=signed)
    got = bulknum.parse_numbers(buf, s, e, fmt)
    for v, g in zip(vals, got, strict=True):
        assert _same(g, num(v)), (template, v, g, num(v))
    # the generic and the SWAR parsers accept the same rows, with the same values
    v1, ok1 = bulknum.parse_shaped(buf, s, e, fmt)
    swar = bulknum.parse_swar(buf, s, e, fmt)
    if swar is not None:
        v2, ok2 = swar
        for i in np.flatnonzero(ok2):
            assert _same(v2[i], num(vals[i]))
    for i in np.flatnonzero(ok1):
        assert _same(v1[i], num(vals[i]))
    return float(ok1.mean())


def _value(rnd: random.Random, f: str) -> bytes:
    x = rnd.choice([rnd.random() * 10 ** rnd.randint(-30, 30), rnd.gauss(0, 1000), 0.0, -0.0,
                    rnd.randint(-10**16, 10**16), rnd.randint(0, 10**8)])
    s = f.format(int(x) if "d" in f else x).encode()
    r = rnd.random()
    if r < 0.3:
        return b" " + s + b" "
    if r < 0.4:
        return b" " + s.replace(b".", b"", 1) + b" "
    if r < 0.5:
        k = rnd.randrange(len(s) + 1)
        return b" " + s[:k] + bytes([rnd.choice(_JUNK)]) + s[k:] + b" "
    if r < 0.55:
        return b" " + rnd.choice([b"nan", b"-inf", b"inf", b"n/a", b"", b"1_0", b"+1", b"--1", b"- 1"]) + b" "
    if r < 0.7:
        return bytes(rnd.choice(_JUNK) for _ in range(rnd.randint(0, 30)))
    return b" " * rnd.randint(0, 12) + s + b" " * rnd.randint(0, 2)


def test_numbers_equal_float_bit_for_bit():
    rnd = random.Random(1)
    for f in FORMATS:
        template = b" " + f.format(1 if "d" in f else 1.5).encode() + b" "
        vals = [_value(rnd, f) for _ in range(4000)]
        assert _check_numbers(template, vals) > 0.2  # the vectorised path took part


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FORMATS), st.integers(0, 2**32), st.integers(1, 300), st.booleans())
def test_property_numbers(f, seed, n, signed):
    rnd = random.Random(seed)
    template = b" " + f.format(7 if "d" in f else 2.25).encode() + b" " * rnd.randint(0, 2)
    _check_numbers(template, [_value(rnd, f) for _ in range(n)], signed=signed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=24), min_size=1, max_size=50), st.sampled_from(FORMATS))
def test_property_any_bytes(vals, f):
    vals = [v.replace(b"|", b" ") for v in vals]
    _check_numbers(b" " + f.format(3 if "d" in f else 3.5).encode() + b" ", vals)


# ------------------------------------------------------------------ whole runs
def _layout() -> tuple[fastpath.Layout, str]:
    head = (DATA / "logs" / "log_iteration_1.txt").read_text().splitlines()[0]
    rec = RunRecord(path="x")
    p = Parser(rec)
    q = fastpath.BulkIterations(p)
    p.feed(1, head.encode())
    return q.layouts[0], head


def _regex_columns(lay: fastpath.Layout, text: bytes, n: int) -> list[np.ndarray] | None:
    groups = lay.rx_bulk.findall(text)
    if len(groups) != n:
        return None
    return [np.array([num(v) for v in col]) for col in zip(*groups, strict=True)]


def _without_fixed(lay: fastpath.Layout, text: bytes, n: int) -> list[np.ndarray] | None:
    """template_columns with the fixed-width paths (shape, fixed columns) switched off (the per-line gather path)."""
    orig = fastpath._fixed_columns, fastpath._shape_columns
    fastpath._fixed_columns = fastpath._shape_columns = lambda *args: None
    try:
        return fastpath.template_columns(lay, text, n)
    finally:
        fastpath._fixed_columns, fastpath._shape_columns = orig


def _without_shape(lay: fastpath.Layout, text: bytes, n: int) -> list[np.ndarray] | None:
    """template_columns with the one-shape path switched off (the fixed-columns path)."""
    orig = fastpath._shape_columns
    fastpath._shape_columns = lambda *args: None
    try:
        return fastpath.template_columns(lay, text, n)
    finally:
        fastpath._shape_columns = orig


def _clean(line: str, it: int) -> str:
    return re.sub(r"iteration\s+\d+/", f"iteration {it:8d}/", line)


def _perturb(rnd: random.Random, line: str, it: int) -> str:
    line = _clean(line, it)
    r = rnd.random()
    if r < 0.5:
        return line
    pieces = line.split("|")
    j = rnd.randrange(len(pieces))
    p = pieces[j]
    if r < 0.6 and ":" in p:  # another value
        k, _ = p.split(":", 1)
        pieces[j] = f"{k}: {_value(rnd, rnd.choice(FORMATS)).decode().strip()} "
    elif r < 0.7:  # a byte changed anywhere
        if p:
            i = rnd.randrange(len(p))
            pieces[j] = p[:i] + chr(rnd.choice(_JUNK)) + p[i + 1:]
    elif r < 0.8:  # a byte inserted or removed
        i = rnd.randrange(len(p) + 1)
        pieces[j] = p[:i] + chr(rnd.choice(_JUNK)) + p[i:] if rnd.random() < 0.5 else p[:i] + p[i + 1:]
    elif r < 0.85:
        return line.replace("2024-04-06", "2024-4-06")
    elif r < 0.9:
        return line + "  "
    elif r < 0.95:
        return line.replace("iteration", "iteration\t", 1)
    else:
        return line.replace(" [", "  [", 1)
    return "|".join(pieces)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 60), st.floats(0, 1))
def test_property_template_columns_equal_the_regex(seed, n, p_bad):
    lay, head = _layout()
    rnd = random.Random(seed)
    lines = [_perturb(rnd, head, i + 1) if rnd.random() < p_bad or i == 0 and rnd.random() < 0.2
             else _clean(head, i + 1) for i in range(n)]
    text = ("\n" + "\n".join(lines)).encode()
    got = fastpath.template_columns(lay, text, n)
    if got is None:
        return
    if len(text) == n * text.find(b"\n", 1):  # lines of one length: where the gather path (variable widths) takes
        gathered = _without_fixed(lay, text, n)  # the run too, it agrees; it may decline a run the fixed-width
        if gathered is not None:  # paths take (a head byte changed in place), which then goes to the line loop
            for g, r in zip(gathered, got, strict=True):
                assert all(_same(a, b) for a, b in zip(g, r, strict=True))
    ref = _regex_columns(lay, text, n)
    assert ref is not None, "accepted a run the regex does not match"
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert all(_same(a, b) for a, b in zip(g, r, strict=True))


def _redigit(rnd: random.Random, line: str, it: int, p_junk: float) -> str:
    """The line with every digit right of the head replaced by a random digit (the same shape), exponent signs
    flipped at random, and with probability ``p_junk`` one byte replaced by a junk byte."""
    line = _clean(line, it)
    h = line.index("|")
    out = list(line)
    for i in range(h, len(out)):
        if out[i].isdigit():
            out[i] = str(rnd.randrange(10))
        elif out[i] in "+-" and out[i - 1] in "eE" and rnd.random() < 0.3:
            out[i] = "+" if out[i] == "-" else "-"
    if rnd.random() < p_junk:
        i = rnd.randrange(len(out))
        out[i] = chr(rnd.choice(_JUNK + b",|:"))
    return "".join(out)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 80), st.floats(0, 0.2))
def test_property_shape_columns_equal_the_regex(seed, n, p_junk):
    """Runs of one shape (random digits in the template's places, random exponent signs, exponents past the exact
    range, now and then a junk byte, the iteration gaining a digit): the shape path's columns equal the regex's
    captures converted one by one and the fixed-columns path's (when that takes the run: the shape path may also take
    a run split where a line is of another shape, which the fixed path does not); a run with no junk is taken by the
    shape path."""
    lay, head = _layout()
    rnd = random.Random(seed)
    it0 = rnd.choice([1000, 1000 - rnd.randint(1, n)])  # (below 1000: the iteration gains a digit in the run)
    lines = [_clean(head, it0 + i) if i == 0 else _redigit(rnd, head, it0 + i, p_junk) for i in range(n)]
    text = ("\n" + "\n".join(lines)).encode()
    line0 = lines[0].encode()
    m = lay.rx_bulk.match(text)
    shaped = fastpath._shape_columns(lay, text, n, line0, m) if len(text) == n * len(line0) + n else None
    ref = _regex_columns(lay, text, n)
    if shaped is None:
        assert p_junk > 0 or len(text) != n * len(line0) + n
        return
    assert ref is not None, "accepted a run the regex does not match"
    fixed = _without_shape(lay, text, n)  # None when only a split run is of one shape per part
    for cols in (ref, fixed) if fixed is not None else (ref,):
        assert len(shaped) == len(cols)
        for g, r in zip(shaped, cols, strict=True):
            assert all(_same(a, b) for a, b in zip(g, r, strict=True))
    assert all(_same(a, b) for g, r in zip(fastpath.template_columns(lay, text, n), ref, strict=True)
               for a, b in zip(g, r, strict=True))


def test_template_columns_take_clean_runs():
    lay, head = _layout()
    lines = [_clean(head, i + 1) for i in range(100)]
    text = ("\n" + "\n".join(lines)).encode()
    got = fastpath.template_columns(lay, text, 100)
    assert got is not None
    ref = _regex_columns(lay, text, 100)
    for g, r in zip(got, ref, strict=True):
        assert all(_same(a, b) for a, b in zip(g, r, strict=True))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FORMATS), st.integers(0, 2**32), st.integers(1, 200), st.booleans())
def test_property_fixed_rows(f, seed, n, signed):
    """parse_fixed (values at one column range of equal-length rows, strided views) == num of each value's text."""
    rnd = random.Random(seed)
    vals = [_value(rnd, f) for _ in range(n)]
    width = max(len(v) for v in vals)
    if rnd.random() < 0.5:  # all values of one length (blanks in front), as a fixed-width column
        vals = [v.rjust(width) for v in vals]
    else:
        vals = [v[:1] * 0 + v for v in vals if len(v) == len(vals[0])] or vals[:1]
        width = len(vals[0])
    prefix = b"x" * rnd.randint(0, 30)
    rows = [prefix + b" k:" + v + b"|" for v in vals]
    buf = b"\n" + b"\n".join(rows)
    lo = len(prefix) + 3
    template = b" " + f.format(7 if "d" in f else 2.25).encode() + b" "
    fmt = bulknum.NumberFormat(template, signed=signed)
    got = bulknum.parse_fixed(buf, 1, len(rows[0]) + 1, len(rows), lo, lo + width, fmt)
    for v, g in zip(vals, got, strict=True):
        assert _same(g, num(v)), (template, v, g, num(v))
