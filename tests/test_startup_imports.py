"""What ``moetune plan`` does outside its search (issue 19, start-up): the modules it imports and the shortcuts that
replace heavier paths, each compared with the path it replaces.

- ``moetune plan --json`` imports neither the click package (typer 0.2x vendors click as ``typer._click``), nor rich
  (the consoles are made on their first print; the default's notice is plain text), nor the sweep's contract models
  (the Slurm script needs only ``sweep.launcher.Launcher``).
- ``output.console`` / ``err_console`` print what a rich ``Console`` with the same settings prints.
- The plan's notices, written without rich, are what rich printed.
- The console script runs the planner without pydantic plugins unless the user's environment says otherwise.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

PLAN = ["plan", "--model", "OLMoE-1B-7B", "--gpus", "8", "--gbs", "64", "--seq", "2048", "--top", "2", "--json"]


def test_plan_json_imports_no_click_rich_or_contract():
    code = (
        "import json, sys\n"
        "from moetune.cli import main\n"
        "try:\n"
        f"    main({PLAN!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "mods = sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'rich')\n"
        "              or m in ('moetune.sweep.contract', 'moetune.sweep.phases'))\n"
        "sys.stderr.write('MODS ' + json.dumps(mods) + '\\n')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(SRC), "MOETUNE_WORKERS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "MODS []" in res.stderr, res.stderr[-2000:]
    assert '"slurm_script": "#!/bin/bash' in res.stdout  # the launch config (and its Slurm script) was rendered


@pytest.mark.parametrize("stderr", [False, True])
@pytest.mark.parametrize("width", [None, 100, 40])
def test_first_print_console_prints_like_a_console(stderr, width, monkeypatch):
    """Markup, styles, soft wrapping, tables: the same bytes as a rich ``Console`` with the same settings."""
    from rich.console import Console
    from rich.table import Table

    from moetune.output import _FirstPrintConsole

    def show(con):
        t = Table("name", "value")
        t.add_row("tp", "8")
        con.print("[bold]moetune plan[/] DeepSeek-V3 on 256 x DGX-H100 :smile: [1, 2]")
        con.print("fit rule: " + "x" * 150, style="dim", markup=False)
        con.print("reproduce: moetune estimate --tp 8 " + "--a b " * 30, markup=False, soft_wrap=True, style="dim")
        con.print(t)

    settings = {"highlight": False, "soft_wrap": True, "width": width, **({"stderr": True} if stderr else {})}
    out = {}
    for kind in ("rich", "lazy"):
        buf = io.StringIO()
        monkeypatch.setattr(sys, "stderr" if stderr else "stdout", buf)
        show(Console(**settings) if kind == "rich" else _FirstPrintConsole(**settings))
        out[kind] = buf.getvalue()
    assert out["lazy"] == out["rich"]
    assert "moetune plan" in out["lazy"]


@pytest.mark.parametrize("argv", [[], ["--gpus", "64"], ["--model", "OLMoE-1B-7B", "--gbs", "64"]])
def test_plan_notices_are_what_rich_printed(argv, monkeypatch, capsys):
    """The plan's default notices go to stderr without rich; rich (the former path) prints the same text."""
    from rich.console import Console

    from moetune.output import PIPE_WIDTH

    seen = []

    def stop(req):
        seen.append(req)
        raise SystemExit(0)

    monkeypatch.setattr("moetune.plan.search.plan", stop)
    from moetune.cli import main

    with pytest.raises(SystemExit):
        main(["plan", *argv])
    assert seen
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and notice.startswith(("Planning the embedded default", "defaults used for:"))
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    Console(stderr=True, highlight=False, soft_wrap=True, width=PIPE_WIDTH).print(notice[:-1])
    assert buf.getvalue() == notice


def _entry_env(argv: list[str], env: dict[str, str]) -> str:
    code = ("import os, sys\nimport moetune.cli as c\n"
            "def record(argv=None):\n"
            "    print('VALUE', repr(os.environ.get('PYDANTIC_DISABLE_PLUGINS')), flush=True)\n"
            f"sys.argv = ['moetune', *{argv!r}]\n"
            "c.main = record\nc.entry()\n")
    base = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**base, "PYTHONPATH": str(SRC), **env})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.split("VALUE ", 1)[1].strip()


@pytest.mark.parametrize(("argv", "env", "value"), [
    (["plan", "--json"], {}, "'__all__'"),
    (["estimate", "--tp", "2"], {}, "'__all__'"),
    (["plan"], {"PYDANTIC_DISABLE_PLUGINS": ""}, "''"),  # the user's setting wins, empty included
    (["plan"], {"PYDANTIC_DISABLE_PLUGINS": "logfire"}, "'logfire'"),
    (["sweep", "submit", "x"], {}, "None"),  # starts sbatch, which passes the environment on to the job
    (["--help"], {}, "None"),
])
def test_entry_turns_pydantic_plugins_off_for_the_planner_only(argv, env, value):
    assert _entry_env(argv, env) == value


def test_table_reads_the_launch_config_of_the_first_candidate_only(capsys):
    """A text plan makes the launch config (Bridge / Megatron-LM / Slurm) of #1 only: the table of a plan's JSON is
    the same with and without the launch configs of the other candidates."""
    import json

    from moetune.cli import main
    from moetune.commands.plan import _render

    with pytest.raises(SystemExit) as exc:
        main(PLAN)
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["candidates"]) > 1 and all("launch" in c for c in out["candidates"])
    _render(out)
    full = capsys.readouterr().out
    for c in out["candidates"][1:]:
        del c["launch"]
    _render(out)
    assert capsys.readouterr().out == full
    assert "Launch #1" in full and "Bridge overrides" in full


def _sanitize(obj):
    """Replace non-finite floats by None (JSON has no NaN/inf): the former ``output._sanitize``."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_sanitize(v) for v in obj]
    return obj


def _former_to_json_bytes(obj, *, indent=True):
    """``output.to_json_bytes`` with the Python pass over every value that replaced non-finite floats (the oracle)."""
    import orjson

    from moetune.output import _default, _plain

    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    try:
        obj = orjson.loads(orjson.dumps(obj, default=_default, option=opts))
    except orjson.JSONEncodeError:
        obj = _plain(obj)
    return orjson.dumps(_sanitize(obj), option=orjson.OPT_INDENT_2 if indent else 0)


def test_json_output_equals_the_sanitising_path():
    """NaN / inf (Python, numpy scalars and arrays, in keys' values, in tuples, behind ``__json__`` and pydantic),
    big integers (the pure-Python path), the plan's result types: the same bytes as with the ``_sanitize`` pass."""
    import dataclasses
    import enum
    import math
    from pathlib import Path

    import numpy as np

    from moetune.output import to_json_bytes
    from moetune.spec.features import Features

    @dataclasses.dataclass
    class Row:
        x: float
        y: tuple

    class Color(enum.Enum):
        RED = "red"

    class Custom:
        def __json__(self):
            return {"v": math.nan, "w": (1.0, math.inf)}

    nan, inf = math.nan, math.inf
    cases = [
        nan, inf, -inf, 1.5, -0.0, None, "s", [nan, (inf, 2)], {"a": nan, 3: (1, -inf), 2.5: [np.float64(nan)]},
        np.array([1.0, np.nan, np.inf]), np.float32(np.inf), {"n": np.int64(7), "p": Path("/x"), "c": Color.RED},
        {"set": {3, 1, 2}, "cx": 1 + 2j, "row": Row(nan, (inf, 1))}, Custom(), Features(), {"big": 2**70, "f": nan},
        [2**64, (nan, inf), {"k": -(2**63) - 1}], {"deep": [[[{"z": [nan] * 3}]]]},
    ]
    for obj in cases:
        for indent in (True, False):
            assert to_json_bytes(obj, indent=indent) == _former_to_json_bytes(obj, indent=indent), obj
