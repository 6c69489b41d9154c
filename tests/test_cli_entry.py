"""The console-script entry (``moetune.cli.entry``) and the one-command app ``moetune.cli.main`` builds.

``entry`` ends the process without the interpreter's teardown (``os._exit`` after the ``atexit`` handlers and a
flush); these tests check that everything a user can observe of a normal exit still happens - exit status, output,
``atexit`` handlers - and that the teardown itself (finalizers of module objects) is skipped. ``_app_for`` gives
typer only the command the arguments name; the answers are those of the whole app.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moetune import __version__
from moetune.cli import _app_for, app

SRC = Path(__file__).resolve().parents[1] / "src"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)})


def test_entry_runs_atexit_flushes_and_skips_teardown():
    code = (
        "import atexit, sys\n"
        "class Noisy:\n"
        "    def __del__(self):\n"
        "        print('TEARDOWN', flush=True)\n"
        "keep = Noisy()  # freed only by the interpreter's teardown\n"
        "atexit.register(lambda: print('ATEXIT'))\n"
        "sys.argv = ['moetune', 'version']\n"
        "from moetune.cli import entry\n"
        "entry()\n"
    )
    res = _run(code)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.split()
    assert lines[0] == __version__
    assert "ATEXIT" in lines  # the handlers ran and their output was flushed
    assert "TEARDOWN" not in lines  # no teardown
    # the same script through main(): a normal exit, with the teardown
    normal = _run(code.replace("from moetune.cli import entry\nentry()", "from moetune.cli import main\nmain()"))
    assert normal.returncode == 0 and "TEARDOWN" in normal.stdout.split()


@pytest.mark.parametrize(("argv", "status"), [(["version"], 0), (["plan", "--model", "No-Such-Model"], 2),
                                              (["no-such-command"], 2)])
def test_entry_keeps_the_exit_status(argv, status):
    res = _run(f"import sys\nsys.argv = ['moetune', *{argv!r}]\nfrom moetune.cli import entry\nentry()\n")
    assert res.returncode == status, res.stderr[-2000:]
    if status:
        assert res.stderr.startswith("error:") and "Traceback" not in res.stderr


def test_entry_with_a_message_exits_1_like_python():
    code = ("import sys\nimport moetune.cli as c\n"
            "def boom(argv=None):\n    sys.exit('a message')\n"
            "c.main = boom\nc.entry()\n")
    res = _run(code)
    assert res.returncode == 1 and res.stderr.strip() == "a message"


def test_app_for_builds_only_the_named_command():
    def names(a):
        return ([c.name or c.callback.__name__ for c in a.registered_commands], [g.name for g in a.registered_groups])

    assert names(_app_for(["plan", "--gpus", "8"])) == (["plan"], [])
    assert names(_app_for(["--version"])) == names(app)
    assert names(_app_for(["catalog", "models"])) == ([], ["catalog"])
    assert names(_app_for(["pla"])) == names(app)  # a mistyped name: the whole app answers ("Did you mean")
    assert names(_app_for([])) == names(app)
    assert _app_for(["plan"]).registered_callback is app.registered_callback  # --version and the root help stay
    assert len(app.registered_commands) > 1  # the app itself is not changed


@pytest.mark.parametrize("argv", [["plan", "--help"], ["catalog", "--help"], ["plan", "--bogus"], ["pla"],
                                  ["layout", "--tp", "2", "--pp", "4", "--ep", "8", "--gpus", "64"]])
def test_one_command_app_answers_as_the_whole_app(argv, capsys):
    from moetune.cli import main

    def run(which):
        import moetune.cli as c

        saved = c._app_for
        if which == "whole":
            c._app_for = lambda args: app
        try:
            with pytest.raises(SystemExit) as exc:
                main(list(argv))
        finally:
            c._app_for = saved
        out = capsys.readouterr()
        return exc.value.code, out.out, out.err

    assert run("one") == run("whole")
