"""The C allocator of a process that runs tools: set up at start so that the arrays of millions of operations the
numpy passes allocate and free come from the heap and are reused, instead of being mapped fresh from the kernel (a
page fault per page touched) until glibc's sliding threshold catches up with their size; and told to hand the heap's
free memory back once a pass is over."""

from __future__ import annotations

import ctypes
import functools
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc malloc.h)
# glibc maps every block above its mmap threshold fresh and, each time it frees one, raises the threshold to that
# size, up to 32 MB on 64-bit. Set there from the start, the tools' large arrays are reused rather than mapped
# afresh: faster, for a slightly higher peak RSS (freed arrays stay for reuse).
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES  # glibc's own pairing: free memory kept at the heap's top


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:  # no C library to load
        return None


def tune() -> bool:
    """Set both thresholds where the allocator is glibc's malloc; True when it took them."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc's malloc
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                  TRIM_THRESHOLD_BYTES))


def release() -> bool:
    """Hand the heap's free memory back to the kernel (glibc's malloc_trim: every arena, not only the top of the
    main one, which is all that TRIM_THRESHOLD_BYTES governs); True where the allocator could.

    Worth it after a numpy pass over millions of operations: the freed arrays stay in the heap otherwise, and the
    SQL after the pass adds its own peak on top of them."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True
