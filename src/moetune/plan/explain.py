"""Why one candidate beats the next: the largest differing step-time terms, and what would make an impossible
request fit."""

from __future__ import annotations

from typing import Any


def flatten_walls(time_est: Any) -> dict[str, float]:
    """``{wall or sub-wall name: seconds}`` from a time estimate's ``walls`` (nested dicts allowed)."""
    walls = time_est.walls if not isinstance(time_est, dict) else time_est.get("walls", {})
    if hasattr(walls, "model_dump"):
        walls = walls.model_dump()
    out: dict[str, float] = {}

    def visit(prefix: str, v: Any) -> None:
        if hasattr(v, "model_dump"):
            v = v.model_dump()
        if isinstance(v, dict):
            if "seconds" in v and isinstance(v["seconds"], int | float):
                out[prefix] = float(v["seconds"])
            for kk, vv in v.items():
                if kk in ("seconds", "share", "fraction"):
                    continue
                if isinstance(vv, dict | int | float) or hasattr(vv, "model_dump"):
                    visit(f"{prefix}.{kk}" if prefix else kk, vv)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[prefix] = float(v)

    visit("", walls)
    return out


def why_better(a: Any, b: Any, *, top: int = 3) -> dict[str, Any]:
    """Compare candidate ``a`` (ranked higher) with ``b``: step-time gain and the largest differing wall terms."""
    wa, wb = flatten_walls(a.time), flatten_walls(b.time)
    diffs = sorted(((k, wb.get(k, 0.0) - wa.get(k, 0.0)) for k in set(wa) | set(wb)),
                   key=lambda kv: -abs(kv[1]))
    # keep leaf-most names first when a parent and its child carry the same delta
    terms = [{"term": k, "delta_s": round(d, 6)} for k, d in diffs if abs(d) > 1e-9][:top]
    layout_diff = {k: (getattr(a.layout, k), getattr(b.layout, k)) for k in
                   ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs") if getattr(a.layout, k) != getattr(b.layout, k)}
    fa, fb = a.job.features, b.job.features
    feat_diff = {k: (getattr(fa, k), getattr(fb, k)) for k in type(fa).model_fields if getattr(fa, k) != getattr(fb, k)}
    from moetune.plan.ties import within_noise

    return {
        "within_noise": within_noise(a, b),
        "vs_next_step_time_s": round(b.step_time_s - a.step_time_s, 6),
        "vs_next_pct": round(100.0 * (b.step_time_s - a.step_time_s) / b.step_time_s, 3) if b.step_time_s else 0.0,
        "layout_differences": {k: list(v) for k, v in layout_diff.items()},
        "feature_differences": {k: [_j(v[0]), _j(v[1])] for k, v in feat_diff.items()},
        "largest_terms": terms,
    }


def _j(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v
