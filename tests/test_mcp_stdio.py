"""`python -m moetune mcp` as a subprocess over stdio: paths outside --root are refused (`../`, absolute, symlinks),
wrong types and unknown names are tool errors, and the server keeps serving after each."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _server(root: Path, *extra: str) -> StdioServerParameters:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return StdioServerParameters(command=sys.executable, args=["-m", "moetune", "mcp", "--root", str(root), *extra],
                                 env=env, cwd=str(root.parent))


def test_stdio_server_confines_paths_and_survives_bad_calls(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(REPO / "examples/hf/qwen3-30b-a3b_config.json", root / "config.json")
    secret = tmp_path / "outside.json"
    shutil.copy(REPO / "examples/hf/qwen3-30b-a3b_config.json", secret)
    (root / "link.json").symlink_to(secret)
    (root / "linkdir").symlink_to(tmp_path)
    outside_dir = tmp_path / "elsewhere"

    refused = [
        ("model_show", {"name": "../outside.json"}),
        ("model_show", {"name": str(secret)}),
        ("model_show", {"name": "link.json"}),
        ("model_show", {"name": "linkdir/outside.json"}),
        ("logs", {"files": ["config.json", "../outside.json"]}),
        ("estimate", {"megatron_args": "../../etc/passwd", "gpus": 8}),
        ("sweep_init", {"baseline": "config.json", "out": str(outside_dir)}),
        ("calibrate", {"csv_file": "../x.csv"}),
        ("layout", {"gpus": 8, "model": "linkdir/outside.json"}),
        ("plan", {"model": "Qwen3-30B-A3B", "gpus": 8, "gbs": 64, "seq": 1024, "save_json": "../plan.json"}),
    ]
    wrong = [
        ("layout", {"gpus": "eight"}, "expected an integer"),
        ("layout", {"gpus": 8.5}, "expected an integer"),
        ("layout", {"gpus": 8, "sequence_parallel": "yes"}, "expected true or false"),
        ("logs", {"files": 3}, "expected a string"),
        ("layout", {"gpus": 8, "gpuz": 1}, "unknown argument"),
        ("model_show", {"name": "Qwen9-1T"}, "unknown model 'Qwen9-1T'"),
        ("layout", {"gpus": 8, "system": "DGX-Z9"}, "unknown system"),
        ("no_such_tool", {}, "unknown tool 'no_such_tool'"),
        ("sweep_submit", {"directory": "sweep"}, "--allow-submit"),
        ("catalog", {"kind": "gpus"}, "kind='gpus': expected one of models, systems"),
    ]

    async def go():
        async with Client(_server(root)) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "plan" in names and "sweep_submit" not in names
            for tool, args in refused:
                r = await c.call_tool(tool, args)
                assert r.is_error, (tool, args)
                assert "outside the allowed root" in r.content[0].text, (tool, r.content[0].text)
                ok = await c.call_tool("model_show", {"name": "config.json"})
                assert not ok.is_error and ok.structured_content["num_moe_experts"] == 128
            for tool, args, text in wrong:
                r = await c.call_tool(tool, args)
                assert r.is_error and text in r.content[0].text, (tool, args, r.content[0].text)
                assert "\n" not in r.content[0].text.strip()
                ok = await c.call_tool("layout", {"gpus": 16, "ep": 8})
                assert not ok.is_error and ok.structured_content["edp"] == 2
            # nothing was written outside the root
            assert not outside_dir.exists() and not (tmp_path / "plan.json").exists()

    anyio.run(go)
