"""skills/*/SKILL.md are executable: valid Agent Skills front matter, and every `moetune` command in them runs as
written from the repository root on the inputs in examples/ (in a scratch copy, so files they write go there)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SKILLS = sorted(p.parent for p in (REPO / "skills").glob("*/SKILL.md"))
EXPECTED_SKILLS = {"moe-optimization-workflow", "expert-parallel-overlap", "parallelism-strategies",
                   "regression-diagnosis", "memory-fit"}
_EXPECT = re.compile(r"\s+#\s*expect exit (\d+)\s*$")


def front_matter(text: str) -> dict:
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, "SKILL.md must start with YAML front matter"
    return yaml.safe_load(m.group(1))


def skill_commands(text: str) -> list[tuple[str, int]]:
    """(command line, expected exit code) of every `moetune` line inside ```bash fences."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.strip()
            if not line.startswith("moetune "):
                continue
            m = _EXPECT.search(line)
            code = int(m.group(1)) if m else 0
            out.append((_EXPECT.sub("", line), code))
    return out


def run_cli(line: str) -> tuple[int, str, str]:
    """Run one `moetune ...` line in-process (the console-script entry point), honouring a trailing `> FILE`."""
    from moetune.cli import main

    argv = shlex.split(line)[1:]
    target = None
    if ">" in argv:
        i = argv.index(">")
        target, argv = argv[i + 1], argv[:i]
    out_b, err_b = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_b, encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(err_b, encoding="utf-8", write_through=True)
    code = 0
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        with contextlib.suppress(Exception):
            out.flush()
            err.flush()
        sys.stdout, sys.stderr = old
    text = out_b.getvalue().decode()
    if target is not None:
        Path(target).write_text(text)
    return code, text, err_b.getvalue().decode()


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_five_skills_exist_with_front_matter():
    assert {p.name for p in SKILLS} == EXPECTED_SKILLS
    for p in SKILLS:
        fm = front_matter((p / "SKILL.md").read_text())
        assert fm["name"] == p.name
        assert isinstance(fm["description"], str) and 40 < len(fm["description"]) <= 1024
        text = (p / "SKILL.md").read_text()
        for section in ("## When to use", "## Steps", "## Reading the results", "## When a step fails"):
            assert section in text, (p.name, section)
        assert len(skill_commands(text)) >= 4, p.name


def test_example_inputs_have_provenance():
    readme = (REPO / "examples" / "README.md").read_text()
    for f in (REPO / "examples").rglob("*"):
        if f.is_file() and f.name != "README.md":
            name = f.name.replace("rank-0", "rank-{0,1}").replace("rank-1", "rank-{0,1}")
            assert name in readme, f


@pytest.mark.parametrize("skill", [p.name for p in SKILLS])
def test_every_skill_command_runs_as_written(skill, scratch):
    text = (REPO / "skills" / skill / "SKILL.md").read_text()
    for line, expected in skill_commands(text):
        for path in re.findall(r"examples/[\w./{},*-]+", line):
            assert (scratch / path).exists() or "*" in path, (skill, path)
        code, out, err = run_cli(line)
        assert code == expected, f"{skill}: `{line}` exited {code} (expected {expected}): {err.strip()[-400:]}"
        if expected == 0:
            assert out.strip(), f"{skill}: `{line}` printed nothing"
        else:
            assert expected == 1 or err.startswith("error: "), err
        if "--json" in line and expected == 0:
            json.loads(out if ">" not in line else Path(shlex.split(line)[-1]).read_text())
