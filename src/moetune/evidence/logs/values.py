"""Small value helpers shared by the log readers: number parsing, evidence-text decoding, config flattening."""

from __future__ import annotations

from typing import Any

from moetune.evidence.logs.model import NAN


def num(v: bytes) -> float:
    """``float(v)``, NaN when the text is not a number."""
    try:
        return float(v)
    except ValueError:
        return NAN


def dec(b: bytes) -> str:
    """Evidence text: UTF-8 (invalid bytes replaced), trailing blanks removed."""
    return b.decode("utf-8", "replace").rstrip()


def coerce(text: str) -> Any:
    """A printed argument value as None / bool / int / float, else the stripped text."""
    t = text.strip()
    if t in ("None", "null", ""):
        return None
    if t in ("True", "true"):
        return True
    if t in ("False", "false"):
        return False
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one ``{"a.b.c": value}`` mapping (non-mappings give ``{}``)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out
