"""Errors that reach the user as one line (exit code 2), never as a traceback.

Readers of user files raise :class:`InputError` naming the field, the value and what was expected;
the CLI entry point turns it into ``error: <message>`` on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class MoetuneError(Exception):
    """Base class of every error moetune reports to the user."""

    exit_code = 2


class InputError(MoetuneError):
    """Bad user input: unreadable file, unknown name, malformed value, impossible layout."""

    def __init__(self, message: str, *, field: str | None = None, value: object = None, expected: str | None = None):
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(message)

    @classmethod
    def bad_value(cls, field: str, value: object, expected: str) -> InputError:
        """``<field>=<value>: expected <expected>``."""
        return cls(f"{field}={value!r}: expected {expected}", field=field, value=value, expected=expected)


class UnknownNameError(InputError):
    """An unknown catalog name; the message lists the closest known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        known = sorted(set(known))
        close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=3, cutoff=0.4)
        lookup = {k.lower(): k for k in known}
        hint = f"; closest: {', '.join(lookup[c] for c in close)}" if close else f"; known: {', '.join(known[:12])}"
        super().__init__(f"unknown {kind} {name!r}{hint}", field=kind, value=name, expected=f"a known {kind}")


class LayoutError(InputError):
    """A parallel layout that Megatron would reject (names the violated constraint)."""


def one_line(exc: BaseException) -> str:
    """Collapse an exception message to one line."""
    text = str(exc).strip() or exc.__class__.__name__
    return " ".join(text.split())


def validation_message(exc: BaseException, source: str | None = None) -> str:
    """One line for a pydantic ``ValidationError``: ``<source>: <field>=<value>: expected <what>``.

    Replaces pydantic's multi-line text ("1 validation error for ModelArch ... For further information visit
    https://errors.pydantic.dev/...") by the first failing field, its value and the constraint, plus a count of
    further errors."""
    errors = getattr(exc, "errors", None)
    try:
        items = errors(include_url=False) if callable(errors) else []
    except TypeError:  # pragma: no cover - older pydantic
        items = errors() if callable(errors) else []
    if not items:
        return f"{source}: {one_line(exc)}" if source else one_line(exc)
    first = items[0]
    loc = ".".join(str(x) for x in first.get("loc", ()) if x != "__root__")
    msg = str(first.get("msg", "invalid")).replace("Value error, ", "").replace("Assertion failed, ", "")
    if msg.startswith("Input should be"):
        msg = "expected" + msg[len("Input should be"):]
    elif msg.startswith("Extra inputs are not permitted"):
        msg = "unknown field"
    elif msg.startswith("Field required"):
        msg = "missing (required field)"
    value = first.get("input")
    shown = "" if first.get("type") == "missing" or isinstance(value, dict) else f"={_short(value)}"
    more = f" (and {len(items) - 1} more error{'s' if len(items) > 2 else ''})" if len(items) > 1 else ""
    text = f"{loc}{shown}: {msg}{more}" if loc else f"{msg}{more}"
    return one_line(f"{source}: {text}" if source else text)


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
