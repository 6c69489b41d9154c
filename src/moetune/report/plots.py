"""The charts moetune draws, as self-contained inline SVG strings: one chart code for the static HTML report
(``moetune report``) and the web page (``moetune serve``, which asks the server for them at ``/ui/charts``).

Self-written SVG (no plotting library, no script, no external reference): the output is deterministic text that an
air-gapped browser renders as is, that a test can parse, and whose marks carry their numbers (``data-*``
attributes and ``<title>`` tooltips). Every chart's root is ``<svg class="mt-chart" data-chart="NAME">``.
"""

from __future__ import annotations

import html
import math
from typing import Any

from moetune.report.data import free_gib

PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974",
           "#64B5CD"]

#: memory components grouped into the five bands the memory chart stacks (anything else is the runtime tail:
#: CUDA context, NCCL / DeepEP buffers, library workspaces, working set, graph pools, fragmentation)
MEMORY_BANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("weights", ("weights", "weight", "params", "parameters")),
    ("grads", ("main_grads", "grads", "gradients")),
    ("optimizer", ("optimizer_state", "optimizer")),
    ("activations", ("activations", "activation")),
)
RUNTIME_TAIL = "runtime tail"
BAND_COLOURS = {"weights": PALETTE[0], "grads": PALETTE[1], "optimizer": PALETTE[2], "activations": PALETTE[3],
                RUNTIME_TAIL: PALETTE[7]}
FONT = "font-family='system-ui,-apple-system,Segoe UI,Roboto,sans-serif'"


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v: float) -> str:
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def nice_ticks(hi: float, n: int = 5) -> list[float]:
    """0 .. >= hi in about ``n`` round steps (1, 2, 2.5 or 5 x 10^k)."""
    if hi <= 0 or not math.isfinite(hi):
        return [0.0, 1.0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    k = math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(k + 1)]


def _open(name: str, w: int, h: int, title: str) -> list[str]:
    return [f"<svg class='mt-chart' data-chart='{_e(name)}' xmlns='http://www.w3.org/2000/svg' "
            f"viewBox='0 0 {w} {h}' width='{w}' height='{h}' role='img' aria-label='{_e(title)}' {FONT} "
            f"font-size='11'><rect width='{w}' height='{h}' fill='white'/>",
            f"<text x='{w / 2:.1f}' y='16' text-anchor='middle' font-size='13' font-weight='600'>{_e(title)}</text>"]


def _panel(x: float, y: float, w: float, h: float) -> str:
    """The plot area's light background (grid lines are drawn on it in white)."""
    return f"<rect class='panel' x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' fill='#eaeaf2'/>"


def _legend(items: list[tuple[str, str]], x: float, y: float) -> list[str]:
    out = []
    for i, (label, colour) in enumerate(items):
        yy = y + 16 * i
        out.append(f"<rect x='{x:.1f}' y='{yy:.1f}' width='11' height='11' fill='{colour}'/>"
                   f"<text x='{x + 15:.1f}' y='{yy + 9.5:.1f}'>{_e(label)}</text>")
    return out


def memory_bands(components: dict[str, float]) -> list[tuple[str, float, dict[str, float]]]:
    """``[(band, GiB, {component: GiB})]`` in stacking order, from one stage's components (zero bands dropped)."""
    taken: set[str] = set()
    out = []
    for band, names in MEMORY_BANDS:
        parts = {k: v for k, v in components.items() if k in names}
        taken.update(parts)
        if parts:
            out.append((band, sum(parts.values()), parts))
    tail = {k: v for k, v in components.items() if k not in taken}
    if tail:
        out.append((RUNTIME_TAIL, sum(tail.values()), tail))
    return [b for b in out if b[1] > 0]


def memory_stacked(stages: list[dict[str, Any]], title: str = "Memory per pipeline rank") -> str | None:
    """Memory per pipeline rank as stacked bars (GiB: weights, grads, optimizer, activations, runtime tail) against
    the HBM capacity line. ``stages``: ``[{stage, components: {name: GiB}, capacity_gib}]``
    (:func:`moetune.report.data.memory_stages`)."""
    if not stages:
        return None
    w, h = 600, 320
    left, right, top, bottom = 48, 120, 28, 38
    pw, ph = w - left - right, h - top - bottom
    cap = stages[0].get("capacity_gib")
    totals = [sum(st["components"].values()) for st in stages]
    hi = max([*totals, cap or 0.0]) * 1.05
    ticks = nice_ticks(hi)
    ymax = ticks[-1]

    def y(v: float) -> float:
        return top + ph - ph * v / ymax

    out = _open("memory", w, h, title)
    out.append(_panel(left, top, pw, ph))
    for t in ticks:
        out.append(f"<line x1='{left}' x2='{left + pw}' y1='{y(t):.1f}' y2='{y(t):.1f}' stroke='white'/>"
                   f"<text x='{left - 4}' y='{y(t) + 3.5:.1f}' text-anchor='end'>{_fmt(t)}</text>")
    out.append(f"<text transform='translate(12,{top + ph / 2:.1f}) rotate(-90)' text-anchor='middle'>GiB per GPU"
               "</text>")
    n = len(stages)
    slot = pw / n
    bw = min(56.0, slot * 0.7)
    used: list[str] = []
    for i, st in enumerate(stages):
        x = left + slot * i + (slot - bw) / 2
        acc = 0.0
        for band, gib, parts in memory_bands(st["components"]):
            if band not in used:
                used.append(band)
            tip = f"PP{st['stage']} {band}: {gib:.2f} GiB" + "".join(
                f"&#10;  {_e(k)}: {v:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
            out.append(f"<rect class='seg' data-band='{_e(band)}' data-gib='{gib:.4f}' x='{x:.1f}' "
                       f"y='{y(acc + gib):.1f}' width='{bw:.1f}' height='{max(y(acc) - y(acc + gib), 0.0):.1f}' "
                       f"fill='{BAND_COLOURS[band]}'><title>{tip}</title></rect>")
            acc += gib
        out.append(f"<text x='{x + bw / 2:.1f}' y='{y(acc) - 3:.1f}' text-anchor='middle' font-size='10'>"
                   f"{acc:.1f}</text>")
        out.append(f"<text x='{x + bw / 2:.1f}' y='{top + ph + 14}' text-anchor='middle'>PP{_e(st['stage'])}</text>")
    out.append(f"<text x='{left + pw / 2:.1f}' y='{h - 6}' text-anchor='middle'>pipeline rank</text>")
    out.append(f"<line x1='{left}' x2='{left}' y1='{top}' y2='{top + ph}' stroke='#888'/>"
               f"<line x1='{left}' x2='{left + pw}' y1='{top + ph}' y2='{top + ph}' stroke='#888'/>")
    legend = [(b, BAND_COLOURS[b]) for b in BAND_COLOURS if b in used]
    if cap:
        out.append(f"<line class='hbm' data-gib='{cap:.4f}' x1='{left}' x2='{left + pw}' y1='{y(cap):.1f}' "
                   f"y2='{y(cap):.1f}' stroke='black' stroke-dasharray='5,3' stroke-width='1.2'>"
                   f"<title>HBM capacity {cap:g} GiB</title></line>")
    ly = top + 4 + 16 * len(legend)
    out += _legend(legend[::-1], left + pw + 12, top + 4)
    if cap:
        out.append(f"<line x1='{left + pw + 12}' x2='{left + pw + 23}' y1='{ly + 5:.1f}' y2='{ly + 5:.1f}' "
                   f"stroke='black' stroke-dasharray='3,2'/><text x='{left + pw + 27}' y='{ly + 9.5:.1f}'>"
                   f"HBM {cap:g} GiB</text>")
    out.append("</svg>")
    return "".join(out)


def hbars(name: str, items: list[tuple[str, float]], *, title: str, unit: str, colours: list[str] | None = None,
          tips: list[str] | None = None) -> str | None:
    """Horizontal bars, one per (label, value), with the value printed at the bar's end."""
    items = [(k, v) for k, v in items if v is not None]
    if not items:
        return None
    w = 600
    bh, gap = 18, 6
    left, right, top, bottom = 150, 70, 28, 34
    h = top + bottom + len(items) * (bh + gap)
    pw = w - left - right
    ticks = nice_ticks(max(v for _, v in items) or 1.0)
    xmax = ticks[-1]
    out = _open(name, w, h, title)
    out.append(_panel(left, top, pw, h - top - bottom))
    for t in ticks:
        x = left + pw * t / xmax
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{top}' y2='{h - bottom}' stroke='white'/>"
                   f"<text x='{x:.1f}' y='{h - bottom + 13}' text-anchor='middle' font-size='10'>{_fmt(t)}</text>")
    for i, (label, v) in enumerate(items):
        yy = top + i * (bh + gap) + gap / 2
        colour = (colours or PALETTE)[i % len(colours or PALETTE)]
        tip = tips[i] if tips else f"{label}: {_fmt(v)} {unit}"
        out.append(f"<text x='{left - 6}' y='{yy + bh / 2 + 4:.1f}' text-anchor='end'>{_e(label)}</text>"
                   f"<rect class='bar' data-label='{_e(label)}' data-value='{v:.6g}' x='{left}' y='{yy:.1f}' "
                   f"width='{max(pw * v / xmax, 0.5):.1f}' height='{bh}' fill='{colour}'><title>{_e(tip)}</title>"
                   f"</rect><text x='{left + pw * v / xmax + 4:.1f}' y='{yy + bh / 2 + 4:.1f}' font-size='10'>"
                   f"{_fmt(v)}</text>")
    out.append(f"<text x='{left + pw / 2:.1f}' y='{h - 6}' text-anchor='middle'>{_e(unit)}</text></svg>")
    return "".join(out)


def walls_bar(walls: dict[str, float], title: str = "Time per wall") -> str | None:
    """Seconds per step spent on each wall (compute, recompute, TP/CP/EP/PP/DP communication, bubble, host,
    optimizer), largest first, with each wall's share of the sum in its tooltip."""
    if not walls:
        return None
    items = sorted(walls.items(), key=lambda kv: -kv[1])
    total = sum(v for _, v in items) or 1.0
    return hbars("walls", items, title=title, unit="seconds per step",
                 tips=[f"{k}: {v:.4g} s ({100 * v / total:.1f} %)" for k, v in items])


def comm_split(hidden_s: float | None, exposed_s: float | None, host_gap_s: float | None = None,
               title: str = "Communication and host gaps (trace)") -> str | None:
    """Hidden vs exposed communication and host-bound idle time of a trace, as bars (seconds)."""
    items = [(k, v) for k, v in (("hidden communication", hidden_s), ("exposed communication", exposed_s),
                                 ("host-bound gaps", host_gap_s)) if isinstance(v, int | float)]
    if not items:
        return None
    return hbars("comm", items, title=title, unit="seconds", colours=[PALETTE[2], PALETTE[3], PALETTE[7]])


def _scatter(name: str, pts: list[tuple[float, float, str, str]], *, title: str, xlabel: str, ylabel: str,
             log: bool = False, diagonal: bool = False) -> str:
    """Points ``(x, y, label, colour)``; ``log`` puts both axes on log10 scale."""
    w, h = 600, 340
    left, right, top, bottom = 64, 24, 28, 42
    pw, ph = w - left - right, h - top - bottom
    tx = (lambda v: math.log10(v)) if log else (lambda v: v)
    xs, ys = [tx(p[0]) for p in pts], [tx(p[1]) for p in pts]
    if diagonal:
        lo, hi = min(xs + ys), max(xs + ys)
        x0, x1, y0, y1 = lo, hi, lo, hi
    else:
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    padx, pady = (x1 - x0) * 0.08 or 1.0, (y1 - y0) * 0.08 or max(abs(y1) * 0.05, 1.0)
    x0, x1, y0, y1 = x0 - padx, x1 + padx, y0 - pady, y1 + pady

    def px(v: float) -> float:
        return left + pw * (v - x0) / (x1 - x0)

    def py(v: float) -> float:
        return top + ph - ph * (v - y0) / (y1 - y0)

    out = _open(name, w, h, title)
    out.append(_panel(left, top, pw, ph))
    for i in range(5):
        fx, fy = x0 + (x1 - x0) * i / 4, y0 + (y1 - y0) * i / 4
        lx, ly = (10 ** fx, 10 ** fy) if log else (fx, fy)
        out.append(f"<line x1='{px(fx):.1f}' x2='{px(fx):.1f}' y1='{top}' y2='{top + ph}' stroke='white'/>"
                   f"<text x='{px(fx):.1f}' y='{top + ph + 14}' text-anchor='middle' font-size='10'>{_fmt(lx)}</text>"
                   f"<line x1='{left}' x2='{left + pw}' y1='{py(fy):.1f}' y2='{py(fy):.1f}' stroke='white'/>"
                   f"<text x='{left - 4}' y='{py(fy) + 3.5:.1f}' text-anchor='end' font-size='10'>{_fmt(ly)}</text>")
    if diagonal:
        out.append(f"<line x1='{px(x0):.1f}' y1='{py(x0):.1f}' x2='{px(x1):.1f}' y2='{py(x1):.1f}' stroke='gray' "
                   "stroke-dasharray='5,3'><title>measured = predicted</title></line>")
    for (x, y, label, colour), vx, vy in zip(pts, xs, ys, strict=True):
        out.append(f"<circle class='pt' cx='{px(vx):.1f}' cy='{py(vy):.1f}' r='4.5' fill='{colour}' "
                   f"data-x='{x:.6g}' data-y='{y:.6g}'><title>{_e(label)}: {_fmt(x)}, {_fmt(y)}</title></circle>")
    for (_x, _y, label, _c), vx, vy in list(zip(pts, xs, ys, strict=True))[:12]:
        right = px(vx) > left + 0.6 * pw  # labels of points on the right run leftwards, inside the plot
        out.append(f"<text x='{px(vx) + (-6 if right else 6):.1f}' y='{py(vy) - 5:.1f}' font-size='9'"
                   f"{' text-anchor=' + chr(39) + 'end' + chr(39) if right else ''}>{_e(label)}</text>")
    out.append(f"<line x1='{left}' x2='{left}' y1='{top}' y2='{top + ph}' stroke='#888'/>"
               f"<line x1='{left}' x2='{left + pw}' y1='{top + ph}' y2='{top + ph}' stroke='#888'/>"
               f"<text x='{left + pw / 2:.1f}' y='{h - 8}' text-anchor='middle'>{_e(xlabel)}</text>"
               f"<text transform='translate(14,{top + ph / 2:.1f}) rotate(-90)' text-anchor='middle'>{_e(ylabel)}"
               "</text></svg>")
    return "".join(out)


def throughput_vs_headroom(cands: list[dict[str, Any]]) -> str | None:
    """Each plan candidate's predicted tokens/s/GPU against the HBM it leaves free on its most loaded rank (GiB)."""
    pts = []
    for i, c in enumerate(cands):
        t, m = c.get("time") or {}, c.get("memory") or {}
        y, x = t.get("tokens_per_s_per_gpu"), free_gib(m)
        if isinstance(x, int | float) and isinstance(y, int | float):
            pts.append((float(x), float(y), f"#{c.get('index', i) + 1} {c.get('label', '')}".strip(),
                        PALETTE[3] if i == 0 else PALETTE[0]))
    if not pts:
        return None
    return _scatter("throughput", pts, title="Candidates: throughput vs free HBM on the most loaded rank",
                    xlabel="free HBM on the most loaded rank (GiB)", ylabel="predicted tokens/s/GPU")


def predicted_vs_measured(rows: list[dict[str, Any]]) -> str | None:
    """Sweep runs: predicted vs measured steady-window step time (log axes; green accepted, red rejected)."""
    pts = [(float(r["predicted"]["step_time_s"]), float(r["step_time_s"]), str(r["run"]),
            PALETTE[2] if r["accepted"] else PALETTE[3]) for r in rows
           if (r.get("predicted") or {}).get("step_time_s") and r.get("step_time_s")]
    if not pts:
        return None
    return _scatter("predicted_vs_measured", pts, title="Predicted vs measured (green accepted, red rejected)",
                    xlabel="predicted step time (s)", ylabel="measured step time (s)", log=True, diagonal=True)


def run_step_times(rows: list[dict[str, Any]]) -> str | None:
    """Sweep runs: measured steady-window step time per run (red = rejected)."""
    pts = [(str(r["run"]), float(r["step_time_s"]), bool(r["accepted"])) for r in rows if r.get("step_time_s")]
    if not pts:
        return None
    return hbars("run_step_times", [(p[0], p[1]) for p in pts], title="Measured step time per run (red = rejected)",
                 unit="steady-window step time (s)", colours=[PALETTE[2] if p[2] else PALETTE[3] for p in pts])
