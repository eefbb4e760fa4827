"""The activity-to-API-call join run per correlation-id range (how large exports stay within the build's memory
limit) gives the same model as one join over the whole export."""

from __future__ import annotations

import sqlite3
from itertools import pairwise

import pytest
from conftest import FIXTURE_FILES, FIXTURE_IDS

from nsightful.profiles import ingest, open_profile
from nsightful.profiles.chunks import correlation_ranges, within

JOINED = ("kernels", "memcpy", "memset", "sync", "graph_exec")
SMALL_RANGE = 400  # API calls per range: several ranges on every fixture with a few thousand calls


def _raw_api_calls(path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        found = con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_RUNTIME'").fetchone()
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] if found[0] else 0


def _tables(path, cache) -> dict[str, list[tuple]]:
    profile = open_profile(path, cache_dir=cache)
    try:
        return {t: profile.con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in JOINED}
    finally:
        profile.close()


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=FIXTURE_IDS)
def test_build_chunks_ranged_join_equals_one_join(path, tmp_path, monkeypatch):
    whole = _tables(path, tmp_path / "whole")
    monkeypatch.setattr(ingest, "ROWS_PER_RANGE", SMALL_RANGE)
    used = []
    monkeypatch.setattr(ingest, "correlation_ranges", lambda con, rows: used.append(correlation_ranges(con, rows))
                        or used[-1])
    ranged = _tables(path, tmp_path / "ranged")
    assert ranged == whole
    calls = _raw_api_calls(path)
    assert calls <= 2 * SMALL_RANGE or len(used[0]) > 1  # the ranged build did run in several ranges


def test_build_chunks_ranges_cover_every_id_and_hold_at_most_the_limit(open_fixture):
    con = open_fixture("nsysai_h100_2gpu_1s").con
    total = con.execute("SELECT count(correlation_id) FROM cuda_api").fetchone()[0]
    ranges = correlation_ranges(con, SMALL_RANGE)
    assert len(ranges) >= total // SMALL_RANGE and ranges[0][0] is None and ranges[-1][1] is None
    assert all(a[1] == b[0] for a, b in pairwise(ranges))  # consecutive: no id falls between two ranges
    counts = [con.execute(f"SELECT count(*) FROM cuda_api WHERE {within('correlation_id', r)}").fetchone()[0]
              for r in ranges]
    assert sum(counts) == total and max(counts) <= SMALL_RANGE
    assert correlation_ranges(con, total) == [(None, None)]
