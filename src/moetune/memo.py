"""The one memo mechanism of moetune: bounded LRU tables, keyed on a function's (hashable) arguments.

Every cache in the package is a function decorated with :func:`memo`; there are no module-level cache dicts. A memo
table is keyed on the *arguments* of its function, so the key is derived from what the function can read: when a
function needs only part of a spec object (a few ``Features`` fields, the batch shape of a ``Job``), it takes that
part as an argument (a frozen projection such as :class:`moetune.perfmodel.step.LayerInputs`) instead of the whole
object, and so cannot read a field that its key lacks. Keys are values, never ``id()``: the frozen spec models
(:class:`moetune.spec.base.FrozenSpec`) hash once and compare by value; a few work objects of the step model compare
by identity (``eq=False`` dataclasses), which is safe because a table holds a reference to every key it stores.

Tables are ``functools.lru_cache`` objects (C implementation: the planner does millions of lookups), bounded by
``maxsize``, least recently used entry evicted first. Values are shared between callers and must be treated as read
only. :func:`clear` empties every table (the one call tests make for a cold evaluation); :func:`stats` /
:func:`report` give hits, misses and sizes per table for debugging (run a plan, then ``print(moetune.memo.report())``).

Worker processes of the planner are forked: they start with a copy of the parent's tables.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: qualified function name -> its lru_cache wrapper (the registry :func:`clear` and :func:`stats` walk)
_TABLES: dict[str, Any] = {}


class TableStats(NamedTuple):
    """Counters of one memo table (``functools`` ``CacheInfo`` fields)."""

    hits: int
    misses: int
    maxsize: int
    size: int


def memo(maxsize: int) -> Callable[[F], F]:
    """Decorator: memoise a pure function in a bounded LRU table keyed on its arguments (all must be hashable).

    ``maxsize`` bounds the table (least recently used entries are dropped first). The wrapped function keeps
    ``cache_clear`` / ``cache_info``; prefer :func:`clear` and :func:`stats`, which cover every table.
    """
    if not isinstance(maxsize, int) or maxsize <= 0:
        raise ValueError(f"memo(maxsize={maxsize!r}): expected a positive int (every memo table is bounded)")

    def deco(fn: F) -> F:
        table = functools.lru_cache(maxsize=maxsize)(fn)
        _TABLES[f"{fn.__module__}.{fn.__qualname__}"] = table  # a redefinition (module reload) replaces its table
        return table  # type: ignore[return-value]

    return deco


def clear() -> None:
    """Empty every memo table (a cold evaluation follows; needed after monkeypatching a catalog in tests)."""
    for table in _TABLES.values():
        table.cache_clear()


def stats() -> dict[str, TableStats]:
    """Per table (qualified function name): hits, misses, bound and current size."""
    out = {}
    for name, table in _TABLES.items():
        info = table.cache_info()
        out[name] = TableStats(info.hits, info.misses, info.maxsize, info.currsize)
    return out


def report() -> str:
    """:func:`stats` as a text table, busiest first (debugging aid)."""
    rows = sorted(stats().items(), key=lambda kv: -(kv[1].hits + kv[1].misses))
    lines = [f"{'table':<64} {'hits':>10} {'misses':>9} {'size':>8} {'bound':>8}"]
    lines += [f"{n:<64} {s.hits:>10} {s.misses:>9} {s.size:>8} {s.maxsize:>8}" for n, s in rows]
    return "\n".join(lines)


@memo(maxsize=65536)
def canonical(value: Any) -> Any:
    """One shared instance per distinct (hashable) value while it stays in the table: later keys built from it
    compare by identity first, which is what makes lookups keyed on large tuples cheap."""
    return value


class FrozenMap(dict):
    """A read-only, hashable dict (hash computed once): a mapping argument of a memoised function, such as the
    kernel counts of the efficiency constants. Mutating methods raise TypeError."""

    __slots__ = ("_hash",)

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash
        except AttributeError:
            self._hash = hash(tuple(sorted(self.items())))
            return self._hash

    def _readonly(self, *args, **kwargs):
        raise TypeError("FrozenMap is read only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]

    def __ior__(self, other):  # type: ignore[override]
        raise TypeError("FrozenMap is read only")

    def __reduce__(self):
        return (FrozenMap, (dict(self),))


class HashedTuple(tuple):
    """A tuple whose hash is computed once (tuples re-hash every element on every lookup): a nested-tuple key of
    memoised functions, such as the per-chunk layer signatures of the memory model. Equal to, and hashing like, the
    plain tuple of the same elements."""

    def __hash__(self) -> int:
        d = self.__dict__
        h = d.get("_hash")
        if h is None:
            h = d["_hash"] = tuple.__hash__(self)
        return h

    def __reduce__(self):
        return (HashedTuple, (tuple(self),))


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration of a search (forked shares inherit the pause), and
    of the ``plan`` command's start-up imports (:mod:`moetune.commands.plan`).

    A search allocates millions of short-lived tuples and frozen specs that reference counting frees; none form
    reference cycles, but every allocation burst triggers generation-0 collections and, as the memo tables grow,
    full collections that rescan every long-lived object: about a fifth of the CPU time of a plan
    (``moetune plan``: 7.1 s -> 5.7 s CPU, same peak RSS). Importing the planner (numpy, the step and memory models,
    the rules registry) builds long-lived module objects the same way: ~0.04 s of collections that find nothing.
    Reference counting still frees everything; the collector is restored (and runs as usual afterwards) even if the
    body raises. Nested pauses keep the outer one's setting (only the outermost re-enables).

    Before it is re-enabled, the objects that outlive the search (the memo tables' keys and values, the result) are
    moved to the collector's permanent generation (``gc.freeze``): otherwise the first allocation afterwards runs a
    collection that scans all of them (they never left generation 0), ~0.3 s after a large plan. They are still freed
    by reference counting when a table evicts them; only a reference cycle among them would outlive its use.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()
