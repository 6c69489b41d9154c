"""Read a Hugging Face ``config.json`` (or a snapshot folder holding one) into a
:class:`~moetune.spec.model.ModelArch`.

This module reads and validates the file; :mod:`moetune.catalog.hf_families` maps each ``model_type`` that transformers
ships with a MoE or hybrid decoder (the list is :data:`moetune.catalog.hf_families.SUPPORTED_MODEL_TYPES`) to Megatron-Core field names, building
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
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moetune.catalog.hf_config import Cfg, show_value
from moetune.catalog.hf_families import builder_for
from moetune.errors import InputError, one_line
from moetune.spec.model import ModelArch

#: Largest config.json accepted (a real one is a few kB).
MAX_CONFIG_BYTES = 16 << 20

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
        raise InputError(f"{path}: invalid value for {loc}={show_value(err.get('input'))}: {err.get('msg')}",
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
