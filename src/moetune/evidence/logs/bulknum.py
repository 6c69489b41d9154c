"""Columnar parsing of runs of iteration lines on the raw bytes with numpy: no regex match and no Python object per line.

A run (:meth:`.fastpath.Layout.run_columns`) is ``n`` lines, each after a ``\\n``. Megatron prints every field of an
iteration line with a fixed format string, so all lines of a run share one *template* (the run's first line, which
must match the layout's regex): the same keys, the same head shape and, per field, the same number format. A line
is accepted here only if it is of that template, checked exactly on its bytes:

* it holds exactly as many ``|`` as the template, the last one its last byte;
* each key (with its ``:``) sits right after the ``|`` before it (compared as fixed-length byte strings);
* its head (the text before the first ``|``) has the template's length, equals the template byte for byte except
  that the timestamp's digits may be any digits, and its iteration / total fields are right-aligned unsigned
  integers (blanks then digits; the iteration after at least one blank, as the regex's ``[ \\t]+``).

Such a line is matched by the layout's regex with the same captured values, so accepting fewer lines than the regex
only sends runs back to it (:mod:`.fastpath`), never changes a result.

Numbers (:func:`parse_numbers`): per field, the template's value fixes the format (``%d``, ``%.Nf``, ``%E`` …: trailing
blanks, exponent part, fraction digits); a value of that shape (blanks, an optional ``-``, 1+ integer digits, the
template's fraction and exponent, the template's trailing blanks) with at most 15 significant digits and a decimal
exponent within ±22 is converted as ``m * 10**p`` / ``m / 10**-p``: one IEEE operation on exact operands, hence the
correctly rounded value ``float()`` gives (Clinger, "How to read floating point numbers accurately", PLDI 1990, the
fast path; Python's ``float`` is correctly rounded, D. Gay's dtoa.c). Any other value is converted by
:func:`.values.num` (``float``, NaN when it is not a number), as the regex path does.
"""

from __future__ import annotations

import re

import numpy as np

from moetune.evidence.logs.values import num

#: exact powers of ten (10**22 is the largest one a float64 holds exactly)
_P10 = 10.0 ** np.arange(23)
#: significant digits that always make an integer below 2**53
_MAX_DIGITS = 15
_CORE = re.compile(rb"(-?)(\d+)(?:(\.)(\d*))?(?:([eE])([+-]?)(\d+))?")


def windows(buf: bytes, width: int) -> np.ndarray:
    """``(len(buf) - width + 1, width)`` uint8 view: row ``i`` is ``buf[i:i + width]`` (no copy)."""
    return np.ndarray((len(buf) - width + 1, width), dtype=np.uint8, buffer=buf, strides=(1, 1))


class NumberFormat:
    """The shape of one field's values, from the template's value (the bytes between ``:`` and ``|``)."""

    __slots__ = ("trail", "exp", "exp_sign", "exp_digits", "dot", "frac", "tail", "width", "signed")

    def __init__(self, value: bytes, *, signed: bool = True) -> None:
        core = value.strip(b" ")
        m = _CORE.fullmatch(core)
        if m is None or value.lstrip(b" ") != core + value[len(value.rstrip(b" ")):]:
            raise ValueError(value)
        self.trail = len(value) - len(value.rstrip(b" "))
        self.exp = m.group(5)  # b"E" / b"e" / None
        self.exp_sign = bool(m.group(6))
        self.exp_digits = len(m.group(7) or b"")
        self.dot = m.group(3) is not None
        self.frac = len(m.group(4) or b"")
        #: bytes right of the integer digits: fraction, exponent, trailing blanks
        self.tail = self.trail + self.frac + self.dot + (
            (1 + self.exp_sign + self.exp_digits) if self.exp else 0)
        self.width = max(16, -(-(len(value) + 8) // 8) * 8)
        self.signed = signed


def _digits(cols: np.ndarray) -> np.ndarray:
    """Bool: every byte of each row is an ASCII digit (``cols``: (n, k) uint8)."""
    return ((cols - 48) < 10).all(axis=1)


def _value(cols: np.ndarray) -> np.ndarray:
    """The decimal integer the digit bytes of each row spell (exact below 2**53)."""
    k = cols.shape[1]
    if not k:
        return np.zeros(len(cols))
    return (cols - 48).astype(np.float64) @ _weights(k)


def _weights(k: int) -> np.ndarray:
    """Place values of ``k`` digit columns, the last one the units (capped at 10**22: rows with more than 15 digits
    are rejected, so capped places never weigh a digit of an accepted row)."""
    return _P10[np.minimum(np.arange(k - 1, -1, -1), 22)]


def parse_numbers(buf: bytes, st: np.ndarray, en: np.ndarray, fmt: NumberFormat) -> np.ndarray:
    """``num(buf[st[i]:en[i]])`` for every i (see module docstring), float64."""
    out, ok = parse_shaped(buf, st, en, fmt)
    for i in np.flatnonzero(~ok).tolist():
        out[i] = num(buf[st[i]:en[i]])
    return out


def parse_shaped(buf: bytes, st: np.ndarray, en: np.ndarray, fmt: NumberFormat) -> tuple[np.ndarray, np.ndarray]:
    """The values ``buf[st[i]:en[i]]`` of the shape ``fmt`` describes, converted exactly (see module docstring), and
    a bool mask of the rows that have that shape (the others' values are undefined)."""
    got = parse_swar(buf, st, en, fmt)
    if got is not None:
        return got
    n = len(st)
    w = fmt.width
    ln = en - st
    out = np.empty(n)
    bad = (ln > w) | (en < w) | (ln < fmt.tail + 1)
    if bad.all():
        return out, ~bad
    M = windows(buf, w)[np.where(bad, w, en) - w]  # right-aligned at en; bad rows read a dummy window
    ok = ~bad
    pos = w  # columns from the right, fixed by the format
    if fmt.trail:
        ok &= (M[:, w - fmt.trail:] == 32).all(axis=1)
        pos -= fmt.trail
    e = np.zeros(n)
    if fmt.exp:
        ed = M[:, pos - fmt.exp_digits:pos]
        ok &= _digits(ed)
        e = _value(ed)
        pos -= fmt.exp_digits
        if fmt.exp_sign:
            s = M[:, pos - 1]
            ok &= (s == 43) | (s == 45)
            e = np.where(s == 45, -e, e)
            pos -= 1
        ok &= M[:, pos - 1] == fmt.exp[0]
        pos -= 1
    fd = M[:, pos - fmt.frac:pos]
    ok &= _digits(fd)
    f = _value(fd)
    pos -= fmt.frac
    if fmt.dot:
        ok &= M[:, pos - 1] == 46
        pos -= 1
    ip = M[:, :pos]  # integer digits, right-aligned, then an optional "-", then blanks to the value's start
    nd_mask = (ip - 48) >= 10
    # rightmost non-digit column of the integer part (-1: none)
    r = pos - 1 - np.argmax(nd_mask[:, ::-1], axis=1)
    r[~nd_mask.any(axis=1)] = -1
    start = w - ln  # first column of the value
    r = np.minimum(np.maximum(r, start - 1), pos - 1)  # (the bound pos - 1 only touches rows marked bad)
    nd = pos - 1 - r
    lead = np.where(r >= start, ip[np.arange(n), np.maximum(r, 0)], 32)
    neg = lead == 45
    ok &= (nd >= 1) & (nd + fmt.frac <= _MAX_DIGITS) & ((lead == 32) | (neg & fmt.signed))
    col = np.arange(pos)
    # blanks only left of the sign / digits, within the value (columns before its start are not the value's)
    left = (col < r[:, None]) & (col >= start[:, None])
    ok &= ~((ip != 32) & left).any(axis=1)
    ipv = np.where(col > r[:, None], ip - 48, 0).astype(np.float64) @ _weights(pos)
    m = ipv * _P10[fmt.frac] + f
    p = e - fmt.frac
    ok &= np.abs(p) <= 22
    pi = np.clip(p, -22, 22).astype(np.int64)
    v = np.where(pi >= 0, m * _P10[np.maximum(pi, 0)], m / _P10[np.maximum(-pi, 0)])
    out[:] = np.where(neg, -v, v)
    return out, ok


# ------------------------------------------------------------------ SWAR: eight bytes per uint64 at a time
_ONES = np.uint64(0x0101010101010101)
_HI = np.uint64(0x8080808080808080)
_LO7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_ZEROS = np.uint64(0x3030303030303030)
_BLANKS = np.uint64(0x2020202020202020)
_MINUS = np.uint64(0x2D2D2D2D2D2D2D2D)
#: _LOW[j]: the low j bytes of a word
_LOW = np.array([(1 << (8 * j)) - 1 for j in range(9)], dtype=np.uint64)


def words(buf: bytes) -> np.ndarray:
    """``(len(buf) - 7,)`` little-endian uint64 view: element ``i`` is ``buf[i:i + 8]`` (no copy)."""
    return np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _eight_digits(v: np.ndarray) -> np.ndarray:
    """The number 8 digit values (0..9, one per byte, the first byte the most significant) spell: the usual SWAR
    reduction (pairs, quadruples, octets; D. Lemire, "Fast numerical parsing", 2018, after Mula)."""
    v = ((v & np.uint64(0x0F0F0F0F0F0F0F0F)) * np.uint64(2561)) >> np.uint64(8)
    v = ((v & np.uint64(0x00FF00FF00FF00FF)) * np.uint64(6553601)) >> np.uint64(16)
    return ((v & np.uint64(0x0000FFFF0000FFFF)) * np.uint64(42949672960001)) >> np.uint64(32)


def _int_word(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """One word of a right-aligned integer field (bytes outside the value already blanks): whether it reads
    blanks, an optional ``-``, digits (the digits last); its digits' value, their count, the ``-``, all digits."""
    y = x ^ _ZEROS
    f = (((y & _LO7) + np.uint64(0x7676767676767676)) | y) & _HI  # 0x80 in each byte that is not a digit
    fm = (f >> np.uint64(7)) * np.uint64(0xFF)
    tidy = (fm & (fm + np.uint64(1))) == 0  # the non-digits are the first bytes
    tb = fm ^ (fm >> np.uint64(8))  # the last non-digit byte
    z = x ^ _BLANKS
    blank = ~(((z & _LO7) + _LO7) | z) & _HI
    g = f & ~blank
    neg = (tb != 0) & ((x & tb) == (_MINUS & tb))
    ok = tidy & ((g == 0) | (neg & (g == (tb & _HI))))
    nd = (((~f & _HI) >> np.uint64(7)) * _ONES) >> np.uint64(56)
    return ok, _eight_digits(y & ~fm), nd, neg, f == 0


class _Gathered:
    """Bytes / words at ``pos + d`` for an array of positions (fancy indexing)."""

    __slots__ = ("a", "wv", "pos")

    def __init__(self, buf: bytes, pos: np.ndarray) -> None:
        self.a, self.wv, self.pos = np.frombuffer(buf, dtype=np.uint8), words(buf), pos

    def byte(self, d: int) -> np.ndarray:
        return self.a[self.pos + d]

    def word(self, d: int) -> np.ndarray:
        return self.wv[self.pos + d]


class _Strided:
    """Bytes / words at ``first + i * stride + d`` (rows of equal length: strided views, no copy)."""

    __slots__ = ("buf", "first", "stride", "n")

    def __init__(self, buf: bytes, first: int, stride: int, n: int) -> None:
        self.buf, self.first, self.stride, self.n = buf, first, stride, n

    def byte(self, d: int) -> np.ndarray:
        return np.ndarray((self.n,), dtype=np.uint8, buffer=self.buf, offset=self.first + d, strides=(self.stride,))

    def word(self, d: int) -> np.ndarray:
        return np.ndarray((self.n,), dtype="<u8", buffer=self.buf, offset=self.first + d, strides=(self.stride,))


def parse_swar(buf: bytes, st: np.ndarray, en: np.ndarray, fmt: NumberFormat) -> tuple[np.ndarray, np.ndarray] | None:
    """As :func:`parse_shaped`, on uint64 words (an integer part of at most 16 bytes, at most 8 fraction digits);
    None when the format needs more (then :func:`parse_shaped` applies)."""
    if fmt.frac > 8 or fmt.exp_digits > 3 or (en - 16 - fmt.tail < 0).any():
        return None
    return _swar(_Gathered(buf, en), en - st, len(st), fmt)


def shaped_fixed(buf: bytes, first: int, stride: int, n: int, lo: int, hi: int, fmt: NumberFormat) \
        -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`parse_shaped` of the values at ``[lo, hi)`` of ``n`` rows of ``stride`` bytes from ``first`` (lines of
    one length), on strided views; None when the format needs the general parser."""
    if fmt.frac > 8 or fmt.exp_digits > 3 or first + hi - 16 - fmt.tail < 0:
        return None
    got = _swar(_Strided(buf, first + hi, stride, n), hi - lo, n, fmt)
    if got is not None and not isinstance(got[1], np.ndarray):
        return got[0], np.full(n, bool(got[1]))
    return got


def parse_fixed(buf: bytes, first: int, stride: int, n: int, lo: int, hi: int, fmt: NumberFormat) -> np.ndarray:
    """``num`` of the values at ``[lo, hi)`` of ``n`` rows of ``stride`` bytes from ``first`` (lines of one length)."""
    got = shaped_fixed(buf, first, stride, n, lo, hi, fmt)
    if got is None:
        starts = first + stride * np.arange(n, dtype=np.int64)
        return parse_numbers(buf, starts + lo, starts + hi, fmt)
    out, ok = got
    for i in np.flatnonzero(~ok).tolist():
        p = first + i * stride
        out[i] = num(buf[p + lo:p + hi])
    return out


def _swar(at: _Gathered | _Strided, ln: np.ndarray | int, n: int, fmt: NumberFormat) \
        -> tuple[np.ndarray, np.ndarray] | None:
    """The SWAR conversion; ``at`` gives the bytes / words relative to each value's end, ``ln`` the values'
    lengths (one int when all are equal)."""
    cur = -fmt.trail
    ok = np.asarray(ln - fmt.trail >= fmt.tail - fmt.trail + 1)
    if not ok.any():
        return None
    ok = np.broadcast_to(ok, (n,)).copy()
    for i in range(fmt.trail):
        ok &= at.byte(-1 - i) == 32
    e = 0
    if fmt.exp:
        e = np.zeros(n, dtype=np.int64)
        for i in range(fmt.exp_digits):
            d = at.byte(cur - fmt.exp_digits + i).astype(np.int64) - 48
            ok &= (d >= 0) & (d < 10)
            e = e * 10 + d
        cur -= fmt.exp_digits
        if fmt.exp_sign:
            s = at.byte(cur - 1)
            ok &= (s == 43) | (s == 45)
            e = np.where(s == 45, -e, e)
            cur -= 1
        ok &= at.byte(cur - 1) == fmt.exp[0]
        cur -= 1
    frac = 0.0
    if fmt.frac:
        y = at.word(cur - 8) ^ _ZEROS
        top = ~_LOW[8 - fmt.frac]
        f = (((y & _LO7) + np.uint64(0x7676767676767676)) | y) & _HI & top
        ok &= f == 0
        frac = _eight_digits(y & top).astype(np.float64)
        cur -= fmt.frac
    if fmt.dot:
        ok &= at.byte(cur - 1) == 46
        cur -= 1
    li = ln + cur  # bytes of the integer part, blanks and sign included (cur <= 0)
    ok &= (li >= 1) & (li <= 16)
    li = min(max(li, 0), 16) if isinstance(li, int) else np.clip(li, 0, 16)
    lo_out = _LOW[8 - np.minimum(li, 8)]
    x = at.word(cur - 8)
    ok_lo, v_lo, nd_lo, neg_lo, all_lo = _int_word((x & ~lo_out) | (_BLANKS & lo_out))
    if np.any(li > 8):
        hi_out = _LOW[8 - np.clip(li - 8, 0, 8)]
        x = at.word(cur - 16)
        xh = (x & ~hi_out) | (_BLANKS & hi_out)
        ok_hi, v_hi, nd_hi, neg_hi, _ = _int_word(xh)
        # digits only in the low word: the high word is blanks; else the low word is all digits, the high word tidy
        ok &= ok_lo & np.where(all_lo, ok_hi, xh == _BLANKS) & ((nd_lo + nd_hi) >= 1)
        neg = np.where(all_lo, neg_hi, neg_lo)
        nd = nd_lo + nd_hi
        m = v_hi.astype(np.float64) * 1e8 + v_lo.astype(np.float64)
    else:  # the integer part fits the low word
        ok &= ok_lo & (nd_lo >= 1)
        neg, nd, m = neg_lo, nd_lo, v_lo.astype(np.float64)
    ok &= (nd + fmt.frac) <= _MAX_DIGITS
    m = m * _P10[fmt.frac] + frac
    p = e - fmt.frac
    if fmt.exp:
        ok &= np.abs(p) <= 22
        pi = np.clip(p, -22, 22)
        v = np.where(pi >= 0, m * _P10[np.maximum(pi, 0)], m / _P10[np.maximum(-pi, 0)])
    else:
        v = m / _P10[fmt.frac] if fmt.frac else m
    if not fmt.signed:
        ok &= ~neg
    return np.where(neg, -v, v), ok


# ------------------------------------------------------------------ one shape: every value's digits at fixed columns
class Shape:
    """The digit layout of a template line (lines of one length): which columns may hold any digit, which must equal
    the template byte, and how the digits of each converted value combine (a row of ``weights`` per value).

    ``spans``: per converted value, its ``[lo, hi)`` columns (between ``key:`` and ``|``, or the iteration / total);
    ``free``: further column ranges whose template digits may be any digit (the timestamp's, unconverted values').
    Raises ValueError when a converted value is not ``[-]digits[.digits][(E|e)[+-]digits]`` with blanks around, has
    more than :data:`_MAX_DIGITS` mantissa digits or more than 3 exponent digits (then the general path applies).

    Conversion as in the module docstring (Clinger, PLDI 1990, the fast path): a value's digits times their exact
    place values sum to its mantissa exactly (every partial sum an integer below 2**53, in any order), then one IEEE
    division or multiplication by an exact power of ten (decimal exponent within ±22) gives the correctly rounded
    value ``float()`` gives; rows outside that range are marked for :func:`.values.num`.
    """

    __slots__ = ("lo", "hi", "digit_cols", "weights", "frac", "neg", "exp_fields", "plain")

    def __init__(self, tmpl: bytes, spans: list[tuple[int, int]], free: list[tuple[int, int]]) -> None:
        t = np.frombuffer(tmpl, dtype=np.uint8)
        isdig = (t - 48) < 10
        anyd = np.zeros(len(t), dtype=bool)
        for lo, hi in [*spans, *free]:
            anyd[lo:hi] = isdig[lo:hi]
        #: per column, the bytes a row may hold there are lo..hi: a digit where the template has one in a span, else
        #: the template byte
        self.lo = np.where(anyd, 48, t).astype(np.uint8)
        self.hi = np.where(anyd, 57, t).astype(np.uint8)
        cols: list[int] = []
        mant: list[tuple[int, list[int], int]] = []  # per value: (value index, its mantissa columns, frac digits)
        exps: list[tuple[int, list[int], int | None]] = []  # per E value: (value index, exponent columns, sign column)
        frac, neg = [], []
        for i, (lo, hi) in enumerate(spans):
            core = tmpl[lo:hi].strip(b" ")
            m = _CORE.fullmatch(core)
            if m is None or not core:
                raise ValueError(tmpl[lo:hi])
            c0 = lo + tmpl[lo:hi].index(core)
            ip = [c0 + m.start(2) + k for k in range(len(m.group(2)))]
            fp = [c0 + m.start(4) + k for k in range(len(m.group(4) or b""))] if m.group(3) else []
            if len(ip) + len(fp) > _MAX_DIGITS:
                raise ValueError(core)
            mant.append((i, ip + fp, len(fp)))
            frac.append(len(fp))
            neg.append(bool(m.group(1)))
            if m.group(5):
                ep = [c0 + m.start(7) + k for k in range(len(m.group(7)))]
                if len(ep) > 3:
                    raise ValueError(core)
                sign = c0 + m.start(6) if m.group(6) else None
                if sign is not None:  # "+" or "-" (43 or 45; 44 "," is checked out in columns())
                    self.lo[sign], self.hi[sign] = 43, 45
                exps.append((i, ep, sign))
        for _, c, _f in mant:
            cols.extend(c)
        for _, c, _s in exps:
            cols.extend(c)
        self.digit_cols = np.array(cols, dtype=np.intp)
        #: per converted value, then per exponent: its rows of the gathered digits and their place values
        self.weights: list[tuple[int, int, np.ndarray]] = []
        r = 0
        for _, c, _f in [*mant, *exps]:
            self.weights.append((r, r + len(c), _P10[np.arange(len(c) - 1, -1, -1)]))
            r += len(c)
        self.frac = np.array(frac)
        self.neg = np.array(neg)
        self.exp_fields = [(i, len(spans) + j, s) for j, (i, _, s) in enumerate(exps)]
        self.plain = np.array([i for i in range(len(spans)) if i not in {e[0] for e in self.exp_fields}],
                              dtype=np.intp)

    def columns(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The converted values of ``rows`` ((n, width) uint8, each a line), one column per span, and the rows whose
        values the fast path converts (the others: exponent out of range, see module docstring); None unless every
        row is of the shape (its template bytes, digits where the template's spans have digits)."""
        # a column's smallest and largest byte over the rows (no temporary the size of the rows)
        if (rows.min(axis=0) < self.lo).any() or (rows.max(axis=0) > self.hi).any():
            return None
        for _, _, sign in self.exp_fields:
            if sign is not None and (rows[:, sign] == 44).any():
                return None
        digits = np.ascontiguousarray((rows[:, self.digit_cols] - np.uint8(48)).T, dtype=np.float64)
        # each value's digits times their place values: integers below 2**53, exact in any summation order
        m = [w @ digits[lo:hi] for lo, hi, w in self.weights]
        k = len(self.frac)
        out = np.empty((k, len(rows))).T  # column-major: each value's column contiguous
        ok = np.ones(len(rows), dtype=bool)
        for i in self.plain.tolist():
            f = int(self.frac[i])
            out[:, i] = m[i] / _P10[f] if f else m[i]
        for i, ec, sign in self.exp_fields:
            e = m[ec]
            if sign is not None:
                e = np.where(rows[:, sign] == 45, -e, e)
            p = e - self.frac[i]
            ok &= np.abs(p) <= 22
            pi = np.clip(p, -22, 22).astype(np.int64)
            out[:, i] = np.where(pi >= 0, m[i] * _P10[np.maximum(pi, 0)], m[i] / _P10[np.maximum(-pi, 0)])
        if self.neg.any():
            out[:, self.neg] = -out[:, self.neg]
        return out, ok
