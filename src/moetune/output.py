"""Output helpers shared by all commands: JSON on stdout (nothing else there), rich for humans on stderr/stdout."""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from typing import Any

import orjson

#: Width of tables when the output is not a terminal (a pipe, a file): every table fits in 100 columns.
PIPE_WIDTH = 100


def _width(stream: Any) -> int | None:
    """Terminal: rich measures it. Pipe or file: ``$COLUMNS`` if set, else :data:`PIPE_WIDTH` (rich would use 80)."""
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        pass
    cols = os.environ.get("COLUMNS", "")
    return int(cols) if cols.isdigit() and int(cols) > 0 else PIPE_WIDTH


class _FirstPrintConsole:
    """A rich ``Console`` with these settings, made on the first :meth:`print` (the only method the commands call):
    importing ``rich.console`` and making the two consoles is ~80 M instructions (~12 ms) of start-up, which a
    command that prints only JSON (``moetune plan --json``) never needs. The settings, the width included, are fixed
    at import as before; the console reads its terminal (colours) when it is made."""

    def __init__(self, **settings: Any) -> None:
        self._settings = settings
        self._console: Any = None

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._settings)
        self._console.print(*objects, **kwargs)


# soft_wrap: a line longer than the width is never broken by rich (copyable lines such as ``fix:``, overrides,
# flags and reproduce commands stay one line in a pipe and in a terminal's copy buffer); tables still fit the width.
console = _FirstPrintConsole(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err_console = _FirstPrintConsole(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


def _default(obj: Any) -> Any:
    """orjson fallback: every result type serialises (``__json__`` protocol, pydantic, dataclasses, numpy, sets,
    paths, enums); anything else is written as its ``str`` rather than failing the command."""
    if hasattr(obj, "__json__"):
        return obj.__json__()
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, complex):
        return str(obj)
    return str(obj)


def _plain(obj: Any) -> Any:
    """Pure-Python twin of the orjson pass, for what orjson refuses (integers beyond 64 bits)."""
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, str | int | float | bool) else k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, str | bool | float):
        return obj
    if isinstance(obj, int):
        return obj if -(2**63) <= obj < 2**64 else float(obj)
    return _plain(_default(obj))


def to_json_bytes(obj: Any, *, indent: bool = True) -> bytes:
    """Serialise ``obj`` (pydantic models, dataclasses, numpy values, any result type) to JSON bytes. Non-finite
    floats are written as null (JSON has no NaN / inf): orjson writes NaN and +-inf as null, numpy's included."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    try:
        obj = orjson.loads(orjson.dumps(obj, default=_default, option=opts))
    except orjson.JSONEncodeError:
        obj = _plain(obj)
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0)


def print_json(obj: Any) -> None:
    """Write ``obj`` as JSON to stdout, followed by a newline."""
    data = to_json_bytes(obj) + b"\n"
    buf = getattr(sys.stdout, "buffer", None)
    if buf is not None:
        buf.write(data)
    else:  # stdout replaced by a text stream (in-process callers, tests)
        sys.stdout.write(data.decode("utf-8"))
    sys.stdout.flush()


def readable(table: Any, *, names: tuple[str, ...] = ()) -> Any:
    """Make a rich Table safe to read and copy from: no header word is cut ("domin…"), no cell is ellipsised
    (long cells fold onto the next line instead of losing characters), and the columns whose header is in
    ``names`` (the names one must type: models, systems, runs, kernels) are never wrapped or cut at all.
    Returns the table (call it just before printing, after every row is added)."""
    from rich.text import Text

    def plain(cell: Any) -> str:
        if isinstance(cell, Text):
            return cell.plain
        return str(cell)

    for col in table.columns:
        header = plain(col.header)
        words = header.split() or [""]
        longest = max(len(w) for w in words)
        col.overflow = "fold"
        if header in names:
            cells = [plain(c) for c in col._cells]
            col.no_wrap = True
            col.min_width = max([len(header), *(max((len(x) for x in c.splitlines()), default=0) for c in cells)])
        else:
            col.min_width = max(col.min_width or 0, longest)
    return table


def progress_on_stderr(label: str, stream: Any = None) -> Any:
    """Context manager rendering :func:`moetune.progress.report` calls as a transient rich progress bar on stderr:
    only when stderr is a terminal and the work has run for ``moetune.progress.SHOW_AFTER_S`` seconds (never on
    stdout, so ``--json`` output is unaffected)."""
    import contextlib
    import time

    from moetune import progress

    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def bar_scope():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        start = time.monotonic()
        state: dict[str, Any] = {"bar": None, "task": None}

        def callback(done: int, total: int | None, what: str | None = "") -> None:
            total = max(int(total or 1), 1)
            if state["bar"] is None:
                if time.monotonic() - start < getattr(progress, "SHOW_AFTER_S", 2.0):
                    return
                bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[what]}"), TimeElapsedColumn(),
                               console=Console(file=stream), transient=True)
                bar.start()
                state["bar"], state["task"] = bar, bar.add_task(label, total=total, what=what or "")
            state["bar"].update(state["task"], completed=done, total=total, what=what or "")

        try:
            with progress.reporting(callback):
                yield
        finally:
            if state["bar"] is not None:
                state["bar"].stop()

    return bar_scope()
