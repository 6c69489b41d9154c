"""Report rendering from PLAN.json / ESTIMATE.json: self-contained HTML with inline SVG plots, and Markdown."""

from __future__ import annotations

import json
import re

from tests.conftest import REPO, run_cli

from moetune.report.data import load_report_input, memory_stages, time_walls
from moetune.report.render import render_html, render_markdown

PLAN = REPO / "tests" / "fixtures" / "sweep" / "PLAN.json"


def test_plan_report_is_self_contained(tmp_path):
    out = tmp_path / "plan.html"
    r = run_cli("report", str(PLAN), "--html", str(out), "--md", str(tmp_path / "plan.md"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kind"] == "plan"
    text = out.read_text()
    assert text.count("<svg") == 3  # memory per stage, time per wall, throughput vs headroom
    assert not re.search(r"""(src|href)=["']?(https?:|file:|/)""", text)  # nothing external
    assert "TP1 PP2 VPP2 CP1 EP8" in text
    md = (tmp_path / "plan.md").read_text()
    lines = md.splitlines()
    head = lines[lines.index("## Memory per stage (GiB)") + 2]
    assert head.startswith("| stage |") and "activations" in head and head.endswith("| total |")


def test_memory_stages_stack_every_component():
    plan = json.loads(PLAN.read_text())
    st = memory_stages(plan["candidates"][0]["memory"])
    assert [s["stage"] for s in st] == [0, 1]
    assert abs(sum(st[0]["components"].values()) - plan["candidates"][0]["memory"]["stages"][0]["peak_gib"]) < 1e-6
    assert time_walls({"walls": {"compute": 1.0, "exposed_comm": {"a2a": 0.2, "dp": {"seconds": 0.1}}}}) == \
        {"compute": 1.0, "exposed_comm:a2a": 0.2, "exposed_comm:dp": 0.1}


def test_estimate_report(tmp_path):
    est = {"memory": {"capacity_gib": 80, "stages": [{"stage": 0, "components": [
        {"name": "weights", "gib": 10.0}, {"name": "activations", "gib": 30.0}]}]},
           "time": {"step_time_s": 2.0, "walls": {"compute": 1.5, "communication": 0.5}}}
    p = tmp_path / "E.json"
    p.write_text(json.dumps(est))
    data = load_report_input(p)
    assert data["kind"] == "estimate" and data["memory"][0]["components"] == {"weights": 10.0, "activations": 30.0}
    html = render_html(data)
    assert html.count("<svg") == 2
    assert "compute" in render_markdown(data)
