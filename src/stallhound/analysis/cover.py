"""How much of each probe interval a set of intervals covers: the length of their union inside it, in numpy.

The intervals are merged into disjoint islands (start order, running maximum of ends) with the covered time
before each island summed; a probe's cover is then two lookups by binary search, however many intervals
overlap it. An equality join of probes to intervals on time buckets costs a row per pair instead: many times the
intervals, even when none of them overlap.
"""

from __future__ import annotations

import numpy as np


def islands(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals [s, e) as disjoint islands (start-sorted; touching intervals merge)."""
    keep = e > s
    s, e = s[keep], e[keep]
    if not len(s):
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    heads = np.flatnonzero(np.concatenate(([True], s[1:] > reach[:-1])))
    return s[heads], reach[np.append(heads[1:], len(s)) - 1]


def covered(probe_s: np.ndarray, probe_e: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per probe [probe_s, probe_e), the length of the union of the intervals [s, e) inside it (0 for an empty
    probe)."""
    starts, ends = islands(s, e)
    if not len(starts):
        return np.zeros(len(probe_s), dtype=np.int64)
    before = np.concatenate(([0], np.cumsum(ends - starts)))  # covered time before each island

    def upto(x: np.ndarray) -> np.ndarray:  # covered time before x (before the first island: 0 of island 0)
        at = np.maximum(np.searchsorted(starts, x, side="right") - 1, 0)
        return before[at] + np.clip(x - starts[at], 0, ends[at] - starts[at])

    return np.maximum(upto(probe_e) - upto(probe_s), 0)
