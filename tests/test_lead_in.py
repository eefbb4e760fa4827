"""What triage's steady window leaves out before it is said by its evidence (issue 35, class 10): work still running
whose launches the trace never recorded, the time before the first step began, and the first step when it is the
warmup outlier; never 'setup and warmup' as one label for all of it.

Real traces: TorchRec on 16 A100s (hta_torchrec_a100_ws16_rank0), whose device runs the step before the first traced
one (launched before torch.profiler recorded launches) for 154.359 ms while the first ProfilerStep's host part, with
its 139 ms blocking read, runs ahead: that is no setup and no warmup. Our H100 capture annotated_steps: model setup
before the first train_step, then a first step 33x the others (warmup)."""

from __future__ import annotations

import sqlite3
import statistics

import pytest
from modeldb import make_model
from test_kineto import device_side, read_json, span, xs

from corpus import sources
from stallhound.analysis import lead_in
from stallhound.analysis.common import ms
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.tools import iterations, triage

BY_NAME = {p.name: p for p in sources.load()}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def kernel(s: int, e: int, launch: int | None) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "start_ns": s, "end_ns": e, "launch_start_ns": launch,
            "short_name": "k", "name": "k"}


def parts(kernels: list[dict], first: int, steady: int) -> tuple[int, int, int]:
    con = make_model(kernels=kernels)
    gpu_start = min(k["start_ns"] for k in kernels)
    return lead_in.parts_ns(con, [0], gpu_start, first, steady)


def test_the_parts_add_up_to_the_time_left_out_each_by_its_evidence():
    unlaunched = [kernel(100, 200, None), kernel(250, 400, None)]
    # queued work runs 100-400, the first step begins at 400: all of it is the queued work's
    assert parts([*unlaunched, kernel(400, 500, 390)], 400, 400) == (300, 0, 0)
    # queued work that runs on past the first step's start counts only until it: the rest is the step's
    assert parts([*unlaunched, kernel(300, 500, 290)], 300, 300) == (200, 0, 0)
    # launched work before the first step: time before it, not queued work
    assert parts([kernel(100, 200, 90), kernel(400, 500, 390)], 400, 400) == (0, 300, 0)
    # queued work ends at 200, launched setup work 300-350, first step 400-600 dropped as warmup, steady from 600
    assert parts([kernel(100, 200, None), kernel(300, 350, 290), kernel(400, 700, 390)], 400, 600) == (100, 200, 200)
    # the first step began on the host before the first GPU work: only the warmup step is left out
    assert parts([kernel(100, 200, 90), kernel(300, 400, 290)], 50, 300) == (0, 0, 200)
    # work never seen launched but starting after the first step began is the step's own, not queued work
    assert parts([kernel(100, 200, 90), kernel(450, 500, None)], 400, 400) == (0, 300, 0)


def test_the_note_names_the_parts_and_nothing_left_out_when_the_step_came_first():
    con = make_model(kernels=[kernel(1_000_000, 3_000_000, None), kernel(3_000_000, 9_000_000, 2_900_000)])
    note = lead_in.left_out(con, [0], 1_000_000, 3_000_000, 5_000_000, "step", 2.5)
    assert note == ("left out 4.000 ms before the first steady iteration: 2.000 ms while the device ran work launched "
                    "before the trace recorded launches (none of its launch calls is in it: launched earlier, still "
                    "running); the first step, 2.000 ms (2.5x the steady median: warmup)")
    assert lead_in.left_after(con, [0], 3_000_001, 9_000_000) == (  # the second kernel starts before the end
        "; left out 6.000 ms after the last steady iteration")
    assert lead_in.left_after(con, [0], 2_900_000, 9_000_000) == (
        "; left out 6.100 ms after the last steady iteration (the work that starts there, run times summed: 1 kernel "
        "(6.000 ms))")
    assert lead_in.left_after(con, [0], 9_000_000, 9_000_000) == ""  # nothing left out after it
    assert lead_in.left_out(con, [0], 1_000_000, 400_000, 400_000, "step", None) == (
        "nothing left out before the first steady iteration (it begins 0.600 ms before the first GPU work)")
    # a step that begins with the first GPU work (gpumodel_a100_fp16_mm): no "begins 0.000 ms before" clause
    for steady_start in (1_000_000, 999_600):
        assert lead_in.left_out(con, [0], 1_000_000, steady_start, steady_start, "step", None) == (
            "nothing left out before the first steady iteration")


def restored(name: str):
    path = sources.resolve(BY_NAME[name])
    if path is None:
        pytest.skip(f"corpus profile {name} is not restored in {sources.cache_dir()} (make corpus-restore)")
    return path


def test_torchrec_leaves_out_the_step_before_still_running_not_setup(cache_root):
    """JSON: the first GPU work, and the end of the GPU work whose correlation no runtime call carries (launched before
    torch.profiler recorded launches): 154.359 ms, where the first ProfilerStep starts on the device."""
    path = restored("hta_torchrec_a100_ws16_rank0")
    doc = read_json(path)
    gpu = xs(doc, *GPU_CATS)
    launched = {e["args"]["correlation"] for e in xs(doc, "cuda_runtime", "cuda_driver") if "correlation" in e["args"]}
    first = min(span(g)[0] for g in gpu)
    queued_end = max(span(g)[1] for g in gpu if g["args"].get("correlation") not in launched)
    assert queued_end - first == 154_359_000
    result = run_skill(open_profile(path, cache_dir=cache_root).con, triage, triage.Params(profile="t"))
    assert result.window.start_ns == queued_end
    assert result.window_note.endswith(
        f"left out {ms(queued_end - first)} before the first steady iteration: {ms(queued_end - first)} while the "
        "device ran work launched before the trace recorded launches (none of its launch calls is in it: launched "
        "earlier, still running)")
    assert "setup" not in result.window_note and "warmup" not in result.window_note


def test_annotated_steps_leaves_out_setup_time_and_the_warmup_step(cache_root):
    """JSON: GPU work starts before the first train_step; every GPU op before it has its launch call in the trace
    (no queued work); the first step, as the device lived it, is over 1.5x the others' median (warmup)."""
    path = restored("annotated_steps")
    doc = read_json(path)
    gpu = xs(doc, *GPU_CATS)
    launched = {e["args"]["correlation"] for e in xs(doc, "cuda_runtime", "cuda_driver") if "correlation" in e["args"]}
    ranges = sorted((e["pid"], e["tid"], *span(e)) for e in xs(doc, "user_annotation") if e["name"] == "train_step")
    lived = device_side(doc, ranges)
    first = min(span(g)[0] for g in gpu)
    assert all(g["args"].get("correlation") in launched for g in gpu if span(g)[0] < lived[0][0])
    ratio = round((lived[0][1] - lived[0][0]) / statistics.median(e - s for s, e in lived[1:]), 3)
    assert ratio > iterations.WARMUP_RATIO
    result = run_skill(open_profile(path, cache_dir=cache_root).con, triage, triage.Params(profile="t"))
    before, warm = lived[0][0] - first, lived[1][0] - lived[0][0]
    assert result.window.start_ns == lived[1][0]
    assert result.window_note.endswith(
        f"left out {ms(before + warm)} before the first steady iteration: {ms(before)} before the first step began; "
        f"the first step, {ms(warm)} ({ratio}x the steady median: warmup)")


def test_sglang_step_keeps_its_stall_no_start_moved_past_work_the_device_idled_behind(cache_root):
    """JSON: the one step[DECODE bs=32] range starts 0.123 ms after the first GPU op, a 4 us kernel; the work queued
    before the step then waits 463 ms (idle device) behind an untraced event. The window starts where the step does:
    the stall is the step's, and what is left out is the time before it, not setup."""
    path = restored("tl_sglang_qwen3_decode_mi300")
    doc = read_json(path)
    gpu = sorted(span(g) for g in xs(doc, *GPU_CATS))
    step = next(span(e) for e in xs(doc, "user_annotation") if e["name"].startswith("step[DECODE"))
    before = step[0] - gpu[0][0]
    assert before == 123_196 and sum(1 for s, _ in gpu if s < step[0]) == 1
    assert gpu[1][0] - step[0] > 460_000_000  # the device idles behind the wait
    result = run_skill(open_profile(path, cache_dir=cache_root).con, triage, triage.Params(profile="t"))
    assert result.window.start_ns == step[0]
    assert f"left out {ms(before)} before the first steady iteration: {ms(before)} before the first step began; " \
        in result.window_note
    # and what it leaves out after the step: the GPU work the JSON shows starting at or after the window's end
    after = [(s, e) for s, e in gpu if s >= result.window.end_ns]
    kernels = [k for k in xs(doc, "kernel") if span(k)[0] >= result.window.end_ns]
    assert (len(after), len(kernels)) == (3, 1)
    assert result.window_note.endswith(
        f"; left out {ms(gpu[-1][1] - result.window.end_ns)} after the last steady iteration (the work that starts "
        f"there, run times summed: 1 kernel ({ms(span(kernels[0])[1] - span(kernels[0])[0])}) and 2 copies or memsets "
        f"({ms(sum(e - s for s, e in after) - (span(kernels[0])[1] - span(kernels[0])[0]))}))")


def test_cutlass_window_says_the_timed_gemm_and_the_copy_back_it_leaves_out(cache_root):
    """SQL on the raw export: 6 GEMM launches; the kernel pattern bounds 5 iterations (each from one launch to the
    next), so the 6th launch (the timed one) and the 768 MiB copy back after it lie after the steady window."""
    path = restored("cutlass_bench_gemm_pageable")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    kernels = raw.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    copies = raw.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start").fetchall()
    assert len(kernels) == 6 and copies[-1][0] > kernels[-1][1]
    result = run_skill(open_profile(path, cache_dir=cache_root).con, triage, triage.Params(profile="t"))
    assert result.window.end_ns == kernels[-1][0]  # the 6th launch starts where the 5th iteration ends
    assert result.window_note.endswith(
        f"; left out {ms(copies[-1][1] - kernels[-1][0])} after the last steady iteration (the work that starts "
        f"there, run times summed: 1 kernel ({ms(kernels[-1][1] - kernels[-1][0])}) and 1 copy or memset "
        f"({ms(copies[-1][1] - copies[-1][0])}))")
