"""The activity-to-API-call join run per correlation-id range (how large exports stay within the build's memory
limit) gives the same model as one join over the whole export."""

from __future__ import annotations

import re
import sqlite3
from itertools import pairwise

import pytest
from conftest import FIXTURE_FILES, FIXTURE_IDS, FIXTURES

from stallhound.formats import open_profile
from stallhound.formats.nsys import build as nsys_build
from stallhound.formats.nsys.chunks import correlation_ranges, rows_per_range, within
from stallhound.model.limits import BUILD_MEMORY_ENV

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
    monkeypatch.setattr(nsys_build, "rows_per_range", lambda: SMALL_RANGE)
    used = []
    monkeypatch.setattr(nsys_build, "correlation_ranges", lambda con, rows: used.append(correlation_ranges(con, rows))
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


# Its runtime and driver calls share correlation ids (cudaLaunchKernel with cudaLaunchKernel_v7000, cudaMemcpy with
# cudaMemcpy_v3020): the joins must still write one row per kernel or copy, naming the earliest call.
SHARED_IDS = FIXTURES / "pipit_saxpy_mpi_a100.sqlite"
ACTIVITY = {  # model table: (raw table, its API calls' names, the call's start and name in the model)
    "kernels": ("CUPTI_ACTIVITY_KIND_KERNEL", r"^(cuda|cu)(Graph(Exec)?)?Launch", "launch_start_ns", "launch_api"),
    "memcpy": ("CUPTI_ACTIVITY_KIND_MEMCPY", r"(?i)memcpy|memprefetch", "launch_start_ns", "api_name")}


def _earliest_calls(table: str, pattern: str) -> tuple[list[tuple], int]:
    """(correlation id, start, start of the earliest matching API call of its id, that call's name) per raw row of
    `table`, and how many of those rows have more than one matching call."""
    with sqlite3.connect(f"file:{SHARED_IDS}?mode=ro", uri=True) as con:
        calls = con.execute("SELECT (r.globalTid >> 24) & 16777215, r.correlationId, r.start, s.value "
                            "FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId").fetchall()
        rows = con.execute(f"SELECT (globalPid >> 24) & 16777215, correlationId, start FROM {table}").fetchall()
    matching: dict[tuple, list[tuple]] = {}
    for pid, corr, start, name in calls:
        name = re.sub(r"_v[0-9]+$", "", name)
        if re.search(pattern, name) and "ynchronize" not in name:
            matching.setdefault((pid, corr), []).append((start, name))
    expected = sorted((corr, start, *min(matching.get((pid, corr), [(None, None)]))) for pid, corr, start in rows)
    return expected, sum(len(matching.get((pid, corr), [])) > 1 for pid, corr, _ in rows)


@pytest.mark.parametrize("rows_per_range", [None, 20], ids=["one join", "ranged"])
def test_build_chunks_shared_correlation_ids_keep_one_row_per_activity_and_its_earliest_call(
        rows_per_range, tmp_path, monkeypatch):
    if rows_per_range:
        monkeypatch.setattr(nsys_build, "rows_per_range", lambda: rows_per_range)
    profile = open_profile(SHARED_IDS, cache_dir=tmp_path)
    try:
        if rows_per_range:
            assert len(correlation_ranges(profile.con, rows_per_range)) > 1
        for model_table, (raw_table, pattern, launch_start, api_name) in ACTIVITY.items():
            got = profile.con.execute(f"SELECT correlation_id, start_ns, {launch_start}, {api_name} "
                                      f"FROM {model_table} ORDER BY ALL").fetchall()
            expected, shared = _earliest_calls(raw_table, pattern)
            assert shared > 0 and got == expected
    finally:
        profile.close()


def test_build_chunks_ranges_scale_with_the_build_memory_limit(monkeypatch):
    monkeypatch.setenv(BUILD_MEMORY_ENV, "150")
    small = rows_per_range()
    monkeypatch.setenv(BUILD_MEMORY_ENV, "1500")
    assert rows_per_range() == 10 * small > 0
