"""Progress of long work (the planner's search), reported through one context-local callback.

The API is two names:

* ``report(done, total, what="")`` — called by the work (e.g. :func:`moetune.plan.search.plan` once per layout
  it prices). Does nothing unless a callback is installed; cheap enough for a hot loop.
* ``reporting(callback)`` — context manager installing ``callback(done: int, total: int, what: str)`` for the
  code run inside it (a :class:`contextvars.ContextVar`, so threads and asyncio tasks each see their own).
  The CLI renders it on stderr (:func:`cli_progress`); an MCP server can forward it as MCP progress notifications.
  A forked worker process (the planner's parallel shares) never calls the parent's callback.

The console script renders it (``moetune.output.progress_on_stderr``, installed by ``moetune.cli.main``): a rich
progress bar on stderr, shown only when stderr is a terminal and the work has run for :data:`SHOW_AFTER_S` seconds,
transient (erased when done); never on stdout, so ``--json`` output is unaffected. In-process callers (the MCP
server, the web API) install their own callback instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

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
