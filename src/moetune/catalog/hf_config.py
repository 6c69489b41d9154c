"""Typed, validated access to the values of one Hugging Face ``config.json`` dict (:class:`Cfg`), shared by the
reader (:mod:`moetune.catalog.hf`) and the per-``model_type`` builders (:mod:`moetune.catalog.hf_families`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from moetune.errors import InputError

_MISSING = object()
REQUIRED = _MISSING

#: Upper bounds of sane values (far above any published model; they stop 10^12-layer configs before allocation).
MAX_LAYERS = 4096
MAX_SIZE = 1 << 24
MAX_VOCAB = 1 << 26
MAX_EXPERTS = 1 << 16


def show_value(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class Cfg:
    """Typed, validated access to one HF config dict; every error names the file, the field, the value and what
    was expected. ``key`` may be a tuple of spellings (current name first, older names after)."""

    def __init__(self, data: dict[str, Any], path: Path, prefix: str = ""):
        self.data = data
        self.path = path
        self.prefix = prefix

    # --- plumbing ---------------------------------------------------------------------------------------------
    def _find(self, key: str | tuple[str, ...]) -> tuple[str, Any]:
        keys = (key,) if isinstance(key, str) else key
        for k in keys:
            v = self.data.get(k, _MISSING)
            if v is not _MISSING and v is not None:
                return k, v
        return keys[0], _MISSING

    def fail(self, key: str, value: Any, expected: str) -> InputError:
        name = f"{self.prefix}{key}"
        return InputError(f"{self.path}: {name}={show_value(value)}: expected {expected}", field=name, value=value,
                          expected=expected)

    def missing(self, key: str | tuple[str, ...]) -> InputError:
        keys = (key,) if isinstance(key, str) else key
        alt = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
        name = f"{self.prefix}{keys[0]}"
        return InputError(f"{self.path}: required field {name!r}{alt} missing from the Hugging Face config "
                          f"(model_type {self.data.get('model_type')!r})", field=name)

    def has(self, key: str | tuple[str, ...]) -> bool:
        return self._find(key)[1] is not _MISSING

    def raw(self, key: str | tuple[str, ...], default: Any = None) -> Any:
        v = self._find(key)[1]
        return default if v is _MISSING else v

    def sub(self, key: str) -> Cfg:
        """A nested config object (DBRX ``attn_config``; multimodal ``text_config``)."""
        v = self.data.get(key)
        if v is None:
            return Cfg({}, self.path, f"{self.prefix}{key}.")
        if not isinstance(v, dict):
            raise self.fail(key, v, "a JSON object")
        return Cfg(v, self.path, f"{self.prefix}{key}.")

    # --- typed getters ----------------------------------------------------------------------------------------
    def int(self, key: str | tuple[str, ...], default: Any = REQUIRED, *, lo: int = 1, hi: int = MAX_SIZE) -> Any:
        """An integer in [lo, hi]; ``default`` when absent (``REQUIRED``: absent is an error)."""
        k, v = self._find(key)
        if v is _MISSING:
            if default is REQUIRED:
                raise self.missing(key)
            return default
        return self.check_int(k, v, lo=lo, hi=hi)

    def check_int(self, key: str, v: Any, *, lo: int = 1, hi: int = MAX_SIZE) -> int:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(key, v, f"an integer in [{lo}, {hi}]")
        if isinstance(v, float):
            if not (math.isfinite(v) and v.is_integer()):
                raise self.fail(key, v, f"an integer in [{lo}, {hi}]")
            v = int(v)
        if not lo <= v <= hi:
            raise self.fail(key, v, f"an integer in [{lo}, {hi}]")
        return v

    def layers(self, key: str | tuple[str, ...] = "num_hidden_layers", default: Any = REQUIRED) -> int:
        return self.int(key, default, lo=1, hi=MAX_LAYERS)

    def bool(self, key: str | tuple[str, ...], default: bool) -> bool:
        k, v = self._find(key)
        if v is _MISSING:
            return default
        if not isinstance(v, bool):
            raise self.fail(k, v, "true or false")
        return v

    def str(self, key: str | tuple[str, ...], default: Any = REQUIRED) -> Any:
        k, v = self._find(key)
        if v is _MISSING:
            if default is REQUIRED:
                raise self.missing(key)
            return default
        if not isinstance(v, str):
            raise self.fail(k, v, "a string")
        return v

    def int_list(self, key: str, *, lo: int = 0, hi: int = MAX_LAYERS) -> list[int] | None:
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise self.fail(key, v, f"a list of integers in [{lo}, {hi}]")
        return [self.check_int(f"{key}[{i}]", x, lo=lo, hi=hi) for i, x in enumerate(v)]

    def types(self, key: str, n: int, allowed: dict[str, str]) -> str | None:
        """A per-layer list of type names (``layer_types``, ``mlp_layer_types``) as pattern chars, checked against
        the layer count; None when absent."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(key, v, f"a list of {n} strings")
        if len(v) != n:
            raise self.fail(key, f"{len(v)} entries", f"{n} entries (one per layer)")
        bad = sorted({x for x in v if x not in allowed})
        if bad:
            raise self.fail(key, bad[0], f"one of {', '.join(sorted(allowed))}")
        return "".join(allowed[x] for x in v)
