"""Run any ``moetune`` command in-process: the one contract shared by the CLI, the MCP server and the web API.

A command is called with a dict of arguments named like its CLI flags with underscores (``gpus``, ``gbs``,
``pipeline_layout``, ``max_evals``; positional arguments by their CLI name: ``files``, ``paths``, ``args``, ``a``,
``b``) and returns the object the command prints with ``--json``. The accepted arguments, their JSON types and
their help text are read from the typer/click command itself (:func:`commands`), so there is one flag vocabulary
and no hand-kept list. Arguments become a ``moetune ...`` argument vector, parsed by click exactly as on the command
line, so defaults, conversions and every check are the CLI's own.

Errors: anything the CLI reports as ``error: <one line>`` (exit code 2, or 1 for e.g. a log without iterations and
no JSON printed) raises :class:`CommandError` with the same line. A command that prints its JSON and then exits 1
(``check`` with remaining errors, ``plan`` when nothing fits, ``logs`` with an empty file) returns that JSON;
:func:`call` also reports the exit code.

Calls are serialised (stdout/stderr capture and the working directory are process-global), output is bounded
(:data:`MAX_OUTPUT_BYTES`), and a ``root`` folder confines every path argument (resolved, symlinks included).
Long calls report progress (``progress=callback(done, total, message)``) and stop at their ``deadline`` through
the planner's progress hook (see :func:`_progress_scope`).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import sys
import threading
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from moetune.errors import InputError, MoetuneError, one_line
from moetune.memo import memo

#: largest ``--json`` output (bytes) a call may produce before it is refused
MAX_OUTPUT_BYTES = 8 * 1024 * 1024

#: the flag every exposed command has; the service always passes it and never exposes it as an argument
JSON_FLAG = "--json"

ProgressFn = Callable[[float, float | None, str | None], None]


class CommandError(MoetuneError):
    """A command failed the way the CLI reports it: one line, exit code (2 for bad input)."""

    def __init__(self, message: str, exit_code: int = 2, *, command: str | None = None):
        self.exit_code = exit_code
        self.command = command
        super().__init__(message)


class OutsideRootError(CommandError):
    """A path argument that resolves (symlinks included) outside the allowed root folder."""


class CallTimeout(CommandError):
    """A call that ran past its deadline (stopped at the next progress report)."""


class OutputTooLarge(CommandError):
    """A command whose output exceeds :data:`MAX_OUTPUT_BYTES`."""


# --------------------------------------------------------------------------------------------------------------
# the commands and their arguments, read from the typer app
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """One argument of a command: a CLI option or positional argument, named with underscores."""

    name: str
    kind: str  # "option" | "argument"
    json_type: str  # "string" | "integer" | "number" | "boolean"
    many: bool  # repeatable option / variadic argument -> a JSON array
    required: bool
    default: Any
    help: str
    flag: str | None  # the CLI flag (``--max-evals``); None for a positional argument
    off_flag: str | None  # ``--no-dist-opt`` of a boolean on/off pair
    is_flag: bool  # boolean switch (no value on the command line)
    is_path: bool  # declared as a filesystem path (pathlib.Path)
    minimum: int | float | None = None

    def schema(self) -> dict[str, Any]:
        item: dict[str, Any] = {"type": self.json_type}
        if self.minimum is not None:
            item["minimum"] = self.minimum
        out: dict[str, Any] = {"type": "array", "items": item} if self.many else dict(item)
        desc = self.help or ""
        if self.flag:
            desc = f"{desc} (CLI {self.flag}{'/' + self.off_flag if self.off_flag else ''})".strip()
        if desc:
            out["description"] = desc
        if self.default is not None and not self.required and _jsonable(self.default):
            out["default"] = list(self.default) if isinstance(self.default, tuple) else self.default
        return out


@dataclass(frozen=True)
class Command:
    """One leaf ``moetune`` command that prints JSON with ``--json``."""

    name: str  # "plan", "model show", "sweep init"
    help: str
    args: dict[str, Arg] = field(default_factory=dict)
    _click: Any = None

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.name.split())

    @property
    def tool_name(self) -> str:
        return "_".join(self.path)

    def schema(self) -> dict[str, Any]:
        """JSON schema (draft 2020-12 subset) of the command's arguments."""
        return {
            "type": "object",
            "properties": {a.name: a.schema() for a in self.args.values()},
            "required": [a.name for a in self.args.values() if a.required],
            "additionalProperties": False,
        }


def _jsonable(v: Any) -> bool:
    try:
        orjson.dumps(v)
    except TypeError:
        return False
    return True


_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string", Path: "string"}


def _annotation(p: Any) -> tuple[type, bool]:
    """(scalar python type, is-list) of a typer/click parameter."""
    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    many = bool(getattr(p, "multiple", False)) or getattr(p, "nargs", 1) == -1
    if ann is not None:
        origin = typing.get_origin(ann)
        if origin in (typing.Union, types.UnionType):
            ann = next(a for a in typing.get_args(ann) if a is not type(None))
            origin = typing.get_origin(ann)
        if origin in (list, tuple):
            ann = typing.get_args(ann)[0]
            many = True
        if isinstance(ann, type) and issubclass(ann, Path):
            ann = Path
        return (ann if ann in _JSON_TYPES else str), many
    # older typer: plain click parameters
    tname = getattr(getattr(p, "type", None), "name", "text").lower()
    scalar = {"integer": int, "float": float, "boolean": bool, "path": Path}.get(tname, str)
    return scalar, many


def _arg_of(p: Any) -> Arg | None:
    opts = list(getattr(p, "opts", []) or [])
    if JSON_FLAG in opts or not getattr(p, "expose_value", True) or getattr(p, "hidden", False):
        return None
    scalar, many = _annotation(p)
    is_option = getattr(p, "param_type_name", "") == "option" or any(o.startswith("-") for o in opts)
    if is_option:
        longs = [o for o in opts if o.startswith("--")] or opts
        flag = longs[0]
        name = flag.lstrip("-").replace("-", "_")
        secondary = list(getattr(p, "secondary_opts", []) or [])
        off = next((o for o in secondary if o.startswith("--")), None)
    else:
        flag, off, name = None, None, p.name
    minimum = getattr(p, "min", None)
    default = p.default if not callable(p.default) else None
    return Arg(name=name, kind="option" if is_option else "argument", json_type=_JSON_TYPES[scalar], many=many,
               required=bool(p.required), default=default, help=" ".join((getattr(p, "help", None) or "").split()),
               flag=flag, off_flag=off, is_flag=bool(getattr(p, "is_flag", False)) and scalar is bool,
               is_path=scalar is Path, minimum=minimum)


@memo(maxsize=256)
def _root_command() -> Any:
    import typer.main

    from moetune.cli import app

    return typer.main.get_command(app)


@memo(maxsize=256)
def commands() -> dict[str, Command]:
    """Every leaf command that takes ``--json``, by name (``"plan"``, ``"model show"``, ``"sweep init"``)."""
    out: dict[str, Command] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is not None:
            for n, sub in subs.items():
                walk(sub, (*path, n))
            return
        params = list(getattr(cmd, "params", []))
        if not any(JSON_FLAG in (getattr(p, "opts", None) or []) for p in params):
            return
        args = {a.name: a for a in map(_arg_of, params) if a is not None}
        text = " ".join((cmd.help or "").split())
        out[" ".join(path)] = Command(name=" ".join(path), help=text, args=args, _click=cmd)

    walk(_root_command(), ())
    return out


def get_command(name: str) -> Command:
    """A command by CLI name (``"model show"``) or tool name (``"model_show"``)."""
    cmds = commands()
    key = " ".join(name.replace("_", " ").split())
    if name in cmds:
        return cmds[name]
    if key in cmds:
        return cmds[key]
    by_tool = {c.tool_name: c for c in cmds.values()}
    if name in by_tool:
        return by_tool[name]
    raise unknown_name("command", name, list(cmds))


def schema(name: str) -> dict[str, Any]:
    """JSON schema of a command's arguments."""
    return get_command(name).schema()


def unknown_name(kind: str, name: str, known: list[str]) -> CommandError:
    """A one-line unknown-name error listing the closest known names."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; closest: {', '.join(close)}" if close else f"; known: {', '.join(sorted(known))}"
    return CommandError(f"unknown {kind} {name!r}{hint}", 2)


# --------------------------------------------------------------------------------------------------------------
# arguments -> argv (types checked, paths confined)
# --------------------------------------------------------------------------------------------------------------


def _type_ok(value: Any, json_type: str) -> bool:
    if json_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if json_type == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if json_type == "boolean":
        return isinstance(value, bool)
    return isinstance(value, str)


_EXPECTED = {"integer": "an integer", "number": "a number", "boolean": "true or false", "string": "a string"}


def _looks_like_path(text: str, root: Path) -> bool:
    """A string value that names a local file: it has a path separator, starts with '.' or '~', or exists.

    ``key=value`` / ``KEY=VALUE`` strings (Hydra overrides, env vars) are not paths when the first '=' comes before
    any separator (the rule ``moetune check`` uses to tell overrides from a config file).
    """
    if not text:
        return False
    head = text.split("/")[0]
    if "=" in head:
        return False
    if "/" in text or "\\" in text or text.startswith((".", "~")) or os.path.isabs(text):
        return True
    try:
        return (root / text).exists()
    except (OSError, ValueError):
        return True


def confine(text: str, root: Path, *, what: str) -> None:
    """Refuse a path that resolves (symlinks included) outside ``root``."""
    if "\x00" in text:
        raise OutsideRootError(f"{what}={text!r}: expected a path without NUL bytes", 2)
    base = root.resolve()
    target = Path(text) if os.path.isabs(text) else base / text
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError) as e:  # symlink loops
        raise OutsideRootError(f"{what}={text!r}: cannot be resolved ({one_line(e)})", 2) from None
    if resolved != base and not resolved.is_relative_to(base):
        raise OutsideRootError(f"{what}={text!r}: resolves to {resolved}, outside the allowed root {base}", 2)


def build_argv(cmd: Command, args: Mapping[str, Any] | None, *, root: Path | None = None) -> list[str]:
    """The ``moetune`` argument vector for ``cmd`` called with ``args`` (checked: names, types, paths)."""
    if args is not None and not isinstance(args, Mapping):
        raise CommandError(f"arguments of `moetune {cmd.name}`: expected an object of named arguments", 2)
    opts: list[str] = []
    positional: list[str] = []
    for key, value in (args or {}).items():
        arg = cmd.args.get(key)
        if arg is None:
            raise unknown_name(f"argument for `moetune {cmd.name}`:", key, list(cmd.args))
        label = arg.flag or arg.name
        if value is None:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        if not arg.many and isinstance(value, list | tuple):
            raise CommandError(f"{label}={value!r}: expected {_EXPECTED[arg.json_type]}, not a list", 2)
        for v in values:
            if not _type_ok(v, arg.json_type):
                raise CommandError(f"{label}={v!r}: expected {_EXPECTED[arg.json_type]}"
                                   + (" (a list of them)" if arg.many else ""), 2)
            if root is not None and isinstance(v, str) and (arg.is_path or _looks_like_path(v, root)):
                confine(v, root, what=label)
        if arg.is_flag:
            if value:
                opts.append(arg.flag)  # type: ignore[arg-type]
            elif arg.off_flag:
                opts.append(arg.off_flag)
            continue
        strs = [("true" if v else "false") if isinstance(v, bool) else str(v) for v in values]
        if arg.kind == "argument":
            positional.extend(strs)
        else:
            for s in strs:
                opts.extend([arg.flag, s])  # type: ignore[list-item]
    argv = [*cmd.path, *opts, JSON_FLAG]
    if positional:
        argv += ["--", *positional]
    return argv


def args_from_argv(name: str, argv: list[str]) -> dict[str, Any]:
    """The arguments (as :func:`run` takes them) of a ``moetune <name>`` command line: the inverse of
    :func:`build_argv`, so a printed line such as a plan candidate's ``reproduce:`` becomes a call. Every spelling
    of an option counts (``--seq`` / ``--seq-length``, ``--no-dist-opt``, ``--natural-routing``); values get the
    argument's JSON type; a word that is no option of the command is a :class:`CommandError`."""
    cmd = get_command(name)
    spell: dict[str, tuple[Arg, bool]] = {}
    for p in getattr(cmd._click, "params", []):
        a = _arg_of(p)
        if a is None or a.kind != "option":
            continue
        for o in getattr(p, "opts", []) or []:
            spell[o] = (a, True)
        for o in getattr(p, "secondary_opts", []) or []:
            spell[o] = (a, False)
    out: dict[str, Any] = {}
    positional: list[str] = []

    def typed(a: Arg, text: str) -> Any:
        try:
            return {"integer": int, "number": float}.get(a.json_type, str)(text)
        except ValueError:
            raise CommandError(f"{a.flag}={text!r}: expected {_EXPECTED[a.json_type]}", 2) from None

    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok == "--":
            positional += argv[i:]
            break
        if tok == JSON_FLAG:
            continue
        if not tok.startswith("-") or tok == "-":
            positional.append(tok)
            continue
        key, eq, val = tok.partition("=")
        if key not in spell:
            raise unknown_name(f"option of `moetune {cmd.name}`:", key, sorted(spell))
        a, on = spell[key]
        if a.is_flag:
            out[a.name] = on
            continue
        if not eq:
            if i >= len(argv):
                raise CommandError(f"{key}: expected a value", 2)
            val = argv[i]
            i += 1
        v = typed(a, val)
        if a.many:
            out.setdefault(a.name, []).append(v)
        else:
            out[a.name] = v
    if positional:
        pos = [a for a in cmd.args.values() if a.kind == "argument"]
        if not pos:
            raise CommandError(f"`moetune {cmd.name}` takes no positional argument (got {positional[0]!r})", 2)
        out[pos[0].name] = positional if pos[0].many else positional[0]
    return out


# --------------------------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------------------------


_LOCK = threading.Lock()


class _Capped(io.RawIOBase):
    """A byte sink that refuses to grow past ``limit`` bytes."""

    def __init__(self, limit: int):
        self.buf = bytearray()
        self.limit = limit
        self.overflow = False

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = len(b)
        if len(self.buf) + n > self.limit:
            self.overflow = True
            raise OutputTooLarge(f"output exceeds {self.limit} bytes; narrow the request", 2)
        self.buf += bytes(b)
        return n


@contextlib.contextmanager
def _captured(limit: int) -> Iterator[tuple[_Capped, _Capped]]:
    out, err = _Capped(limit), _Capped(limit)
    w_out = io.TextIOWrapper(io.BufferedWriter(out), encoding="utf-8", write_through=True)
    w_err = io.TextIOWrapper(io.BufferedWriter(err), encoding="utf-8", write_through=True)
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = w_out, w_err
    try:
        yield out, err
    finally:
        with contextlib.suppress(Exception):
            w_out.flush()
            w_err.flush()
        sys.stdout, sys.stderr = old


@contextlib.contextmanager
def _cwd(root: Path | None) -> Iterator[None]:
    if root is None:
        yield
        return
    old = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _progress_scope(progress: ProgressFn | None, deadline: float | None, command: str) -> Iterator[None]:
    """The one place long calls report progress and stop at their deadline.

    It installs a callback in ``moetune.progress`` (the planner reports ``done, total`` through it) when that
    module exists; the callback forwards to ``progress`` and raises :class:`CallTimeout` past ``deadline``.
    """
    try:
        from moetune import progress as hook  # type: ignore[attr-defined]
    except ImportError:
        hook = None
    scope = getattr(hook, "reporting", None) if hook is not None else None
    if scope is None or (progress is None and deadline is None):
        yield
        return

    def report(done: float, total: float | None = None, message: str | None = None) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise CallTimeout(f"`moetune {command}` stopped: time limit reached after {done:g}"
                              + (f" of {total:g}" if total else "") + " steps", 2, command=command)
        if progress is not None:
            progress(done, total, message)

    with scope(report):
        yield


@dataclass
class Result:
    """What one call produced: the ``--json`` object, the exit code and what went to stderr."""

    data: Any
    exit_code: int
    stderr: str
    argv: list[str]


def call(name: str, args: Mapping[str, Any] | None = None, *, root: str | Path | None = None,
         progress: ProgressFn | None = None, timeout_s: float | None = None,
         max_output_bytes: int = MAX_OUTPUT_BYTES) -> Result:
    """Run ``moetune <name> ... --json`` in-process; see the module docstring.

    ``root``: path arguments must resolve inside it, and the command runs with it as working directory (relative
    paths mean the same as on a command line started there). ``timeout_s``: the call stops at the next progress
    report after that many seconds (calls that report no progress finish).
    """
    from moetune.cli import EXIT_EXCEPTIONS, user_error

    cmd = get_command(name)
    root_p = Path(root).resolve() if root is not None else None
    if root_p is not None and not root_p.is_dir():
        raise CommandError(f"root={str(root)!r}: expected an existing folder", 2)
    argv = build_argv(cmd, args, root=root_p)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    if not _LOCK.acquire(timeout=timeout_s if timeout_s else -1):
        raise CommandError(f"`moetune {cmd.name}`: another call is still running (waited {timeout_s:g} s)", 2,
                           command=cmd.name)
    try:
        code = 0
        err_text = ""
        with _captured(max_output_bytes) as (out, err), _cwd(root_p), \
                _progress_scope(progress, deadline, cmd.name):
            try:
                rv = _root_command().main(args=argv, prog_name="moetune", standalone_mode=False)
                code = rv if isinstance(rv, int) else 0
            except EXIT_EXCEPTIONS as exc:
                code = exc.exit_code
            except OutputTooLarge as exc:
                raise CommandError(f"`moetune {cmd.name}`: {exc}", 2, command=cmd.name) from None
            except CommandError:
                raise
            except Exception as exc:
                if out.overflow:
                    raise CommandError(f"`moetune {cmd.name}`: output exceeds {max_output_bytes} bytes; narrow the "
                                       "request", 2, command=cmd.name) from None
                known = user_error(exc)
                if known is None:
                    raise
                raise CommandError(known[0], known[1], command=cmd.name) from None
        err_text = err.buf.decode("utf-8", "replace")
        text = bytes(out.buf)
    finally:
        _LOCK.release()
    if not text.strip():
        last = [ln for ln in err_text.splitlines() if ln.strip()]
        msg = one_line(last[-1]) if last else f"`moetune {cmd.name}` printed no JSON (exit code {code})"
        raise CommandError(msg.removeprefix("error: "), code or 2, command=cmd.name)
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise CommandError(f"`moetune {cmd.name} --json` printed invalid JSON ({e})", 2, command=cmd.name) from None
    return Result(data=data, exit_code=code, stderr=err_text, argv=argv)


def run(name: str, args: Mapping[str, Any] | None = None, **kw: Any) -> Any:
    """The ``--json`` object of ``moetune <name>`` called with ``args`` (see :func:`call`)."""
    return call(name, args, **kw).data


__all__ = ["Arg", "CallTimeout", "Command", "CommandError", "InputError", "OutputTooLarge", "OutsideRootError",
           "Result", "args_from_argv", "build_argv", "call", "commands", "confine", "get_command", "run",
           "schema"]
