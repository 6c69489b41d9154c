"""Gather what a report shows from a sweep directory, a PLAN.json (``moetune plan --json``) or an ESTIMATE.json
(``moetune estimate --json``). Readers are tolerant of extra keys; a file of none of these kinds is a one-line error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from moetune.errors import InputError


def _num(x: Any) -> float | None:
    if isinstance(x, dict):
        for k in ("seconds", "s", "value", "gib", "median"):
            if isinstance(x.get(k), int | float):
                return float(x[k])
        return None
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def free_gib(memory: dict[str, Any]) -> float | None:
    """HBM left free on the most loaded pipeline rank: capacity minus the largest per-rank device total (GiB).

    (``memory.headroom_gib`` is the policy's required margin, the same for every candidate on one system.)"""
    cap = _num(memory.get("capacity_gib"))
    dev = []
    for st in memory.get("stages") or []:
        if not isinstance(st, dict):
            continue
        d = _num(st.get("device_gib"))
        if d is None:  # older PLAN.json: the stage's peak, else the sum the memory chart stacks
            d = _num(st.get("peak_gib"))
        if d is None and isinstance(st.get("components"), dict):
            d = sum(v for v in (_num(x) for x in st["components"].values()) if v is not None) or None
        if d is not None:
            dev.append(d)
    return cap - max(dev) if cap is not None and dev else None


def memory_stages(memory: dict[str, Any]) -> list[dict[str, Any]]:
    """[{stage, components: {name: GiB}}] from an estimate/plan ``memory`` section."""
    out = []
    for i, st in enumerate(memory.get("stages") or []):
        if not isinstance(st, dict):
            continue
        comps = st.get("components") or {}
        if isinstance(comps, list):  # [{name, gib}] form
            comps = {str(c.get("name", c.get("component", j))): c.get("gib", c.get("bytes")) for j, c in
                     enumerate(comps) if isinstance(c, dict)}
        vals = {str(k): v for k, v in ((k, _num(v)) for k, v in comps.items()) if v is not None and v > 0}
        if vals:
            out.append({"stage": st.get("stage", st.get("pp_rank", i)), "components": vals,
                        "capacity_gib": _num(memory.get("capacity_gib"))})
    return out


def time_walls(time: dict[str, Any]) -> dict[str, float]:
    walls = time.get("walls") or {}
    if isinstance(walls, list):
        walls = {str(w.get("name", j)): w for j, w in enumerate(walls) if isinstance(w, dict)}
    out = {}
    for k, v in walls.items():
        x = _num(v)
        if x is not None:
            if x > 0:
                out[str(k)] = x
        elif isinstance(v, dict):  # nested by kind, e.g. exposed communication
            for k2, v2 in v.items():
                x2 = _num(v2)
                if x2 is not None:
                    out[f"{k}:{k2}"] = x2
    return out


def _load_json(path: Path) -> Any:
    from moetune.files import decode_text, read_bytes

    data = decode_text(read_bytes(path, "a sweep folder, PLAN.json or ESTIMATE.json"), str(path), "JSON text")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None


def load_report_input(path: Path, *, efficiency: Any = None, trace_workers: int | None = None) -> dict[str, Any]:
    """-> {kind: sweep|plan|estimate, title, ...} for the renderers (a sweep not collected yet is collected with
    ``efficiency`` / ``trace_workers``, :func:`moetune.sweep.collect.collect_sweep`)."""
    if path.is_dir():
        from moetune.sweep.collect import collect_sweep

        res_path = path / "collect" / "results.json"
        from moetune.sweep.sweepdir import load_sweep

        results = _load_json(res_path) if res_path.is_file() else \
            collect_sweep(path, efficiency=efficiency, trace_workers=trace_workers)
        sweep, _ = load_sweep(path)
        plan_cands = sweep.get("plan_candidates") or []
        base = plan_cands[sweep.get("candidate", 0)] if plan_cands else {}
        return {"kind": "sweep", "title": f"moetune sweep {results['sweep']}", "source": str(path),
                "results": results, "plan_candidates": plan_cands, "baseline": base,
                "memory": memory_stages(base.get("memory") or {}), "walls": time_walls(base.get("time") or {})}
    data = _load_json(path)
    if isinstance(data, dict) and isinstance(data.get("candidates"), list):
        cands = data["candidates"]
        best = cands[0] if cands else {}
        return {"kind": "plan", "title": f"moetune plan {path.name}", "source": str(path), "plan": data,
                "plan_candidates": [{"index": i, "label": layout_label(c.get("layout") or {}), **c}
                                    for i, c in enumerate(cands)],
                "baseline": best, "memory": memory_stages(best.get("memory") or {}),
                "walls": time_walls(best.get("time") or {})}
    if isinstance(data, dict) and ("memory" in data or "time" in data):
        return {"kind": "estimate", "title": f"moetune estimate {path.name}", "source": str(path), "estimate": data,
                "plan_candidates": [], "baseline": data, "memory": memory_stages(data.get("memory") or {}),
                "walls": time_walls(data.get("time") or {})}
    raise InputError(f"{path}: not a sweep directory, PLAN.json (needs 'candidates') or ESTIMATE.json "
                     "(needs 'memory' or 'time')")


def layout_label(lay: dict[str, Any]) -> str:
    s = f"TP{lay.get('tp', 1)} PP{lay.get('pp', 1)}"
    if (lay.get("vpp") or 1) > 1:
        s += f" VPP{lay['vpp']}"
    return s + f" CP{lay.get('cp', 1)} EP{lay.get('ep', 1)} MBS{lay.get('mbs', 1)}"
