"""The allocator setting the stallhound command makes at start (model/allocator.py): arrays freed and allocated again,
as the numpy passes do, reuse the heap instead of faulting fresh pages in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stallhound.model import allocator

CHURN = """
import resource, sys
import numpy as np
from stallhound.model import allocator
if sys.argv[1] == "tuned":
    assert allocator.tune()
def churn():  # a pass over chunks of growing size, each freed before the next
    for mb in (2, 4, 8, 16, 24):
        chunk = np.ones(mb * 2**20 // 8)
        del chunk
churn()  # the first pass maps its arrays either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_allocator_tuned_process_reuses_freed_arrays():
    # in the passes after the first, default glibc faults pages in again (2,528 here, every run); tuned reuses the
    # freed arrays (0)
    default, tuned = _faults("default"), _faults("tuned")
    assert tuned <= 0.1 * default


def test_allocator_tune_says_whether_it_took():
    assert allocator.tune() is sys.platform.startswith("linux")


RELEASE = """
import sys
import numpy as np
from stallhound.model import allocator
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20
allocator.tune()
arrays = [np.ones(8 * 2**20 // 8) for _ in range(20)]  # 160 MB from the heap (below the mmap threshold)
del arrays[:-1]  # the last one pins the heap's top: glibc's own trim at free cannot reach the rest
before = rss_mb()
took = allocator.release()
print(took, before - rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_allocator_release_hands_freed_heap_memory_back():
    done = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True)
    took, freed_mb = done.stdout.split()
    assert took == "True" and int(freed_mb) >= 100
