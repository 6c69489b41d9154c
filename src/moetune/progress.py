"""Progress of long work (the planner's search), reported through one context-local callback.

The API is three names:

* ``report(done, total, what="")`` — called by the work (e.g. :func:`moetune.plan.search.plan` once per layout
  it prices). Does nothing unless a callback is installed; cheap enough for a hot loop.
* ``reporting(callback)`` — context manager installing ``callback(done: int, total: int, what: str)`` for the
  code run inside it (a :class:`contextvars.ContextVar`, so threads and asyncio tasks each see their own).
  The CLI renders it on stderr (:func:`cli_progress`); an MCP server can forward it as MCP progress notifications.
  A forked worker process (the planner's parallel shares) never calls the parent's callback.
* ``cli_progress(label)`` — the CLI's renderer: a rich progress bar on stderr, shown only when stderr is a
  terminal and the work has run for :data:`SHOW_AFTER_S` seconds; transient (erased when done). Never writes to
  stdout, so ``--json`` output is unaffected.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

ProgressCallback = Callable[[int, int, str], None]

#: (callback, pid of the process that installed it)
_CURRENT: ContextVar[tuple[ProgressCallback, int] | None] = ContextVar("moetune_progress", default=None)

#: the CLI shows a progress bar only for work that has already taken this long
SHOW_AFTER_S = 2.0


def report(done: int, total: int, what: str = "") -> None:
    """Tell the installed callback (if any) that ``done`` of ``total`` units of work are finished."""
    cur = _CURRENT.get()
    if cur is None or cur[1] != os.getpid():
        return
    cur[0](done, total, what)


@contextmanager
def reporting(callback: ProgressCallback | None) -> Iterator[None]:
    """Install ``callback`` for the work run inside the ``with`` block (None: no progress)."""
    token = _CURRENT.set((callback, os.getpid()) if callback is not None else None)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@contextmanager
def cli_progress(label: str, stream: Any = None) -> Iterator[None]:
    """Render :func:`report` calls as a transient rich progress bar on stderr (terminal only, after 2 s)."""
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.monotonic()
    state: dict[str, Any] = {"bar": None, "task": None}

    def callback(done: int, total: int, what: str) -> None:
        if state["bar"] is None:
            if time.monotonic() - start < SHOW_AFTER_S:
                return
            bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("{task.fields[what]}"), TimeElapsedColumn(),
                           console=Console(file=stream), transient=True)
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task(label, total=max(total, 1), what=what)
        state["bar"].update(state["task"], completed=done, total=max(total, 1), what=what)

    try:
        with reporting(callback):
            yield
    finally:
        if state["bar"] is not None:
            state["bar"].stop()
