"""gpu_utilization: union busy time, kernel overlap, streams, timeline slices, idle concentration."""

from __future__ import annotations

import random
import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, dump
from modeldb import make_model, union_ns

from stallhound.analysis import common, device_pass
from stallhound.analysis.common import scope_args
from stallhound.analysis.intervals import GPU_WORK
from stallhound.model.errors import InvalidRequest
from stallhound.tools import gpu_utilization as gu

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def k(s: int, e: int, device: int = 0, stream: int = 7) -> dict:
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "short_name": "k", "name": "k"}


def c(s: int, e: int, device: int = 0, stream: int = 3) -> dict:
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "bytes": 1, "direction": "H2D"}


def run(con, **kw) -> gu.Result:
    return gu.run(con, gu.Params(profile="t", **kw))


# --- independent reference: sweep over plain Python tuples -----------------------------------------
def at_least_two_ns(intervals: list[tuple[int, int]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    total, running, last = 0, 0, None
    for t, delta in events:
        if running >= 2:
            total += t - last
        running, last = running + delta, t
    return total


def clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi and e > s]


def slice_busy(intervals, bounds):
    return [union_ns(clip(intervals, lo, hi)) for lo, hi in zip(bounds, bounds[1:], strict=False)]


# --- unit ------------------------------------------------------------------------------------------
def test_gpu_utilization_whole_result_on_tiny_model():
    con = make_model(kernels=[k(0, 10), k(5, 15, stream=8), k(40, 50)], memcpy=[c(20, 30)])
    result = run(con, buckets=5)
    assert result.scope.model_dump() == {"profile": "t", "devices": [0], "start_ns": 0, "end_ns": 50,
                                         "duration_ns": 50, "window_basis": "gpu_active"}
    assert (result.busy_pct, result.idle_pct, result.bucket_count, result.bucket_ns) == (70.0, 30.0, 5, 10)
    assert result.devices == [gu.DeviceUtilization(
        device=0, busy_ns=35, busy_pct=70.0, idle_ns=15, kernel_busy_ns=25, kernel_busy_pct=50.0, overlap_ns=5,
        overlap_pct=10.0, stream_count=3,
        streams=[gu.StreamBusy(stream=7, busy_ns=20, busy_pct=40.0), gu.StreamBusy(stream=3, busy_ns=10, busy_pct=20.0),
                 gu.StreamBusy(stream=8, busy_ns=10, busy_pct=20.0)],
        timeline_busy_pct=[100.0, 50.0, 100.0, 0.0, 100.0], idle_concentration_pct=66.67,
        idle_pattern="concentrated")]


@pytest.mark.parametrize("kernels, busy, overlap", [
    ([(0, 10), (2, 8), (4, 12)], 12, 8),  # three deep: 2+ from 2 to 10
    ([(0, 100), (10, 20), (30, 40)], 100, 20),  # nested in a long kernel
    ([(0, 10), (10, 20)], 20, 0),  # touching is not overlapping
    ([(0, 10), (0, 10)], 10, 10),  # identical
    ([(5, 5), (0, 10)], 10, 0),  # zero-length kernel counts for nothing
])
@pytest.mark.parametrize("rows_per_chunk", [device_pass.ROWS_PER_CHUNK, 1])
def test_gpu_utilization_union_and_overlap(kernels, busy, overlap, rows_per_chunk, monkeypatch):
    monkeypatch.setattr(device_pass, "ROWS_PER_CHUNK", rows_per_chunk)
    device = run(make_model(kernels=[k(s, e) for s, e in kernels])).devices[0]
    assert (device.busy_ns, device.kernel_busy_ns, device.overlap_ns) == (busy, busy, overlap)


@pytest.mark.parametrize("rows_per_chunk", [device_pass.ROWS_PER_CHUNK, 1, 3])
@pytest.mark.parametrize("seed", range(12))
def test_gpu_utilization_matches_brute_force(seed, rows_per_chunk, monkeypatch):
    """Also with the work read in tiny start-time chunks: the running maxima carried across chunks."""
    monkeypatch.setattr(device_pass, "ROWS_PER_CHUNK", rows_per_chunk)
    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(1, 25)):
        s = rng.randint(0, 180)
        rows.append((rng.choice(["k", "c"]), rng.choice([1, 2]), rng.choice([7, 8]), s, s + rng.randint(0, 40)))
    rows.append(("k", 1, 7, 0, 1))  # fixes the window to 0..220 with device 1 always present
    rows.append(("k", 1, 7, 219, 220))
    buckets = rng.choice([1, 3, 7, 20, 200])
    lo, hi = (rng.randint(0, 90), rng.randint(120, 220)) if seed % 2 else (None, None)
    con = make_model(kernels=[k(s, e, d, st) for kind, d, st, s, e in rows if kind == "k"],
                     memcpy=[c(s, e, d, st) for kind, d, st, s, e in rows if kind == "c"])
    result = run(con, buckets=buckets, start_ns=lo, end_ns=hi)
    lo, hi = result.scope.start_ns, result.scope.end_ns
    bounds = [lo + (i * (hi - lo) + buckets - 1) // buckets for i in range(buckets + 1)]
    for dev in result.devices:
        every = clip([(s, e) for _, d, _, s, e in rows if d == dev.device], lo, hi)
        kern = clip([(s, e) for kind, d, _, s, e in rows if d == dev.device and kind == "k"], lo, hi)
        assert dev.busy_ns == union_ns(every)
        assert dev.kernel_busy_ns == union_ns(kern)
        assert dev.overlap_ns == at_least_two_ns(kern)
        expected = [gu.pct(b, h - lo_) for b, lo_, h in zip(slice_busy(every, bounds), bounds, bounds[1:],
                                                              strict=False)]
        assert dev.timeline_busy_pct == expected
        streams = {st: union_ns(clip([(s, e) for _, d, st2, s, e in rows if d == dev.device and st2 == st],
                                     lo, hi)) for st in (7, 8)}
        assert {s.stream: s.busy_ns for s in dev.streams} == {st: b for st, b in streams.items() if b}


def test_gpu_utilization_streams_serial_summed_mixed_swept():
    """Stream 7 runs one after another though stream 8 overlaps it (summed); stream 8 and the unnumbered stream
    overlap themselves (their own sorted pass): each stream's busy time is its own union either way."""
    con = make_model(kernels=[k(0, 10), k(10, 20), k(5, 30, stream=8), k(8, 12, stream=8), k(40, 50),
                              {**k(60, 70), "stream_id": None}, {**k(65, 80), "stream_id": None}])
    streams = run(con).devices[0].streams
    assert [(s.stream, s.busy_ns) for s in streams] == [(7, 30), (8, 25), (None, 20)]


def test_gpu_utilization_device_idle_in_window_has_zero_row():
    con = make_model(kernels=[k(0, 100, device=0), k(0, 10, device=1)])
    result = run(con, start_ns=50, end_ns=100, buckets=2)
    assert [(d.device, d.busy_ns, d.timeline_busy_pct, d.idle_pattern) for d in result.devices] == [
        (0, 50, [100.0, 100.0], "no_idle"), (1, 0, [0.0, 0.0], "unknown")]


def test_gpu_utilization_idle_spread_evenly():
    kernels = [k(i * 10, i * 10 + 5) for i in range(10)] + [k(99, 100, device=1)]  # window 0..100
    result = run(make_model(kernels=kernels), buckets=10, device=0)
    assert [(d.busy_ns, d.timeline_busy_pct, d.idle_concentration_pct, d.idle_pattern) for d in result.devices] == [
        (50, [50.0] * 10, 20.0, "spread")]


def test_gpu_utilization_streams_capped_by_limit():
    con = make_model(kernels=[k(i, i + 1, stream=i) for i in range(6)])
    result = run(con, limit=2)
    assert result.truncated and result.devices[0].stream_count == 6
    assert [s.stream for s in result.devices[0].streams] == [0, 1]


def test_gpu_utilization_without_gpu_activity_says_so():
    con = make_model(cuda_api=[{"pid": 1, "tid": 1, "name": "cudaMalloc", "start_ns": 0, "end_ns": 100}])
    result = run(con)
    assert (result.devices, result.note) == ([], gu.NO_GPU_NOTE.format(capture="`nsys profile --trace=cuda`"))
    assert "no GPU activity" in gu.render(result)


# --- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 5}, "device 5 is not in this profile"),
    ({"start_ns": 30, "end_ns": 30}, "is empty"),
    ({"start_ns": 1000, "end_ns": 2000}, "outside the capture"),
])
def test_gpu_utilization_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(kernels=[k(0, 50)]), **kw)


def test_gpu_utilization_rejects_bad_buckets():
    with pytest.raises(ValueError):
        gu.Params(profile="t", buckets=201)


def test_gpu_utilization_empty_export_has_no_window(open_fixture):
    with pytest.raises(InvalidRequest, match="no timed events"):
        run(open_fixture("dynamicvit_empty_export").con)


# --- golden: real exports against a sweep over the raw SQLite rows ---------------------------------
def raw_intervals(stem: str) -> list[tuple[str, int, int, int, int]]:
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    rows = []
    for kind, table in (("k", "CUPTI_ACTIVITY_KIND_KERNEL"), ("c", "CUPTI_ACTIVITY_KIND_MEMCPY"),
                        ("s", "CUPTI_ACTIVITY_KIND_MEMSET")):
        if table in tables:
            rows += [(kind, *r) for r in con.execute(f'SELECT deviceId, streamId, start, "end" FROM {table}')]
    con.close()
    return rows


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_gpu_utilization_golden_union_matches_raw_sweep(open_fixture, stem):
    rows = raw_intervals(stem)
    lo, hi = min(r[3] for r in rows), max(r[4] for r in rows)
    result = run(open_fixture(stem).con)
    assert (result.scope.start_ns, result.scope.end_ns) == (lo, hi)
    assert [d.device for d in result.devices] == sorted({r[1] for r in rows})
    bounds = [lo + (i * (hi - lo) + 19) // 20 for i in range(21)]
    for dev in result.devices:
        every = clip([(s, e) for _, d, _, s, e in rows if d == dev.device], lo, hi)
        kern = clip([(s, e) for kind, d, _, s, e in rows if d == dev.device and kind == "k"], lo, hi)
        assert (dev.busy_ns, dev.kernel_busy_ns, dev.overlap_ns) == (
            union_ns(every), union_ns(kern), at_least_two_ns(kern))
        assert dev.timeline_busy_pct == [gu.pct(b, h - lo_) for b, lo_, h in
                                         zip(slice_busy(every, bounds), bounds, bounds[1:], strict=False)]
        for st in dev.streams:
            assert st.busy_ns == union_ns(clip([(s, e) for _, d, s2, s, e in rows
                                                if d == dev.device and s2 == st.stream], lo, hi))


# gpu_utilization's stream query before it summed the streams that run one operation after another
OLD_STREAMS_SQL = "WITH " + GPU_WORK + """,
o AS (
  SELECT device_id, stream_id, start_ns AS s, end_ns AS e, max(end_ns) OVER (PARTITION BY device_id, stream_id
         ORDER BY start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end FROM gpu_work)
SELECT device_id, stream_id, sum(e - greatest(s, prev_end)) FILTER (WHERE e > prev_end OR prev_end IS NULL) AS busy
FROM o GROUP BY ALL ORDER BY device_id, busy DESC, stream_id
"""


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_gpu_utilization_streams_match_the_sorted_pass_of_every_stream(open_fixture, stem):
    con = open_fixture(stem).con
    result = run(con, limit=500)
    old = con.execute(OLD_STREAMS_SQL, scope_args(result.scope)).fetchall()
    assert [(d.device, s.stream, s.busy_ns) for d in result.devices for s in d.streams] == old


@pytest.mark.parametrize("stem", ["nsysai_mfu_2gpu_before", "clue_t4_report4"])
def test_gpu_utilization_snapshot(open_fixture, stem, snapshot):
    assert dump(run(open_fixture(stem).con, buckets=10)) == snapshot


# --- planted vs found ------------------------------------------------------------------------------
def test_gpu_utilization_sees_the_planted_idle(demo):
    profile, truth = demo
    result = run(profile.con)
    gaps = {d: sum(g["duration_ns"] for g in truth["gpu_gaps"] if g["device"] == d) for d in truth["devices"]}
    for dev in result.devices:
        assert dev.idle_ns >= gaps[dev.device] > 0
    for gap in truth["gpu_gaps"]:
        inside = run(profile.con, device=gap["device"], start_ns=gap["start_ns"], end_ns=gap["end_ns"])
        assert inside.devices[0].busy_ns == 0


def test_gpu_utilization_quiet_on_clean(clean):
    profile, _ = clean
    result = run(profile.con)
    assert all(d.busy_pct > 99 for d in result.devices)


@pytest.mark.parametrize("stem", ["nsysai_mfu_2gpu_before", "clue_t4_report4", "nsysai_h100_2gpu_1s"])
@pytest.mark.parametrize("rows", [97])
def test_gpu_utilization_chunked_pass_equals_one_pass(open_fixture, stem, rows, monkeypatch):
    """Work read in start-time chunks, the running maxima carried across them, gives the one-chunk figures."""
    con = open_fixture(stem).con
    monkeypatch.setattr(common, "_model_cache", {})
    whole = run(con, buckets=37, limit=500)
    monkeypatch.setattr(common, "_model_cache", {})
    monkeypatch.setattr(device_pass, "ROWS_PER_CHUNK", rows)
    assert run(con, buckets=37, limit=500) == whole
