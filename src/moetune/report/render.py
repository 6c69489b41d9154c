"""Render a report as one self-contained HTML file (inline SVG charts from :mod:`moetune.report.plots`, the chart
code the web page uses too; inline CSS) or as Markdown.

Sections: contract, memory per stage (stacked bars), time per wall, candidates' throughput vs free HBM,
runs with acceptance and reasons, predicted vs measured, the A/B table, and the final evidence bundle the seeds list
(config diff, versions, hardware, semantics label, proof of active features, steady step time and TFLOP/s, loss
health, peak memory).
"""

from __future__ import annotations

import html
from typing import Any

from moetune.report import plots
from moetune.report.data import free_gib

CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.ok{color:#1a7f37;font-weight:600}
.bad{color:#c62828;font-weight:600}.pending{color:#666}.warn{color:#9a6700}.plots{display:flex;flex-wrap:wrap;gap:16px}
.plot{border:1px solid #eee;padding:6px}.plot svg{max-width:560px;height:auto}code{font-size:11px}"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _f(x: Any, nd: int = 4) -> str:
    if isinstance(x, bool) or x is None:
        return "" if x is None else str(x)
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{nd}g}"
    return str(x)


def _pct(x: Any) -> str:
    return f"{x:+.2f}" if isinstance(x, int | float) and not isinstance(x, bool) else ""


def _ci(x: Any) -> str:
    if isinstance(x, list | tuple) and len(x) == 2 and all(isinstance(v, int | float) for v in x):
        return f"[{x[0]:+.2f}, {x[1]:+.2f}]"
    return ""


def _table(head: list[str], rows: list[list[str]], raw: bool = False) -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def figures(data: dict[str, Any]) -> list[tuple[str, str]]:
    figs = [("Memory per stage", plots.memory_stacked(data.get("memory") or [])),
            ("Time per wall", plots.walls_bar(data.get("walls") or {})),
            ("Throughput vs headroom", plots.throughput_vs_headroom(data.get("plan_candidates") or []))]
    res = data.get("results")
    if res:
        figs += [("Predicted vs measured", plots.predicted_vs_measured(res["runs"])),
                 ("Measured step time", plots.run_step_times(res["runs"]))]
    return [(t, s) for t, s in figs if s]


def _status(run: dict[str, Any]) -> str:
    if run.get("status") == "pending":
        return '<span class="pending">pending</span>'
    return '<span class="ok">accepted</span>' if run["accepted"] else '<span class="bad">rejected</span>'


def evidence_bundle(res: dict[str, Any]) -> dict[str, Any] | None:
    """The seeds' final evidence for the validated (or best accepted) run."""
    runs = {r["run"]: r for r in res["runs"]}
    final = runs.get("validate-winner")
    if not final or not final["accepted"]:
        winners = [w["run"] for w in res["winners"] if w.get("run")]
        final = next((runs[w] for w in reversed(winners) if w in runs and runs[w]["accepted"]), None)
    if final is None:
        return None
    ref = runs.get("retune-ref") or final
    diff = {k: (ref["features"].get(k), v) for k, v in final["features"].items() if ref["features"].get(k) != v}
    diff.update({f"layout.{k}": (ref["layout"].get(k), v) for k, v in final["layout"].items()
                 if ref["layout"].get(k) != v})
    c = res["contract"]
    loss = next((ch for ch in final["checks"] if ch["check"] == "loss_finite"), {})
    skipped = next((ch for ch in final["checks"] if ch["check"] == "no_skipped"), {})
    return {
        "run": final["run"],
        "config_diff": diff,
        "versions": {**c.get("versions", {}), **(final.get("versions") or {})},
        "hardware": c.get("hardware", {}),
        "semantics": c.get("semantics", {}),
        "proof": [f"{ch['check']}: {ch['status']} — {ch['reason']}" for ch in final["checks"]
                  if ch["check"].endswith("_active")],
        "steady_step_time_s": final.get("step_time_s"),
        "window": final.get("window"),
        "tflops_per_gpu": final.get("tflops_per_gpu"),
        "tokens_per_s_per_gpu": final.get("tokens_per_s_per_gpu"),
        "loss_health": f"{loss.get('reason', 'unknown')}; {skipped.get('reason', '')}",
        "peak_memory_gib": final.get("peak_mem_gib"),
    }


def render_html(data: dict[str, Any]) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(data['title'])}</title>"
             f"<style>{CSS}</style></head><body><h1>{_e(data['title'])}</h1><p>source: <code>"
             f"{_e(data['source'])}</code></p>"]
    res = data.get("results")
    if res:
        c = res["contract"]
        hw = c["hardware"]
        parts.append("<h2>Contract</h2>" + _table(["field", "value"], [
            ["model", c["model"]], ["hardware", f"{hw['gpus']} x {hw['gpu_type']} ({hw['system']}, {hw['nodes']} nodes)"],
            ["semantics", f"{c['semantics']['label']} ({', '.join(c['semantics']['reasons']) or 'no caveats'})"],
            ["precision", c["precision"]],
            ["shape", f"GBS {c['shape']['global_batch_size']}, MBS {c['shape']['micro_batch_size']}, "
                      f"seq {c['shape']['seq_length']}"],
            ["layout", ", ".join(f"{k}={v}" for k, v in c["layout"].items() if v is not None)],
            ["windows", f"screen {c['screen']['first']}-{c['screen']['last']} of {c['screen']['steps']}; validate "
                        f"{c['validate']['first']}-{c['validate']['last']} of {c['validate']['steps']}"],
            ["contract unchanged", "yes" if res["contract_ok"] else "NO — contract.yaml edited after generation"],
        ]))
    figs = figures(data)
    parts.append("<h2>Plots</h2><div class='plots'>" + "".join(
        f"<div class='plot' title='{_e(t)}'>{svg}</div>" for t, svg in figs) + "</div>")
    if data.get("plan_candidates"):
        rows = []
        for c in data["plan_candidates"][:20]:
            t, m = c.get("time") or {}, c.get("memory") or {}
            rows.append([str(c.get("index")), c.get("label", ""), _f(t.get("step_time_s")),
                         _f(t.get("tokens_per_s_per_gpu")), _f(m.get("peak_gib", m.get("peak_allocated_gib"))),
                         _f(free_gib(m))])
        parts.append("<h2>Candidates</h2>" + _table(["#", "layout", "step s", "tokens/s/GPU", "peak GiB",
                                                      "free GiB (most loaded rank)"], rows))
    if res:
        rows = []
        for r in res["runs"]:
            reasons = "; ".join(r["reasons"]) or ("unverified: " + "; ".join(r["unverified"]) if r["unverified"]
                                                  else "")
            rows.append([_e(r["run"]), _e(r["phase"]), _e(r.get("variable") or ""), _status(r),
                         _e(_f(r.get("step_time_s"))), _e(_f((r.get("predicted") or {}).get("step_time_s"))),
                         _e(_f(r.get("tflops_per_gpu"))), _e(reasons)])
        parts.append("<h2>Runs and acceptance</h2>" + _table(
            ["run", "phase", "variable", "status", "measured step s", "predicted step s", "TFLOP/s/GPU",
             "reasons"], rows, raw=True))
        ab_rows = [[_e(a["a"]), _e(a["b"]), _e(a.get("variable")), _e(a.get("verdict")), _e(_pct(a.get("delta_pct"))),
                    _e(_ci(a.get("ci_pct"))), _e(a.get("reason", ""))] for a in res["ab"]]
        parts.append("<h2>A/B table (one variable changed)</h2>" + _table(
            ["A", "B", "variable", "verdict", "delta %", "CI %", "reason"], ab_rows, raw=True))
        parts.append("<h2>Winners per phase</h2>" + _table(
            ["phase", "run", "why"], [[w["phase"], w.get("run") or "-", w.get("reason", "")] for w in res["winners"]]))
        eb = evidence_bundle(res)
        if eb:
            rows = [["run", eb["run"]],
                    ["config diff vs reference", "; ".join(f"{k}: {a} → {b}" for k, (a, b) in eb["config_diff"].items())
                     or "none (reference configuration)"],
                    ["versions", ", ".join(f"{k}={v}" for k, v in eb["versions"].items())],
                    ["hardware", ", ".join(f"{k}={v}" for k, v in eb["hardware"].items())],
                    ["semantics label", f"{eb['semantics'].get('label')} ({eb['semantics'].get('routing')}, data "
                                        f"{eb['semantics'].get('data')})"],
                    ["proof of active features", " | ".join(eb["proof"])],
                    ["steady step time", f"{_f(eb['steady_step_time_s'])} s over window {eb['window']}"],
                    ["TFLOP/s/GPU", _f(eb["tflops_per_gpu"])], ["tokens/s/GPU", _f(eb["tokens_per_s_per_gpu"])],
                    ["loss health", eb["loss_health"]], ["peak memory (GiB)", _f(eb["peak_memory_gib"])]]
            parts.append("<h2>Evidence bundle</h2>" + _table(["item", "value"], rows))
    parts.append("</body></html>")
    return "".join(parts)


def render_markdown(data: dict[str, Any]) -> str:
    out = [f"# {data['title']}", "", f"source: `{data['source']}`", ""]

    def table(head: list[str], rows: list[list[Any]]) -> None:
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for r in rows:
            out.append("| " + " | ".join(str(_f(c)).replace("|", "\\|") for c in r) + " |")
        out.append("")

    if data.get("memory"):
        out += ["## Memory per stage (GiB)", ""]
        names = sorted({k for st in data["memory"] for k in st["components"]})
        table(["stage", *names, "total"], [[st["stage"], *[st["components"].get(n, 0.0) for n in names],
                                            sum(st["components"].values())] for st in data["memory"]])
    if data.get("walls"):
        out += ["## Time per wall (s)", ""]
        table(["wall", "seconds"], sorted(data["walls"].items(), key=lambda kv: -kv[1]))
    if data.get("plan_candidates"):
        out += ["## Candidates", ""]
        table(["#", "layout", "step s", "tokens/s/GPU", "free GiB (most loaded rank)"],
              [[c.get("index"), c.get("label", ""), (c.get("time") or {}).get("step_time_s"),
                (c.get("time") or {}).get("tokens_per_s_per_gpu"), free_gib(c.get("memory") or {})]
               for c in data["plan_candidates"][:20]])
    res = data.get("results")
    if res:
        out += ["## Runs and acceptance", ""]
        table(["run", "phase", "status", "measured step s", "predicted step s", "reasons"],
              [[r["run"], r["phase"], "pending" if r.get("status") == "pending" else "accepted" if r["accepted"] else "REJECTED", r.get("step_time_s"),
                (r.get("predicted") or {}).get("step_time_s"), "; ".join(r["reasons"])] for r in res["runs"]])
        out += ["## A/B table", ""]
        table(["A", "B", "variable", "verdict", "delta %", "reason"],
              [[a["a"], a["b"], a.get("variable"), a.get("verdict"), a.get("delta_pct"), a.get("reason", "")]
               for a in res["ab"]])
        out += ["## Winners", ""]
        table(["phase", "run", "why"], [[w["phase"], w.get("run") or "-", w.get("reason", "")] for w in res["winners"]])
        eb = evidence_bundle(res)
        if eb:
            out += ["## Evidence bundle", ""]
            table(["item", "value"], [[k, v] for k, v in eb.items()])
    return "\n".join(out) + "\n"
