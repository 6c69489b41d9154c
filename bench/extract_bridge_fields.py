"""Write ``src/moetune/catalog/bridge_fields.json``: the field names of every Megatron-Bridge ``ConfigContainer``
section, so unknown fields and overrides are rejected (with the closest field) as Bridge rejects them.

Reads the dataclass fields (annotated class attributes, inherited through base classes) of the classes each
``ConfigContainer`` section is typed with, from a Megatron-Bridge checkout (``--bridge``, a git directory or work
tree) and the installed ``megatron-core`` (``TransformerConfig``, ``OptimizerConfig``,
``DistributedDataParallelConfig`` ...). The ``model`` section accepts the fields of every model provider under
``megatron/bridge/models/`` (a recipe's provider class decides which apply).

    python bench/extract_bridge_fields.py --bridge /path/to/Megatron-Bridge.git --megatron-lm /path/to/Megatron-LM.git
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src/moetune/catalog/bridge_fields.json"


def _sources_git(repo: str, rev: str, *trees: str) -> dict[str, str]:
    names = subprocess.check_output(["git", "-C", repo, "ls-tree", "-r", "--name-only", rev, *trees],
                                    text=True).split()
    return {n: subprocess.check_output(["git", "-C", repo, "show", f"{rev}:{n}"], text=True, errors="replace")
            for n in names if n.endswith(".py")}


class Classes:
    def __init__(self) -> None:
        self.bases: dict[str, set[str]] = defaultdict(set)
        self.fields: dict[str, set[str]] = defaultdict(set)
        self.files: dict[str, set[str]] = defaultdict(set)
        self.alias: dict[str, set[str]] = defaultdict(set)  # ``import X as Y``: Y -> X

    def add(self, path: str, text: str) -> None:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.asname and a.asname != a.name:
                        self.alias[a.asname].add(a.name)
            if not isinstance(node, ast.ClassDef):
                continue
            self.files[node.name].add(path)
            for b in node.bases:
                name = b.attr if isinstance(b, ast.Attribute) else b.id if isinstance(b, ast.Name) else None
                if isinstance(b, ast.Subscript):
                    v = b.value
                    name = v.attr if isinstance(v, ast.Attribute) else v.id if isinstance(v, ast.Name) else None
                if name:
                    self.bases[node.name].add(name)
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    ann = ast.unparse(st.annotation)
                    if not ann.startswith("ClassVar"):
                        self.fields[node.name].add(st.target.id)

    def all_fields(self, name: str, seen: set[str] | None = None) -> set[str]:
        seen = seen if seen is not None else set()
        if name in seen:
            return set()
        seen.add(name)
        out = set(self.fields.get(name, ()))
        for b in self.bases.get(name, set()) | self.alias.get(name, set()):
            out |= self.all_fields(b, seen)
        return out

    def derives(self, name: str, root: str, seen: set[str] | None = None) -> bool:
        seen = seen if seen is not None else set()
        if name == root:
            return True
        if name in seen:
            return False
        seen.add(name)
        return any(self.derives(b, root, seen) for b in self.bases.get(name, set()) | self.alias.get(name, set()))


def _container_sections(text: str) -> dict[str, list[str]]:
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ConfigContainer":
            out = {}
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and \
                        not st.target.id.startswith("_"):
                    names = {n.id for n in ast.walk(st.annotation) if isinstance(n, ast.Name)}
                    names |= {n.attr for n in ast.walk(st.annotation) if isinstance(n, ast.Attribute)}
                    out[st.target.id] = sorted(names - {"Optional", "Union", "None", "str", "int", "float", "bool",
                                                        "dict", "list"})
            return out
    raise SystemExit("ConfigContainer not found")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bridge", required=True, help="Megatron-Bridge git directory or checkout")
    ap.add_argument("--megatron-lm", required=True, help="Megatron-LM git directory or checkout")
    ap.add_argument("--commit", default="HEAD", help="Bridge revision")
    ap.add_argument("--mlm-commit", default="HEAD", help="Megatron-LM revision")
    args = ap.parse_args()
    srcs = _sources_git(args.bridge, args.commit, "src/megatron/bridge")
    rev = subprocess.check_output(["git", "-C", args.bridge, "rev-parse", args.commit], text=True).strip()
    mlm_rev = subprocess.check_output(["git", "-C", args.megatron_lm, "rev-parse", args.mlm_commit], text=True).strip()
    srcs.update(_sources_git(args.megatron_lm, mlm_rev, "megatron/core", "megatron/training/config"))
    cls = Classes()
    for path, text in srcs.items():
        cls.add(path, text)
    sections = _container_sections(srcs["src/megatron/bridge/training/config.py"])
    out: dict[str, list[str]] = {}
    for sec, names in sections.items():
        if sec == "env_vars":
            continue  # free-form mapping of environment variables
        fields: set[str] = set()
        if sec == "model":
            roots = ("TransformerConfig", "ModelProviderMixin")
            for name, files in cls.files.items():
                if any(f.startswith("src/megatron/bridge/models/") for f in files) and \
                        any(cls.derives(name, r) for r in roots):
                    fields |= cls.all_fields(name)
            fields |= cls.all_fields("TransformerConfig") | cls.all_fields("MLATransformerConfig")
        elif sec == "dataset":
            for name in cls.files:
                if any(cls.derives(name, r) for r in (*names, "BlendedMegatronDatasetConfig", "DatasetProvider")):
                    fields |= cls.all_fields(name)
        for n in names:
            fields |= cls.all_fields(n)
        if fields:
            out[sec] = sorted(f for f in fields if not f.startswith("__"))
    doc = {"source": {"repo": "github NVIDIA-NeMo/Megatron-Bridge", "commit": rev,
                      "megatron_lm": {"repo": "github NVIDIA/Megatron-LM", "commit": mlm_rev},
                      "what": "dataclass field names of each ConfigContainer section (training/config.py), "
                              "inherited fields included; model = every provider under megatron/bridge/models/ "
                              "(bench/extract_bridge_fields.py)"},
           "sections": out}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{OUT}: {', '.join(f'{k} {len(v)}' for k, v in out.items())}")


if __name__ == "__main__":
    main()
