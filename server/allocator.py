"""The C allocator set up for a process that runs tools: the arrays of millions of operations the numpy passes
allocate and free come from the heap and are reused, instead of being mapped fresh from the kernel (a page fault per
page touched) until glibc's sliding threshold catches up with their size."""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc malloc.h)
# glibc maps every block above its mmap threshold fresh and, each time it frees one, raises the threshold to that
# size, up to 32 MB on 64-bit. Set there from the start, the first triage on the 1 GB benchmark export took
# 2.26-2.31 s instead of 2.41-2.73 s, its peak RSS 50-100 MB higher (freed arrays stay for reuse).
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES  # glibc's own pairing: free memory kept at the heap's top


def tune() -> bool:
    """Set both thresholds where the allocator is glibc's malloc; True when it took them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to load, or one without mallopt
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                  TRIM_THRESHOLD_BYTES))
