"""Giving freed memory back to the operating system (glibc; elsewhere nothing is done).

ONNX Runtime runs without its own memory arena (ner/runtime/onnx.py), so every tensor of a
batch is a malloc and a free, and a burst of large batches leaves the C heap with large free
stretches that glibc keeps: a server's RSS steps up at each burst and never comes down.
`malloc_trim(0)` hands every free page back. Serving large tensors by mmap instead (a fixed
M_MMAP_THRESHOLD) keeps RSS flat too, but its page faults cost more throughput than trimming, so
the heap stays and is trimmed when the graphs are idle (docs/decisions/memory.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator keeps its own ways
        return None
    return trim


_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Free heap pages back to the OS: milliseconds, so for moments the graphs would idle anyway."""
    if _TRIM is not None:
        _TRIM(0)
