"""The package layering of ``src/moetune`` (docs/design.md, "Layers"): the import graph between its packages is
acyclic, every import counted (module level and function local, absolute and relative), and no module imports
another module's private (``_name``) names."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "moetune"


def _module_name(path: Path, src: Path = SRC) -> tuple[str, bool]:
    parts = list(path.relative_to(src).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def _imports(path: Path, src: Path = SRC) -> list[tuple[str, list[str], int]]:
    """``(imported module, names taken from it, line)`` for every import statement of ``path``, relative ones
    resolved; ``from moetune import x`` counts as an import of ``moetune.x``."""
    mod, is_pkg = _module_name(path, src)
    here = mod.split(".")
    out: list[tuple[str, list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_pkg else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            if target == "moetune":  # a submodule, or a name of the package itself (__version__)
                pkg = src / "moetune"
                out += [(f"moetune.{n}", [], node.lineno) if (pkg / n).is_dir() or (pkg / f"{n}.py").is_file()
                        else ("moetune", [n], node.lineno) for n in names]
            else:
                out.append((target, names, node.lineno))
    return out


def _node(module: str) -> str:
    """The package-graph node of a module: its subpackage of moetune, or the top-level module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "moetune"


def package_graph() -> dict[str, dict[str, list[str]]]:
    """``{package: {imported package: ["module:line", ...]}}`` over every module under src/moetune."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        mod, _ = _module_name(path)
        src = _node(mod)
        graph.setdefault(src, {})
        for target, _names, line in _imports(path):
            if not target.startswith("moetune."):
                continue
            dst = _node(target)
            if dst != src:
                graph[src].setdefault(dst, []).append(f"{mod}:{line}")
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle of the graph as ``[a, b, ..., a]``, or None when it is acyclic (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, {})):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {}}) is None


def test_relative_imports_are_resolved(tmp_path):
    pkg = tmp_path / "moetune" / "x"
    pkg.mkdir(parents=True)
    f = pkg / "m.py"
    f.write_text("from . import a\nfrom ..y import b\nfrom .z import c\nfrom moetune import x, __version__\n")
    got = [t for t, _, _ in _imports(f, tmp_path)]
    assert got == ["moetune.x", "moetune.y", "moetune.x.z", "moetune.x", "moetune"]


def test_package_graph_is_acyclic():
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle:
        where = [f"{a} -> {b} ({', '.join(graph[a][b][:3])})" for a, b in zip(cycle, cycle[1:], strict=False)]
        raise AssertionError("package import cycle " + " -> ".join(cycle) + ":\n  " + "\n  ".join(where))


#: private names still imported across modules, each with the change that removes it (keep this list short)
PRIVATE_IMPORTS_BEING_REMOVED: set[str] = set()


def test_no_private_name_imported_across_modules():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        mod, _ = _module_name(path)
        for target, names, line in _imports(path):
            if not target.startswith("moetune") or target == mod:
                continue
            bad += [f"{mod}:{line} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")
                    and f"{mod}:{target}.{n}" not in PRIVATE_IMPORTS_BEING_REMOVED]
    assert not bad, "private names imported across modules:\n  " + "\n  ".join(bad)
    seen = {f"{_module_name(p)[0]}:{t}.{n}" for p in ROOT.rglob("*.py") for t, names, _ in _imports(p) for n in names}
    gone = PRIVATE_IMPORTS_BEING_REMOVED - seen
    assert not gone, f"no longer imported, drop from PRIVATE_IMPORTS_BEING_REMOVED: {sorted(gone)}"


def test_help_and_layout_import_no_heavy_modules():
    """``moetune --help`` and ``moetune layout`` build without numpy, scipy, the planner or the catalogs' models."""
    code = (
        "import sys\n"
        "from moetune.cli import main\n"
        "for argv in (['--help'], ['layout', '--tp', '2', '--pp', '4', '--ep', '8', '--gpus', '64']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'scipy')\n"
        "               or m.startswith(('moetune.plan', 'moetune.perfmodel.step', 'moetune.catalog.models')))\n"
        "print('HEAVY', heavy)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "HEAVY []" in res.stdout, res.stdout[-2000:]


def test_top_level_help_is_plain_and_lists_every_command():
    """``moetune --help`` renders in click's plain layout (no ``typer.rich_utils`` / rich markdown import) and still
    names every command with its whole one-line help; a subcommand's help keeps the rich layout."""
    code = (
        "import sys\n"
        "from moetune.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('RICH', sorted(m for m in sys.modules if m in ('typer.rich_utils', 'rich.markdown')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "RICH []" in res.stdout, res.stdout[-2000:]
    from moetune.cli import COMMAND_MODULES

    for name in COMMAND_MODULES:
        assert f"\n  {name} " in res.stdout, name
    assert "step time; emit a launchable config." in res.stdout  # plan's help line is not cut to the width
    sub = subprocess.run([sys.executable, "-m", "moetune", "layout", "--help"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert sub.returncode == 0 and "╭─ Options" in sub.stdout
