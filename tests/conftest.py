"""Shared test fixtures: the real artifacts in ../shared/data and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _find_shared() -> Path:
    env = os.environ.get("MOETUNE_SHARED")
    if env:
        return Path(env)
    for base in (REPO, *REPO.parents):
        cand = base / "shared"
        if (cand / "data").is_dir():
            return cand
        cand = base.parent / "shared"
        if (cand / "data").is_dir():
            return cand
    return REPO.parent / "shared"


SHARED = _find_shared()
DATA = SHARED / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not DATA.is_dir():
        if os.environ.get("CI"):
            # CI lays a copy of shared/ beside the clone: a missing one must fail, not skip every golden test
            pytest.fail(f"shared data not found at {DATA} (set MOETUNE_SHARED or place shared/ beside the repo)")
        pytest.skip("../shared/data not present")
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
