"""The ``moetune serve`` JSON API, driven with Starlette's TestClient: every endpoint returns what the CLI prints
with ``--json`` on the same inputs (uploads compared with the CLI run next to the file), bad requests get a 4xx
with the CLI's one-line message and the server keeps serving; uploads stay in a per-request temp dir; the page and
its assets are local; the page's charts are the report's charts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.conftest import DATA, REPO, run_cli

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from moetune.web.app import create_app, static_dir  # noqa: E402

QUERY = {"model": "Qwen3-30B-A3B", "system": "DGX-H100", "gpus": 16, "gbs": 1024, "seq": 4096}
BRIDGE_YAML = REPO / "tests" / "fixtures" / "memory_bridge_small.yaml"
LOG = DATA / "logs" / "log_iteration_1.txt"
OOM_LOG = DATA / "logs" / "log_oom_message_1.txt"
TRACE = DATA / "traces" / "deepseek_profile_data_train.json"


@pytest.fixture(scope="module")
def uploads_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("uploads")


@pytest.fixture(scope="module")
def client(uploads_root):
    return TestClient(create_app(tmp_root=str(uploads_root)))


def flags(d: dict) -> list[str]:
    return [x for k, v in d.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def cli_json(*args: str, cwd: Path | None = None, ok=(0,)) -> dict:
    r = run_cli(*args, "--json", cwd=cwd)
    assert r.returncode in ok, r.stderr
    return json.loads(r.stdout)


def cli_error(*args: str) -> str:
    r = run_cli(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip().splitlines()[-1]
    return line.removeprefix("error: ")


def _no_timing(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k != "seconds"}


# ------------------------------------------------------------------------------------------ same JSON as the CLI


def test_plan_query_string_equals_cli(client):
    r = client.get("/api/plan", params=QUERY)
    assert r.status_code == 200, r.text
    api = r.json()
    cli = cli_json("plan", *flags(QUERY))
    assert _no_timing(api) == _no_timing(cli)
    assert api["candidates"][0]["layout"]["ep"] >= 1 and len(api["candidates"]) >= 2


def test_plan_json_body_with_pins_equals_cli(client):
    body = {**QUERY, "fix": "pp=2,recompute=selective", "top": 3}
    r = client.post("/api/plan", json=body)
    assert r.status_code == 200, r.text
    cli = cli_json("plan", *flags(body))
    assert _no_timing(r.json()) == _no_timing(cli)
    assert all(c["layout"]["pp"] == 2 for c in r.json()["candidates"])


def test_plan_hf_config_upload_equals_cli(client):
    hf = DATA / "models" / "hf_qwen3-30b-a3b.json"
    job = {k: v for k, v in QUERY.items() if k != "model"}
    with hf.open("rb") as f:
        r = client.post("/api/plan", files={"model": (hf.name, f)}, data={k: str(v) for k, v in job.items()})
    assert r.status_code == 200, r.text
    cli = cli_json("plan", "--model", hf.name, *flags(job), cwd=hf.parent)
    assert _no_timing(r.json()) == _no_timing(cli)
    assert r.json()["request"]["model"] == "hf_qwen3-30b-a3b"


def test_estimate_json_and_form_equal_cli(client):
    body = {**QUERY, "ep": 8, "recompute": "full", "mbs": 2, "dispatcher": "deepep"}
    cli = cli_json("estimate", *flags(body))
    assert client.post("/api/estimate", json=body).json() == cli
    # form fields are text: converted to the flags' types from the command's schema
    assert client.post("/api/estimate", data={k: str(v) for k, v in body.items()}).json() == cli


def test_estimate_bridge_yaml_upload_equals_cli(client):
    with BRIDGE_YAML.open("rb") as f:
        r = client.post("/api/estimate", files={"bridge_config": (BRIDGE_YAML.name, f)},
                        data={"system": "DGX-H100", "gpus": "8"})
    assert r.status_code == 200, r.text
    cli = cli_json("estimate", "--bridge-config", BRIDGE_YAML.name, "--system", "DGX-H100", "--gpus", "8",
                   cwd=BRIDGE_YAML.parent)
    assert r.json() == cli


def test_check_upload_equals_cli(client):
    with BRIDGE_YAML.open("rb") as f:
        r = client.post("/api/check", files={"args": (BRIDGE_YAML.name, f)},
                        data={"args": "model.expert_model_parallel_size=8", "gpus": "8"})
    assert r.status_code == 200, r.text
    cli = cli_json("check", BRIDGE_YAML.name, "model.expert_model_parallel_size=8", "--gpus", "8",
                   cwd=BRIDGE_YAML.parent, ok=(0, 1))
    assert r.json() == cli
    assert r.json()["findings"], "the fixture has findings to show"


def test_logs_and_diagnose_uploads_equal_cli(client):
    with LOG.open("rb") as f:
        r = client.post("/api/logs", files={"files": (LOG.name, f)})
    assert r.status_code == 200, r.text
    assert r.json() == cli_json("logs", LOG.name, cwd=LOG.parent)
    assert r.json()["runs"][0]["file"] == LOG.name
    with OOM_LOG.open("rb") as f:
        r = client.post("/api/diagnose", files={"files": (OOM_LOG.name, f)})
    assert r.status_code == 200, r.text
    cli = cli_json("diagnose", OOM_LOG.name, cwd=OOM_LOG.parent)
    assert r.json() == cli and cli["findings"][0]["kind"] == "oom"


def test_trace_upload_equals_cli(client):
    with TRACE.open("rb") as f:
        r = client.post("/api/trace", files={"paths": (TRACE.name, f)})
    assert r.status_code == 200, r.text
    assert r.json() == cli_json("trace", TRACE.name, cwd=TRACE.parent)
    rank = r.json()["ranks"][0]
    assert rank["hidden_comm_s"] > 0 and rank["exposed_comm_s"] > 0


def test_catalog_endpoints_equal_cli(client):
    assert client.get("/api/catalog/models").json() == cli_json("catalog", "models")
    assert client.get("/api/catalog/systems").json() == cli_json("catalog", "systems")


def test_printed_command_line_becomes_the_same_call(client):
    """/ui/reproduce turns a printed `moetune estimate ...` line (a plan candidate's reproduce line) into the
    arguments of /api/estimate, every spelling of the CLI's options included; the answer equals the CLI's."""
    import shlex

    plan = client.get("/api/plan", params={**QUERY, "top": 2}).json()
    lines = [c["reproduce"] for c in plan["candidates"] if c.get("reproduce")] or [
        "moetune estimate --model Qwen3-30B-A3B --system DGX-H100 --gpus 16 --gbs 1024 --seq 4096 --ep 8 "
        "--natural-routing --no-dist-opt --recompute full --cuda-graph-scope attn,moe_router"]
    for line in lines:
        r = client.post("/ui/reproduce", json={"line": line})
        assert r.status_code == 200, r.text
        assert r.json()["command"] == "estimate"
        api = client.post("/api/estimate", json=r.json()["args"])
        assert api.status_code == 200, api.text
        assert api.json() == cli_json(*shlex.split(line)[1:])
    bad = client.post("/ui/reproduce", json={"line": "moetune estimate --gpuz 16"})
    assert bad.status_code == 400 and "--gpuz" in bad.json()["error"]
    assert client.post("/ui/reproduce", json={"line": "rm -rf /"}).status_code == 400


# ------------------------------------------------------------------------------------------ bad requests


@pytest.mark.parametrize("body, cli_args", [
    ({**QUERY, "model": "Qwen9-Nope"}, ["plan", *flags({**QUERY, "model": "Qwen9-Nope"})]),
    ({**QUERY, "fix": "tp=two"}, ["plan", *flags({**QUERY, "fix": "tp=two"})]),
    ({**QUERY, "max_recompute": "most"}, ["plan", *flags({**QUERY, "max_recompute": "most"})]),
])
def test_bad_plan_requests_get_the_cli_message(client, body, cli_args):
    r = client.post("/api/plan", json=body)
    assert r.status_code == 400
    assert r.json() == {"error": cli_error(*cli_args), "exit_code": 2}


def test_bad_estimate_gets_the_cli_message(client):
    body = {**QUERY, "tp": 3}
    r = client.get("/api/estimate", params=body)
    assert r.status_code == 400
    assert r.json()["error"] == cli_error("estimate", *flags(body))


def test_malformed_requests_are_4xx_and_the_server_keeps_serving(client):
    cases = [
        client.get("/api/plan", params={**QUERY, "gpus": "sixteen"}),
        client.post("/api/plan", json={**QUERY, "gpus": [16, 32]}),
        client.post("/api/plan", json={"modle": "Qwen3-30B-A3B"}),
        client.post("/api/plan", content=b"{not json", headers={"Content-Type": "application/json"}),
        client.post("/api/plan", content=b"[1, 2]", headers={"Content-Type": "application/json"}),
        client.post("/api/logs", files={"files": ("empty.log", b"nothing here\n")}),
        client.post("/api/estimate", json={**QUERY, "model": "/etc/hostname.json"}),
    ]
    for r in cases:
        assert 400 <= r.status_code < 500, r.text
        msg = r.json()["error"]
        assert msg and "\n" not in msg and "Traceback" not in msg
    assert "gpus" in cases[0].json()["error"] and "modle" in cases[2].json()["error"]
    assert "outside" in cases[6].json()["error"] and "moetune-serve-" not in cases[6].json()["error"]
    assert client.get("/api/nope").status_code == 404
    assert client.get("/api/plan", params=QUERY).status_code == 200


def test_upload_cap_and_temp_dir(tmp_path):
    c = TestClient(create_app(max_upload_bytes=4096, tmp_root=str(tmp_path)))
    r = c.post("/api/logs", files={"files": ("big.log", b"x" * 10_000)})
    assert r.status_code == 413 and "upload cap" in r.json()["error"]
    with LOG.open("rb") as f:
        assert c.post("/api/logs", files={"files": (LOG.name, f)}).status_code == 200
    assert list(tmp_path.iterdir()) == []  # every request's uploads were removed


def test_uploaded_names_cannot_escape(client, uploads_root):
    with LOG.open("rb") as f:
        r = client.post("/api/logs", files={"files": ("../../evil/..log", f)})
    assert r.status_code == 200, r.text
    assert r.json()["runs"][0]["file"] == "log"
    assert list(uploads_root.iterdir()) == []


# ------------------------------------------------------------------------------------------ page, assets, charts


def test_page_and_assets_are_local(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    refs = re.findall(r"""(?:src|href)=["']([^"']+)""", page.text)
    assert refs and all(ref.startswith("/assets/") for ref in refs)
    for ref in refs:
        assert client.get(ref).status_code == 200
    js = (static_dir() / "app.js").read_text()
    assert not re.search(r"https?://", js)  # no CDN, no network: the page talks only to its own server
    assert set(re.findall(r"""fetch\(\s*["'`]([^"'`]+)""", js)) <= {"/api/", "/ui/charts", "/ui/reproduce", "/api/schema"}
    assert client.get("/assets/../app.py").status_code == 404


def test_assets_ship_as_package_data():
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["moetune"]
    assert "web/static/*" in data
    assert {p.name for p in static_dir().iterdir()} >= {"index.html", "app.js", "app.css"}


def test_page_charts_are_the_report_charts(client, tmp_path):
    """One chart code: /ui/charts for the CLI plan's #1 returns the very SVG the static report embeds."""
    from moetune.report.data import load_report_input
    from moetune.report.render import render_html

    plan = cli_json("plan", *flags(QUERY))
    p = tmp_path / "PLAN.json"
    p.write_text(json.dumps(plan))
    report = render_html(load_report_input(p))
    ch = client.post("/ui/charts", json={"result": plan["candidates"][0], "candidates": plan["candidates"]}).json()
    for key in ("memory", "walls", "throughput"):
        assert ch[key] and ch[key].startswith("<svg class='mt-chart'") and ch[key] in report
    # the memory chart stacks every component of every pipeline rank, against HBM
    gib = sum(float(x) for x in re.findall(r"data-gib='([0-9.]+)' x=", ch["memory"]))
    assert gib == pytest.approx(sum(sum(s["components"].values()) for s in plan["candidates"][0]["memory"]["stages"]),
                                rel=1e-4)
    assert f"data-gib='{plan['candidates'][0]['memory']['capacity_gib']:.4f}'" in ch["memory"]


def test_trace_charts(client):
    trace = cli_json("trace", str(TRACE))
    ch = client.post("/ui/charts", json={"trace": trace}).json()
    assert len(ch["comm"]) == len(trace["ranks"]) and "data-chart='comm'" in ch["comm"][0]
    assert client.post("/ui/charts", content=b"nope", headers={"Content-Type": "application/json"}).status_code == 400


def test_serve_command_rejects_bad_flags():
    r = run_cli("serve", "--port", "70000")
    assert r.returncode == 2 and "--port" in r.stderr and "Traceback" not in r.stderr


def test_moetune_serve_listens_on_localhost():
    """The real command: ``moetune serve`` binds 127.0.0.1 and answers the API over HTTP."""
    import urllib.request

    from tests.test_web_chromium import Server

    srv = Server()
    try:
        assert srv.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(srv.url + "/api/catalog/systems", timeout=30) as r:
            assert json.load(r) == cli_json("catalog", "systems")
    finally:
        srv.close()
