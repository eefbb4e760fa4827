"""The allocator setting the nsightful command makes at start (server/allocator.py): arrays freed and allocated again,
as the numpy passes do, reuse the heap instead of faulting fresh pages in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nsightful.server import allocator

CHURN = """
import resource, sys
import numpy as np
from nsightful.server import allocator
if sys.argv[1] == "tuned":
    assert allocator.tune()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):  # a few passes over chunks of growing size, freed after each
    for mb in (2, 4, 8, 16, 24):
        chunk = np.ones(mb * 2**20 // 8)
        del chunk
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_allocator_tuned_process_reuses_freed_arrays():
    default, tuned = _faults("default"), _faults("tuned")
    assert tuned <= 0.6 * default  # default maps each new size fresh, then once more from the heap: about twice


def test_allocator_tune_says_whether_it_took():
    assert allocator.tune() is sys.platform.startswith("linux")
