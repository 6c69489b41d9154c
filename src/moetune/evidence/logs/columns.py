"""Compact, lossless storage of per-iteration samples: float64 columns packed in chunks of 8192 values.

A training log prints each number with a fixed format (``%.1f`` ms, ``%.6E`` loss, ``%5d`` batch size …), so a
column of parsed float64 values is mostly small integers, constants, arithmetic progressions or short decimals.
Each full chunk is stored with the first of these encodings that reproduces every value *bit for bit* (checked on
the whole chunk when it is sealed, so decoding never changes a value):

* ``c`` constant (one value; all-NaN included),
* ``a`` arithmetic progression of integers (iteration numbers, consumed samples at a fixed batch size),
* ``i`` integers as offsets from the chunk minimum in the smallest unsigned type (line numbers: 2 bytes),
* ``d`` decimals ``(lo + offset) / 10**k [* 1e-3]`` with the offsets in the smallest unsigned type (``%.6E`` losses,
  ``%.1f`` ms times scaled to seconds); the few values the decimal does not reproduce are kept as exceptions,
* ``r`` raw float64 (anything else),

with NaNs (fields not printed on some lines) kept apart as a bit mask. This is frame-of-reference / patched
encoding as used by columnar formats (Zukowski et al., "Super-Scalar RAM-CPU Cache Compression", ICDE 2006).
The decimal decode ``m / 10**k`` is a single correctly rounded IEEE division of exact operands (``m < 2**53``,
``k <= 15``), i.e. the same double ``float()`` gives for the printed decimal (Clinger, "How to read floating point
numbers accurately", PLDI 1990); the encoder verifies it rather than relying on it.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

#: values per sealed chunk
CHUNK = 8192
_POW10 = 10.0 ** np.arange(0, 16)
_ARANGE = np.arange(CHUNK, dtype=np.float64)
#: unit scales tried by the decimal encoding (the reader stores ms times as seconds: value_ms * 1e-3)
_MULS = (1.0, 1e-3)
_MAX_EXACT = 2.0**53
#: at most this fraction of a chunk may be exceptions of the decimal encoding
_MAX_EXCEPTIONS = 1 / 16


def _uint_for(span: float) -> Any:
    if span < 256:
        return np.uint8
    if span < 65536:
        return np.uint16
    if span < 2.0**32:
        return np.uint32
    return None


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.view(np.uint64) == b.view(np.uint64)


def _decimal_guess(f: np.ndarray) -> list[tuple[int, float]]:
    """(k, mul) candidates, best first, from a sample of at most 64 values of a finite float column."""
    sample = f[:: max(1, len(f) // 64)][:64]
    out = []
    with np.errstate(all="ignore"):
        for mul in _MULS:
            q = (sample / mul)[:, None] * _POW10[None, :] if mul != 1.0 else sample[:, None] * _POW10[None, :]
            dec = np.rint(q) / _POW10[None, :]
            if mul != 1.0:
                dec = dec * mul
            frac = (dec == sample[:, None]).mean(axis=0)
            good = np.flatnonzero(frac >= 0.9)
            if good.size:
                out.append((int(good[0]), mul))
    out.sort()
    return out


def _encode_finite(f: np.ndarray) -> tuple:
    n = len(f)
    if not np.isfinite(f).all():
        return ("r", n, f.copy())
    with np.errstate(all="ignore"):
        r = np.rint(f)
        if (r == f).all() and np.abs(f).max() < _MAX_EXACT:
            lo = float(f.min())
            if n > 1:
                step = float(f[1] - f[0])
                dec = f[0] + step * np.arange(n, dtype=np.float64)
                if _same_bits(dec, f).all():
                    return ("a", n, float(f[0]), step)
            dt = _uint_for(float(f.max()) - lo)
            if dt is not None:
                d = (f - lo).astype(dt)
                if _same_bits(lo + d.astype(np.float64), f).all():
                    return ("i", n, lo, d)
        for k, mul in _decimal_guess(f):
            s = _POW10[k]
            m = np.rint(f / mul * s) if mul != 1.0 else np.rint(f * s)
            if not np.abs(m).max() < _MAX_EXACT:
                continue
            lo = float(m.min())
            dt = _uint_for(float(m.max()) - lo)
            if dt is None:
                continue
            d = (m - lo).astype(dt)
            dec = (lo + d.astype(np.float64)) / s
            if mul != 1.0:
                dec = dec * mul
            bad = np.flatnonzero(~_same_bits(dec, f))
            if len(bad) <= n * _MAX_EXCEPTIONS:
                pos = bad.astype(np.uint16 if n <= 65536 else np.int64)
                return ("d", n, lo, k, mul, d, pos, f[bad].copy())
    return ("r", n, f.copy())


def encode(a: np.ndarray) -> tuple:
    """Encode one float64 chunk (see module docstring); ``decode(encode(a))`` equals ``a`` bit for bit (NaN
    payloads aside)."""
    n = len(a)
    if n == 0:
        return ("c", 0, float("nan"))
    bits = a.view(np.uint64)
    if (bits == bits[0]).all():
        return ("c", n, float(a[0]))
    nan = np.isnan(a)
    if nan.any():
        if nan.all():
            return ("c", n, float("nan"))
        return ("n", n, np.packbits(nan), _encode_finite(a[~nan]))
    return _encode_finite(a)


def decode_into(t: tuple, out: np.ndarray) -> None:
    """``out[:] = decode(t)`` without the temporaries (the same operations in the same order, so the same bits)."""
    kind = t[0]
    if kind == "c":
        out[:] = t[2]
    elif kind == "a":
        np.multiply(_ARANGE[:t[1]], t[3], out=out)
        out += t[2]
    elif kind == "i":
        out[:] = t[3]
        out += t[2]
    elif kind == "d":
        _, _, lo, k, mul, d, pos, val = t
        out[:] = d
        out += lo
        out /= _POW10[k]
        if mul != 1.0:
            out *= mul
        out[pos.astype(np.int64)] = val
    elif kind == "r":
        out[:] = t[2]
    else:
        out[:] = decode(t)


def decode(t: tuple) -> np.ndarray:
    kind, n = t[0], t[1]
    if kind == "c":
        return np.full(n, t[2])
    if kind == "a":
        return t[2] + t[3] * np.arange(n, dtype=np.float64)
    if kind == "i":
        return t[2] + t[3].astype(np.float64)
    if kind == "d":
        _, _, lo, k, mul, d, pos, val = t
        out = (lo + d.astype(np.float64)) / _POW10[k]
        if mul != 1.0:
            out *= mul
        out[pos.astype(np.int64)] = val
        return out
    if kind == "n":
        mask = np.unpackbits(t[2], count=n).astype(bool)
        out = np.full(n, np.nan)
        out[~mask] = decode(t[3])
        return out
    return t[2].copy()


def encoded_nbytes(t: tuple) -> int:
    """Bytes held by one encoded chunk (arrays plus a fixed 64 B for the tuple and its scalars)."""
    return 64 + sum(x.nbytes if isinstance(x, np.ndarray) else encoded_nbytes(x) for x in t
                    if isinstance(x, (np.ndarray, tuple)))


class PackedColumn:
    """An append-only float64 column: sealed chunks of :data:`CHUNK` encoded values plus an ``array('d')`` tail."""

    __slots__ = ("_chunks", "_sealed", "_tail")

    def __init__(self) -> None:
        self._chunks: list[tuple] = []
        self._sealed = 0
        self._tail = array("d")

    def __len__(self) -> int:
        return self._sealed + len(self._tail)

    def append(self, x: float) -> None:
        self._tail.append(x)
        if len(self._tail) == CHUNK:
            self._seal()

    def extend(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=np.float64)
        room = CHUNK - len(self._tail)
        if len(values) < room:
            self._tail.frombytes(values.tobytes())
            return
        self._tail.frombytes(values[:room].tobytes())
        self._seal()
        k = room
        while len(values) - k >= CHUNK:  # whole chunks are encoded straight from the input
            self._chunks.append(encode(values[k:k + CHUNK].copy()))
            self._sealed += CHUNK
            k += CHUNK
        self._tail.frombytes(values[k:].tobytes())

    def pad(self, n: int) -> None:
        """NaN up to length ``n``."""
        if len(self) < n:
            self.extend(np.full(n - len(self), np.nan))

    def _seal(self) -> None:
        """Encode the tail (exactly CHUNK values) as one chunk."""
        self._chunks.append(encode(np.frombuffer(self._tail, dtype=np.float64).copy()))
        self._sealed += len(self._tail)
        self._tail = array("d")

    def values(self) -> np.ndarray:
        """All values as one float64 array (a new array)."""
        out = np.empty(len(self))
        for j, t in enumerate(self._chunks):
            decode_into(t, out[j * CHUNK:(j + 1) * CHUNK])
        if self._tail:
            out[self._sealed:] = np.frombuffer(self._tail, dtype=np.float64)
        return out

    def constant(self) -> float | None:
        """The one value every element holds (same bits) when the column is all one value (every sealed chunk a
        ``c`` chunk of it, the tail too), else None; empty -> None. Reads the chunk headers only."""
        if not len(self):
            return None
        first = self._chunks[0] if self._chunks else None
        if first is not None:
            if first[0] != "c":
                return None
            value = first[2]
        else:
            value = self._tail[0]
        bits = np.float64(value).view(np.uint64)
        for t in self._chunks:
            if t[0] != "c" or np.float64(t[2]).view(np.uint64) != bits:
                return None
        if self._tail and not (np.frombuffer(self._tail, dtype=np.uint64) == bits).all():
            return None
        return value

    def assign(self, values: np.ndarray) -> None:
        """Replace all values."""
        self._chunks, self._sealed, self._tail = [], 0, array("d")
        self.extend(values)

    def get(self, i: int) -> float:
        if i < 0:
            i += len(self)
        if i >= self._sealed:
            return self._tail[i - self._sealed]
        return float(decode(self._chunks[i // CHUNK])[i % CHUNK])

    def set(self, i: int, x: float) -> None:
        if i < 0:
            i += len(self)
        if i >= self._sealed:
            self._tail[i - self._sealed] = x
            return
        c = decode(self._chunks[i // CHUNK])
        c[i % CHUNK] = x
        self._chunks[i // CHUNK] = encode(c)

    @property
    def nbytes(self) -> int:
        return sum(encoded_nbytes(t) for t in self._chunks) + len(self._tail) * 8
