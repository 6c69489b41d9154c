"""A command group called without a subcommand (and ``moetune`` alone) prints its help, no error line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("argv", [[], ["catalog"], ["sweep"], ["model"]])
def test_group_without_command_shows_help_only(argv):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    p = subprocess.run([sys.executable, "-m", "moetune", *argv], capture_output=True, text=True, env=env,
                       timeout=120)
    assert "Usage" in p.stdout + p.stderr
    assert "error" not in p.stderr.lower(), p.stderr
    assert "Traceback" not in p.stderr
    assert p.returncode == 2  # click's convention for a missing command
