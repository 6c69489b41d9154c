"""The package layering of ``src/moetune`` (docs/design.md, "Layers"): the import graph between its packages is
acyclic, every import counted (module level and function local, absolute and relative)."""

from __future__ import annotations

import ast
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
            if target == "moetune":
                out += [(f"moetune.{n}", [], node.lineno) for n in names]
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
    f.write_text("from . import a\nfrom ..y import b\nfrom .z import c\n")
    got = [t for t, _, _ in _imports(f, tmp_path)]
    assert got == ["moetune.x", "moetune.y", "moetune.x.z"]


def test_package_graph_is_acyclic():
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle:
        where = [f"{a} -> {b} ({', '.join(graph[a][b][:3])})" for a, b in zip(cycle, cycle[1:], strict=False)]
        raise AssertionError("package import cycle " + " -> ".join(cycle) + ":\n  " + "\n  ".join(where))
