"""Shared fixtures: real exports from ../shared/fixtures/nsys (used in place) and synthetic samples."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from fixture_guard import FIXTURES_ROOT, missing_fixtures_hooks

from stallhound.formats import Profile, open_profile

FIXTURES = FIXTURES_ROOT / "nsys"
FIXTURE_FILES = sorted(FIXTURES.glob("*.sqlite"))
FIXTURE_IDS = [p.stem for p in FIXTURE_FILES]

pytest_configure, pytest_collection_modifyitems, pytest_terminal_summary = missing_fixtures_hooks()


REQUIRED_ARGS = {  # the arguments a tool cannot be called without, beside its profile
    "query_sql": {"sql": "SELECT count(*) AS n FROM kernels"}, "find_kernels": {"pattern": "gemm"},
    "call_sites": {"events": "syncs"}}


@pytest.fixture
def anyio_backend():
    """The MCP client and server tests run on asyncio (anyio would also try trio)."""
    return "asyncio"


def text_of(result) -> str:
    """The text content of an MCP tool result."""
    return "".join(c.text for c in result.content if getattr(c, "text", None))


def one_sentence(message: str) -> None:
    """An error as a user sees it: one line, no traceback."""
    assert message and "\n" not in message and "Traceback" not in message, message


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stallhound-cache")


@pytest.fixture(scope="session")
def open_fixture(cache_root):
    """open_fixture('nsysai_mock') -> Profile of a real export, built once per test session."""
    opened: dict[str, Profile] = {}

    def _open(stem: str) -> Profile:
        if stem not in opened:
            opened[stem] = open_profile(FIXTURES / f"{stem}.sqlite", cache_dir=cache_root)
        return opened[stem]

    yield _open
    for profile in opened.values():
        profile.close()


def _sample(tmp_path_factory, cache_root, preset: str) -> tuple[Profile, dict]:
    from stallhound import synth
    path = tmp_path_factory.mktemp(f"synth-{preset}") / f"{preset}.sqlite"
    truth = synth.write_sample(path, getattr(synth, preset)())
    return open_profile(path, cache_dir=cache_root), truth


@pytest.fixture(scope="session")
def demo(tmp_path_factory, cache_root):
    """(Profile, ground truth dict) of the synthetic sample with every problem planted."""
    profile, truth = _sample(tmp_path_factory, cache_root, "demo")
    yield profile, truth
    profile.close()


@pytest.fixture(scope="session")
def clean(tmp_path_factory, cache_root):
    """(Profile, ground truth dict) of the synthetic sample with nothing planted."""
    profile, truth = _sample(tmp_path_factory, cache_root, "clean")
    yield profile, truth
    profile.close()


def lived_iterations(truth: dict) -> list[tuple[int, int]]:
    """The synthetic truth's iterations as the devices lived them (iterations' rule): each rank's range from its
    start, or the end of its previous iteration's GPU work if later (no later than its own first GPU work), to its
    end or its GPU work's end if later; ranks combined by the median start and end."""
    per_device = [{d["device"]: d for d in i["per_device"]} for i in truth["iterations"]]
    spans = [[(max(d["start_ns"], min(per_device[k - 1][dev]["gpu_end_ns"], d["gpu_start_ns"])) if k else
               d["start_ns"], max(d["end_ns"], d["gpu_end_ns"])) for dev, d in rank.items()]
             for k, rank in enumerate(per_device)]
    return [(int(statistics.median(s for s, _ in k)), int(statistics.median(e for _, e in k))) for k in spans]


def planted(truth: dict, kind: str) -> list[dict]:
    return [p for p in truth["planted"] if p["kind"] == kind]


def dump(model) -> dict:
    """A pydantic result as plain JSON data (for snapshots)."""
    return json.loads(model.model_dump_json())


def kernels_in_export(path: Path) -> int:
    """Kernel launches in a raw export, by plain SQLite: the independent figure to check tools against."""
    import sqlite3
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


SYNTH_PAIR_BASE = {"devices": 2, "iterations": 10}  # small enough to build in a second or two, long enough to be steady
SYNTH_PAIRS = {  # name -> (before overrides, after overrides): one planted change of known size each
    "removed_sync": ({"device_syncs_per_iteration": 1}, {}),
    "pinned_memory": ({"pageable_h2d_per_iteration": 3}, {"pageable_h2d_per_iteration": 3, "pin_pageable_h2d": True}),
    "fewer_tiny_kernels": ({"tiny_kernels_per_iteration": 300}, {"tiny_kernels_per_iteration": 30}),
    "slower_rank": ({}, {"straggler_device": 1}),
}


@pytest.fixture(scope="session")
def synth_pair(tmp_path_factory, cache_root):
    """synth_pair(name) -> ((before Profile, truth), (after Profile, truth)) for a SYNTH_PAIRS change, built once."""
    from stallhound import synth
    made: dict[str, tuple] = {}

    def _pair(name: str) -> tuple:
        if name not in made:
            folder = tmp_path_factory.mktemp(f"pair-{name}")
            sides = []
            for side, overrides in zip(("before", "after"), SYNTH_PAIRS[name], strict=True):
                path = folder / f"{side}.sqlite"
                truth = synth.write_sample(path, synth.SynthConfig(**SYNTH_PAIR_BASE, **overrides))
                sides.append((open_profile(path, cache_dir=cache_root), truth))
            made[name] = tuple(sides)
        return made[name]

    yield _pair
    for pair in made.values():
        for profile, _ in pair:
            profile.close()


RAW_WORK = """SELECT o.start, o."end", r.start, r."end" FROM (
  SELECT start, "end", correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = :d
  UNION ALL SELECT start, "end", correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = :d
  UNION ALL SELECT start, "end", correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = :d) o
LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId"""
RAW_CALLS = """SELECT r.start, r."end" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
WHERE s.value LIKE :name AND r.globalTid = :tid"""


def work_runs(work: list[tuple[int, int, int | None, int | None]], lo: int, hi: int) -> list[tuple[int, ...]]:
    """(start, end, busy_from, run_start, run_launch, run_idle) of the idle stretches of `work` (start, end, its launch
    call's start and return; sorted) in [lo, hi) (edges included): busy_from, the end of the last stretch before it
    whose work after it was launched by a call not yet returned when it began (lo at first); run_start, the end of the
    last one whose work after it the host began to launch only after it began (lo at first); run_launch, when that
    launch call began (lo at first); run_idle, the idle of the stretches since run_start whose launch had not
    returned when they began."""
    gaps, reach, busy_from, run_start, run_launch, run_idle = [], lo, lo, lo, lo, 0
    for a, b, launched, returned in [*work, (hi, hi, None, None)]:
        if a > reach:
            gaps.append((reach, a, busy_from, run_start, run_launch, run_idle))
            busy_from = a if returned is None or returned > reach else busy_from
            if launched is not None and launched <= reach:
                run_idle += a - reach if returned > reach else 0
            else:
                run_start, run_launch, run_idle = a, launched, 0
        reach = max(reach, b)
    return gaps


def waited_ns(call: tuple[int, int], gap_start: int, runs: tuple[int, ...]) -> int:
    """The device's work that a blocking call (start, end) waited for before a gap starting at gap_start, with the
    gap's (busy_from, run_start, run_launch, run_idle) from work_runs: from the call's start (or busy_from when later)
    to the gap (or the call's end); or, when longer, from the call's start (or run_start when later and the work the
    run began with was launched only after the call began) less the run's unqueued idle."""
    busy_from, run_start, run_launch, run_idle = runs
    since = max(call[0], run_start) if run_launch is None or run_launch > call[0] else call[0]
    return max(0, min(gap_start, call[1]) - min(max(call[0], busy_from), since + run_idle))


def blocked_share(path: Path, device: int, global_tid: int, name_like: str, lo: int, hi: int,
                  since: int | None = None) -> tuple[int, int]:
    """(gaps, ns), read from a raw export with sqlite3: the device's idle gaps in [lo, hi) (edges included) that
    begin inside a CUDA runtime call named like `name_like` on thread `global_tid`, each counted from its start to
    the call's return and then on for at most attribution.SYNC_RESUME_MAX_NS and the device's work the call waited for
    (waited_ns): the blocking call's share. since: where the window the runs of work are read in begins (lo when
    None)."""
    since = lo if since is None else since
    import sqlite3

    from stallhound.analysis.attribution import SYNC_RESUME_MAX_NS
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        work = sorted((max(a, since), min(b, hi), ls, le) for a, b, ls, le in raw.execute(RAW_WORK, {"d": device})
                      if b > since and a < hi)
        calls = sorted(raw.execute(RAW_CALLS, {"name": name_like, "tid": global_tid}).fetchall())
    shares = []
    for g0, g1, *run in (g for g in work_runs(work, since, hi) if g[0] >= lo):
        for start, end in (c for c in calls if c[0] <= g0 < c[1]):
            turn = min(max(0, min(g1, end + SYNC_RESUME_MAX_NS) - end), waited_ns((start, end), g0, tuple(run)))
            shares.append(min(g1, end) - g0 + turn)
    return len(shares), sum(shares)
