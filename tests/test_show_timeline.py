"""show_timeline: lanes bucketed per column, the longest kernels and gaps exact, steps; and its MCP App view."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, dump, planted, text_of
from mcp.client import Client
from mcp.client.extension import ClientExtension
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID
from modeldb import make_model, union_ns
from timeline_ref import levels, raw_lanes

from stallhound.analysis import attribution
from stallhound.analysis.intervals import islands
from stallhound.server.app import build_server
from stallhound.server.ui import TIMELINE_URI
from stallhound.tools import gpu_idle_gaps, iterations
from stallhound.tools import show_timeline as st

REAL = "nsysai_h100_2gpu_1s"


def run(con, **kw) -> st.Result:
    return st.run(con, st.Params(profile="t", **kw))


def k(s: int, e: int, device: int = 0, name: str = "gemm", category: str = "compute") -> dict:
    return {"device_id": device, "stream_id": 7, "start_ns": s, "end_ns": e, "short_name": name, "name": name,
            "category": category}


def test_show_timeline_lanes_levels_and_exact_spans_on_a_tiny_model():
    con = make_model(kernels=[k(0, 10), k(5, 15), k(60, 100), k(20, 35, name="nccl", category="nccl")],
                     memcpy=[{"device_id": 0, "start_ns": 40, "end_ns": 44, "direction": "H2D", "bytes": 1},
                             {"device_id": 0, "start_ns": 50, "end_ns": 51, "direction": "D2D", "bytes": 1}])
    result = run(con, buckets=10, limit=2)
    assert (result.scope.start_ns, result.scope.end_ns, result.bucket_ns) == (0, 100, 10)
    (dev,) = result.devices
    assert [(lane.lane, lane.busy_ns, lane.levels) for lane in result.lanes] == [
        ("compute", 55, "9500009999"), ("nccl", 15, "0095000000"), ("h2d", 4, "0000400000"),
        ("other_copy", 1, "0000010000")]
    assert [(s.name, s.start_ns, s.end_ns) for s in result.kernels] == [("gemm", 60, 100), ("nccl", 20, 35)]
    assert dev.kernel_count == 4 and result.truncated
    assert result.gaps == [] and dev.gap_count == 0  # no gap of 1 ms in 100 ns


def test_show_timeline_a_window_clips_every_lane():
    con = make_model(kernels=[k(0, 10), k(5, 15), k(60, 100)])
    result = run(con, start_ns=8, end_ns=68, buckets=12)
    (lane,) = result.lanes
    assert lane.busy_ns == union_ns([(8, 10), (8, 15), (60, 68)]) == 15
    assert lane.levels == levels([(8, 10), (8, 15), (60, 68)], 8, 68, 12)


@pytest.fixture(scope="module")
def real(open_fixture):
    return open_fixture(REAL)


def test_show_timeline_lanes_match_the_raw_export(real):
    result = run(real.con, buckets=300)
    s = result.scope
    raw = raw_lanes(FIXTURES / f"{REAL}.sqlite", s.start_ns, s.end_ns)
    got = {(lane.device, lane.lane): lane for lane in result.lanes}
    assert sorted(got) == sorted(key for key, v in raw.items() if v)
    for key, lane in got.items():
        assert lane.busy_ns == union_ns(raw[key]), key
        assert lane.levels == levels(raw[key], s.start_ns, s.end_ns, 300), key


# The lanes as first written: busy islands numbered with two sorted passes, each split over the columns it touches.
ISLANDS_LANES_SQL = "WITH " + st.LANE_WORK + ",\n" + islands("lane_busy", "lane_work", "device_id, lane") + """,
pieces AS (
  SELECT device_id, lane, b,
         least(end_ns, """ + st.EDGE % "b + 1" + ") - greatest(start_ns, " + st.EDGE % "b" + """) AS ns
  FROM (SELECT *, unnest(range(((start_ns - $start) * $buckets) // $width,
                               ((end_ns - 1 - $start) * $buckets) // $width + 1)) AS b FROM lane_busy)),
columns AS (
  SELECT device_id, lane, b, sum(ns) AS ns,
         ceil($levels * sum(ns) / (""" + st.EDGE % "b + 1" + " - " + st.EDGE % "b" + """))::INTEGER AS level
  FROM pieces GROUP BY device_id, lane, b)
SELECT device_id, lane, sum(ns)::BIGINT, list_sort(list([b, level])) FROM columns GROUP BY ALL ORDER BY ALL
"""


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_show_timeline_lanes_equal_the_island_split_on_every_fixture(open_fixture, stem):
    con = open_fixture(stem).con
    if not con.execute("SELECT count(*) FROM gpus").fetchone()[0]:
        pytest.skip("no GPU work")
    s = st.resolve_scope(con, st.Params(profile="t"), default="gpu_active")
    for buckets in (10, 997):
        args = {**st.scope_args(s), "buckets": buckets, "width": s.duration_ns, "levels": st.LEVELS}
        got = sorted((d, lane, busy, sorted(c)) for d, lane, busy, c in con.execute(st.LANES_SQL, args).fetchall())
        assert got == [(d, lane, busy, c) for d, lane, busy, c in con.execute(ISLANDS_LANES_SQL, args).fetchall()]
        assert got, stem


def in_turn(spans: list[tuple], limit: int) -> list[tuple]:
    """(device, start, end) spans: each device's longest in turn (first every device's longest, ...), then longest
    first within a turn."""
    ranked = []
    for device in {s[0] for s in spans}:
        mine = sorted((s for s in spans if s[0] == device), key=lambda s: (s[1] - s[2], s[1]))
        ranked.extend((rank, s) for rank, s in enumerate(mine))
    return [s for _, s in sorted(ranked, key=lambda r: (r[0], r[1][1] - r[1][2], r[1][0], r[1][1]))][:limit]


def test_show_timeline_longest_kernels_are_the_exports_longest_of_each_device_in_turn(real):
    result = run(real.con, limit=5)
    with sqlite3.connect(f"file:{FIXTURES / REAL}.sqlite?mode=ro", uri=True) as db:
        spans = db.execute("SELECT deviceId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    assert [(x.device, x.start_ns, x.end_ns) for x in result.kernels] == in_turn(spans, 5)
    assert {x.device for x in result.kernels[:2]} == {0, 1}
    counts = {d: sum(1 for s in spans if s[0] == d) for d in (0, 1)}
    assert {d.device: d.kernel_count for d in result.devices} == counts and result.truncated


def test_show_timeline_gaps_are_gpu_idle_gaps_longest_with_their_causes(demo):
    profile, truth = demo
    result = run(profile.con, limit=6)
    gaps = gpu_idle_gaps.run(profile.con, gpu_idle_gaps.Params(profile="t", limit=500))
    theirs = {(g.device, g.start_ns, g.end_ns): (g.cause, g.blocked_in) for g in gaps.gaps}
    assert [(g.device, g.start_ns, g.end_ns) for g in result.gaps] == in_turn(list(theirs), 6)
    assert all(theirs[(g.device, g.start_ns, g.end_ns)] == (g.cause, g.blocked_in) for g in result.gaps)
    assert {d.device: d.gap_count for d in result.devices} == {d.device: d.gap_count for d in gaps.devices}
    planted_gap = planted(truth, "idle_gap")[0]  # 20 ms with nothing traced on the host: the longest of its device
    first = next(g for g in result.gaps if g.device == planted_gap["device"])
    assert (first.start_ns, first.end_ns, first.cause) == (planted_gap["start_ns"], planted_gap["end_ns"],
                                                           "host_untraced")


def test_show_timeline_steps_are_the_iterations(demo):
    profile, truth = demo
    result = run(profile.con)
    found = iterations.run(profile.con, iterations.Params(profile="t", limit=500))
    assert [(x.start_ns, x.end_ns) for x in result.steps] == [(r.start_ns, r.end_ns) for r in found.rows]
    assert len(result.steps) == len(truth["iterations"]) and result.step_method == found.method
    inside = found.rows[2].end_ns - 1  # a window from inside step 2 shows steps 2.. only
    cut = run(profile.con, start_ns=inside)
    assert [x.index for x in cut.steps] == [r.index for r in found.rows[2:]]


def test_show_timeline_idle_is_the_attributions(demo):
    profile, _ = demo
    result = run(profile.con)
    attr = attribution.attribute(profile.con, result.scope)
    assert {d.device: d.idle_ns for d in result.devices} == {d: v.idle_ns for d, v in attr.devices.items()}


def test_show_timeline_demo_data_snapshot(demo, snapshot):
    profile, _ = demo
    assert dump(run(profile.con, buckets=40, limit=2)) == snapshot


# --- over MCP: the tool, its view and the extension ---------------------------------------------------------------
class AppsClient(ClientExtension):
    """A client that says it shows MCP Apps, as a UI host does."""
    identifier = EXTENSION_ID

    def settings(self) -> dict:
        return {"mimeTypes": [APP_MIME_TYPE]}


@pytest.fixture(scope="module")
def server(cache_root):
    return build_server([FIXTURES], cache_dir=cache_root)


@pytest.mark.anyio
async def test_show_timeline_view_is_listed_readable_and_bound_to_the_tool(server):
    async with Client(server) as client:
        listed = {str(r.uri): r for r in (await client.list_resources()).resources}
        assert listed[TIMELINE_URI].mime_type == APP_MIME_TYPE
        read = await client.read_resource(TIMELINE_URI)
        html = read.contents[0].text
        assert read.contents[0].mime_type == APP_MIME_TYPE
        assert html.startswith("<!DOCTYPE html>") and "ui/initialize" in html and "NsTimeline" in html
        tool = next(t for t in (await client.list_tools()).tools if t.name == "show_timeline")
        assert tool.meta["ui"] == {"resourceUri": TIMELINE_URI}


@pytest.mark.anyio
@pytest.mark.parametrize("shows_apps", [True, False])
async def test_show_timeline_result_names_its_view_only_for_clients_that_show_apps(server, shows_apps):
    path = str(FIXTURES / f"{REAL}.sqlite")
    async with Client(server, extensions=[AppsClient()] if shows_apps else None) as client:
        result = await client.call_tool("show_timeline", {"profile": path, "device": 1, "buckets": 50})
    assert not result.is_error, text_of(result)
    assert result.structured_content["scope"]["devices"] == [1]
    lanes = result.structured_content["lanes"]
    assert lanes and all(len(lane["levels"]) == 50 and lane["device"] == 1 for lane in lanes)
    assert "device 1: busy" in text_of(result)
    assert ((result.meta or {}).get("ui") == {"resourceUri": TIMELINE_URI}) is shows_apps


@pytest.mark.anyio
async def test_show_timeline_bad_buckets_is_one_sentence(server):
    async with Client(server) as client:
        result = await client.call_tool("show_timeline", {"profile": str(FIXTURES / f"{REAL}.sqlite"),
                                                          "buckets": 5})
        assert result.is_error and "buckets must be an integer from 10 to 10000 (got 5)" in text_of(result)
        still = await client.call_tool("show_timeline", {"profile": str(FIXTURES / f"{REAL}.sqlite")})
        assert not still.is_error


def test_show_timeline_range_name_picks_the_step_range_as_iterations_does():
    """Two ranges recur with GPU work; auto takes the step-named one, range_name the other, as iterations does."""
    nvtx = [{"pid": 1, "tid": 1, "text": text, "start_ns": s, "end_ns": s + length, "kind": "push_pop",
             "depth": depth} for s in (0, 1000, 2000) for text, length, depth in (("train_step", 900, 0),
                                                                                 ("forward", 400, 1))]
    kernels = [{**k(s + 10, s + 300), "pid": 1, "tid": 1, "launch_start_ns": s + 5} for s in (0, 1000, 2000)]
    con = make_model(nvtx=nvtx, kernels=kernels)
    by_range = {name: iterations.run(con, iterations.Params(profile="t", range_name=name))
                for name in (None, "forward")}
    for name, found in by_range.items():
        result = run(con, range_name=name)
        assert result.step_method == found.method == ("nvtx:forward" if name else "nvtx:train_step")
        assert [(s.start_ns, s.end_ns) for s in result.steps] == [(r.start_ns, r.end_ns) for r in found.rows]
