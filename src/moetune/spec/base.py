"""Base class of the frozen spec models: pydantic models whose hash is computed once.

The perf models memoise per-model and per-layout quantities in :mod:`moetune.memo` tables keyed on these objects;
pydantic's default frozen hash re-hashes every field on every lookup (ModelArch has ~70 fields), which dominated
the planner's inner loop. The cached value lives in the instance ``__dict__`` under a non-field key, which
pydantic's equality and serialisation ignore.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

_HASH_KEY = "_moetune_hash"


class FrozenSpec(BaseModel):
    """Immutable, extra-forbidding pydantic model with a cached hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __hash__(self) -> int:
        try:
            return self.__dict__[_HASH_KEY]  # the hit path: one subscript (the planner hashes specs ~1M times)
        except KeyError:
            d = self.__dict__
            h = d[_HASH_KEY] = hash((type(self), tuple(d[f] if not isinstance(d[f], list | dict | set) else repr(d[f])
                                                       for f in type(self).model_fields)))
            return h

    def __getstate__(self) -> dict:
        """Pickle state without the cached values: a hash is only valid in the process that computed it (string
        hashing is salted per process), so an object sent to a worker process must hash afresh there."""
        state = super().__getstate__()
        fields = type(self).model_fields
        state["__dict__"] = {k: v for k, v in state["__dict__"].items() if k in fields}
        return state

    def model_copy(self, *, update=None, deep: bool = False):  # type: ignore[override]
        """Copy that drops derived values cached on the instance (the hash, ``cached_property`` results), which
        pydantic's copy would otherwise carry over from the original."""
        c = super().model_copy(update=update, deep=deep)
        fields = type(self).model_fields
        for key in [k for k in c.__dict__ if k not in fields]:
            del c.__dict__[key]
        return c
