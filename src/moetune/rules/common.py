"""Helpers shared by the rule modules: fix builders that address the field Bridge actually reads."""

from __future__ import annotations

import math
from typing import Any

from moetune.rules.engine import Ctx

E, RT, ENV, W_, I_ = "error", "error(rt)", "error(env)", "warning", "info"


def ovl(c: Ctx, field: str, value: Any) -> dict[str, Any]:
    """Override for a CommOverlapConfig-owned model field: on ``comm_overlap`` when Bridge has one (OVL-013)."""
    if c.bridge and isinstance(c.raw.get("comm_overlap"), dict):
        return {f"comm_overlap.{field}": value}
    return {f"model.{field}": value}


def prec(c: Ctx, field: str, value: Any) -> dict[str, Any]:
    """Override for a precision field: on ``mixed_precision`` when set (it overwrites the model, PRC-002)."""
    if c.bridge and isinstance(c.raw.get("mixed_precision"), dict):
        return {f"mixed_precision.{field}": value}
    return {f"model.{field}": value}


def rewritten_on_model(c: Ctx, fields: tuple[str, ...]) -> bool:
    """Is any of ``fields`` set on the config's own ``model`` section (``c.raw_has(f"model.{f}")``) with a value the
    replay changed (``c.raw_get(f"model.{f}") != c.m(f)``)? The section is read once: the steps of ``get_path``."""
    sec = c.raw_get("model")
    return isinstance(sec, dict) and any(f in sec and sec[f] != c.m(f) for f in fields)


def mp_or(c: Ctx, field: str, section: str = "model") -> Any:
    return c.get(f"{section}.{field}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in divisors(n) if d <= max(1, cap))


def lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def modules(v: Any) -> list[str]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)
