"""memory_transfers: per-direction volume and bandwidth, pageable vs pinned, exposed copy time, syncing copies."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, planted
from modeldb import make_model, union_ns

from stallhound.analysis import copy_exposure
from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import memory_transfers as mt

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]


def k(s: int, e: int, stream: int = 7) -> dict:
    return {"device_id": 0, "stream_id": stream, "pid": 1, "start_ns": s, "end_ns": e, "short_name": "k", "name": "k"}


def copy(s: int, e: int, direction: str, nbytes: int | None, src: str, dst: str, corr: int | None = None,
         api: str | None = None, device: int = 0) -> dict:
    return {"device_id": device, "stream_id": 3, "pid": 1, "tid": 1 if api else None, "correlation_id": corr,
            "start_ns": s, "end_ns": e, "bytes": nbytes, "direction": direction, "src_kind": src, "dst_kind": dst,
            "api_name": api}


def call(s: int, e: int, name: str, corr: int | None = None) -> dict:
    kind = "sync" if "Synchronize" in name else "memcpy"
    return {"pid": 1, "tid": 1, "correlation_id": corr, "name": name, "kind": kind, "start_ns": s, "end_ns": e}


def tiny_model():
    """Kernels cover 100-400 and 700-800 ns on device 0; device 1 runs one untraced copy and no kernel."""
    return make_model(
        kernels=[k(100, 300), k(200, 400, stream=8), k(700, 800)],
        memcpy=[copy(0, 250, "H2D", 1000, "pageable", "device", 1, "cudaMemcpy"),
                copy(350, 750, "H2D", 4000, "pinned", "device", 2, "cudaMemcpyAsync"),
                copy(900, 910, "D2H", 4, "device", "pinned", 3, "cudaMemcpyAsync"),  # .item(): async + sync
                copy(950, 960, "D2H", 8, "device", "pageable", 4, "cudaMemcpy"),  # synchronous call
                copy(970, 1000, "D2H", 2048, "device", "pinned", 5, "cudaMemcpyAsync"),  # not small
                copy(1100, 1110, "D2H", 16, "device", "pinned", 8, "cudaMemcpyAsync"),  # no sync follows
                copy(150, 260, "D2D", 10_000, "device", "device"),
                copy(0, 100, "H2D", 500, "pinned", "device", device=1)],
        cuda_api=[call(0, 300, "cudaMemcpy", 1), call(340, 345, "cudaMemcpyAsync", 2),
                  call(880, 890, "cudaMemcpyAsync", 3), call(900, 912, "cudaStreamSynchronize"),
                  call(940, 962, "cudaMemcpy", 4), call(965, 968, "cudaMemcpyAsync", 5),
                  call(968, 1005, "cudaStreamSynchronize"), call(1050, 1060, "cudaMemcpyAsync", 8)])


def run(con, **kw) -> mt.Result:
    return run_skill(con, mt, mt.Params(profile="t", **kw))


def bw(nbytes: int, ns: int) -> float | None:
    return round(nbytes / ns, 3) if ns else None


def row(direction, device, n, nbytes, ns, window_pct, pageable, pinned, exposed, pageable_exposed) -> mt.DirectionRow:
    return mt.DirectionRow(
        direction=direction, device=device, count=n, bytes=nbytes, time_ns=ns, bandwidth_gb_per_s=bw(nbytes, ns),
        window_pct=window_pct, pageable_count=pageable[0], pageable_bytes=pageable[1], pageable_time_ns=pageable[2],
        pageable_bandwidth_gb_per_s=bw(pageable[1], pageable[2]), pinned_count=pinned[0], pinned_bytes=pinned[1],
        pinned_time_ns=pinned[2], pinned_bandwidth_gb_per_s=bw(pinned[1], pinned[2]), exposed_time_ns=exposed,
        exposed_pct=round(100 * exposed / ns, 2), pageable_exposed_ns=pageable_exposed)


# --- unit ------------------------------------------------------------------------------------------
def test_memory_transfers_whole_result_on_tiny_model():
    result = run(tiny_model())
    assert result.scope.duration_ns == 1110
    assert result.rows == [
        row("H2D", None, 3, 5500, 750, 33.78, (1, 1000, 250), (2, 4500, 500), 100 + 300 + 100, 100),
        row("D2D", None, 1, 10_000, 110, 4.95, (0, 0, 0), (0, 0, 0), 0, 0),
        row("D2H", None, 4, 2076, 60, 2.7, (1, 8, 10), (3, 2068, 50), 60, 10)]
    assert (result.copy_count, result.copy_bytes, result.copy_time_ns) == (8, 17_576, 920)
    assert (result.sync_copy_calls, result.sync_copy_api_ns) == (2, 300 + 22)
    # small D2H: the async copy + its sync (10 + 12) and the synchronous copy (22); the last one never waits
    assert (result.small_d2h_count, result.small_d2h_blocking, result.small_d2h_blocked_ns) == (3, 2, 44)
    # the pageable copies (1,000 B up, 8 B down) are under rules.PAGEABLE_STAGED_BYTES: they cost their latency, which
    # pinning does not shorten, so no pageable-host-memory (though one takes 22% of the window); the H2D time is all:
    assert [(f.root_cause, f.severity, f.device, f.time_at_stake_ns, f.tags) for f in result.findings] == [
        ("excessive-h2d-transfers", "high", 0, 400, ["pinned"]),
        ("excessive-h2d-transfers", "high", 1, 100, ["pinned"])]
    assert "H2D" in mt.render(result)


def test_memory_transfers_per_device_rows():
    result = run(tiny_model(), per_device=True)
    assert [(r.direction, r.device, r.count, r.time_ns, r.exposed_time_ns, r.window_pct) for r in result.rows] == [
        ("H2D", 0, 2, 650, 400, 58.56), ("D2D", 0, 1, 110, 0, 9.91), ("H2D", 1, 1, 100, 100, 9.01),
        ("D2H", 0, 4, 60, 60, 5.41)]
    assert result.findings == run(tiny_model()).findings  # findings are per device either way


@pytest.mark.parametrize("kernels, exposed", [
    ([], 400),  # no kernel at all
    ([(0, 1000)], 0),  # one kernel covers the copy
    ([(300, 400), (500, 600), (550, 700)], 400 - 50 - 200),  # 350-400 and 500-700 covered
    ([(360, 370), (360, 380), (365, 390), (700, 760)], 400 - 30 - 50),  # overlapping kernels count once
    ([(0, 3_000), (100, 400)], 0),  # a kernel longer than the join's time bucket covers it from buckets before
    ([(740, 9_000), (360, 370)], 400 - 10 - 10),  # ... or from the bucket the copy ends in
])
def test_memory_transfers_exposed_time_is_copy_minus_kernel_union(kernels, exposed):
    con = make_model(kernels=[k(s, e, stream=i) for i, (s, e) in enumerate(kernels)],
                     memcpy=[copy(350, 750, "H2D", 4000, "pinned", "device")])
    assert run(con).rows[0].exposed_time_ns == exposed


def test_memory_transfers_limit_and_device():
    capped = run(tiny_model(), limit=1)
    assert ([r.direction for r in capped.rows], capped.truncated, capped.total_rows) == (["H2D"], True, 3)
    assert [(r.direction, r.count) for r in run(tiny_model(), device=1).rows] == [("H2D", 1)]


def test_memory_transfers_pageable_finding_uses_the_pinned_bandwidth():
    pageable = [copy(i * 100, i * 100 + 50, "H2D", 2 << 20, "pageable", "device") for i in range(3)]
    pinned = [copy(1000, 1025, "H2D", 2 << 20, "pinned", "device")]
    result = run(make_model(memcpy=pageable + pinned))
    [finding] = [f for f in result.findings if f.root_cause == "pageable-host-memory"]
    # 6 MiB at the pinned 2 MiB / 25 ns would take 75 ns of the 150 spent
    assert (finding.device, finding.time_at_stake_ns, finding.tags) == (0, 75, [])


@pytest.mark.parametrize("api, tags", [("cudaMemcpy", ["large-single"]), ("cudaMemcpyAsync", ["large-single",
                                                                                                 "async-blocking"])])
def test_memory_transfers_one_large_pageable_copy_is_not_hidden_by_count_thresholds(api, tags):
    """One 1 GiB pageable copy, 40% of the window: no count threshold may hide it."""
    con = make_model(memcpy=[copy(0, 400, "H2D", 1 << 30, "pageable", "device", 1, api)],
                     kernels=[k(400, 1000)], cuda_api=[call(0, 400, api, 1)])
    [finding] = [f for f in run(con).findings if f.root_cause == "pageable-host-memory"]
    assert (finding.time_at_stake_ns, finding.tags) == (200, tags)  # half of it, without a pinned copy to compare


# --- golden: independent SQL on the raw export ------------------------------------------------------------
RAW_BYTES_SQL = """
SELECT replace(substr(o.name, length('CUDA_MEMCPY_KIND_') + 1), 'TO', '2') AS direction, count(*), sum(m.bytes)
FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind
GROUP BY direction ORDER BY direction
"""


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "clue_t4_report4", "fuser_h200_crossentropy",
                                  "nsysai_mfu_2gpu_before", "nsysai_mock"])
def test_memory_transfers_bytes_per_direction_match_raw_sql(open_fixture, stem):
    raw = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    result = run(open_fixture(stem).con, limit=100)
    expected = [tuple(r) for r in raw.execute(RAW_BYTES_SQL)]
    assert sorted((r.direction, r.count, r.bytes) for r in result.rows) == expected



@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "nsysai_mfu_2gpu_before"])
def test_memory_transfers_direction_rows_sum_the_device_rows(open_fixture, stem):
    """The rows per direction are summed from the per-device query: every figure, over two real devices."""
    con = open_fixture(stem).con
    merged, split = run(con, limit=100), run(con, per_device=True, limit=100)
    assert len({r.device for r in split.rows}) == 2
    fields = ("count", "bytes", "time_ns", "pageable_count", "pageable_bytes", "pageable_time_ns", "pinned_count",
              "pinned_bytes", "pinned_time_ns", "exposed_time_ns", "pageable_exposed_ns")
    for r in merged.rows:
        mine = [d for d in split.rows if d.direction == r.direction]
        assert [getattr(r, f) for f in fields] == [sum(getattr(d, f) for d in mine) for f in fields], r.direction
    assert [r.time_ns for r in merged.rows] == sorted((r.time_ns for r in merged.rows), reverse=True)
    assert merged.findings == split.findings and merged.total_rows == len({r.direction for r in split.rows})

def _exposed_by_kernel_union(con) -> dict[tuple[str, int], int]:
    """Per (direction, device): copy time outside the device's merged kernel intervals, in Python from the rows."""
    union: dict[int, list[list[int]]] = {}
    for device, s, e in con.execute("SELECT device_id, start_ns, end_ns FROM kernels WHERE end_ns > start_ns "
                                    "ORDER BY 1, 2, 3").fetchall():
        merged = union.setdefault(device, [])
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    exposed: dict[tuple[str, int], int] = {}
    for direction, device, s, e in con.execute("SELECT direction, device_id, start_ns, end_ns FROM memcpy").fetchall():
        busy = sum(max(0, min(e, ke) - max(s, ks)) for ks, ke in union.get(device, []) if ks < e and ke > s)
        exposed[direction, device] = exposed.get((direction, device), 0) + (e - s) - busy
    return exposed


def test_memory_transfers_exposed_time_matches_the_kernel_union(open_fixture):
    """The copy-to-kernel bucket join gives each copy's time outside the device's kernel union, as merging every
    kernel of the device does; this capture's copies run partly under kernels (the other fixtures' never do)."""
    con = open_fixture("extrap_windows_con_kernel").con
    rows = run(con, per_device=True, limit=100).rows
    assert all(0 < r.exposed_time_ns < r.time_ns for r in rows)
    assert {(r.direction, r.device): r.exposed_time_ns for r in rows} == _exposed_by_kernel_union(con)


@pytest.mark.parametrize("fixture", ["extrap_windows_con_kernel", "clue_t4_report4", "nsysai_h100_2gpu_1s"])
def test_memory_transfers_figures_do_not_depend_on_the_copy_chunks(open_fixture, monkeypatch, fixture):
    """Copies and kernels read three at a time (a copy's kernels may start in a later chunk) give the one-chunk
    figures."""
    con = open_fixture(fixture).con
    whole = run(con, per_device=True, limit=100)
    assert whole.copy_count > 3 * 2
    monkeypatch.setattr(copy_exposure, "ROWS_PER_CHUNK", 3)
    assert run(con, per_device=True, limit=100) == whole


# --- planted problems on the synthetic sample ---------------------------------------------------------
def test_memory_transfers_finds_planted_pageable_copies(demo):
    profile, truth = demo
    plants = planted(truth, "pageable_h2d")
    assert len(plants) == len(truth["devices"])
    for plant in plants:
        result = run(profile.con, device=plant["device"])
        [h2d] = [r for r in result.rows if r.direction == "H2D"]
        assert (h2d.pageable_count, h2d.pageable_bytes, h2d.pageable_time_ns) == (
            plant["count"], plant["bytes"], plant["copy_time_ns"])
        assert (h2d.pinned_count, h2d.pinned_bytes) == (plant["pinned_count"], plant["pinned_bytes"])
        assert h2d.pageable_bandwidth_gb_per_s < h2d.pinned_bandwidth_gb_per_s
        assert [f.device for f in result.findings if f.root_cause == "pageable-host-memory"] == [plant["device"]]


def test_memory_transfers_counts_planted_small_blocking_d2h(demo):
    profile, truth = demo
    for plant in planted(truth, "small_d2h"):
        result = run(profile.con, device=plant["device"])
        assert (result.small_d2h_count, result.small_d2h_blocking) == (plant["count"], plant["count"])
        # blocked = time in the syncs (the truth) plus the copy calls themselves (<= 10 us each in the sample)
        assert plant["blocked_ns"] < result.small_d2h_blocked_ns <= plant["blocked_ns"] + plant["count"] * 10_000


def test_memory_transfers_quiet_on_clean(clean):
    profile, _ = clean
    result = run(profile.con)
    assert result.small_d2h_count == 0 and result.findings == []
    assert all(r.pageable_count == 0 for r in result.rows)


# --- errors and bounds ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 9}, "device 9 is not in this profile"),
    ({"start_ns": 500, "end_ns": 100}, "is empty"),
    ({"start_ns": 10**6, "end_ns": 2 * 10**6}, "outside the capture"),
])
def test_memory_transfers_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(tiny_model(), **kw)


def test_memory_transfers_empty_export_has_no_window(open_fixture):
    with pytest.raises(InvalidRequest):
        run(open_fixture("dynamicvit_empty_export").con)


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_memory_transfers_default_result_is_small(open_fixture, stem):
    result = run(open_fixture(stem).con)
    assert len(result.model_dump_json()) < 20_000 and mt.render(result)


# --- savings never exceed the copies they are about; one owner per nanosecond -------------------------------------
def test_memory_transfers_pinned_saving_never_exceeds_the_pageable_copies_and_their_calls():
    """A synchronous pageable upload: the call runs 10-2,000 ns, the transfer 1,000-1,900. The device idles from 20
    (inside the call) to 1,000 and from 1,900 to the next kernel at 2,900 (the host's turnaround after the call, no
    longer than the 900 ns transfer it waited for): half the 900 ns exposed transfer plus 1,980 ns of idle would be
    2,430 ns, more than the 1,990 ns the copy and its call take, which is all pinning can save."""
    con = make_model(kernels=[k(0, 20), {**k(2_900, 3_000), "tid": 1, "correlation_id": 9}],
                     memcpy=[copy(1_000, 1_900, "H2D", 10**6, "pageable", "device", 1, "cudaMemcpy")],
                     cuda_api=[call(10, 2_000, "cudaMemcpy", 1),
                               {**call(2_850, 2_890, "cudaLaunchKernel", 9), "kind": "launch"}])
    [f, *_] = run(con).findings
    assert (f.root_cause, f.time_at_stake_ns, f.evidence["pageable_span_ns"]) == ("pageable-host-memory", 1_990, 1_990)
    assert (f.evidence["pageable_time_ns"], f.evidence["idle_in_pageable_copies_ns"]) == (900, 1_980)


def test_memory_transfers_h2d_finding_owns_the_copies_pinning_is_not_claimed_for():
    """Two small pageable uploads (not recurring enough, nor long, no idle while the host was in them) beside a
    pinned one, 42% of the window together: no pageable-host-memory finding, so excessive-h2d-transfers claims all the
    exposed upload time and cites nothing."""
    con = make_model(kernels=[k(0, 10), k(990, 1_000)],
                     memcpy=[copy(100, 110, "H2D", 100, "pageable", "device", 1, "cudaMemcpyAsync"),
                             copy(200, 210, "H2D", 100, "pageable", "device", 2, "cudaMemcpyAsync"),
                             copy(300, 700, "H2D", 4000, "pinned", "device", 3, "cudaMemcpyAsync")],
                     cuda_api=[call(90, 95, "cudaMemcpyAsync", 1), call(190, 195, "cudaMemcpyAsync", 2),
                               call(290, 295, "cudaMemcpyAsync", 3)])
    [f] = run(con).findings
    assert (f.root_cause, f.time_at_stake_ns, f.evidence["pinned_saving_ns"]) == ("excessive-h2d-transfers", 420, 0)
    assert "pageable-host-memory" not in f.title


def test_memory_transfers_pipit_pageable_and_h2d_findings_share_no_copy_time(open_fixture):
    """pipit's saxpy uploads x and y (pageable, 250 MB each) and reads y back every step, no kernel running. On
    triage's window, checked on the raw export: pinning saves half of each pageable copy (no pinned copy to compare)
    plus the idle the host spent in them, never more than the copies and their calls take; excessive-h2d-transfers
    claims the other half of the uploads and cites pageable-host-memory for the first."""
    from stallhound.tools import triage
    con = open_fixture("pipit_saxpy_mpi_a100").con
    w = triage.run(con, triage.Params(profile="p")).window
    raw = sqlite3.connect(f"file:{FIXTURES / 'pipit_saxpy_mpi_a100.sqlite'}?mode=ro", uri=True)
    # each copy with its call: the outer one (cudaMemcpy holds a cudaMemcpy_v3020 of the same correlation id)
    copies = raw.execute("""SELECT m.copyKind, m.start, m."end", min(r.start), max(r."end")
        FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
        WHERE m.srcKind = 0 OR m.dstKind = 0 GROUP BY m.rowid""").fetchall()
    mine = [c for c in copies if w.start_ns <= c[1] < w.end_ns]
    h2d = sum(e - s for kind, s, e, _, _ in mine if kind == 1)
    d2h = sum(e - s for kind, s, e, _, _ in mine if kind == 2)
    span = union_ns([(max(min(s, a), w.start_ns), min(max(e, b), w.end_ns)) for _, s, e, a, b in mine])
    result = run(con, start_ns=w.start_ns, end_ns=w.end_ns)
    pinned, uploads = result.findings
    assert (len(mine), pinned.evidence["pageable_span_ns"], pinned.evidence["pageable_time_ns"]) == (
        12, span, h2d + d2h)
    idle = pinned.evidence["idle_in_pageable_copies_ns"]
    assert pinned.time_at_stake_ns == h2d // 2 + d2h // 2 + idle <= span
    assert uploads.time_at_stake_ns == h2d - h2d // 2 == h2d - uploads.evidence["pinned_saving_ns"]
    assert "pageable-host-memory" in uploads.title


def test_memory_transfers_counts_memsets_and_those_on_managed_memory(open_fixture):
    raw = sqlite3.connect(f"file:{FIXTURES / 'clue_t4_report4.sqlite'}?mode=ro", uri=True)
    expected = raw.execute("""SELECT count(*), sum(bytes), sum("end" - start),
        count(*) FILTER (WHERE k.name LIKE '%MANAGED%'), sum("end" - start) FILTER (WHERE k.name LIKE '%MANAGED%')
        FROM CUPTI_ACTIVITY_KIND_MEMSET s JOIN ENUM_CUDA_MEM_KIND k ON k.id = s.memKind""").fetchone()
    r = run(open_fixture("clue_t4_report4").con)
    assert (r.memset_count, r.memset_bytes, r.memset_time_ns, r.managed_memset_count, r.managed_memset_time_ns) == (
        expected) == (160, 1_606_008_080, 26_033_081, 100, 19_204_027)
    assert "100 on managed memory" in mt.render(r)


def test_memory_transfers_copies_without_a_byte_count_have_no_bandwidth():
    """ROCm torch.profiler traces record gpu_memcpy events without 'bytes': the copies still count, with their time,
    and no bandwidth is made up from the unknown size (this crashed on int(None))."""
    con = make_model(kernels=[k(0, 50)], memcpy=[copy(100, 300, "H2D", None, "pinned", "device"),
                                                 copy(400, 500, "H2D", None, "pinned", "device")])
    (h2d,) = [r for r in run(con).rows if r.direction == "H2D"]
    assert (h2d.count, h2d.bytes, h2d.time_ns, h2d.bandwidth_gb_per_s) == (2, 0, 300, None)
