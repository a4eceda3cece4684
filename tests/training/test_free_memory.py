"""Freed heap memory goes back to the operating system between the phases of a CPU run."""

from __future__ import annotations

import platform
import sys

import psutil
import pytest
from nego.training.free_memory import release_freed_memory

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system():
    me = psutil.Process()
    blocks = [bytearray(b"x" * 100_000) for _ in range(2_000)]  # 200 MB in heap chunks (under the mmap threshold)
    pinned = bytearray(b"y" * 100_000)  # allocated last: the heap's top stays in use, so free() alone keeps the pages
    del blocks
    held = me.memory_info().rss
    assert release_freed_memory()
    assert held - me.memory_info().rss > 100 * 2**20
    assert pinned[0] == ord("y")


def test_where_the_c_library_cannot_trim_it_says_so(monkeypatch):
    import nego.training.free_memory as fm

    monkeypatch.setattr(fm, "_trim", lambda: None)
    assert fm.release_freed_memory() is False
