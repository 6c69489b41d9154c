"""The report's figures as inline SVG strings (matplotlib, Agg backend, no files)."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974",
           "#64B5CD"]


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def memory_stacked(stages: list[dict[str, Any]]) -> str | None:
    """Memory per pipeline stage as stacked bars (GiB), with the HBM capacity line when known."""
    if not stages:
        return None
    names: list[str] = []
    for st in stages:
        for k in st["components"]:
            if k not in names:
                names.append(k)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    x = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for i, n in enumerate(names):
        vals = [st["components"].get(n, 0.0) for st in stages]
        ax.bar(x, vals, bottom=bottom, label=n, color=PALETTE[i % len(PALETTE)])
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    cap = stages[0].get("capacity_gib")
    if cap:
        ax.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"HBM {cap:g} GiB")
    ax.set_xticks(x, [f"stage {st['stage']}" for st in stages])
    ax.set_ylabel("GiB per GPU")
    ax.set_title("Memory per pipeline stage")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(fig)


def walls_bar(walls: dict[str, float]) -> str | None:
    if not walls:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 2.8))
    items = sorted(walls.items(), key=lambda kv: -kv[1])
    ax.barh([k for k, _ in items], [v for _, v in items], color=PALETTE[: len(items)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step")
    ax.set_title("Predicted time per wall")
    return _svg(fig)


def throughput_vs_headroom(cands: list[dict[str, Any]]) -> str | None:
    pts = []
    for c in cands:
        t, m = c.get("time") or {}, c.get("memory") or {}
        y = t.get("tokens_per_s_per_gpu")
        x = m.get("headroom_gib")
        if isinstance(x, int | float) and isinstance(y, int | float):
            pts.append((x, y, c.get("label") or f"#{c.get('index')}"))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=40, color=PALETTE[0], zorder=3)
    for i, p in enumerate(pts[:12]):
        ax.annotate(f"#{i} {p[2]}", (p[0], p[1]), fontsize=6, xytext=(4, 3), textcoords="offset points")
    ax.set_xlabel("memory headroom (GiB)")
    ax.set_ylabel("predicted tokens/s/GPU")
    ax.set_title("Candidates: throughput vs memory headroom")
    ax.grid(alpha=0.3)
    return _svg(fig)


def predicted_vs_measured(rows: list[dict[str, Any]]) -> str | None:
    pts = [(r["predicted"].get("step_time_s"), r.get("step_time_s"), r["run"], r["accepted"]) for r in rows
           if (r.get("predicted") or {}).get("step_time_s") and r.get("step_time_s")]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    for p, m, _name, ok in pts:
        ax.scatter([p], [m], color=PALETTE[2] if ok else PALETTE[3], marker="o" if ok else "x", s=40, zorder=3)
    lo = min(min(p[0], p[1]) for p in pts) * 0.8
    hi = max(max(p[0], p[1]) for p in pts) * 1.2
    ax.plot([lo, hi], [lo, hi], color="gray", linestyle="--", linewidth=1, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("measured steady-window step time (s)")
    ax.set_title("Predicted vs measured (o accepted, x rejected)")
    ax.legend(fontsize=7)
    return _svg(fig)


def run_step_times(rows: list[dict[str, Any]]) -> str | None:
    pts = [(r["run"], r["step_time_s"], r["accepted"]) for r in rows if r.get("step_time_s")]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(pts) + 1.2))
    ax.barh([p[0] for p in pts], [p[1] for p in pts], color=[PALETTE[2] if p[2] else PALETTE[3] for p in pts])
    ax.invert_yaxis()
    ax.set_xlabel("steady-window step time (s); red = rejected")
    ax.set_title("Measured step time per run")
    return _svg(fig)
