"""The idle a blocking copy costs is the copy's: a gap that ends inside a copy call begun in it gives the time from the
call's start to the gap's end to the copy (attribution's lead piece), and only copies large enough to pay for their
staging through the driver's buffer are pageable-host-memory's (rules.PAGEABLE_STAGED_BYTES): tiny models at the rules'
edges, and real exports read independently with sqlite3."""

from __future__ import annotations

import bisect
import gzip
import json
import sqlite3

import pytest
from modeldb import make_model
from test_idle_evidence import corpus_profile

from stallhound.analysis import attribution, common, rules
from stallhound.formats import open_profile
from stallhound.tools import memory_transfers, triage

T = 1_000_000  # the timeline starts here, so launch calls can come before it
MIB = 1 << 20


def _kernel(n: int, s: int, e: int, launch: tuple[int, int]) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "tid": 7, "correlation_id": n, "start_ns": T + s,
            "end_ns": T + e, "short_name": f"k{n}", "name": f"k{n}", "category": "compute",
            "launch_api": "cudaLaunchKernel", "launch_start_ns": T + launch[0], "launch_end_ns": T + launch[1]}


def _call(name: str, kind: str, s: int, e: int, corr: int) -> dict:
    return {"pid": 1, "tid": 7, "correlation_id": corr, "name": name, "kind": kind, "start_ns": T + s, "end_ns": T + e}


def _gap(api: str, src: str, nbytes: int, call_start: int = 4_600_000, device: int = 0) -> attribution.Gap:
    """k1 ends at 10 us; the host shows nothing until the copy call (call_start to 5.6 ms); its 1 MiB-or-other H2D
    transfer runs 5.0-5.5 ms on `device`; k2 runs at 6 ms: the long gap 10 us-5 ms on device 0."""
    kernels = [_kernel(1, 0, 10_000, (-5_000, -1_000)), _kernel(2, 6_000_000, 6_010_000, (5_700_000, 5_750_000))]
    copy = {"device_id": device, "stream_id": 7, "pid": 1, "tid": 7, "correlation_id": 50, "start_ns": T + 5_000_000,
            "end_ns": T + 5_500_000, "bytes": nbytes, "direction": "H2D", "src_kind": src, "dst_kind": "device"}
    calls = [_call(api, "memcpy", call_start, 5_600_000, 50)] + [
        _call("cudaLaunchKernel", "launch", k["launch_start_ns"] - T, k["launch_end_ns"] - T, k["correlation_id"])
        for k in kernels]
    con = make_model(kernels=kernels, memcpy=[copy], cuda_api=calls)
    found = attribution.attribute(con, common.resolve_scope(con, common.ScopedParams(profile="t"),
                                                            default="gpu_active"))
    return found.long_gaps[0]


@pytest.mark.parametrize("api, src, nbytes, lead", [
    ("cudaMemcpy", "pageable", MIB, "pageable_copy"),  # staged through the driver's buffer
    ("cudaMemcpyAsync", "pageable", rules.PAGEABLE_STAGED_BYTES, "pageable_copy"),  # blocks: pageable, Async or not
    ("cudaMemcpy", "pageable", rules.PAGEABLE_STAGED_BYTES - 1, "small_copy"),  # too small to pay for staging
    ("cudaMemcpy", "pinned", MIB, "sync_copy"),  # a synchronous copy's latency
    ("cudaMemcpyAsync", "pinned", MIB, None),  # does not block: the host's own time
])
def test_copy_lead_the_end_of_a_gap_spent_in_a_blocking_copy_call_is_the_copys(api, src, nbytes, lead):
    """The 0.4 ms from the call's start (4.6 ms) to the transfer's (5 ms) are the copy's, by its kind; the 4.59 ms
    before it the host showed nothing."""
    gap = _gap(api, src, nbytes)
    assert (gap.start_ns, gap.end_ns) == (T + 10_000, T + 5_000_000)
    if lead is None:
        assert gap.pieces() == (("host_untraced", 4_990_000), (None, 0), (None, 0), (None, 0), (None, 0))
    else:
        assert gap.pieces() == (("host_untraced", 4_590_000), (None, 0), (None, 0), (None, 0), (lead, 400_000))


@pytest.mark.parametrize("api, src, lead", [("cudaMemcpy", "pageable", "pageable_copy"),
                                            ("cudaMemcpy", "pinned", "sync_copy")])
@pytest.mark.parametrize("call_start, stall", [
    (3_600_000, 0),  # waits 1.4 ms: 0.9 ms past the transfer's 0.5 ms, under STALL_MIN_NS: the host's, as before
    (3_500_000, 1_000_000),  # 1 ms past it: a stall
    (3_000_000, 1_500_000),
    (1_000_000, 3_500_000),  # the call is most of the gap: the 0.99 ms before it are judged without it
])
def test_copy_lead_is_at_most_the_copys_transfer_time_and_a_longer_wait_a_stall(api, src, lead, call_start, stall):
    """The call waits from call_start to 5 ms before its 0.5 ms transfer: staging 1 MiB takes about its transfer's
    time, so 0.5 ms are the copy's; the host sitting there STALL_MIN_NS or more past it, launching and moving nothing,
    is a stall in the call (call_stall); a shorter excess stays the host's. The time before the call, with no host
    activity, is host_untraced even where the call's time is most of the gap (no launching)."""
    assert attribution.STALL_MIN_NS == 1_000_000
    assert _gap(api, src, MIB, call_start=call_start).pieces() == (
        ("host_untraced", 4_490_000 - stall), (None, 0), (None, 0), ("call_stall" if stall else None, stall),
        (lead, 500_000))


def test_copy_lead_needs_the_call_to_begin_in_the_gap_and_move_on_its_device():
    """A gap begun inside the copy call is the call's already (its blocking cause, no lead); a copy whose transfer
    runs on another device does not end this one's gap (10 us-6 ms): the gap stays the host's."""
    assert _gap("cudaMemcpy", "pageable", MIB, call_start=5_000).pieces() == (
        ("pageable_copy", 4_990_000), (None, 0), (None, 0), (None, 0), (None, 0))
    assert _gap("cudaMemcpy", "pageable", MIB, device=1).pieces() == (
        ("host_untraced", 5_990_000), (None, 0), (None, 0), (None, 0), (None, 0))


def _pageable(nbytes: int) -> list:
    """20 synchronous pageable uploads of nbytes, 1 us each with no kernel running, one every 10 us."""
    copies = [{"device_id": 0, "stream_id": 3, "pid": 1, "tid": 1, "correlation_id": i, "start_ns": i * 10_000,
               "end_ns": i * 10_000 + 1_000, "bytes": nbytes, "direction": "H2D", "src_kind": "pageable",
               "dst_kind": "device", "api_name": "cudaMemcpy"} for i in range(20)]
    result = memory_transfers.run(make_model(memcpy=copies), memory_transfers.Params(profile="t"))
    return [f for f in memory_transfers.findings(result) if f.root_cause == "pageable-host-memory"]


def test_copy_lead_pageable_host_memory_only_for_copies_that_pay_for_their_staging():
    """At 64 KiB the copies pay for their staging: pinning saves half their 20 us (no pinned copy to compare); one
    byte less, a copy costs its latency, which pinning does not shorten: no finding."""
    [f] = _pageable(rules.PAGEABLE_STAGED_BYTES)
    assert (f.time_at_stake_ns, f.evidence["pageable_count"], f.evidence["small_pageable_count"]) == (10_000, 20, 0)
    assert "20 copies of 64 KiB or more" in f.title
    assert _pageable(rules.PAGEABLE_STAGED_BYTES - 1) == []


KNN = ("knn_cublas_texture_alloc", "a8025579a9fd49c146912400c40a04cdb3621d64a068683365e185c29c93a07b")
LEAD_SQL = """SELECT r.start, r."end", m.start, m.bytes, m."end" - m.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r
JOIN StringIds s ON s.id = r.nameId JOIN CUPTI_ACTIVITY_KIND_MEMCPY m ON m.correlationId = r.correlationId
WHERE s.value LIKE 'cudaMemcpy%' AND m.deviceId = 0 ORDER BY r.start"""
WORK_SQL = """SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0 AND "end" > ? AND start < ?
UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = 0 AND "end" > ? AND start < ?
ORDER BY 1"""


def _raw_leads(path, start: int, end: int) -> dict[tuple[int, int], tuple[int, str, int]]:
    """From the export alone: device 0's idle gaps of 1 ms or more in [start, end), and for each that ends inside a
    copy call (cudaMemcpy2D, cudaMemcpyToArray: all synchronous, from pageable memory) begun in it, whose transfer
    starts at the gap's end or later, the time from the call's start to the gap's end, at most the transfer's own
    time, the copy's cause (pageable_copy from 64 KiB, else small_copy), and the call's wait past that time."""
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    gaps, reach = [], start
    for s, e in raw.execute(WORK_SQL, (start, end, start, end)):
        if s > reach:
            gaps.append((reach, min(s, end)))
        reach = max(reach, e)
    calls = raw.execute(LEAD_SQL).fetchall()
    begins = [c[0] for c in calls]
    out = {}
    for gs, ge in (g for g in gaps if g[1] - g[0] >= attribution.BUBBLE_MIN_NS):
        i = bisect.bisect_left(begins, ge) - 1
        if i >= 0 and gs < calls[i][0] and calls[i][1] >= ge and calls[i][2] >= ge:
            staged = calls[i][3] >= rules.PAGEABLE_STAGED_BYTES
            lead = min(ge - calls[i][0], calls[i][4])
            out[gs, ge] = (lead, "pageable_copy" if staged else "small_copy", ge - calls[i][0] - lead)
    return out


HELD_SQL = """SELECT r."end", (SELECT min(o.start) FROM OSRT_API o JOIN StringIds n ON n.id = o.nameId
  WHERE o.globalTid = r.globalTid AND o.start >= r."end" AND n.value NOT LIKE 'ioctl%'),
  (SELECT min(a.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME a JOIN StringIds n ON n.id = a.nameId
   WHERE a.globalTid = r.globalTid AND a.start >= r."end" AND (n.value LIKE 'cudaFree%' OR n.value LIKE 'cudaMalloc%')),
  (SELECT sum(min(a."end", :ge) - a.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME a JOIN StringIds n ON n.id = a.nameId
   WHERE a.globalTid = r.globalTid AND a.start >= r."end" AND a.start < :ge
     AND (n.value LIKE 'cudaFree%' OR n.value LIKE 'cudaMalloc%'))
FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
JOIN CUPTI_ACTIVITY_KIND_MEMCPY m ON m.correlationId = r.correlationId
WHERE s.value LIKE 'cudaMemcpy%' AND m.deviceId = 0 AND m.bytes < :small AND r.start < m.start AND m."end" = :gs
AND r."end" > :gs"""


def _raw_pieces(path, gaps) -> dict[tuple[int, int], int]:
    """For the gaps (start, end) that begin as a small copy's transfer ends inside its call: the call's piece, its
    in-call idle and its turnaround (until the thread's first OS call, ioctl the driver's own, or allocation call: the
    allocations that cover most of the gap, claimed for their own time), not capped at the copy's own transfer: the
    copy is the work, not a wait on earlier work (short_gaps.UNCAPPED)."""
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = {}
    for gs, ge in gaps:
        query = raw.execute(HELD_SQL, {"small": rules.PAGEABLE_STAGED_BYTES, "gs": gs, "ge": ge})
        for call_end, first_os, first_alloc, alloc_ns in query:
            cut = first_alloc if (alloc_ns or 0) >= attribution.DOMINANT_SHARE * (ge - gs) else ge
            turn = min(max(0, min(ge, first_os or ge, cut) - call_end), attribution.SYNC_RESUME_MAX_NS)
            out[gs, ge] = min(ge, call_end) - gs + turn
    return out


def _triaged_gaps(path, cache_root) -> tuple[triage.Result, list]:
    """triage's result on the profile, and the attribution's gaps of 1 ms or more over triage's window."""
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile="p"))
        w = result.window
        scope = common.resolve_scope(profile.con, common.ScopedParams(profile="p", start_ns=w.start_ns,
                                                                      end_ns=w.end_ns))
        return result, attribution.attribute(profile.con, scope).long_gaps
    finally:
        profile.close()


def test_copy_lead_knn_idle_in_pageable_2d_copies_leaves_the_bubble(cache_root):
    """knn (C++ kNN, 1,136 blocking cudaMemcpy2D from pageable memory): in 207 of the window's 310 gaps of 1 ms or
    more the host sits in a cudaMemcpy2D, begun in the gap, until its transfer starts at the gap's end: 76.113 ms
    (sqlite3), 70.578 ms bounded by each transfer's own time (24 wait longer: 22 8 MiB copies wait 0.89-1.04 ms
    before moving for 0.78-0.98 ms, two small ones ~1 ms before moving for 2-3 us). Each is the copy's
    (pageable_copy from 64 KiB, else small_copy), but for one 1.054 ms gap that the small copy it began in holds
    whole already; the 70.577 ms left the bubble (320.659 ms before). Two small copies (12.8 and 64 KB) began gaps
    of 8.7 and 169.8 ms: each claims its in-call idle and its turnaround (_raw_pieces; sqlite3: 60,690 and 224,127
    ns), not capped at its own transfer (1,440 and 3,936 ns): a copy from host memory is the work, it waits on no
    earlier work; the rest of those gaps is the bubble's. One small copy's call waits 1.012 ms before its 3.2 us
    transfer: the 1.009 ms past it, 1 ms or more, is a stall in the call (call_stall), the bubble's still, now said."""
    path = corpus_profile(*KNN)
    result, gaps = _triaged_gaps(path, cache_root)
    w = result.window
    raw = _raw_leads(path, w.start_ns, w.end_ns)
    assert (len(raw), sum(ns for ns, _, _ in raw.values())) == (207, 70_578_442)
    ours = {(g.start_ns, g.end_ns): g for g in gaps}
    led = {key: (g.lead_ns, g.lead_cause) for key, g in ours.items() if g.lead_ns}
    [(whole, lead)] = [(key, lead[:2]) for key, lead in raw.items() if key not in led]
    assert (lead, ours[whole].pieces()[0]) == ((1_633, "small_copy"), ("small_copy", whole[1] - whole[0]))
    assert led == {key: lead[:2] for key, lead in raw.items() if key != whole}
    stalls = {key: over for key, (_, _, over) in raw.items() if key != whole and over >= attribution.STALL_MIN_NS}
    assert {key: g.stall_ns for key, g in ours.items() if g.stall_ns} == stalls and len(stalls) == 1
    by_root = {f.root_cause: f for f in result.findings}
    pieces = _raw_pieces(path, [key for key, g in ours.items() if g.cause == "small_copy" and g.late_ns])
    assert pieces == {key: ours[key].pieces()[0][1] for key in pieces}
    assert sorted(pieces.values()) == [9_701, 9_766, 60_690, 224_127]
    assert by_root["gpu-bubbles"].time_at_stake_ns == 320_658_794 - (70_578_442 - 1_633)
    assert by_root["gpu-bubbles"].evidence["stall_ns"] == sum(stalls.values())
    assert "stalled once, inside one cudaMemcpy2D call" in by_root["gpu-bubbles"].title
    assert by_root["pageable-host-memory"].time_at_stake_ns <= 394_300_000  # all pageable copies' transfer time


def test_copy_lead_balinski_tiny_reads_are_no_pageable_finding(cache_root):
    """balinski (C++ solver): its pageable copies are 2,455 4-byte flag reads and a few of 400 B-40 KB (sqlite3: none
    of 64 KiB or more): pinning saves nothing there; its findings are the tiny kernels' launches and the reads'
    synchronization (test_gap_split: the reads claim 20.28 ms, no more than the work they waited for)."""
    path = corpus_profile("balinski_gomory_tinykernels",
                          "a43530a762f770f679f4a9d69ce3e0583f38c70a2879c5bb02d8eb046179edca")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert raw.execute("""SELECT count(*), max(bytes), count(*) FILTER (WHERE bytes >= ?)
                          FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE srcKind = 0 OR dstKind = 0""",
                       (rules.PAGEABLE_STAGED_BYTES,)).fetchone() == (2460, 40_000, 0)
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile="balinski"))
    finally:
        profile.close()
    roots = [f.root_cause for f in result.findings]
    assert "pageable-host-memory" not in roots and roots[:2] == ["small-kernel-overhead", "blocking-d2h-sync"]


def _json_leads(path, start_us: float, end_us: float) -> dict[int, int]:
    """From the JSON alone: the window's device gaps of 1 ms or more ending where a pageable copy of 64 KiB or more
    starts whose cudaMemcpyAsync began in the gap, each with the call's wait before it, at most its transfer's time
    (keyed by the gap's end, us)."""
    events = json.load(gzip.open(path))["traceEvents"]
    work = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("Kernel", "Memcpy", "Memset"))
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "Runtime" and "Memcpy" in e["name"]}
    gaps, reach = [], start_us
    for s, e in work:
        if s > reach and min(s, end_us) - reach >= attribution.BUBBLE_MIN_NS / 1e3:
            gaps.append((reach, min(s, end_us)))
        reach = max(reach, e)
    out = {}
    for c in (e for e in events if e.get("cat") == "Memcpy" and "Pageable" in e["name"]
              and e["args"]["bytes"] >= rules.PAGEABLE_STAGED_BYTES):
        call = calls[c["args"]["correlation"]]
        if any(gs < call["ts"] and ge == c["ts"] for gs, ge in gaps):
            out[c["ts"]] = min(c["ts"] - call["ts"], c["dur"])
    return out


def _json_first_copy(path, start_us: float) -> tuple[int, int, int]:
    """From the JSON alone, the first pageable upload's cudaMemcpyAsync: from the window's start to the call's start,
    the call's wait before its transfer starts, the transfer's time (ns)."""
    events = json.load(gzip.open(path))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "Runtime" and "Memcpy" in e["name"]}
    first = min((e for e in events if e.get("cat") == "Memcpy" and "Pageable" in e["name"]), key=lambda e: e["ts"])
    call = calls[first["args"]["correlation"]]
    return (round((call["ts"] - start_us) * 1000), round((first["ts"] - call["ts"]) * 1000),
            round(first["dur"] * 1000))


def test_copy_lead_nw4_first_copy_claims_its_transfer_time_and_the_rest_is_a_stall(cache_root):
    """kineto_resnet50_nw4 (Kineto, ResNet50): its 6 pageable uploads of 19,267,584 B take 2.9-3.6 ms each; the first
    cudaMemcpyAsync, in the window's lead-in (the first GPU work, 44.992 ms after ProfilerStep#5 begins), waits
    36.436 ms before its 3.605 ms transfer, the others 0.19-0.32 ms (JSON). Staging 19 MB takes about its transfer's
    time: the first lead is 3.605 ms and pageable-host-memory claims no more than the copies' 18.953 ms (47.404 ms
    before the bound); the other 32.831 ms the host sat in the call launching nothing, a stall in it (call_stall), not
    launching (it was cpu-bottleneck's, ranked above the tiny kernels' 102.1 ms); the 8.556 ms before the call, the
    host in the loader's __next__ and operators, judged without it. gpu-bubbles says the stall and what to capture."""
    path = corpus_profile("kineto_resnet50_nw4", "c290eb249e74824736f81886587614fc5d96660d3e60d0c256dee4b4a0e268f6")
    result, gaps = _triaged_gaps(path, cache_root)
    w = result.window
    raw = _json_leads(path, w.start_ns / 1e3, w.end_ns / 1e3)
    assert sorted(raw.values()) == [189, 193, 318, 3605]
    assert {g.end_ns: (g.lead_ns, g.lead_cause) for g in gaps if g.lead_ns} == {
        int(ts) * 1000: (us * 1000, "pageable_copy") for ts, us in raw.items()}
    before, wait, transfer = _json_first_copy(path, w.start_ns / 1e3)
    assert (before, wait, transfer) == (8_556_000, 36_436_000, 3_605_000)
    [first] = [g for g in gaps if g.start_ns == w.start_ns]
    assert first.pieces() == (("host_op", before), (None, 0), (None, 0), ("call_stall", wait - transfer),
                              ("pageable_copy", transfer))
    by_root = {f.root_cause: f for f in result.findings}
    assert by_root["pageable-host-memory"].evidence["pageable_time_ns"] == 18_953_000
    assert by_root["pageable-host-memory"].time_at_stake_ns <= 18_953_000
    bubble = by_root["gpu-bubbles"]
    assert (bubble.time_at_stake_ns, bubble.evidence["stall_ns"], bubble.evidence["stall_calls"]) == (
        wait - transfer, wait - transfer, 1)
    assert "stalled once, inside one cudaMemcpyAsync call" in bubble.title and "-t cuda,osrt -s cpu" in bubble.title
    roots = [f.root_cause for f in result.findings]
    assert roots.index("small-kernel-overhead") < roots.index("cpu-bottleneck")
