"""Base class of the frozen spec models: pydantic models whose hash is computed once.

The perf models memoise per-model and per-layout quantities in :mod:`moetune.memo` tables keyed on these objects;
pydantic's default frozen hash re-hashes every field on every lookup (ModelArch has ~70 fields), which dominated
the planner's inner loop. The cached value lives in the instance ``__dict__`` under a non-field key, which
pydantic's equality and serialisation ignore.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

_HASH_KEY = "_moetune_hash"
#: :meth:`FrozenSpec.trusted` per-field default kinds: required, the default object as is, ``FieldInfo.get_default``
_REQUIRED, _AS_IS, _GET_DEFAULT = 0, 1, 2


def _immutable_default(value) -> bool:
    """A default that pydantic's default copy (``smart_deepcopy``) returns as is: None, a bool / int / float / str,
    or an empty tuple / frozenset."""
    return value is None or type(value) in (bool, int, float, str) or (type(value) in (tuple, frozenset) and not value)


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

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs) -> None:
        """Prepare :meth:`trusted` once per class: per field, (name, default kind, default)."""
        super().__pydantic_init_subclass__(**kwargs)
        fields = cls.__pydantic_fields__
        plain = not cls.__pydantic_post_init__ and not any(f.alias or f.validation_alias for f in fields.values())
        plan = []
        for name, f in fields.items():
            if f.is_required():
                plan.append((name, _REQUIRED, None))
            elif f.default_factory is None and _immutable_default(f.default):
                plan.append((name, _AS_IS, f.default))
            else:
                plan.append((name, _GET_DEFAULT, f))
        type.__setattr__(cls, "_trusted_plan", tuple(plan) if plain else None)

    @classmethod
    def trusted(cls, **values):
        """``cls.model_construct(**values)`` for values that are already valid (no validation), without its per-field
        alias handling and default copying: the same instance - ``__dict__`` in field order with the missing fields
        at their defaults, the given names as the fields set, no extra or private values (pydantic 2
        ``BaseModel.model_construct``; tests/test_plan_fastpath.py compares both). A default that is an immutable
        scalar or an empty tuple / frozenset is used as is (what pydantic's copy of it returns: the object itself),
        any other default is taken from ``FieldInfo.get_default`` as ``model_construct`` does. Models with a
        post-init hook or aliases take ``model_construct`` itself. The planner builds ~50k jobs per large request
        this way (``Job.model_construct``: 12.6 us each, this: ~3 us)."""
        plan = cls.__dict__.get("_trusted_plan")
        if plan is None:
            return cls.model_construct(**values)
        d: dict = {}
        for name, kind, default in plan:
            if name in values:
                d[name] = values[name]
            elif kind == _AS_IS:
                d[name] = default
            elif kind == _GET_DEFAULT:
                d[name] = default.get_default(call_default_factory=True, validated_data=d)
        m = cls.__new__(cls)
        setattr_ = object.__setattr__
        setattr_(m, "__dict__", d)
        setattr_(m, "__pydantic_fields_set__", set(values))
        setattr_(m, "__pydantic_extra__", None)
        setattr_(m, "__pydantic_private__", None)
        return m

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
