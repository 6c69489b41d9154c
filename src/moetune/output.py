"""Output helpers shared by all commands: JSON on stdout (nothing else there), rich for humans on stderr/stdout."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import orjson
from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def _default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _sanitize(obj: Any) -> Any:
    """Replace non-finite floats by None (JSON has no NaN/inf)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_sanitize(v) for v in obj]
    return obj


def to_json_bytes(obj: Any, *, indent: bool = True) -> bytes:
    """Serialise ``obj`` (pydantic models, dataclasses, numpy values allowed) to JSON bytes."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    obj = orjson.loads(orjson.dumps(obj, default=_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    opts = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(_sanitize(obj), option=opts)


def print_json(obj: Any) -> None:
    """Write ``obj`` as JSON to stdout, followed by a newline."""
    sys.stdout.buffer.write(to_json_bytes(obj) + b"\n")
    sys.stdout.flush()
