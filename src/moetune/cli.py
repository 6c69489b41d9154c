"""The ``moetune`` command: a thin typer app.

Each command lives in ``moetune.commands.<module>`` and registers itself through ``register(app)``;
this file only wires them together and turns every user-facing error into one line with exit code 2.
"""

from __future__ import annotations

import atexit
import copy
import importlib
import os
import sys
import threading

import typer

from moetune.errors import MoetuneError, one_line, validation_message
from moetune.output import err_console

# Newer typer (0.2x) vendors click as ``typer._click`` and raises only its exceptions and its own ``typer.Exit`` /
# ``typer.Abort``: the click package is then not imported at all (~13 ms of start-up). Older typer is built on the
# click package itself.
try:
    from typer import _click as _vendored_click
except ImportError:  # pragma: no cover - older typer uses the click package itself
    _vendored_click = None
if _vendored_click is not None:
    _USAGE_ERRORS: tuple[type[BaseException], ...] = (_vendored_click.exceptions.UsageError,)
    _CLICK_ERRORS: tuple[type[BaseException], ...] = (_vendored_click.exceptions.ClickException,)
    _NO_ARGS_HELP: tuple[type[BaseException], ...] = (_vendored_click.exceptions.NoArgsIsHelpError,)
    _ABORT: tuple[type[BaseException], ...] = (typer.Abort,)
    #: the exceptions click and typer raise for a normal exit with a code (``typer.Exit``, ``--help``)
    EXIT_EXCEPTIONS: tuple[type[BaseException], ...] = (typer.Exit,)
else:  # pragma: no cover
    import click

    _USAGE_ERRORS = (click.exceptions.UsageError,)
    _CLICK_ERRORS = (click.ClickException,)
    _NO_ARGS_HELP = (click.exceptions.NoArgsIsHelpError,)
    _ABORT = (click.exceptions.Abort, getattr(typer, "Abort", click.exceptions.Abort))
    EXIT_EXCEPTIONS = (click.exceptions.Exit, getattr(typer, "Exit", click.exceptions.Exit))


class _PlainTopHelp(typer.core.TyperGroup):
    """The top-level ``moetune --help`` in click's plain layout (every subcommand's help keeps typer's rich one):
    rendering it with rich imports ``typer.rich_utils`` and rich's markdown stack, about a third of the start-up."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**{**kwargs, "rich_markup_mode": None})


app = typer.Typer(
    name="moetune",
    cls=_PlainTopHelp,
    context_settings={"terminal_width": 120, "max_content_width": 120},
    help="Plan, estimate, check and diagnose Mixture-of-Experts training on Megatron-Core / Megatron-Bridge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: command modules, in the order they appear in ``moetune --help``
COMMAND_MODULES = (
    "plan",
    "estimate",
    "check",
    "recipes",
    "logs",
    "trace",
    "sweep",
    "catalog",
    "layout",
    "flops",
    "calibrate",
    "mcp",
    "serve",
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"moetune.commands.{_name}").register(app)


def _version_info() -> dict[str, str]:
    import platform

    from moetune import __version__

    return {"moetune": __version__, "python": platform.python_version()}


@app.command("version")
def version(json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout.")) -> None:
    """Print the moetune version."""
    info = _version_info()
    if json_out:
        from moetune.output import print_json

        print_json(info)
    else:
        print(info["moetune"])


def _print_version(value: bool) -> None:
    if value:
        print(_version_info()["moetune"])
        raise typer.Exit(0)


@app.callback()
def _root(version_flag: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                             help="Print the moetune version and exit.")) -> None:
    """Plan, estimate, check and diagnose Mixture-of-Experts training on Megatron-Core / Megatron-Bridge."""


def _fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    sys.exit(code)


def user_error(exc: BaseException) -> tuple[str, int] | None:
    """The one-line message and exit code the CLI reports for ``exc``; ``None`` for a bug (a traceback).

    One mapping for the console script and for in-process callers (``moetune.service``: MCP server, web API).
    """
    if isinstance(exc, MoetuneError):
        return one_line(exc), exc.exit_code
    if isinstance(exc, _USAGE_ERRORS):
        return one_line(exc.format_message()), 2
    if isinstance(exc, _ABORT):
        return "aborted", 130
    if isinstance(exc, _CLICK_ERRORS):
        return one_line(exc.format_message()), 2
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename}: no such file", 2
    if isinstance(exc, IsADirectoryError):
        return f"{exc.filename}: is a directory, expected a file", 2
    if isinstance(exc, PermissionError):
        return f"{exc.filename}: permission denied", 2
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})", 2
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return validation_message(exc), 2
    return None


def _command_name(args: list[str]) -> str | None:
    """The command (or group) name in ``args``: the first argument that is not an option (the root options are flags
    without values); ``None`` where there is none."""
    return next((a for a in args if not a.startswith("-")), None)


def _app_for(args: list[str]) -> typer.Typer:
    """``app`` with only the command or command group that ``args`` names, so that typer converts that one command
    to click instead of all of them (it reads the signature and evaluates the annotations of every command function
    on each run). The whole app where ``args`` names none (``--help``, ``--version``, a mistyped name: the listing
    and the "No such command" error need every command). The root options are flags without values (``--version``,
    ``--help``), so the first argument that is not an option is the command's name (:func:`_command_name`)."""
    name = _command_name(args)
    if name is None:
        return app
    cmds = [c for c in app.registered_commands if (c.name or c.callback.__name__.replace("_", "-")) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if not cmds and not groups:
        return app
    one = copy.copy(app)  # same settings and root callback; the two registries are replaced, not mutated
    one.registered_commands, one.registered_groups = cmds, groups
    return one


def main(argv: list[str] | None = None) -> None:
    """The command line (``argv``: the arguments, default ``sys.argv[1:]``); ends with ``SystemExit`` carrying the
    exit status. Tests and in-process callers call this; the console script calls :func:`entry`."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        from moetune.output import progress_on_stderr

        with progress_on_stderr("moetune"):  # long work (the planner's search) shows a bar on a terminal's stderr
            rv = _app_for(args)(args=args, standalone_mode=False)
    except EXIT_EXCEPTIONS as exc:
        sys.exit(exc.exit_code)
    except _NO_ARGS_HELP as exc:  # a group called without a command: a rich help is printed as the error is built,
        if msg := exc.format_message():  # a plain one is its message
            print(msg)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback reaches the user
        known = user_error(exc)
        if known is None:
            if os.environ.get("MOETUNE_DEBUG"):
                raise
            known = (f"internal error ({exc.__class__.__name__}: {one_line(exc)[:300]}); please report it "
                     "(MOETUNE_DEBUG=1 shows the traceback)", 2)
        _fail(*known)
    sys.exit(rv if isinstance(rv, int) else 0)


#: commands that start no other program and whose console-script process runs without pydantic plugins (:func:`entry`)
NO_PYDANTIC_PLUGINS = frozenset({"plan", "estimate", "check"})


def entry() -> None:
    """Console-script entry point (``moetune``, ``python -m moetune``): :func:`main`, then the process ends without
    the interpreter's teardown. The teardown frees every object one by one - after a large plan, the planner's memo
    tables, about 0.05-0.1 s - and runs a last garbage collection over them; the operating system reclaims the memory
    at once. Everything else a normal exit does still happens first: the ``atexit`` handlers run (logging, temporary
    files, multiprocessing) and stdout / stderr are flushed. Falls back to the normal exit where other threads are
    still running (a normal exit waits for them) or where this Python has no ``atexit._run_exitfuncs``.

    For the commands in :data:`NO_PYDANTIC_PLUGINS` it sets ``PYDANTIC_DISABLE_PLUGINS=__all__`` unless the user's
    environment sets it (any value, empty included, wins): pydantic otherwise looks for plugins at its first model
    build by reading the entry points of every installed distribution (~30 M instructions, ~4 ms with 200
    distributions), and moetune's models use none. Only commands that start no other program get it: the variable is
    inherited by child processes, and ``sweep submit`` would pass it on to the training job through sbatch."""
    if _command_name(sys.argv[1:]) in NO_PYDANTIC_PLUGINS:
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is None or threading.active_count() > 1:
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): Python prints the message to stderr and exits with 1
        print(code, file=sys.stderr)
        status = 1
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written (as at a normal exit)
            pass
    os._exit(status & 0xFF)


if __name__ == "__main__":  # pragma: no cover
    entry()
