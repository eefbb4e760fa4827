"""analysis/cover.py against a brute-force count of covered nanoseconds, on random probes and intervals (nested,
touching, zero-length, unsorted)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from stallhound.analysis import cover


def _brute(probes: list[tuple[int, int]], intervals: list[tuple[int, int]]) -> list[int]:
    covered = set()
    for s, e in intervals:
        covered.update(range(s, e))
    return [sum(1 for t in range(ps, pe) if t in covered) for ps, pe in probes]


def _random(rng: random.Random, count: int, longest: int) -> list[tuple[int, int]]:
    return [(s, s + rng.randint(0, longest)) for s in (rng.randrange(1000) for _ in range(count))]


@pytest.mark.parametrize("seed", range(10))
def test_cover_covered_equals_a_brute_force_count(seed):
    rng = random.Random(seed)
    probes = _random(rng, 60, 300)
    intervals = _random(rng, rng.choice([0, 1, 5, 80]), rng.choice([3, 40, 400]))
    ps, pe = (np.array([p[i] for p in probes], dtype=np.int64) for i in (0, 1))
    s, e = (np.array([v[i] for v in intervals], dtype=np.int64) for i in (0, 1))
    assert cover.covered(ps, pe, s, e).tolist() == _brute(probes, intervals)


def test_cover_islands_merge_overlapping_and_touching_intervals():
    s, e = np.array([50, 0, 10, 30, 31, 70]), np.array([60, 10, 20, 35, 33, 70])
    starts, ends = cover.islands(s, e)
    assert (starts.tolist(), ends.tolist()) == ([0, 30, 50], [20, 35, 60])
