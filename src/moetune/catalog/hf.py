"""Read a Hugging Face ``config.json`` (or a snapshot folder holding one) into a
:class:`~moetune.spec.model.ModelArch`.

This module reads and validates the file; :mod:`moetune.catalog.hf_families` maps each ``model_type`` that transformers
ships with a MoE or hybrid decoder (the list is :data:`SUPPORTED_MODEL_TYPES`) to Megatron-Core field names, building
the layer pattern exactly as the transformers model class does. The parameter count of the result equals the tensors
``AutoModelForCausalLM.from_config`` instantiates (parameters plus persistent buffers such as DeepSeek's
``e_score_correction_bias``), with the vocabulary padded as Megatron pads it; ``tests/test_hf_meta.py`` proves it on
the meta device.

Bad input never gives a traceback: unreadable, binary or malformed files, a folder without ``config.json``, an unknown
``model_type``, a missing field, a field of the wrong type (string / float / bool where an integer belongs), a
non-positive or absurd size, a top-k larger than the expert count are each one :class:`~moetune.errors.InputError`
naming the file, the field, the value and what was expected.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moetune.errors import InputError, one_line
from moetune.spec.model import ModelArch

_MISSING = object()
REQUIRED = _MISSING

#: Upper bounds of sane values (far above any published model; they stop 10^12-layer configs before allocation).
MAX_LAYERS = 4096
MAX_SIZE = 1 << 24
MAX_VOCAB = 1 << 26
MAX_EXPERTS = 1 << 16
#: Largest config.json accepted (a real one is a few kB).
MAX_CONFIG_BYTES = 16 << 20


def _show(v: Any) -> str:
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
        return InputError(f"{self.path}: {name}={_show(value)}: expected {expected}", field=name, value=value,
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


# --- files ----------------------------------------------------------------------------------------------------
def resolve_config_path(path: Path | str) -> Path:
    """``path`` itself, or ``path/config.json`` for a snapshot folder; errors name what is missing."""
    path = Path(path)
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise InputError(f"{path}: folder has no config.json (expected a Hugging Face snapshot folder or a "
                             "config.json file)", field="model", value=str(path), expected="a folder with config.json")
        return cfg
    if not path.exists():
        raise InputError(f"{path}: no such file (expected a Hugging Face config.json or a snapshot folder)",
                         field="model", value=str(path), expected="an existing config.json")
    return path


def read_config_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a Hugging Face ``config.json``)."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise InputError(f"{path}: {size} bytes: expected a Hugging Face config.json (at most "
                             f"{MAX_CONFIG_BYTES >> 20} MiB)", field="model")
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({one_line(exc)})", field="model") from exc
    if b"\x00" in raw[:8192]:
        raise InputError(f"{path}: binary file: expected a Hugging Face config.json (UTF-8 JSON text)", field="model")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}): expected a Hugging Face config.json",
                         field="model") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                         field="model") from exc
    except RecursionError as exc:
        raise InputError(f"{path}: JSON nested too deeply: expected a Hugging Face config.json", field="model") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: a JSON {type(data).__name__}: expected a JSON object (a Hugging Face config.json)",
                         field="model")
    return data


def _name(path: Path, data: dict[str, Any]) -> str:
    if isinstance(data.get("_name_or_path"), str) and data["_name_or_path"]:
        return data["_name_or_path"]
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def _validate(kw: dict[str, Any], c: Cfg) -> None:
    """Meaning checks the per-field getters cannot make alone."""
    experts = kw.get("num_moe_experts")
    if experts and "E" in kw.get("mlp_pattern", ""):
        k = kw.get("moe_router_topk", 2)
        if k > experts:
            key = kw.pop("_topk_key", "num_experts_per_tok")
            raise c.fail(key, k, f"at most the number of routed experts ({experts})")
    kw.pop("_topk_key", None)
    heads, groups = kw.get("num_attention_heads"), kw.get("num_query_groups")
    if heads and groups and heads % groups:
        raise c.fail("num_key_value_heads", groups, f"a divisor of num_attention_heads ({heads})")


def model_from_hf_dict(data: dict[str, Any], path: Path | str = "<config>") -> ModelArch:
    """A :class:`ModelArch` from an already-parsed HF config dict (see :func:`model_from_hf_config`)."""
    from moetune.catalog.hf_families import builder_for  # the families module imports Cfg from here

    path = Path(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object (a Hugging Face config.json)", field="model")
    name = _name(path, data)
    c = Cfg(data, path)
    build, c, note = builder_for(c)
    kw = build(c)
    _validate(kw, c)
    kw.update(name=name, source=f"Hugging Face config {path}{note}")
    try:
        return ModelArch.model_validate(kw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "config"
        raise InputError(f"{path}: invalid value for {loc}={_show(err.get('input'))}: {err.get('msg')}",
                         field=loc) from exc
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: {one_line(exc)}") from exc


def model_from_hf_config(path: Path | str) -> ModelArch:
    """Read a Hugging Face ``config.json`` (or a snapshot folder holding one) into a :class:`ModelArch`.

    Raises :class:`InputError` (one line, exit 2 in the CLI) for unreadable, binary or malformed files, a folder
    without ``config.json``, an unsupported ``model_type``, a missing field or an impossible value (named in the
    message with the file).
    """
    p = resolve_config_path(path)
    return model_from_hf_dict(read_config_json(p), p)


def __getattr__(name: str) -> Any:  # SUPPORTED_MODEL_TYPES lives with the families; keep the old import path
    if name == "SUPPORTED_MODEL_TYPES":
        from moetune.catalog.hf_families import SUPPORTED_MODEL_TYPES

        return SUPPORTED_MODEL_TYPES
    raise AttributeError(name)
