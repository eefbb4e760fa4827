"""The unexplained idle (gpu-bubbles) names what the launching process was inside meanwhile (analysis/idle_bubbles):
tiny models at the rule's edges, and a real Kineto trace read against its JSON."""
from __future__ import annotations

import gzip
import json

import pytest
from modeldb import make_model
from test_idle_evidence import corpus_profile

from stallhound.analysis import attribution, common, idle_bubbles
from stallhound.analysis.attribution import Attribution, Gap
from stallhound.analysis.common import Finding, Scope, ScopedParams, resolve_scope
from stallhound.formats import open_profile
from stallhound.tools import triage

MS = 1_000_000
SCOPE = Scope(profile="t", devices=[0], start_ns=0, end_ns=100 * MS, duration_ns=100 * MS,
              window_basis="capture")


def call(name: str, kind: str, tid: int, start_ms: float, end_ms: float, pid: int = 1) -> dict:
    return {"pid": pid, "tid": tid, "name": name, "kind": kind, "start_ns": int(start_ms * MS),
            "end_ns": int(end_ms * MS), "duration_ns": int((end_ms - start_ms) * MS), "correlation_id": 0}


def rng(text: str, tid: int, start_ms: float, end_ms: float) -> dict:
    return {"pid": 1, "tid": tid, "text": text, "start_ns": int(start_ms * MS), "end_ns": int(end_ms * MS),
            "duration_ns": int((end_ms - start_ms) * MS), "kind": "push_pop", "depth": 0}


def seen(cuda_api: list[dict], nvtx: list[dict] = ()) -> dict:
    """One unexplained gap 10-30 ms on device 0, judged by thread 1 of process 1 (its first 5 ms a blocking sync)."""
    gap = Gap(gap_id=1, device=0, start_ns=5 * MS, end_ns=30 * MS, cause="sync", blocked_in="cudaDeviceSynchronize",
              pid=1, tid=1, late_ns=20 * MS, late_cause="host_untraced")
    con = make_model(cuda_api=cuda_api, nvtx=list(nvtx))
    return idle_bubbles.host_seen(con, SCOPE, Attribution(devices={}, long_gaps=[gap]))


def test_calls_of_any_thread_of_the_process_count_clipped_to_the_unexplained_piece():
    """Only the unexplained piece (10-30 ms) is looked at; another thread's free counts (its 5-15 ms: 5 ms in the
    piece), another process's call does not; the longest named with its overlapped time, the union once."""
    got = seen([call("cudaFree", "alloc", 2, 5, 15), call("cudaStreamCreate", "other", 1, 12, 20),
                call("cudaMalloc", "alloc", 3, 40, 50), call("cudaFree", "alloc", 9, 10, 30, pid=2)])
    assert got[0, False] == idle_bubbles.HostSeen(seen_ns=10 * MS, top="CUDA call cudaStreamCreate", top_ns=8 * MS)


def test_ranges_count_only_when_they_launched_no_gpu_work():
    """A range around a launch says nothing about the gap (the step's range); one with no launch inside does, even
    when its thread launches just after it ends."""
    got = seen([call("cudaLaunchKernel", "launch", 1, 29, 29.5), call("cudaLaunchKernel", "launch", 2, 26, 26.1)],
               [rng("ProfilerStep#1", 1, 0, 40), rng("optimizer.step", 2, 11, 26)])
    assert got[0, False] == idle_bubbles.HostSeen(seen_ns=15 * MS + MS // 2 + MS // 10, top="range optimizer.step",
                                                  top_ns=15 * MS)


def test_nothing_seen_says_so_and_what_to_capture_and_ranks_after_evidence():
    """No call or range of the process in the piece: the words say nothing was seen and what to capture, the tag
    UNSEEN ranks the bubble after a finding with evidence although it holds more time."""
    assert seen([call("cudaMalloc", "alloc", 1, 31, 40)]) == {}
    text, evidence, tags = idle_bubbles.words(20 * MS, 0, 0, idle_bubbles.HostSeen())
    assert "nothing of the launching process seen" in text and "-s cpu" in text and "with_stack" in text
    assert (evidence, tags) == ({"host_seen_ns": 0}, [common.UNSEEN])
    bare = Finding(root_cause="gpu-bubbles", severity="high", title="b", time_at_stake_ns=20 * MS, tags=tags,
                   evidence={})
    named = Finding(root_cause="alloc-in-loop", severity="medium", title="a", time_at_stake_ns=5 * MS, evidence={})
    assert common.leads_first([bare, named], lambda f: f, 5) == [named, bare]


def test_seen_times_stay_within_the_bubble_and_waits_come_first():
    """A seen time longer than what the bubble keeps (a collection pause took part) is cut to it."""
    text, evidence, tags = idle_bubbles.words(10 * MS, 4 * MS, 0, idle_bubbles.HostSeen(9 * MS, "CUDA call x", 8 * MS))
    assert evidence == {"host_seen_ns": 6 * MS, "host_top": "CUDA call x", "host_top_ns": 6 * MS} and tags == []
    assert text.startswith("4.000 ms of it with the launching thread in OS waits") and "6.000 ms of it more" in text


@pytest.mark.parametrize("calls, stall_ms, said", [
    (1, 3, "3.000 ms of it with the launching thread stalled once, inside one cudaMemcpy call past the time its"),
    (2, 30, "10.000 ms of it with the launching thread stalled inside 2 cudaMemcpy calls past the time their"),
])
def test_a_stall_in_a_copy_call_is_said_with_what_to_capture_and_is_evidence(calls, stall_ms, said):
    """A 10 ms bubble holding stall_ms of call_stall (cut to the bubble): said as a stall in the call, what it may be
    and what to capture to see inside it; OS waits and what else was seen share only the rest; it is evidence (no
    UNSEEN tag)."""
    stall = attribution.CauseTime(ns=stall_ms * MS, gaps=calls, calls=calls, api="cudaMemcpy")
    text, evidence, tags = idle_bubbles.words(10 * MS, 4 * MS, 0, idle_bubbles.HostSeen(9 * MS, "CUDA call x", 8 * MS),
                                              stall)
    kept = min(stall_ms, 10)
    assert said in text and "-t cuda,osrt -s cpu" in text and "nothing of the launching process seen" not in text
    assert evidence["stall_ns"] == kept * MS and evidence["stall_calls"] == calls and tags == []
    assert evidence["host_seen_ns"] == max(0, 10 - kept - min(4, 10 - kept)) * MS


@pytest.mark.parametrize("queued_ms, seen_ms, waits_ms, unseen", [
    (10, 4, 0, True),  # mostly queued, the host seen in under half: no evidence of most of it
    (10, 9, 0, True),
    (10, 10, 0, False),  # the host seen in half of it: evidence
    (10, 6, 4, False),  # OS waits are host activity seen too
    (9, 0, 0, True),  # nothing seen at all: unseen whatever it waited on
    (9, 9, 0, False),  # under half queued, the host seen in 9 ms: evidence
])
def test_a_bubble_mostly_queued_with_the_host_mostly_unseen_ranks_after_evidence(queued_ms, seen_ms, waits_ms, unseen):
    """A 20 ms bubble: where most of it (half or more) lies before work already queued (the device waited on
    something the trace does not show) and the host is seen in less than half of it, it is tagged UNSEEN; its title
    says how much was queued whenever that is most of it, and the tag QUEUED picks the fix for it."""
    host = idle_bubbles.HostSeen(seen_ms * MS, "CUDA call x", seen_ms * MS) if seen_ms else idle_bubbles.HostSeen()
    text, evidence, tags = idle_bubbles.words(20 * MS, waits_ms * MS, queued_ms * MS, host)
    assert (common.UNSEEN in tags) == unseen
    assert ("before work already queued" in text) == (queued_ms >= 10) == ("queued_ns" in evidence)
    assert (idle_bubbles.QUEUED in tags) == (queued_ms >= 10)  # picks the fix that looks for what it waited on
    assert evidence.get("queued_ns", queued_ms * MS) == queued_ms * MS


def _json_seen(path, pieces: list[tuple[int, int]], pid: int) -> tuple[int, dict[str, int]]:
    """From the JSON alone: the union of the process's CUDA runtime calls and its ops/annotations that launched no
    GPU work (no launch, copy or memset call of their thread begins in them) inside the pieces, and per name."""
    with gzip.open(path) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("pid") == pid]
    launch = ("Launch", "Memcpy", "Memset")
    starts = [(e["tid"], e["ts"] * 1000) for e in evs
              if e.get("cat") == "cuda_runtime" and any(w in e["name"] for w in launch)]
    spans: dict[str, list[tuple[int, int]]] = {}
    for e in evs:
        s, t = e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000
        if e.get("cat") in ("cpu_op", "user_annotation"):
            if any(tid == e["tid"] and s <= at < t for tid, at in starts):
                continue
        elif e.get("cat") != "cuda_runtime" or "ynchronize" in e["name"]:  # a wait on the GPU keeps nothing idle
            continue
        for a, b in pieces:
            if min(b, t) > max(a, s):
                spans.setdefault(e["name"], []).append((max(a, s), min(b, t)))
    return union([x for v in spans.values() for x in v]), {n: union(v) for n, v in spans.items()}


def union(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for s, e in sorted(spans):
        total += max(0, e - max(s, reach if reach is not None else s))
        reach = e if reach is None else max(reach, e)
    return total


def _json_events(path) -> list[dict]:
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _json_gaps(evs: list[dict], start_us: float = 0, end_us: float = float("inf")) -> list[tuple[dict, float, float]]:
    """From the JSON alone: the GPU's idle stretches of 1 ms or more (the union of kernels, copies and memsets) inside
    [start_us, end_us], each as (the op after it, start and end in us)."""
    ops = sorted((e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    gaps, reach = [], None
    for e in ops:
        if reach is not None and e["ts"] - reach >= 1000 and reach >= start_us and e["ts"] <= end_us:
            gaps.append((e, reach, e["ts"]))
        reach = max(reach or 0, e["ts"] + e["dur"])
    return gaps


def _triaged(path, cache_root):
    """Triage's ranked findings on a profile, and the unexplained pieces (off the window's edges) its bubble reads."""
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile=path.stem))
        w = result.window
        scope = resolve_scope(profile.con, ScopedParams(profile="p", start_ns=w.start_ns, end_ns=w.end_ns))
        pieces = [(s, e) for _, _, s, e, edge in idle_bubbles._pieces(attribution.attribute(profile.con, scope), scope)
                  if not edge]
    finally:
        profile.close()
    return result, pieces


def test_torchrec_bubble_names_the_process_activity_the_json_shows(cache_root):
    """hta_torchrec_a100_ws16_rank0: of the 205.068 ms no cause explains, the process (pid 4515, main and autograd
    threads) was inside CUDA calls or quiet ops for 59.976 ms, the most in cudaLaunchKernel (35.219 ms in all): the JSON
    read alone says the same. The main thread's 158 ms cudaDeviceSynchronize after the last step overlaps 74.564 ms of
    the pieces but is not named: a thread waiting on the GPU while it idles is not what keeps it idle. Most of the
    bubble lies before work already queued (the JSON: the op after the gap was launched, its launch call returned,
    before the gap began, outside the D2H reads that held their gaps): 122.462 ms where the op is a kernel or a copy,
    256.159 ms with the memsets of the CUDA graphs launched before (the model links no launch to those memsets). So
    the bubble holds little evidence of its cause: it ranks after NCCL's exposed time and the launch-bound idle."""
    path = corpus_profile("hta_torchrec_a100_ws16_rank0",
                          "b8ce7a1a143b55dd1811d269272b09d1c693ffea85b91858f5fb246e7ad8c5f8")
    result, pieces = _triaged(path, cache_root)
    [bubble] = [f for f in result.findings if f.root_cause == "gpu-bubbles"]
    seen_ns, by_name = _json_seen(path, pieces, 4515)
    assert sum(e - s for s, e in pieces) == bubble.time_at_stake_ns == 205_064_000
    assert bubble.evidence["host_seen_ns"] == seen_ns == 59_976_000
    assert bubble.evidence["host_top"] == "CUDA call cudaLaunchKernel"
    assert bubble.evidence["host_top_ns"] == by_name["cudaLaunchKernel"] == max(by_name.values()) == 35_219_000
    assert "cudaDeviceSynchronize" not in bubble.title
    linked, every = _json_queued(path, result.window.start_ns / 1000, result.window.end_ns / 1000)
    assert (linked, every) == (122_462_000, 256_159_000)
    assert bubble.time_at_stake_ns / 2 <= linked <= bubble.evidence["queued_ns"] <= every
    assert seen_ns < bubble.time_at_stake_ns / 2 and bubble.tags == [common.UNSEEN, idle_bubbles.QUEUED]
    assert bubble.fix.startswith("Most of this idle came with the next work already queued")
    order = [f.root_cause for f in result.findings]
    assert order.index("gpu-bubbles") > max(order.index("nccl-serialization"), order.index("cpu-bottleneck"))


def _json_queued(path, start_us: float, end_us: float) -> tuple[int, int]:
    """ns of the window's gaps of 1 ms or more before an op whose launch call had returned when the gap began, but
    for the gaps a D2H read holds (its call covers the gap's end and most of it, its copy runs after the gap): where
    the op is a kernel or a copy, and with the memsets of CUDA graphs too."""
    evs = _json_events(path)
    calls = {e["args"].get("correlation"): e for e in evs if e.get("cat") == "cuda_runtime"}
    d2h = {e["args"]["correlation"]: e["ts"] for e in evs if e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"]}
    reads = [c for k, c in calls.items() if k in d2h and c["name"] == "cudaMemcpyAsync"]
    linked = every = 0.0
    for op, s, e in _json_gaps(evs, start_us, end_us):
        launch = calls.get(op["args"].get("correlation"))
        held = any(r["ts"] < e <= r["ts"] + r["dur"] and e - max(s, r["ts"]) >= (e - s) / 2
                   and d2h[r["args"]["correlation"]] >= e for r in reads)
        if launch and launch["ts"] + launch["dur"] <= s and not held:
            every += e - s
            linked += 0 if op["cat"] == "gpu_memset" and "Graph" in launch["name"] else e - s
    return round(linked * 1000), round(every * 1000)


def test_alexnet_one_time_stream_creation_is_setup_not_a_bubble(cache_root):
    """hta_alexnet_a100_bench: the 824.158 ms gap before the 10 s one (JSON: kernels, copies and memsets) lies inside
    the first aten::cudnn_convolution, where the main thread creates cuDNN's streams (16 cudaStreamCreateWithFlags,
    one of 732.657 ms) and asks the device's properties (cudaGetDeviceProperties, 5.950 ms): 740.830 ms in those calls,
    once in the run. It is one-time setup beside the 10,033.725 ms one, never a bubble: the setup finding takes both
    gaps whole (10,857.883 ms), and what stays unexplained is too little to report."""
    path = corpus_profile("hta_alexnet_a100_bench", "b9febb1abc8cc729a2890fb6a4171de9867ba72c944437ee046067e7c89912dc")
    result, _ = _triaged(path, cache_root)
    evs = _json_events(path)
    gaps = sorted(((e - s, s, e) for _, s, e in _json_gaps(evs)), reverse=True)
    runtime = [e for e in evs if e.get("cat") == "cuda_runtime"]
    [(gap_us, s, e)] = [g for g in gaps if any(c["name"] == "cudaStreamCreateWithFlags" and g[1] <= c["ts"] < g[2]
                                                and c["dur"] > 700_000 for c in runtime)]
    init = union([(max(c["ts"], s) * 1000, min(c["ts"] + c["dur"], e) * 1000) for c in runtime
                  if c["name"] in ("cudaStreamCreateWithFlags", "cudaGetDeviceProperties")
                  and c["ts"] < e and c["ts"] + c["dur"] > s])
    assert (round(gap_us * 1000), round(init)) == (824_158_000, 740_830_000)
    assert round(gaps[0][0] * 1000) == 10_033_725_000 and s < gaps[0][1]
    [setup] = [f for f in result.findings if f.root_cause == "profiler-window-on-warmup"]
    assert setup.time_at_stake_ns == 10_033_725_000 + 824_158_000
    assert "creating streams, events or contexts (a library's first use) 740.830 ms in 1 gap" in setup.title
    assert "gpu-bubbles" not in [f.root_cause for f in result.findings]
