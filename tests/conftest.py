"""Shared test fixtures: the real artifacts in the repo's data/ and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]

# CI (the env var CI set, as .ci/run's callers do) draws the same hypothesis examples on every run, so a landing is
# judged on a reproducible suite; locally each run explores new examples (and keeps failures in .hypothesis/).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


DATA = REPO / "data"  # the real third-party artifacts the tests run on (provenance: data/README.md)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The repo's data folder (named for where it was copied from; the tests never read outside the repo)."""
    assert DATA.is_dir(), f"{DATA} missing: the repo ships its test data"
    return DATA


def run_cli(*args: str, input: str | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m moetune ARGS`` in a subprocess (real exit codes, real stdout/stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "moetune", *args],
        capture_output=True,
        text=True,
        input=input,
        cwd=cwd,
        timeout=600,
    )


@pytest.fixture
def cli():
    return run_cli
