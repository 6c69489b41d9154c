"""The C allocator's large-block thresholds while logs are read (glibc only).

The bulk path converts each 2 MiB chunk with numpy temporaries of a few hundred KiB to a few MiB. glibc serves
blocks at or above its mmap threshold with a fresh ``mmap`` and returns them on ``free``, and trims the top of the
heap when more than its trim threshold is free; both thresholds start low (128 KiB) and only rise as the process
frees large blocks (mallopt(3), "M_MMAP_THRESHOLD": dynamic adjustment up to ``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB
on 64-bit; the trim threshold follows at twice it, glibc malloc/malloc.c ``_int_free``). Until then every chunk's
temporaries are fresh pages, and the kernel zero-fills each 4 KiB page on first touch: on the bench's realistic
512 MB log ~115,000 page faults, about a fifth of the reader's CPU time. :func:`settle_thresholds` sets both to the
values the dynamic adjustment would reach (32 MiB and 64 MiB), so the temporaries are reused from the heap (~20,000
faults; peak RSS unchanged, bench/logs_speed.py).

It runs once per process, only under glibc, and not when the user set either threshold through the environment
(``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``, which also switch the dynamic adjustment off).
"""

from __future__ import annotations

import ctypes
import os

#: glibc malloc/malloc.c: DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (4 * 1024 * 1024 * sizeof(long))
MMAP_THRESHOLD = 32 << 20
#: twice the mmap threshold, as glibc's dynamic adjustment sets it (malloc.c ``_int_free``: trim_threshold =
#: 2 * mmap_threshold)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
#: mallopt(3) parameter numbers (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_done = False


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # not a glibc system (confstr name unknown, or no confstr)
        return False


def settle_thresholds() -> bool:
    """Set glibc's mmap / trim thresholds (module docstring) once; True when they were set by this call."""
    global _done
    if _done:
        return False
    _done = True
    if any(v in os.environ for v in _ENV) or not _glibc():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mmap_set = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        trim_set = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        return bool(mmap_set and trim_set)
    except (OSError, AttributeError):
        return False
