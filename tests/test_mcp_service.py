"""moetune.service: in-process commands with the CLI's flags, JSON and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moetune import service

REPO = Path(__file__).resolve().parents[1]


def _cli(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moetune", *argv], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=120)


def test_every_json_command_is_exposed_with_its_flags():
    import typer.main

    from moetune.cli import app

    root = typer.main.get_command(app)
    cmds = service.commands()
    assert {"plan", "estimate", "check", "layout", "flops", "model show", "catalog models", "logs", "diagnose",
            "compare", "trace", "sweep init", "report", "calibrate"} <= set(cmds)
    for name, cmd in cmds.items():
        click_cmd = root
        for part in name.split():
            click_cmd = click_cmd.commands[part]
        flags = {o for p in click_cmd.params for o in p.opts if o.startswith("--")} - {"--json"}
        assert {a.flag for a in cmd.args.values() if a.flag} <= flags
        longs = {p.opts[0] if p.opts[0].startswith("--") else next(o for o in p.opts if o.startswith("--"))
                 for p in click_cmd.params if any(o.startswith("--") for o in p.opts)} - {"--json"}
        assert longs == {a.flag for a in cmd.args.values() if a.flag}, name
        sch = cmd.schema()
        assert sch["type"] == "object" and set(sch["properties"]) == set(cmd.args)
        for a in cmd.args.values():
            if a.flag:
                assert a.name == a.flag[2:].replace("-", "_")


def test_schema_types_follow_the_annotations():
    est = service.schema("estimate")["properties"]
    assert est["gpus"]["type"] == "integer"
    assert est["routing_imbalance"]["type"] == "number"
    # tri-state feature flags: unset means "as the starting features (Bridge recipe / library defaults) have it"
    assert est["dist_opt"]["type"] == "boolean" and est["dist_opt"].get("default") is None
    assert est["explain"]["type"] == "boolean" and est["explain"]["default"] is False
    assert est["overrides"] == {"type": "array", "items": {"type": "string"}, **{k: est["overrides"][k]
                                                                                    for k in ("description",)}}
    assert "json" not in est and "json_out" not in est
    assert service.schema("plan")["properties"]["top"]["default"] == service.get_command("plan")._click.params[
        [p.name for p in service.get_command("plan")._click.params].index("top")].default
    assert service.schema("flops")["required"] == ["model", "seq"]


def test_call_equals_cli_json():
    args = {"gpus": 64, "tp": 2, "pp": 2, "ep": 8, "model": "Qwen3-30B-A3B", "tp_pp_dp_mapping": False,
            "sequence_parallel": True}
    argv = service.build_argv(service.get_command("layout"), args)
    assert "--sequence-parallel" in argv and "--tp-pp-dp-mapping" not in argv
    got = service.run("layout", args)
    cli = _cli(*argv)
    assert cli.returncode == 0, cli.stderr
    assert got == json.loads(cli.stdout)


def test_errors_carry_the_cli_line():
    for args in ({"gpus": 3, "tp": 2}, {"model": "Nope-1B", "gpus": 8}):
        with pytest.raises(service.CommandError) as ei:
            service.run("layout", args)
        cli = _cli(*service.build_argv(service.get_command("layout"), args))
        assert cli.returncode == 2
        assert cli.stderr.strip() == f"error: {ei.value}"
        assert ei.value.exit_code == 2


@pytest.mark.parametrize("args, text", [
    ({"gpus": "eight"}, "--gpus='eight': expected an integer"),
    ({"gpus": True}, "expected an integer"),
    ({"gpus": 8, "sequence_parallel": "yes"}, "expected true or false"),
    ({"gpus": 8, "gpuz": 1}, "unknown argument"),
    ({"gpus": [8]}, "not a list"),
])
def test_bad_arguments_are_one_line_errors(args, text):
    with pytest.raises(service.CommandError, match=text.replace("[", r"\[")):
        service.run("layout", args)


def test_unknown_command():
    with pytest.raises(service.CommandError, match="unknown command 'plam'; closest: plan"):
        service.run("plam", {})


def test_paths_are_confined_to_the_root(tmp_path):
    (tmp_path / "inside").mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (tmp_path / "inside" / "link.json").symlink_to(outside)
    root = tmp_path / "inside"
    for bad in ("../outside.json", str(outside), "link.json"):
        with pytest.raises(service.OutsideRootError, match="outside the allowed root"):
            service.run("model show", {"name": bad}, root=root)
    # a catalog name is not a path; a path inside the root is read (and fails on its content, not the root)
    assert service.run("model show", {"name": "Qwen3-30B-A3B"}, root=root)["name"] == "Qwen3-30B-A3B"
    (root / "empty.json").write_text("{}")
    with pytest.raises(service.CommandError) as ei:
        service.run("model show", {"name": "empty.json"}, root=root)
    assert not isinstance(ei.value, service.OutsideRootError)


def test_output_is_bounded():
    with pytest.raises(service.CommandError, match="exceeds 1000 bytes"):
        service.run("catalog models", {}, max_output_bytes=1000)


def test_json_printed_before_exit_1_is_a_result():
    args = {"recipe": "deepseek_v3_pretrain_256gpu_b200_bf16_config", "args": ["model.expert_model_parallel_size=3"]}
    res = service.call("check", args)
    cli = _cli(*service.build_argv(service.get_command("check"), args))
    assert res.exit_code == cli.returncode == 1
    assert res.data == json.loads(cli.stdout)
    assert any(f["id"] == "PAR-002" for f in res.data["findings"])


def test_a_log_without_iterations_is_an_error_with_exit_code_1():
    with pytest.raises(service.CommandError) as ei:
        service.run("logs", {"files": ["README.md"]}, root=REPO)
    assert ei.value.exit_code == 1 and "no training iterations" in str(ei.value)
