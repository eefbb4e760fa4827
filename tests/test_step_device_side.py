"""Steps as the device lived them never overlap on one thread (issue 31): a step starts when its thread's earlier GPU
work ends, no later than its own first work on its main stream (work it prefetches on a side stream runs ahead);
a step's work that runs on into the next step counts in the next; a thread's first step moves over earlier work
only when the GPU worked through that wait about as much as through the step.

Tiny models for each edge, then a real trace: TorchRec on 16 A100s (hta_torchrec_a100_ws16_rank0), whose device runs
~160 ms behind the host on its compute stream while input copies of the next batch start at once on side streams.
Before, its ProfilerSteps were 372-377 ms apiece with a 216 ms period (each from its side-stream copy to its last
kernel); now each runs from the end of the GPU work of the step before to the end of its own, read from the JSON."""

from __future__ import annotations

import statistics

import pytest
from modeldb import make_model
from test_kineto import read_json, span, xs

from corpus import sources
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.tools import iterations as it
from stallhound.tools import triage as tr

BY_NAME = {p.name: p for p in sources.load()}


def step(s: int, e: int) -> dict:
    return {"pid": 1, "tid": 1, "text": "train_step", "start_ns": s, "end_ns": e, "kind": "push_pop", "depth": 0}


def work(s: int, e: int, launch: int, stream: int = 7, table: str = "k") -> dict:
    row = {"device_id": 0, "stream_id": stream, "pid": 1, "tid": 1, "start_ns": s, "end_ns": e,
           "launch_start_ns": launch}
    return {**row, "short_name": table, "name": table} if table == "k" else {**row, "bytes": 1, "direction": "H2D"}


def rows(**tables) -> list[tuple[int, int]]:
    result = run_skill(make_model(**tables), it, it.Params(profile="t"))
    return [(r.start_ns, r.end_ns) for r in result.rows]


def test_a_side_stream_prefetch_does_not_start_the_step_its_main_stream_does():
    """Host steps of 100 ns; the compute stream runs each step's 100 ns of kernels 150 ns after launch; each step's
    input copy for later runs at once on stream 9. Steps: from the compute of the step before ending to its own
    (before: from the copy, 5 ns after the host step began, overlapping the step before by 140 ns)."""
    kernels, copies = [], []
    for k in range(4):
        h = 100 * k
        kernels += [work(150 + h, 200 + h, h + 10), work(200 + h, 250 + h, h + 20)]
        copies.append(work(h + 5, h + 15, h + 1, stream=9, table="c"))
    got = rows(nvtx=[step(100 * k, 100 * k + 90) for k in range(4)], kernels=kernels, memcpy=copies)
    # the first starts on the host (no earlier work to wait for), then each where the compute before it ends
    assert got == [(0, 250), (250, 350), (350, 450), (450, 550)]


def test_work_that_runs_on_into_the_next_step_counts_in_the_next():
    """Step 0 launches a long copy on a side stream (5-260) beside its kernels (10-90); step 1's kernels start at once
    on the compute stream (110-190). Step 1 starts with its compute, the copy still running (not behind it), and
    step 0 ends there (before: step 0 ran to 260, over most of step 1)."""
    kernels = [work(10, 90, 5), work(110, 190, 105), work(210, 290, 205)]
    got = rows(nvtx=[step(0, 95), step(100, 195), step(200, 295)], kernels=kernels,
               memcpy=[work(5, 260, 2, stream=9, table="c")])
    assert got == [(0, 110), (110, 195), (210, 295)]


def test_a_first_step_stays_where_it_began_when_the_gpu_idles_through_the_wait():
    """Work queued before the trace (no launch recorded) ends at 500 after idling since 20; the one step's kernels
    run 500-600 at full use. The GPU did not work through the wait: the stall stays in the step (0-600)."""
    kernels = [{**work(10, 20, 0), "launch_start_ns": None}, {**work(490, 500, 0), "launch_start_ns": None},
               work(500, 600, 5)]
    assert rows(nvtx=[step(0, 50)], kernels=kernels) == [(0, 600)]
    busy = [{**work(s, s + 10, 0), "launch_start_ns": None} for s in range(10, 500, 10)]
    assert rows(nvtx=[step(0, 50)], kernels=[*busy, work(500, 600, 5)]) == [(500, 600)]  # busy through it: moved


def test_a_first_step_moves_past_a_wait_that_precedes_all_recorded_gpu_work():
    """The host queues everything ahead (a prelude launched at 1, step k at 10 + 100k) and the device shows nothing
    until 1000 (work the trace missed, or a host/device clock offset, as tl_vllm_piecewise_mi300's 147 ms), then runs
    the prelude (1000-1010) and each step's 90 ns at full use. Before the devices' first record there is neither work
    nor a stall to give the first step: it starts after the prelude, as a steady one (before: 5-1100, 11x others)."""
    kernels = [work(1000, 1010, 1)] + [work(1010 + 100 * k, 1100 + 100 * k, 10 + 100 * k) for k in range(3)]
    got = rows(nvtx=[step(5 + 100 * k, 50 + 100 * k) for k in range(3)], kernels=kernels)
    assert got == [(1010, 1100), (1100, 1200), (1200, 1300)]


def restored(name: str):
    path = sources.resolve(BY_NAME[name])
    if path is None:
        pytest.skip(f"corpus profile {name} is not restored in {sources.cache_dir()} (make corpus-restore)")
    return path


def torchrec_in_json(doc: dict) -> tuple[list[tuple[int, int]], list[int], list[int], int]:
    """(host ProfilerStep spans, the end of the last GPU work each launched, the start of each one's first kernel on
    its busiest stream, the end of the GPU work never seen launched), read from the JSON by correlation."""
    steps = sorted(span(e) for e in xs(doc, "user_annotation") if e["name"].startswith("ProfilerStep#"))
    tid = next(e["tid"] for e in xs(doc, "user_annotation") if e["name"].startswith("ProfilerStep#"))
    launches = {e["args"]["correlation"]: span(e)[0] for e in xs(doc, "cuda_runtime") if e["tid"] == tid
                and "correlation" in e["args"]}
    every = {e["args"]["correlation"] for e in xs(doc, "cuda_runtime", "cuda_driver") if "correlation" in e["args"]}
    gpu = xs(doc, "kernel", "gpu_memcpy", "gpu_memset")
    ends, mains = [], []
    for s, e in steps:
        mine = [(g["args"]["stream"], *span(g)) for g in gpu if s <= launches.get(g["args"].get("correlation"), -1) < e]
        ends.append(max(end for *_, end in mine))
        held: dict[int, int] = {}
        for stream, a, b in mine:
            held[stream] = held.get(stream, 0) + b - a
        busiest = max(held, key=held.__getitem__)
        mains.append(min(a for stream, a, _ in mine if stream == busiest))
    queued = max(span(g)[1] for g in gpu if g["args"].get("correlation") not in every)
    return steps, ends, mains, queued


def test_torchrec_steps_run_end_to_end_on_the_device(cache_root):
    path = restored("hta_torchrec_a100_ws16_rank0")
    host, ends, mains, queued = torchrec_in_json(read_json(path))
    # the compute stream is queued: each step's main work starts after the step before's work ends (~160 ms late)
    assert all(m >= e for m, e in zip(mains[1:], ends, strict=False)) and mains[0] >= queued
    assert min(m - s for m, (s, _) in zip(mains, host, strict=True)) > 140_000_000
    con = open_profile(path, cache_dir=cache_root).con
    result = run_skill(con, it, it.Params(profile="t"))
    assert (result.method, result.duration_basis) == ("nvtx:ProfilerStep#N", "range")
    assert [(r.start_ns, r.end_ns) for r in result.rows] == list(zip([queued, *ends[:-1]], ends, strict=True))
    lived = [r.duration_ns for r in result.rows]  # 216.286 215.570 216.517 216.211 212.518 ms
    assert all(abs(d - (e - s)) < 0.035 * (e - s) for d, (s, e) in zip(lived, host, strict=True))
    assert result.steady_median_ns == statistics.median(lived[1:]) and result.first_vs_steady < 1.05
    window = run_skill(con, tr, tr.Params(profile="t")).window
    assert (window.start_ns, window.end_ns) == (queued, ends[-1])


def test_a_first_step_queued_before_the_devices_first_record_is_not_warmup(cache_root):
    """tl_vllm_piecewise_mi300: one vLLM prefill on an MI300; the host queues all 24 layers (one
    vllm::unified_kv_cache_update op each) in 26 ms, and the device's first record comes ~147 ms after the first.
    Before, the first 'iteration' ran from that op on the host (153.752 ms vs a 6.500 ms median) and triage called
    it warmup; now it starts on the device, as the others (6.381 ms)."""
    path = restored("tl_vllm_piecewise_mi300")
    doc = read_json(path)
    first_record = min(span(g)[0] for g in xs(doc, "kernel", "gpu_memcpy", "gpu_memset"))
    ops = sorted(span(e) for e in xs(doc, "cpu_op") if e["name"] == "vllm::unified_kv_cache_update")
    assert len(ops) == 24 and first_record - ops[0][0] > 140_000_000  # the host ran far ahead of the device's record
    con = open_profile(path, cache_dir=cache_root).con
    result = run_skill(con, it, it.Params(profile="t"))
    assert result.rows[0].start_ns >= first_record and result.first_vs_steady < 1.05
    assert result.findings == []
