"""Loader for ``catalog/memory.yaml``: runtime constants of the memory model, each with its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moetune.files import load_yaml
from moetune.memo import memo

_PATH = Path(__file__).with_name("memory.yaml")


@memo(maxsize=256)
def memory_catalog() -> dict[str, dict[str, Any]]:
    """All entries: name -> {value, source}."""
    with _PATH.open() as f:
        data = load_yaml(f)
    for name, entry in data.items():
        if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
            raise ValueError(f"{_PATH}: entry {name!r} needs 'value' and 'source'")
    return data


@memo(maxsize=256)
def const(name: str) -> Any:
    """The value of one constant (dicts are returned as-is; do not mutate)."""
    return memory_catalog()[name]["value"]


def source(name: str) -> str:
    return str(memory_catalog()[name]["source"]).strip()
