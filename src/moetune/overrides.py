"""Hydra-style ``a.b.c=value`` overrides for nested config dicts (as Megatron-Bridge's ``process_config_with_overrides``).

Values are parsed as YAML scalars (``true``/``false``/``null``/ints/floats/strings); ``[x,y]`` gives a list.
A leading ``+`` (Hydra "add") and ``~`` (delete) are accepted. Bad syntax raises a one-line :class:`InputError`
naming the override.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import yaml

from moetune.errors import InputError


def parse_value(text: str) -> Any:
    """YAML-scalar parse of an override value; ``[a,b]`` lists; bare words stay strings."""
    t = text.strip()
    if t == "":
        return ""
    try:
        val = yaml.safe_load(t)
    except yaml.YAMLError:
        if t.startswith("[") and t.endswith("]"):
            inner = t[1:-1].strip()
            return [parse_value(x) for x in inner.split(",")] if inner else []
        return t
    if isinstance(val, dict):
        # ``a=b:c`` style strings (e.g. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) are plain strings
        return t
    return val


def parse_override(text: str) -> tuple[str, Any, str]:
    """``'model.tensor_model_parallel_size=2'`` -> ('model.tensor_model_parallel_size', 2, op); op in set/add/del."""
    s = text.strip()
    op = "set"
    if s.startswith("~"):
        key = s[1:].split("=", 1)[0].strip()
        if not key:
            raise InputError(f"override {text!r}: expected ~key.path")
        _refuse_internal(text, key)
        return key, None, "del"
    if s.startswith("+"):
        op, s = "add", s.lstrip("+")
    if "=" not in s:
        raise InputError(f"override {text!r}: expected key.path=value (e.g. model.expert_model_parallel_size=8)")
    key, value = s.split("=", 1)
    key = key.strip()
    if not key or any(not part.isidentifier() for part in key.split(".")):
        raise InputError(f"override {text!r}: key {key!r} is not a dotted field path")
    _refuse_internal(text, key)
    return key, parse_value(value), op


def _refuse_internal(text: str, key: str) -> None:
    """``_meta`` holds what moetune read from the recipe or config (model, system, GPUs); it is not a config field."""
    if key.split(".", 1)[0] == "_meta":
        raise InputError(f"override {text!r}: '_meta' is moetune's record of the recipe, not a config section")


def set_path(cfg: dict, path: str, value: Any) -> None:
    """Set ``cfg['a']['b'] = value`` for path 'a.b', creating sections."""
    parts = path.split(".")
    node = cfg
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        elif not isinstance(nxt, dict):
            raise InputError(f"override {path}: {p!r} is {nxt!r}, not a section")
        node = nxt
    node[parts[-1]] = value


def get_path(cfg: dict, path: str, default: Any = None) -> Any:
    node: Any = cfg
    for p in path.split("."):
        if not isinstance(node, dict) or p not in node:
            return default
        node = node[p]
    return node


def del_path(cfg: dict, path: str) -> None:
    parts = path.split(".")
    node = cfg
    for p in parts[:-1]:
        node = node.get(p)
        if not isinstance(node, dict):
            return
    node.pop(parts[-1], None)


def apply_overrides(cfg: dict, overrides: Iterable[str] | dict[str, Any]) -> dict:
    """Return a deep copy of ``cfg`` with overrides applied (strings ``a.b=c`` or a mapping path -> value)."""
    out = copy.deepcopy(cfg)
    if isinstance(overrides, dict):
        for k, v in overrides.items():
            set_path(out, k, v)
        return out
    for text in overrides:
        key, value, op = parse_override(text)
        if op == "del":
            del_path(out, key)
        else:
            set_path(out, key, value)
    return out


def format_value(value: Any) -> str:
    """Inverse of :func:`parse_value` for one override value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


def format_override(path: str, value: Any) -> str:
    return f"{path}={format_value(value)}"
