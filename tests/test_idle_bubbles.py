"""The unexplained idle (gpu-bubbles) names what the launching process was inside meanwhile (analysis/idle_bubbles):
tiny models at the rule's edges, and a real Kineto trace read against its JSON."""
from __future__ import annotations

import gzip
import json

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
    text, evidence, tags = idle_bubbles.words(20 * MS, 0, idle_bubbles.HostSeen())
    assert "nothing of the launching process seen" in text and "-s cpu" in text and "with_stack" in text
    assert (evidence, tags) == ({"host_seen_ns": 0}, [common.UNSEEN])
    bare = Finding(root_cause="gpu-bubbles", severity="high", title="b", time_at_stake_ns=20 * MS, tags=tags,
                   evidence={})
    named = Finding(root_cause="alloc-in-loop", severity="medium", title="a", time_at_stake_ns=5 * MS, evidence={})
    assert common.leads_first([bare, named], lambda f: f, 5) == [named, bare]


def test_seen_times_stay_within_the_bubble_and_waits_come_first():
    """A seen time longer than what the bubble keeps (a collection pause took part) is cut to it."""
    text, evidence, tags = idle_bubbles.words(10 * MS, 4 * MS, idle_bubbles.HostSeen(9 * MS, "CUDA call x", 8 * MS))
    assert evidence == {"host_seen_ns": 6 * MS, "host_top": "CUDA call x", "host_top_ns": 6 * MS} and tags == []
    assert text.startswith("4.000 ms of it with the launching thread in OS waits") and "6.000 ms of it more" in text


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


def _bubble_and_pieces(path, cache_root):
    """Triage's gpu-bubbles finding on a profile and the unexplained pieces (off the window's edges) it reads."""
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile=path.stem))
        w = result.window
        scope = resolve_scope(profile.con, ScopedParams(profile="p", start_ns=w.start_ns, end_ns=w.end_ns))
        pieces = [(s, e) for _, _, s, e, edge in idle_bubbles._pieces(attribution.attribute(profile.con, scope), scope)
                  if not edge]
    finally:
        profile.close()
    [bubble] = [f for f in result.findings if f.root_cause == "gpu-bubbles"]
    return bubble, pieces


def test_torchrec_bubble_names_the_process_activity_the_json_shows(cache_root):
    """hta_torchrec_a100_ws16_rank0: of the 205.068 ms no cause explains, the process (pid 4515, main and autograd
    threads) was inside CUDA calls or quiet ops for 59.976 ms, the most in cudaLaunchKernel (35.219 ms in all): the JSON
    read alone says the same. The main thread's 158 ms cudaDeviceSynchronize after the last step overlaps 74.564 ms of
    the pieces but is not named: a thread waiting on the GPU while it idles is not what keeps it idle."""
    path = corpus_profile("hta_torchrec_a100_ws16_rank0",
                          "b8ce7a1a143b55dd1811d269272b09d1c693ffea85b91858f5fb246e7ad8c5f8")
    bubble, pieces = _bubble_and_pieces(path, cache_root)
    seen_ns, by_name = _json_seen(path, pieces, 4515)
    assert sum(e - s for s, e in pieces) == bubble.time_at_stake_ns == 205_068_000
    assert bubble.evidence["host_seen_ns"] == seen_ns == 59_976_000
    assert bubble.evidence["host_top"] == "CUDA call cudaLaunchKernel"
    assert bubble.evidence["host_top_ns"] == by_name["cudaLaunchKernel"] == max(by_name.values()) == 35_219_000
    assert "cudaDeviceSynchronize" not in bubble.title
    assert common.UNSEEN not in bubble.tags


def test_alexnet_bubble_names_the_stream_creation_not_the_setup_gaps_launch(cache_root):
    """hta_alexnet_a100_bench: the bubble's 830.529 ms are mostly one 824 ms gap in which the main thread (pid
    2869224) sits 732.657 ms in cudaStreamCreateWithFlags (JSON). The 3,055.6 ms cudaLaunchKernel lies in the 10 s gap
    that one-time setup takes (alloc's longest), which the bubble leaves out, so it must not be named."""
    path = corpus_profile("hta_alexnet_a100_bench", "b9febb1abc8cc729a2890fb6a4171de9867ba72c944437ee046067e7c89912dc")
    bubble, pieces = _bubble_and_pieces(path, cache_root)
    seen_ns, by_name = _json_seen(path, pieces, 2869224)
    assert bubble.evidence["host_top"] == "CUDA call cudaStreamCreateWithFlags"
    assert bubble.evidence["host_top_ns"] == by_name["cudaStreamCreateWithFlags"] == max(by_name.values())
    assert 732_657_000 <= bubble.evidence["host_top_ns"] <= bubble.evidence["host_seen_ns"] == seen_ns
    assert seen_ns <= bubble.time_at_stake_ns == 830_529_000
    assert "cudaLaunchKernel" not in bubble.title
