"""Hand the memory a phase of a CPU run freed back to the operating system.

Torch's CPU allocator is the C library's ``malloc``. Blocks freed after a dev evaluation or a training step stay in
the process's heap (glibc returns only the top of each arena on its own), so the resident size keeps the largest
phase's footprint and the next phase's peak adds to it. ``malloc_trim(0)`` returns every free page of every arena;
it costs milliseconds and changes nothing the process computes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache
from typing import Any


@cache
def _trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return the heap's free pages to the operating system; False where the C library cannot."""
    trim = _trim()
    return bool(trim(0)) if trim is not None else False
