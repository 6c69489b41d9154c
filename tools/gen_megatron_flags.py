#!/usr/bin/env python3
"""Generate ``src/moetune/catalog/megatron_flags.json``: every command-line flag Megatron-LM's
``megatron/training/arguments.py`` defines, read from a named Megatron-LM commit with :mod:`ast` (Megatron is never
imported or executed).

Usage::

    python tools/gen_megatron_flags.py MEGATRON_GIT_DIR_OR_CHECKOUT [--commit SHA] [--out PATH] [--check-tests]

What is read (all at the given commit):

* ``add_megatron_arguments`` in ``megatron/training/arguments.py`` -- the ``_add_*_args`` functions it calls, in
  order; in each, every ``<group>.add_argument(...)`` call (argparse semantics: option strings, ``dest`` derived
  from the first long option, ``type``, ``default``, ``nargs``, ``action``, ``choices``, ``const``) and every
  ``ArgumentGroupFactory(Config, exclude=[...]).build_group(parser, title)``;
* for each such factory, the dataclass ``Config`` (followed through imports and base classes) and the rules of
  ``ArgumentGroupFactory._build_argparse_kwargs_from_field`` in ``megatron/training/argument_utils.py``: one flag
  ``--field-name`` per ``init`` field not excluded; ``Optional[X]`` / ``X | None`` -> X; ``list[X]`` -> nargs '+';
  ``Literal[...]`` -> choices; an Enum -> choices of its member names; ``bool`` -> ``store_true`` when the default
  is False, else ``store_false`` spelled ``--no-<name>`` and ``--disable-<name>``; ``metadata['argparse_meta']``
  overrides all of these.

Each flag gets ``models``: what moetune's estimate does with it (``memory``, ``time``, ``memory+time``, or
``none``), taken from the reader's mapping in :mod:`moetune.io.megatron_args` (``MODELED``).

``--check-tests`` also reads every ``tests/functional_tests/test_cases/**/model_config.yaml`` at the commit and
reports MODEL_ARGS keys that are not flags of the catalog (a self-check of this generator).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARGS_FILE = "megatron/training/arguments.py"
FACTORY_FILE = "megatron/training/argument_utils.py"


class GenError(Exception):
    pass


# --------------------------------------------------------------------------------------------------- source access
class Source:
    """Files of one Megatron-LM commit: a bare git dir / checkout read with ``git show``, or a plain checkout."""

    def __init__(self, root: str, commit: str | None) -> None:
        self.root = Path(root)
        self.git = _is_git(self.root)
        if commit is None and self.git:
            commit = _git(self.root, "rev-parse", "HEAD").strip()
        if self.git:
            commit = _git(self.root, "rev-parse", f"{commit}^{{commit}}").strip()
            self.date = _git(self.root, "show", "-s", "--format=%cI", commit).strip()
        else:
            self.date = None
        self.commit = commit
        self._cache: dict[str, str | None] = {}
        self.files_read: list[str] = []

    def read(self, path: str) -> str | None:
        if path not in self._cache:
            text: str | None
            if self.git:
                try:
                    text = _git(self.root, "show", f"{self.commit}:{path}")
                except subprocess.CalledProcessError:
                    text = None
            else:
                p = self.root / path
                text = p.read_text() if p.is_file() else None
            self._cache[path] = text
            if text is not None:
                self.files_read.append(path)
        return self._cache[path]

    def ls(self, prefix: str) -> list[str]:
        if self.git:
            return _git(self.root, "ls-tree", "-r", "--name-only", self.commit, prefix).split()
        return [str(p.relative_to(self.root)) for p in (self.root / prefix).rglob("*") if p.is_file()]


def _is_git(root: Path) -> bool:
    try:
        _git(root, "rev-parse", "--git-dir")
        return True
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


# --------------------------------------------------------------------------------------------------- module graph
class Modules:
    """Resolve names (classes) across Megatron modules by following ``import`` statements, as Python would."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self._trees: dict[str, tuple[str, ast.Module] | None] = {}

    def tree(self, module: str) -> tuple[str, ast.Module] | None:
        if module not in self._trees:
            base = module.replace(".", "/")
            found = None
            for path in (base + ".py", base + "/__init__.py"):
                text = self.src.read(path)
                if text is not None:
                    found = (path, ast.parse(text))
                    break
            self._trees[module] = found
        return self._trees[module]

    @staticmethod
    def _package(module: str, path: str) -> str:
        return module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]

    def find_class(self, module: str, name: str, _depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """(module, ClassDef) of ``name`` as seen from ``module`` (top level or imported into it)."""
        if _depth > 12:
            return None
        t = self.tree(module)
        if t is None:
            return None
        path, tree = t
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        target = self._resolve_from(module, path, node)
                        hit = self.find_class(target, alias.name, _depth + 1)
                        if hit:
                            return hit
        return None

    def _resolve_from(self, module: str, path: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        pkg = self._package(module, path).split(".")
        if node.level > 1:
            pkg = pkg[: len(pkg) - (node.level - 1)]
        return ".".join(pkg + ([node.module] if node.module else []))

    def imports_in(self, module: str, fn: ast.FunctionDef) -> dict[str, str]:
        """Names imported inside a function body (``from megatron.training.config import X``) -> module."""
        out: dict[str, str] = {}
        t = self.tree(module)
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and t:
                for alias in node.names:
                    out[alias.asname or alias.name] = self._resolve_from(module, t[0], node)
        return out


# --------------------------------------------------------------------------------------------------- value rendering
def _literal(node: ast.AST | None) -> tuple[bool, Any]:
    if node is None:
        return True, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _jsonable(v: Any) -> Any:
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return str(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _type_name(node: ast.AST | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return node.id
    return ast.unparse(node)


_PRIMITIVES = {"int", "float", "str", "bool"}


@dataclass
class Flag:
    options: list[str]
    dest: str
    group: str
    source: str
    action: str = "store"
    type: str | None = None
    default: Any = None
    default_expr: str | None = None
    nargs: Any = None
    choices: list[Any] | None = None
    const: Any = None
    required: bool = False
    condition: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------- dataclass groups
@dataclass
class DCField:
    name: str
    annotation: ast.AST
    default: ast.AST | None  # value node, or None when MISSING
    has_default: bool
    default_factory: ast.AST | None
    init: bool
    argparse_meta: ast.AST | None
    owner: str


class Dataclasses:
    """The fields of a dataclass as :func:`dataclasses.fields` returns them (bases first, overrides in place)."""

    def __init__(self, mods: Modules) -> None:
        self.mods = mods

    def fields(self, module: str, name: str) -> list[DCField]:
        hit = self.mods.find_class(module, name)
        if hit is None:
            raise GenError(f"cannot find class {name} (seen from {module})")
        cmod, cls = hit
        out: dict[str, DCField] = {}
        for base in cls.bases:
            bname = _type_name(base)
            if bname and bname.split(".")[-1] not in ("object", "Protocol", "Generic"):
                bhit = self.mods.find_class(cmod, bname.split(".")[-1])
                if bhit is not None and self._is_dataclass(bhit[1]):
                    for f in self.fields(bhit[0], bhit[1].name):
                        out[f.name] = f
        if not self._is_dataclass(cls):
            return list(out.values())
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if "ClassVar" in ast.unparse(node.annotation) or "InitVar" in ast.unparse(node.annotation):
                continue
            f = DCField(node.target.id, node.annotation, None, False, None, True, None, f"{cls.name}")
            v = node.value
            if isinstance(v, ast.Call) and _type_name(v.func) in ("field", "dataclasses.field"):
                for kw in v.keywords:
                    if kw.arg == "default":
                        f.default, f.has_default = kw.value, True
                    elif kw.arg == "default_factory":
                        f.default_factory = kw.value
                    elif kw.arg == "init":
                        ok, val = _literal(kw.value)
                        f.init = bool(val) if ok else True
                    elif kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                        for k, mv in zip(kw.value.keys, kw.value.values, strict=True):
                            if isinstance(k, ast.Constant) and k.value == "argparse_meta":
                                f.argparse_meta = mv
            elif v is not None:
                f.default, f.has_default = v, True
            out[f.name] = f  # an override keeps the base's position, as dataclasses does
        return list(out.values())

    @staticmethod
    def _is_dataclass(cls: ast.ClassDef) -> bool:
        return any("dataclass" in ast.unparse(d) for d in cls.decorator_list)

    def enum_members(self, module: str, name: str) -> list[str] | None:
        hit = self.mods.find_class(module, name.split(".")[-1])
        if hit is None:
            return None
        cls = hit[1]
        if not any("Enum" in ast.unparse(b) for b in cls.bases):
            return None
        members = []
        for node in cls.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if not node.targets[0].id.startswith("_"):
                    members.append(node.targets[0].id)
        return members


class TypeInferenceError(Exception):
    pass


def _extract_type(dcs: Dataclasses, module: str, ann: ast.AST) -> dict[str, Any]:
    """``ArgumentGroupFactory._extract_type`` on an annotation's AST."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        ann = ast.parse(ann.value, mode="eval").body
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):  # X | None
        if isinstance(ann.right, ast.Constant) and ann.right.value is None:
            return _extract_type(dcs, module, ann.left)
        raise TypeInferenceError(f"Unions not supported by argparse: {ast.unparse(ann)}")
    if isinstance(ann, ast.Subscript):
        origin = _type_name(ann.value).split(".")[-1]
        args = list(ann.slice.elts) if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if origin == "Optional":
            return _extract_type(dcs, module, args[0])
        if origin == "Union":
            if len(args) >= 2 and isinstance(args[1], ast.Constant) and args[1].value is None:
                return _extract_type(dcs, module, args[0])
            raise TypeInferenceError(f"Unions not supported by argparse: {ast.unparse(ann)}")
        if origin in ("list", "List"):
            if len(args) != 1:
                raise TypeInferenceError(f"Multi-type lists not supported: {ast.unparse(ann)}")
            kw = _extract_type(dcs, module, args[0])
            kw["nargs"] = "+"
            return kw
        if origin == "Literal":
            vals = [ast.literal_eval(a) for a in args]
            return {"type": type(vals[0]).__name__, "choices": vals}
        raise TypeInferenceError(f"Unsupported type: {ast.unparse(ann)}")
    name = _type_name(ann)
    if name in ("Callable", "ContextManager", "Tuple", "tuple", "List", "Dict", "dict"):
        raise TypeInferenceError(f"Unsupported type: {name}")
    if name in _PRIMITIVES:
        return {"type": name}
    members = dcs.enum_members(module, name)
    if members is not None:
        return {"type": f"enum:{name.split('.')[-1]}", "choices": members}
    return {"type": name}


def _meta_dict(node: ast.AST | None) -> dict[str, ast.AST]:
    if not isinstance(node, ast.Dict):
        return {}
    return {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}


def _default_of(dcs: Dataclasses, module: str, node: ast.AST | None) -> tuple[Any, str | None]:
    ok, val = _literal(node)
    if ok:
        return _jsonable(val), None
    if isinstance(node, ast.Attribute) and dcs.enum_members(module, _type_name(node.value)) is not None:
        return node.attr, None  # Enum.member -> its name
    return None, ast.unparse(node)


def dataclass_flags(dcs: Dataclasses, module: str, cls: str, exclude: set[str], title: str | None,
                    condition: str | None) -> list[Flag]:
    """``ArgumentGroupFactory(cls, exclude).build_group(parser, title)``."""
    hit = dcs.mods.find_class(module, cls)
    if hit is None:
        raise GenError(f"cannot resolve dataclass {cls} from {module}")
    cmod = hit[0]
    out = []
    for f in dcs.fields(cmod, cls):
        if f.name in exclude or not f.init:
            continue
        fmod = cmod
        fl = Flag(options=["--" + f.name.replace("_", "-")], dest=f.name, group=title or cls,
                  source=f"{f.owner}.{f.name}", condition=condition)
        if f.has_default:
            fl.default, fl.default_expr = _default_of(dcs, fmod, f.default)
        elif f.default_factory is not None:
            fac = f.default_factory
            body = fac.body if isinstance(fac, ast.Lambda) else None
            if isinstance(fac, ast.Name) and fac.id in ("list", "dict", "set"):
                fl.default = {"list": [], "dict": {}, "set": []}[fac.id]
            elif body is not None:
                fl.default, fl.default_expr = _default_of(dcs, fmod, body)
            else:
                fl.default_expr = ast.unparse(fac) + "()"
        meta = _meta_dict(f.argparse_meta)
        try:
            kw = _extract_type(dcs, fmod, f.annotation)
            fl.type = kw.get("type")
            fl.nargs = kw.get("nargs")
            fl.choices = kw.get("choices")
            if fl.type == "bool":
                # ``attribute.default == False`` (0 and False compare equal; None / MISSING do not)
                okd, dval = _literal(f.default) if f.has_default else (False, None)
                is_false = okd and f.has_default and dval == False  # noqa: E712
                fl.action = "store_true" if is_false else "store_false"
                fl.type = None
                if fl.action == "store_false":
                    fl.options = ["--no-" + f.name.replace("_", "-"), "--disable-" + f.name.replace("_", "-")]
        except TypeInferenceError as e:
            if not meta:
                raise GenError(f"{cls}.{f.name}: {e} and no argparse_meta (Megatron would fail too)") from None
        for k, v in meta.items():
            ok, val = _literal(v)
            if k == "arg_names":
                fl.options = list(val)
            elif k == "dest":
                fl.dest = val
            elif k == "default":
                fl.default, fl.default_expr = _default_of(dcs, fmod, v)
            elif k == "type":
                fl.type = _type_name(v)
            elif k == "choices":
                if ok:
                    fl.choices = _jsonable(val)
                elif isinstance(v, ast.ListComp):  # [scope.name for scope in Enum]
                    it = _type_name(v.generators[0].iter)
                    fl.choices = dcs.enum_members(fmod, it) or ast.unparse(v)
                else:
                    fl.choices = ast.unparse(v)
            elif k == "nargs":
                fl.nargs = val if ok else ast.unparse(v)
            elif k == "action":
                fl.action = val if ok else ast.unparse(v)
            elif k == "const":
                fl.const = _jsonable(val) if ok else ast.unparse(v)
            elif k != "help":
                fl.extra[k] = _jsonable(val) if ok else ast.unparse(v)
        if fl.action in ("store_true", "store_false") and fl.default is None and fl.default_expr is None \
                and "default" not in meta:
            pass
        out.append(fl)
    return out


# --------------------------------------------------------------------------------------------------- explicit groups
def _action_name(node: ast.AST) -> str:
    ok, val = _literal(node)
    if ok:
        return str(val)
    name = _type_name(node)
    return name.split(".")[-1] if name.startswith("argparse.") else name


def explicit_flag(call: ast.Call, group: str, fn: str, condition: str | None) -> Flag:
    opts = []
    for a in call.args:
        ok, val = _literal(a)
        if not ok or not isinstance(val, str):
            raise GenError(f"{fn}: non-literal option string {ast.unparse(a)}")
        opts.append(val)
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = _action_name(kw["action"]) if "action" in kw else "store"
    longs = [o for o in opts if o.startswith("--")]
    dest = (longs or opts)[0].lstrip("-").replace("-", "_")
    if "dest" in kw:
        dest = ast.literal_eval(kw["dest"])
    fl = Flag(options=opts, dest=dest, group=group, source=f"arguments.py:{fn}", action=action,
              condition=condition)
    if action == "BooleanOptionalAction":  # argparse adds --no-<name> for every --<name> (that one stores False)
        neg = ["--no-" + o[2:] for o in opts if o.startswith("--")]
        fl.options = opts + neg
        fl.extra["negations"] = neg
    if "type" in kw:
        fl.type = _type_name(kw["type"])
    if "default" in kw:
        ok, val = _literal(kw["default"])
        fl.default, fl.default_expr = (_jsonable(val), None) if ok else (None, ast.unparse(kw["default"]))
    elif action == "store_true":
        fl.default = False
    elif action == "store_false":
        fl.default = True
    if "nargs" in kw:
        ok, val = _literal(kw["nargs"])
        fl.nargs = val if ok else ast.unparse(kw["nargs"])
    if "choices" in kw:
        ok, val = _literal(kw["choices"])
        fl.choices = _jsonable(val) if ok else ast.unparse(kw["choices"])
    if "const" in kw:
        ok, val = _literal(kw["const"])
        fl.const = _jsonable(val) if ok else ast.unparse(kw["const"])
    if "required" in kw:
        ok, val = _literal(kw["required"])
        fl.required = bool(val) if ok else False
    return fl


class Walker:
    """Replays one ``_add_*_args(parser)`` body: groups, factories and add_argument calls, in source order."""

    def __init__(self, dcs: Dataclasses, module: str, fn: ast.FunctionDef) -> None:
        self.dcs, self.module, self.fn = dcs, module, fn
        self.groups: dict[str, str] = {"parser": "options"}
        self.factories: dict[str, tuple[str, str, set[str]]] = {}
        self.lists: dict[str, ast.AST] = {}
        self.imports = dcs.mods.imports_in(module, fn)
        self.flags: list[Flag] = []

    def run(self) -> list[Flag]:
        self._block(self.fn.body, None)
        return self.flags

    def _block(self, body: list[ast.stmt], cond: str | None) -> None:
        for st in body:
            if isinstance(st, ast.If):
                c = ast.unparse(st.test)
                self._block(st.body, c if cond is None else f"{cond} and {c}")
                self._block(st.orelse, f"not ({c})" if cond is None else f"{cond} and not ({c})")
            elif isinstance(st, ast.Try):
                self._block(st.body, cond)
            elif isinstance(st, (ast.With, ast.For)):
                self._block(st.body, cond)
            elif isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                self._assign(st.targets[0].id, st.value, cond)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                self._call(st.value, cond)
            elif isinstance(st, ast.Return) and isinstance(st.value, ast.Call):
                self._call(st.value, cond)

    def _assign(self, name: str, value: ast.AST, cond: str | None) -> None:
        if isinstance(value, (ast.List, ast.Tuple)):
            self.lists[name] = value
        if not isinstance(value, ast.Call):
            return
        func = value.func
        if isinstance(func, ast.Attribute) and func.attr == "add_argument_group":
            self.groups[name] = self._title(value) or name
        elif isinstance(func, ast.Attribute) and func.attr == "add_mutually_exclusive_group":
            self.groups[name] = self.groups.get(_type_name(func.value), name)
        elif _type_name(func) == "ArgumentGroupFactory":
            self.factories[name] = self._factory(value)
        elif isinstance(func, ast.Attribute) and func.attr == "build_group":
            self.groups[name] = self._build(value, cond)
        else:
            self._call(value, cond)

    def _title(self, call: ast.Call, pos: int = 0) -> str | None:
        for k in call.keywords:
            if k.arg == "title":
                return ast.literal_eval(k.value)
        if len(call.args) > pos:
            ok, val = _literal(call.args[pos])
            return val if ok else None
        return None

    def _factory(self, call: ast.Call) -> tuple[str, str, set[str]]:
        cls = _type_name(call.args[0])
        exclude: set[str] = set()
        for k in call.keywords:
            if k.arg == "exclude":
                node = self.lists.get(k.value.id) if isinstance(k.value, ast.Name) else k.value
                exclude = set(ast.literal_eval(node))
        module = self.imports.get(cls, self.module)
        return module, cls, exclude

    def _build(self, call: ast.Call, cond: str | None) -> str:
        f = call.func
        assert isinstance(f, ast.Attribute)
        if isinstance(f.value, ast.Call):
            module, cls, exclude = self._factory(f.value)
        else:
            module, cls, exclude = self.factories[_type_name(f.value)]
        title = self._title(call, pos=1) or cls
        self.flags.extend(dataclass_flags(self.dcs, module, cls, exclude, title, cond))
        return title

    def _call(self, call: ast.Call, cond: str | None) -> None:
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr == "add_argument":
            gname = _type_name(f.value)
            if gname not in self.groups:
                raise GenError(f"{self.fn.name}: add_argument on unknown group {gname}")
            self.flags.append(explicit_flag(call, self.groups[gname], self.fn.name, cond))
        elif isinstance(f, ast.Attribute) and f.attr == "build_group":
            self._build(call, cond)


# --------------------------------------------------------------------------------------------------- whole parser
def collect(src: Source) -> list[Flag]:
    text = src.read(ARGS_FILE)
    if text is None:
        raise GenError(f"{ARGS_FILE} not found at {src.commit}")
    if src.read(FACTORY_FILE) is None:
        raise GenError(f"{FACTORY_FILE} not found at {src.commit} (this generator reads ArgumentGroupFactory groups)")
    mods = Modules(src)
    dcs = Dataclasses(mods)
    module = "megatron.training.arguments"
    tree = mods.tree(module)[1]
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    top = fns.get("add_megatron_arguments")
    if top is None:
        raise GenError("add_megatron_arguments not found")
    order = []
    for node in ast.walk(top):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in fns:
            order.append((node.lineno, node.func.id))
    flags: list[Flag] = []
    for _, name in sorted(order):
        flags.extend(Walker(dcs, module, fns[name]).run())
    seen: dict[str, str] = {}
    for fl in flags:
        for o in fl.options:
            if o in seen:
                raise GenError(f"option {o} defined twice ({seen[o]}, {fl.source}); argparse would refuse it")
            seen[o] = fl.source
    return flags


def _models_map() -> dict[str, str]:
    """flag -> what moetune models with it, from the reader's own mapping (moetune.io.megatron_args.MODELED)."""
    root = Path(__file__).resolve().parents[1] / "src"
    sys.path.insert(0, str(root))
    from moetune.io.megatron_args import MODELED  # noqa: PLC0415  (moetune's reader, not Megatron)

    return dict(MODELED)


def to_json(src: Source, flags: list[Flag], repo: str, lenient: bool = False) -> dict:
    models = _models_map()
    out: dict[str, Any] = {}
    for fl in flags:
        for o in fl.options:
            rec: dict[str, Any] = {"dest": fl.dest, "group": fl.group, "action": fl.action}
            if fl.type is not None:
                rec["type"] = fl.type
            rec["default"] = fl.default
            if fl.default_expr is not None:
                rec["default_expr"] = fl.default_expr
            for k in ("nargs", "choices", "const"):
                v = getattr(fl, k)
                if v is not None:
                    rec[k] = v
            if fl.required:
                rec["required"] = True
            if fl.condition:
                rec["condition"] = fl.condition
            if len(fl.options) > 1:
                rec["aliases"] = [x for x in fl.options if x != o]
            if fl.action == "BooleanOptionalAction":
                rec["stores"] = o not in fl.extra.get("negations", [])
            rec["source"] = fl.source
            rec["models"] = models.get(o, "none")
            out[o] = rec
    unknown = sorted(set(models) - set(out))
    if unknown and lenient:
        print(f"warning: {len(unknown)} flags of moetune's mapping are not Megatron-LM flags at {src.commit}",
              file=sys.stderr)
    elif unknown:
        raise GenError(f"moetune's mapping names flags Megatron-LM does not define at {src.commit}: {unknown}")
    groups: dict[str, dict[str, int]] = {}
    for fl in flags:
        g = groups.setdefault(fl.group, {"arguments": 0, "options": 0})
        g["arguments"] += 1
        g["options"] += len(fl.options)
    return {
        "source": {"repository": repo, "commit": src.commit, "commit_date": src.date,
                   "files": sorted(set(src.files_read))},
        "generated_by": "tools/gen_megatron_flags.py",
        "count": len(out),
        "arguments": len(flags),
        "groups": dict(sorted(groups.items())),
        "flags": dict(sorted(out.items())),
    }


def check_tests(src: Source, flags: dict[str, Any]) -> list[str]:
    import yaml  # noqa: PLC0415

    bad = []
    for path in src.ls("tests/functional_tests/test_cases"):
        if not path.endswith("model_config.yaml"):
            continue
        try:
            doc = yaml.safe_load(src.read(path) or "")
        except yaml.YAMLError:
            continue
        for key, block in (doc or {}).items():
            if not str(key).startswith("MODEL_ARGS") or not isinstance(block, dict):
                continue
            for k in block:
                k = str(k)
                if k.startswith("--") and k.split("=")[0] not in flags:
                    bad.append(f"{path}: {k}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("megatron", help="Megatron-LM git dir (bare or not) or checkout")
    ap.add_argument("--commit", default=None, help="commit to read (default: HEAD)")
    ap.add_argument("--repo", default="NVIDIA/Megatron-LM")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1]
                                         / "src/moetune/catalog/megatron_flags.json"))
    ap.add_argument("--check-tests", action="store_true",
                    help="report functional-test MODEL_ARGS keys that are not catalog flags")
    ap.add_argument("--lenient", action="store_true",
                    help="warn (do not fail) when moetune's mapping names flags this commit lacks")
    a = ap.parse_args(argv)
    try:
        src = Source(a.megatron, a.commit)
        flags = collect(src)
        doc = to_json(src, flags, a.repo, a.lenient)
    except GenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tmp = Path(a.out + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(a.out)
    print(f"{doc['count']} flags ({doc['arguments']} arguments) from {a.repo}@{src.commit} -> {a.out}")
    print(f"  {'arguments':>9}  {'options':>7}  group")
    for g, n in doc["groups"].items():
        print(f"  {n['arguments']:9d}  {n['options']:7d}  {g}")
    if a.check_tests:
        bad = check_tests(src, doc["flags"])
        per_case: dict[str, list[str]] = {}
        for b in bad:
            path, key = b.split(": ", 1)
            per_case.setdefault(path.rsplit("/", 2)[-2], []).append(key)
        print(f"functional-test MODEL_ARGS keys not in the catalog: {len(bad)} in {len(per_case)} cases "
              "(entry points with their own extra_args_provider: inference, export, distillation, MIMO, ...)")
        for case, keys in sorted(per_case.items()):
            print(f"  {case}: {' '.join(sorted(set(keys)))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
