"""Knobs users set in the environment, read once here by the commands and passed down as parameters (the library
below reads no environment variable).

- ``MOETUNE_EFFICIENCY``: a file written by ``moetune calibrate``; the time model's efficiency parameters for
  ``estimate`` (unless ``--efficiency`` is given), ``plan``, ``compare`` and ``sweep collect``.
- ``MOETUNE_WORKERS``: processes the planner searches in (requests of >= 64 GPUs; default up to 2 of the CPUs).
- ``MOETUNE_TRACE_WORKERS``: processes that read per-rank Kineto traces (default one per CPU, at most one per file).
"""

import os

from moetune.errors import InputError


def _positive_int(name: str) -> int | None:
    text = os.environ.get(name)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InputError.bad_value(name, text, "a positive integer") from None
    return max(1, value)


def efficiency() -> str | None:
    """``$MOETUNE_EFFICIENCY`` (an efficiency file), None when unset: the shipped catalog values."""
    return os.environ.get("MOETUNE_EFFICIENCY") or None


def workers() -> int | None:
    """``$MOETUNE_WORKERS`` (planner processes), None when unset: the planner's default."""
    return _positive_int("MOETUNE_WORKERS")


def trace_workers() -> int | None:
    """``$MOETUNE_TRACE_WORKERS`` (trace-reading processes), None when unset (or 0): the reader's default."""
    text = os.environ.get("MOETUNE_TRACE_WORKERS")
    if text is not None and text.strip() == "0":
        return None
    return _positive_int("MOETUNE_TRACE_WORKERS")
