"""moetune mcp: the SDK's in-memory client lists the tools and calls every one on real inputs (results equal to the
CLI's --json), reads the resources and prompts, and runs every skill eval's expected calls and facts."""

from __future__ import annotations

import json
import math
import shlex
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402

from moetune import service  # noqa: E402
from moetune.mcp.server import MoetuneMCP  # noqa: E402
from moetune.mcp.tools import SAVE_ARG, TOOLS  # noqa: E402
from test_skills import run_cli  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EX = "examples"
Q = {"model": "Qwen3-30B-A3B", "system": "DGX-H100", "gpus": 16, "gbs": 1024, "seq": 4096}

#: every tool with real inputs from examples/ (paths relative to the root)
CALLS: dict[str, dict[str, Any]] = {
    "plan": {**Q, "top": 2},
    "estimate": {"megatron_args": f"{EX}/megatron/gpt3_moe_tp2_pp2_ep4_etp1_model_config.yaml", "system": "DGX-H100",
                 "gpus": 8, "explain": True},
    "check": {"args": [f"{EX}/bridge/qwen3_30b_a3b_16gpu_h100_bf16.yaml", "model.expert_model_parallel_size=8"],
              "gpus": 16, "fix": True},
    "layout": {"gpus": 16, "ep": 8, "model": f"{EX}/hf/qwen3-30b-a3b_config.json", "gbs": 1024, "seq": 4096},
    "flops": {"model": "Qwen3-30B-A3B", "seq": 4096, "gbs": 1024},
    "model_show": {"name": f"{EX}/hf/qwen3-30b-a3b_config.json"},
    "catalog": {"kind": "models"},
    "logs": {"files": [f"{EX}/logs/baseline_dgx_h100_golden.json", f"{EX}/logs/mixtral_16xh100_iterations.txt"],
             "gpus": 8},
    "diagnose": {"files": [f"{EX}/logs/crash_oom.txt", f"{EX}/logs/slowdown_within_run.txt"]},
    "compare": {"a": f"{EX}/logs/baseline_dgx_h100_golden.json", "b": f"{EX}/logs/candidate_dgxh100_dgxc_golden.json",
                "gpus": 8},
    "trace": {"paths": [f"{EX}/traces/hta_trace_filter_sampled_rank-0.json.gz",
                        f"{EX}/traces/hta_trace_filter_sampled_rank-1.json.gz"]},
    "sweep_init": {"from_plan": "plan.json", "out": "sweep", "recipe": "qwen3_30b_a3b_pretrain_config"},
    "sweep_collect": {"directory": "sweep"},
    "report": {"source": "plan.json"},
    "calibrate": {"csv_file": f"{EX}/calibration/bridge_published_h100.csv", "params": "gemm_eff.hopper.bf16",
                  "out": "eff.yaml"},
    "recipes": {"model": "Qwen3-30B-A3B", "system": "DGX-H100"},
}
_VOLATILE = {"seconds", "created"}  # wall-clock time of the search and of a sweep's creation


def _stable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _stable(v) for k, v in x.items() if k not in _VOLATILE}
    if isinstance(x, list):
        return [_stable(v) for v in x]
    return x


def _argv(tool: str, args: dict[str, Any]) -> list[str]:
    spec = next(t for t in TOOLS if t.name == tool)
    command, cargs = spec.command_for(dict(args))
    return service.build_argv(service.get_command(command), cargs)


def _cli_json(argv: list[str]) -> Any:
    code, out, err = run_cli("moetune " + shlex.join(argv))
    assert code in (0, 1), err
    return json.loads(out)


def _root(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    shutil.copytree(REPO / "examples", root / "examples")
    return root


async def _session(root: Path, fn, **kw):
    async with Client(MoetuneMCP(root, **kw).server) as client:
        return await fn(client)


def test_tool_listing(tmp_path):
    async def go(c):
        return (await c.list_tools()).tools

    tools = anyio.run(_session, tmp_path, go)
    names = {t.name for t in tools}
    required = {"plan", "estimate", "check", "layout", "flops", "model_show", "catalog", "logs", "diagnose",
                "compare", "trace", "sweep_init", "report", "calibrate"}
    assert required <= names
    assert "recipes" in names or "recipes" not in service.commands()
    assert "sweep_submit" not in names and "sweep_status" not in names  # not without --allow-submit
    for t in tools:
        assert "Call" in t.description and "--json" in t.description
        spec = next(s for s in TOOLS if s.name == t.name)
        if len(spec.commands) == 1:
            expect = service.schema(spec.commands[0])
            assert set(t.input_schema["properties"]) == set(expect["properties"]) | {SAVE_ARG}
            assert t.input_schema["required"] == expect["required"]
    cat = next(t for t in tools if t.name == "catalog")
    assert cat.input_schema["properties"]["kind"]["enum"] == ["models", "systems"]


def test_allow_submit_adds_the_slurm_tools(tmp_path):
    async def go(c):
        return {t.name for t in (await c.list_tools()).tools}

    assert {"sweep_submit", "sweep_status"} <= anyio.run(lambda: _session(tmp_path, go, allow_submit=True))


def test_every_tool_equals_the_cli_json(tmp_path, monkeypatch):
    """Each tool on real inputs in root A; the CLI (console-script entry point) with the same argv in root B."""
    root_mcp, root_cli = _root(tmp_path, "mcp"), _root(tmp_path, "cli")
    names = [t.name for t in TOOLS if t.available(service.commands()) and not t.needs_submit]
    assert set(names) <= set(CALLS)

    async def go(c):
        out = {}
        plan_args = {**CALLS["plan"], SAVE_ARG: "plan.json"}
        res = await c.call_tool("plan", plan_args)
        assert not res.is_error, res.content
        out["plan"] = res.structured_content
        for name in names:
            if name == "plan":
                continue
            res = await c.call_tool(name, CALLS[name])
            assert not res.is_error, (name, res.content[0].text)
            assert json.loads(res.content[0].text) == (res.structured_content if "items" not in
                                                       res.structured_content else res.structured_content["items"])
            out[name] = res.structured_content
        return out

    got = anyio.run(_session, root_mcp, go)
    assert json.loads((root_mcp / "plan.json").read_text()) == got["plan"]
    monkeypatch.chdir(root_cli)
    for name in ["plan", *[n for n in names if n != "plan"]]:
        argv = _argv(name, CALLS[name])
        cli = _cli_json(argv)
        if name == "plan":
            Path("plan.json").write_text(json.dumps(cli))
        mcp_obj = got[name]["items"] if isinstance(cli, list) else got[name]
        assert _stable(mcp_obj) == _stable(cli), name


def test_bad_calls_are_tool_errors_with_the_cli_line(tmp_path, monkeypatch):
    root = _root(tmp_path, "r")
    bad = {
        "layout": {"gpus": 3, "tp": 2},
        "model_show": {"name": "Nope-7B"},
        "plan": {**Q, "mbs": "zero"},
        "logs": {"files": ["examples/logs/crash_oom.txt"]},
    }

    async def go(c):
        out = {}
        for name, args in bad.items():
            r = await c.call_tool(name, args)
            assert r.is_error
            out[name] = r.content[0].text
        r = await c.call_tool("layout", {"gpus": 16, "tp": 2, "ep": 8})
        assert not r.is_error  # still serving
        return out

    msgs = anyio.run(_session, root, go)
    monkeypatch.chdir(root)
    for name, args in bad.items():
        code, out, err = run_cli("moetune " + shlex.join(_argv(name, args)))
        assert code in (1, 2) and not out.strip()
        assert err.strip() == f"error: {msgs[name]}", name


def test_resources_and_prompts(tmp_path):
    async def go(c):
        res = (await c.list_resources()).resources
        docs = {str(r.uri): json.loads((await c.read_resource(str(r.uri))).contents[0].text) for r in res}
        prompts = (await c.list_prompts()).prompts
        texts = {p.name: (await c.get_prompt(p.name, {"model": "DeepSeek-V3"} if p.name != "diagnose_regression"
                                             else {"baseline": "a.log", "candidate": "b.log"})).messages[0]
                 for p in prompts}
        return docs, {p.name for p in prompts}, texts

    docs, names, texts = anyio.run(_session, tmp_path, go)
    assert docs["moetune://catalog/models"] == service.run("catalog models", {})
    assert docs["moetune://catalog/systems"] == service.run("catalog systems", {})
    rules = docs["moetune://catalog/rules"]["rules"]
    assert len(rules) == docs["moetune://catalog/rules"]["count"] > 100
    assert all(r["source"] and r["message"] for r in rules) and any(r["fix"] for r in rules)
    eff = docs["moetune://catalog/efficiency"]["params"]
    assert eff and all(p["source"] for p in eff.values())
    assert docs["moetune://catalog/recipes"]["recipes"]
    assert names == {"optimize_moe_throughput", "enable_ep_overlap", "size_parallel_layout", "diagnose_regression"}
    t = texts["optimize_moe_throughput"].content.text
    assert "DeepSeek-V3" in t and t.index("`plan`") < t.index("`estimate`") < t.index("`sweep_init`")
    e = texts["enable_ep_overlap"].content.text
    assert e.index("1. Plain EP overlap on the alltoall") < e.index("2. Delayed wgrad") < e.index("3. Flex dispatcher")
    assert "PP * lcm(TP*CP, ETP*EP)" in texts["size_parallel_layout"].content.text
    assert "`compare` a=a.log, b=b.log" in texts["diagnose_regression"].content.text


# ---------------------------------------------------------------------------------------------------- skill evals

def _get(obj: Any, path: str) -> Any:
    cur: list[Any] = [obj]
    star = False
    for part in path.split("."):
        nxt: list[Any] = []
        for c in cur:
            if part == "*":
                nxt.extend(c)
                star = True
            elif isinstance(c, list):
                nxt.append(c[int(part)])
            else:
                nxt.append(c[part])
        cur = nxt
    return cur if star else cur[0]


def _holds(op: str, got: Any, want: Any, rel: float | None) -> bool:
    if op == "==":
        return got == want
    if op in ("<", "<=", ">", ">="):
        return {"<": got < want, "<=": got <= want, ">": got > want, ">=": got >= want}[op]
    if op == "approx":
        return math.isclose(got, want, rel_tol=rel or 0.05)
    if op == "between":
        return want[0] <= got <= want[1]
    if op == "in":
        return got in want
    if op == "contains":
        return any(want in g if isinstance(g, str) and not isinstance(got, str) else g == want for g in got) \
            if isinstance(got, list) else want in got
    if op == "not_contains":
        return all(not (isinstance(g, str) and g.startswith(want)) for g in got)
    if op == "startswith":
        return str(got).startswith(want)
    if op == "len==":
        return len(got) == want
    raise AssertionError(f"unknown op {op}")


EVALS = sorted((REPO / "skills").glob("*/evals.json"))


def test_every_skill_has_evals():
    assert {p.parent.name for p in EVALS} == {p.parent.name for p in (REPO / "skills").glob("*/SKILL.md")}


@pytest.mark.parametrize("path", EVALS, ids=[p.parent.name for p in EVALS])
def test_skill_evals(path, tmp_path):
    spec = json.loads(path.read_text())
    assert spec["skill"] == path.parent.name and spec["evals"]
    root = _root(tmp_path, "root")

    async def go(c):
        results = []
        for ev in spec["evals"]:
            assert ev["prompt"] and ev["expected_calls"] and ev["facts"]
            outs = []
            for call in ev["expected_calls"]:
                r = await c.call_tool(call["tool"], call["arguments"])
                assert not r.is_error, (ev["id"], call["tool"], r.content[0].text)
                outs.append(r.structured_content)
            results.append(outs)
        return results

    results = anyio.run(_session, root, go)
    for ev, outs in zip(spec["evals"], results, strict=True):
        for fact in ev["facts"]:
            got = _get(outs[fact["call"]], fact["path"])
            want = _get(outs[fact["value_from"]["call"]], fact["value_from"]["path"]) if "value_from" in fact \
                else fact["value"]
            assert _holds(fact["op"], got, want, fact.get("rel")), (ev["id"], fact["fact"], got, want)
