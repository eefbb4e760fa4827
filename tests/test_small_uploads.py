"""Many small host-to-device copies (analysis/small_uploads.py) and the finding memory_transfers makes of them."""

from __future__ import annotations

import bisect
import gzip
import json

import pytest
from modeldb import make_model, union_ns

from corpus import sources
from stallhound.analysis import attribution, rules
from stallhound.analysis import small_uploads as su
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.tools import memory_transfers as mt
from stallhound.tools import triage

STEP_NS = 100_000


def kernel(s: int, e: int) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "start_ns": s, "end_ns": e, "short_name": "k",
            "name": "k", "launch_start_ns": s}


def upload(t: int, corr: int, nbytes: int, sync_ns: int) -> tuple[dict, list[dict]]:
    """A blocking upload at t: its call t..t+75, its transfer t+60..t+200 (pageable), a sync t+100..t+100+sync_ns."""
    copy = {"device_id": 0, "stream_id": 3, "pid": 1, "tid": 1, "correlation_id": corr, "start_ns": t + 60,
            "end_ns": t + 200, "bytes": nbytes, "direction": "H2D", "src_kind": "pageable", "dst_kind": "device",
            "api_name": "cudaMemcpyAsync"}
    calls = [{"pid": 1, "tid": 1, "correlation_id": corr, "name": "cudaMemcpyAsync", "kind": "memcpy",
              "start_ns": t, "end_ns": t + 75}]
    if sync_ns:
        calls.append({"pid": 1, "tid": 1, "name": "cudaStreamSynchronize", "kind": "sync", "start_ns": t + 100,
                      "end_ns": t + 100 + sync_ns})
    return copy, calls


def stepped(per_step: int, sync_ns: int = 50, nbytes: int = su.SMALL_UPLOAD_BYTES) -> dict[str, list[dict]]:
    """The rows of three ProfilerSteps of STEP_NS (the window is 0-300,000 ns), each with per_step uploads 1 us
    apart and a kernel in its last 5 us: each upload holds the host 75 + sync_ns ns."""
    nvtx, kernels, memcpy, api = [], [], [], []
    for k in range(3):
        base = k * STEP_NS
        nvtx.append({"pid": 1, "tid": 1, "text": f"ProfilerStep#{k + 1}", "start_ns": base,
                     "end_ns": base + STEP_NS - 1_000, "kind": "push_pop", "depth": 0})
        kernels.append(kernel(base + STEP_NS - 5_000, base + STEP_NS))
        for i in range(per_step):
            copy, calls = upload(base + 1_000 + 1_000 * i, k * 1_000 + i + 1, nbytes, sync_ns)
            memcpy.append(copy)
            api += calls
    return {"nvtx": nvtx, "kernels": kernels, "memcpy": memcpy, "cuda_api": api}


def run(con) -> mt.Result:
    return run_skill(con, mt, mt.Params(profile="t"))


def many_small(result: mt.Result) -> list:
    return [f for f in result.findings if "many-small" in f.tags]


@pytest.mark.parametrize("per_step, sync_ns, nbytes, fires", [
    (40, 50, su.SMALL_UPLOAD_BYTES, True),  # 120 x 125 ns = 15,000 ns: 5.0% of the 300,000 ns window
    (40, 49, su.SMALL_UPLOAD_BYTES, False),  # 120 x 124 ns: 4.96%
    (40, 50, su.SMALL_UPLOAD_BYTES + 1, False),  # not small
    (su.MANY_SMALL_PER_STEP, 400, 8, True),  # 32 a step, 96 x 475 ns: 15.2%
    (su.MANY_SMALL_PER_STEP - 1, 400, 8, False),  # 31 a step: a batch's fields, not one copy per sample
])
def test_small_uploads_fire_at_their_count_size_and_host_share(per_step, sync_ns, nbytes, fires):
    rows = stepped(per_step, sync_ns, nbytes)
    found = many_small(run(make_model(**rows)))
    assert bool(found) == fires
    if fires:
        [f] = found
        host = union_ns([(a["start_ns"], a["end_ns"]) for a in rows["cuda_api"]])
        assert (f.root_cause, f.evidence["count"], f.evidence["steps"]) == (
            "excessive-h2d-transfers", 3 * per_step, 3.0)
        assert f.evidence["host_ns"] == f.evidence["host_no_kernel_ns"] == host == 3 * per_step * (75 + sync_ns)
        assert f.evidence["call_ns"] == 3 * per_step * 75
        # the device's idle in and after them, where they are small_copy's (under 64 KiB): between two transfers
        # (t+200 to the next's t+1,060), and from the last one's end to the step's kernel, all inside a call or the
        # host's turnaround (under 1 ms); the gap before each step's first call is not theirs
        last_end = 1_000 + 1_000 * (per_step - 1) + 200
        idle = 3 * ((per_step - 1) * 860 + STEP_NS - 5_000 - last_end) if nbytes < rules.PAGEABLE_STAGED_BYTES else 0
        assert (f.evidence["copy_idle_ns"], f.time_at_stake_ns) == (idle, max(host, idle))
        assert f"{per_step} a step" in f.title


def test_small_uploads_leave_pageable_host_memory_only_the_time_outside_them():
    """Each upload runs from its call (t..t+75) to its transfer's end (t+200); its call and sync (t+100..t+150)
    are the small uploads' time, so pageable-host-memory may claim only the other 75 ns of each: the two findings
    never share a nanosecond, and together stay within the 200 ns each upload takes."""
    rows = stepped(40)
    result = run(make_model(**rows))
    [small] = many_small(result)
    [pinned] = [f for f in result.findings if f.root_cause == "pageable-host-memory"]
    spans = [(c["start_ns"] - 60, c["end_ns"]) for c in rows["memcpy"]]  # from the call's start to the transfer's end
    outside = union_ns(spans + [(a["start_ns"], a["end_ns"]) for a in rows["cuda_api"]]) - small.evidence["host_ns"]
    assert pinned.evidence["pageable_span_ns"] == outside == 120 * 75
    assert pinned.time_at_stake_ns <= outside
    assert small.time_at_stake_ns + pinned.time_at_stake_ns <= union_ns(spans) == 120 * 200


def test_small_uploads_without_steps_are_counted_per_second_and_kernels_are_not_their_time():
    """No step markers and no kernel rhythm: 32 uploads 900 us apart (a window of 28.0 ms, 1,144 a second) fire,
    1,100 us apart (34.2 ms, 937 a second) do not. A kernel running through one sync takes that sync's time out."""
    def model(gap_ns: int):
        memcpy, api = [], []
        for i in range(32):
            copy, calls = upload(i * gap_ns, i + 1, 4096, 100_000)
            memcpy.append(copy)
            api += calls
        return make_model(kernels=[kernel(100, 100_200)], memcpy=memcpy, cuda_api=api)

    [f] = many_small(run(model(900_000)))
    assert f.evidence["steps"] == 0.0 and "a second" in f.title
    assert f.evidence["host_ns"] == 32 * 100_075
    assert f.evidence["host_no_kernel_ns"] == 32 * 100_075 - 100_000  # the first sync, 100..100,100, under it
    assert f.time_at_stake_ns == min(max(f.evidence["host_no_kernel_ns"], f.evidence["copy_idle_ns"]),
                                     f.evidence["device_idle_ns"])
    assert not many_small(run(model(1_100_000)))


def test_small_uploads_claim_the_idle_after_them_only_where_no_other_small_pageable_copy_shares_it():
    """The small_copy idle (in the uploads' calls and the turnaround after them) is theirs only where every small
    pageable copy in the window is an upload: one 4 KiB pageable download among them and the finding keeps its host
    time (a read of 1 KiB or less is a readback, not small_copy: it does not count)."""
    rows = stepped(su.MANY_SMALL_PER_STEP, 400, 8)
    for nbytes, shared in ((4096, True), (rules.SMALL_READ_BYTES, False)):
        down = {**rows["memcpy"][0], "correlation_id": 9_999, "direction": "D2H", "src_kind": "device",
                "dst_kind": "pageable", "bytes": nbytes, "start_ns": 96_000, "end_ns": 96_100}
        [f] = many_small(run(make_model(**{**rows, "memcpy": rows["memcpy"] + [down]})))
        assert (f.evidence["copy_idle_ns"] == 0) == shared
        assert f.time_at_stake_ns == (f.evidence["host_ns"] if shared else f.evidence["copy_idle_ns"])


def test_small_uploads_of_the_h2d_many_small_capture_match_the_trace(cache_root):
    """Our H100 capture of a batch gathered sample by sample: the finding's counts and host times equal an
    independent reading of the JSON (each copy's runtime call by correlation id, and the synchronize on the same
    thread starting within 100 us after it returns)."""
    [capture] = [p for p in sources.load() if p.name == "h2d_many_small"]
    with gzip.open(sources.stored(capture)) as fh:
        events = json.load(fh)["traceEvents"]
    con = open_profile(sources.resolve(capture), cache_dir=cache_root).con
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    syncs = sorted((e for e in events if e.get("cat") == "cuda_runtime" and "Synchronize" in e["name"]),
                   key=lambda e: e["ts"])
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    calls = [runtime[c["args"]["correlation"]] for c in copies]
    after = [syncs[bisect.bisect_left([s["ts"] for s in syncs], c["ts"] + c["dur"])] for c in calls]
    assert all(s["tid"] == c["tid"] and s["ts"] - c["ts"] - c["dur"] <= 100 for c, s in zip(calls, after, strict=True))
    call_us, sync_us = sum(c["dur"] for c in calls), sum(s["dur"] for s in after)
    w = triage.run(con, triage.Params(profile="p")).window
    [f] = many_small(run_skill(con, mt, mt.Params(profile="p", start_ns=w.start_ns, end_ns=w.end_ns)))
    assert (f.evidence["count"], f.evidence["bytes"], f.evidence["steps"]) == (
        len(copies), sum(c["args"]["bytes"] for c in copies), 3.0) == (1536, 9_443_328, 3.0)
    assert abs(f.evidence["call_ns"] - 1000 * call_us) < 1536 and abs(f.evidence["sync_ns"] - 1000 * sync_us) < 1536
    ours = f.evidence["copy_idle_ns"]
    assert f.time_at_stake_ns == ours > f.evidence["host_ns"] and ours <= f.evidence["device_idle_ns"]
    assert (f.evidence["host_ns"], ours) == (17_053_249, 59_615_035)
    assert 0 <= _json_copy_idle(events, w.start_ns, w.end_ns, calls, after) - ours < 60_000  # 59,666,335 ns


def _json_copy_idle(events, start: int, end: int, calls, syncs) -> int:
    """From the JSON alone: the device's idle in the gaps that begin inside an upload's span, from its call's start
    to its sync's end and the host's turnaround after it (up to 1 ms, or the thread's next kernel launch), clipped to
    those spans: an upper bound of the idle the uploads cost (the attribution ends a turnaround at the launch's
    return, and at the host's own work)."""
    def ns(us: float) -> int:
        return round(us * 1000)
    launches = sorted(ns(e["ts"]) for e in events if e.get("name") == "cudaLaunchKernel")
    spans = []
    for c, y in zip(calls, syncs, strict=True):
        reach = ns(y["ts"] + y["dur"])
        i = bisect.bisect_left(launches, reach)
        spans.append((ns(c["ts"]), min(reach + attribution.SYNC_RESUME_MAX_NS, launches[i] if i < len(launches)
                                       else end)))
    union: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if union and s <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], e))
        else:
            union.append((s, e))
    work = sorted((ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events
                  if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    total, reach = 0, start
    for s, e in work + [(end, end)]:
        if min(s, end) > reach and reach < end:
            i = bisect.bisect_right([u[0] for u in union], reach) - 1
            if i >= 0 and union[i][0] <= reach < union[i][1]:
                total += sum(max(0, min(e2, min(s, end)) - max(s2, reach)) for s2, e2 in union[i:])
        reach = max(reach, e)
    return total


def test_small_uploads_time_is_not_claimed_again_by_the_h2d_volume_finding():
    """Beside the 40 small uploads a step, a 1 MB pinned upload runs 10,000 ns a step with no kernel: H2D copies
    take 15.6% of the window, 46,800 ns exposed (120 x 140 small, 3 x 10,000 large). Pinning claims half the small
    pageable copies' exposed time (no faster pinned copy to compare: 8,400 ns); the volume finding claims what neither
    pinning nor the small uploads (15,000 ns) do."""
    rows = stepped(40)
    big = [{**rows["memcpy"][0], "correlation_id": 9_000 + k, "start_ns": k * STEP_NS + 50_000,
            "end_ns": k * STEP_NS + 60_000, "bytes": 1 << 20, "src_kind": "pinned"} for k in range(3)]
    calls = [{**rows["cuda_api"][0], "correlation_id": 9_000 + k, "start_ns": k * STEP_NS + 49_000,
              "end_ns": k * STEP_NS + 49_010} for k in range(3)]
    result = run(make_model(**{**rows, "memcpy": rows["memcpy"] + big, "cuda_api": rows["cuda_api"] + calls}))
    [small] = many_small(result)
    [volume] = [f for f in result.findings if f.root_cause == "excessive-h2d-transfers" and f is not small]
    assert (volume.evidence["exposed_time_ns"], volume.evidence["pinned_saving_ns"], small.time_at_stake_ns) == (
        46_800, 8_400, 15_000)
    assert volume.time_at_stake_ns == 46_800 - 8_400 - 15_000
