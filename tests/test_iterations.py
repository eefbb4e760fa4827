"""iterations: the step from NVTX (not a per-op range) or a stable kernel period, a step range's own span on the
device or start-to-start boundaries, GPU busy from the interval union, the warmup finding and the steady window."""

from __future__ import annotations

import re
import sqlite3
import statistics
from collections import Counter

import pytest
from conftest import FIXTURES, dump, lived_iterations, planted
from modeldb import make_model, union_ns

from stallhound.analysis import step_boundaries as sb
from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import iterations as it


def rng_(text: str, s: int, e: int, depth: int | None = 0, tid: int = 1, kind: str = "push_pop") -> dict:
    return {"pid": 1, "tid": tid, "text": text, "start_ns": s, "end_ns": e, "kind": kind, "depth": depth}


def kern(s: int, e: int, name: str = "k", device: int = 0, tid: int = 1, launch: int | None = None) -> dict:
    """A kernel launched by thread `tid` at `launch` (default: when it starts)."""
    return {"device_id": device, "stream_id": 7, "pid": 1, "tid": tid, "start_ns": s, "end_ns": e, "short_name": name,
            "name": name, "launch_start_ns": s if launch is None else launch}


def copy(table: str, s: int, e: int, launch: int, corr: int, device: int = 0, tid: int = 1) -> tuple[dict, dict]:
    """A memcpy/memset row and the API call (on `tid`, at `launch`) that issued it."""
    return ({"device_id": device, "stream_id": 7, "pid": 1, "tid": tid, "correlation_id": corr, "start_ns": s,
             "end_ns": e},
            {"pid": 1, "tid": tid, "correlation_id": corr, "name": f"cuda{table.title()}Async", "start_ns": launch,
             "end_ns": launch + 1, "kind": table})


def steps(text: str, starts: list[int], ends: list[int], tid: int = 1, depth: int = 0, device: int = 0,
          kernel_ns: int = 10) -> tuple[list[dict], list[dict]]:
    """NVTX ranges `text.format(k)` on `tid`, each launching one kernel at its start."""
    ranges = [rng_(text.format(k), s, e, depth=depth, tid=tid) for k, (s, e) in enumerate(zip(starts, ends,
                                                                                              strict=True))]
    return ranges, [kern(s, s + kernel_ns, device=device, tid=tid) for s in starts]


def run(con, **kw) -> it.Result:
    return run_skill(con, it, it.Params(profile="t", **kw))


# Two ranks: thread 1 drives device 0, thread 2 device 1; ranges end before the next starts (host time between).
T1, T2 = ([0, 300, 400, 500], [250, 380, 480, 590]), ([10, 320, 410, 520], [260, 390, 500, 600])
MEMSET, MEMSET_API = copy("memset", 50, 150, launch=1, corr=91)
MEMCPY, MEMCPY_API = copy("memcpy", 10, 110, launch=11, corr=92, device=1, tid=2)


def two_ranks(**extra) -> object:
    r1, _ = steps("iteration {}", *T1)
    r2, _ = steps("iteration {}", *T2, tid=2, device=1)
    kernels = [kern(0, 100), kern(300, 355), kern(400, 455), kern(500, 555),
               kern(320, 375, device=1, tid=2), kern(410, 465, device=1, tid=2), kern(520, 575, device=1, tid=2)]
    return make_model(nvtx=r1 + r2, kernels=kernels, memset=[MEMSET], memcpy=[MEMCPY],
                      cuda_api=[MEMSET_API, MEMCPY_API], **extra)


# --- unit ------------------------------------------------------------------------------------------
def test_iterations_whole_result_from_two_ranks():
    result = run(two_ranks())
    # each range's own span (its GPU work ends inside it); combined: the median of the ranks' k-th starts and ends
    assert result.rows == [
        # device 0: kernel 0-100 and memset 50-150 overlap; device 1: memcpy 10-110: (145 + 100) / 500
        it.IterationRow(index=0, start_ns=5, end_ns=255, duration_ns=250, gpu_busy_pct=49.0),
        it.IterationRow(index=1, start_ns=310, end_ns=385, duration_ns=75, gpu_busy_pct=66.67),  # (45 + 55) / 150
        it.IterationRow(index=2, start_ns=405, end_ns=490, duration_ns=85, gpu_busy_pct=61.76),  # (50 + 55) / 170
        it.IterationRow(index=3, start_ns=510, end_ns=595, duration_ns=85, gpu_busy_pct=58.82)]  # (45 + 55) / 170
    assert result.candidates == [it.Candidate(name="iteration N", kind="push_pop", depth=0, counter=True, ranges=8,
                                              threads=2, gpu_ranges_pct=100.0, median_period_ns=105.0)]
    assert (result.method, result.duration_basis, result.note, result.iteration_count, result.truncated,
            result.total_rows) == ("nvtx:iteration N", "range", None, 4, False, 4)
    assert result.reason == ("'iteration N' (named like a step): 8 ranges on 2 thread(s), 100.0% launching GPU work, "
                             "median period 0.000 ms")
    assert (result.span_start_ns, result.span_end_ns, result.first_ns, result.steady_median_ns,
            result.first_vs_steady, result.steady_start_ns) == (5, 595, 250, 85, 2.941, 310)
    # durations 250, 75, 85, 85: p10 75 + 0.3 x 10, p90 85 + 0.7 x 165; steady 75, 85, 85: p10 77, p90 85
    assert (result.mean_ns, result.std_ns, result.p10_ns, result.p90_ns, result.spread_ratio,
            result.steady_spread_ratio) == (123.8, 73.0, 78.0, 200.5, 2.571, 1.104)
    assert (result.slowest_index, result.slowest_ns, result.outliers) == (0, 250, [])
    assert [(f.root_cause, f.device, f.severity, f.time_at_stake_ns, f.tags) for f in result.findings] == [
        ("profiler-window-on-warmup", 0, "medium", 165, ["nvtx-steps"]),
        ("profiler-window-on-warmup", 1, "medium", 165, ["nvtx-steps"])]
    assert it.steady_window(result) == (310, 595)
    assert "4 iterations by nvtx:iteration N" in it.render(result)


def test_iterations_device_scope_keeps_the_threads_that_drive_it():
    result = run(two_ranks(), device=1)
    assert [(r.start_ns, r.end_ns) for r in result.rows] == [(10, 260), (320, 390), (410, 500), (520, 600)]
    assert result.candidates[0].threads == 1 and [f.device for f in result.findings] == [1]


PER_OP = ["aten::add, seq = 3, op_id = {}", "aten::to, op_id = {}", "MyFunction, seq = {}", "prim::TupleConstruct {}",
          "c10d::allreduce_ {}", "_c10d_functional::all_reduce {}", "flash_attn::_flash_attn_forward {}",
          "ncclAllReduce {}", "nccl:all_reduce {}", "cublasSgemm_v2 {}", "cudnnConvolutionForward {}",
          "cub::DeviceReduce::Sum {}", "thrust::transform {}", "record_param_comms", "MPI_Send", "MPI_Recv",
          "Thunk:#hlo_op=fusion.{}#", "train.py(42): forward {}", "model.cpp:45 step {}"]


@pytest.mark.parametrize("text", PER_OP)
def test_iterations_never_takes_a_per_op_range(text):
    ranges, kernels = steps(text, [0, 100, 200, 300], [90, 190, 290, 390])
    result = run(make_model(nvtx=ranges, kernels=kernels))
    assert (result.candidates, result.method) == ([], "kernel_pattern:k")


@pytest.mark.parametrize("text, name", [
    ("FSDP::pre_forward (blocks.{}._checkpoint_wrapped_module), op_id = 7", "FSDP::pre_forward "
     "(blocks.N._checkpoint_wrapped_module)"),  # module-level framework range, op_id stripped
    ("ProfilerStep#{}", "ProfilerStep#N"),
    ("epoch 0 step {}", "epoch N step N"),  # the tuple (0, k) increases
])
def test_iterations_takes_step_level_ranges(text, name):
    ranges, kernels = steps(text, [0, 100, 200, 300], [90, 190, 290, 390])
    assert run(make_model(nvtx=ranges, kernels=kernels)).method == f"nvtx:{name}"


def test_iterations_repeating_numbers_make_distinct_ranges():
    # blocks 0..2 in every step of a longer capture: each text is its own range, 'blocks.0' marks the step
    starts = [100 * step + 30 * block for step in range(4) for block in range(3)]
    ranges = [rng_(f"pre_forward (blocks.{b})", s, s + 20) for s, b in zip(starts, [0, 1, 2] * 4, strict=True)]
    result = run(make_model(nvtx=ranges, kernels=[kern(s, s + 5) for s in starts]))
    assert [c.name for c in result.candidates] == [
        "pre_forward (blocks.0)", "pre_forward (blocks.1)", "pre_forward (blocks.2)"]
    assert not result.candidates[0].counter
    assert [(r.start_ns, r.end_ns) for r in result.rows] == [(0, 100), (100, 200), (200, 300)]


def test_iterations_never_merges_texts_that_differ_beyond_their_numbers():
    texts = ["step 1 fwd", "step 2 bwd", "step 3 fwd", "step 4 bwd", "step 5 fwd", "step 6 bwd"]
    ranges = [rng_(t, 100 * i, 100 * i + 90) for i, t in enumerate(texts)]
    result = run(make_model(nvtx=ranges, kernels=[kern(100 * i, 100 * i + 5, name=f"k{i}") for i in range(6)]))
    assert [(c.name, c.ranges) for c in result.candidates] == [("step N fwd", 3), ("step N bwd", 3)]


@pytest.mark.parametrize("texts", [
    ["step 8", "step 9", "step 10", "step 11"],  # as strings '10' < '9': numbers compare by value
    ["epoch 1 step 9", "epoch 1 step 10", "epoch 2 step 1", "epoch 2 step 2"],  # the first number first
])
def test_iterations_counter_numbers_compare_as_numbers(texts):
    ranges = [rng_(t, 100 * i, 100 * i + 90) for i, t in enumerate(texts)]
    result = run(make_model(nvtx=ranges, kernels=[kern(100 * i, 100 * i + 5) for i in range(4)]))
    name = "step N" if len(texts[0].split()) == 2 else "epoch N step N"
    assert [(c.name, c.counter, c.ranges) for c in result.candidates] == [(name, True, 4)]
    assert [(r.start_ns, r.end_ns) for r in result.rows] == [(0, 90), (100, 190), (200, 290), (300, 390)]


def test_iterations_numbers_that_fall_on_one_thread_are_no_counter():
    r1, k1 = steps("layer {}", [0, 100, 200], [90, 190, 290])
    r2 = [rng_(f"layer {k}", s, s + 90, tid=2) for k, s in zip([2, 1, 0], [0, 100, 200], strict=True)]
    k2 = [kern(s, s + 10, tid=2, device=1) for s in (0, 100, 200)]
    result = run(make_model(nvtx=r1 + r2, kernels=k1 + k2))
    assert result.candidates == []  # 'layer 0', 'layer 1', 'layer 2': once per thread each


@pytest.mark.parametrize("ranges, kernels, name", [
    # torch.profiler's step wins over a step-like name, even shallower
    ([*steps("step {}", [0, 100, 200], [99, 199, 299])[0],
      *steps("ProfilerStep#{}", [1, 101, 201], [98, 198, 298], depth=1)[0]], [kern(s, s + 5) for s in (2, 102, 202)],
     "ProfilerStep#N"),
    # a step-like name wins over a shallower one
    ([*steps("layer {}", [0, 100, 200, 300, 400, 500], [90, 190, 290, 390, 490, 590])[0],
      *steps("step {}", [0, 200, 400], [190, 390, 590], depth=1)[0]], [kern(s, s + 5) for s in range(0, 600, 100)],
     "step N"),
    # otherwise the outermost
    ([*steps("fwd", [0, 100, 200, 300], [90, 190, 290, 390])[0],
      *steps("op", [0, 100, 200, 300], [50, 150, 250, 350], depth=1)[0]], [kern(s, s + 5) for s in (0, 100, 200, 300)],
     "fwd"),
    # then the longest period (start/end ranges count as depth 0)
    ([*steps("a", [0, 100, 200, 300], [90, 190, 290, 390])[0],
      *[rng_("b", s, s + 150, depth=None, tid=2, kind="start_end") for s in (0, 200, 400)]],
     [kern(s, s + 5) for s in (0, 100, 200, 300)] + [kern(s, s + 5, tid=2) for s in (0, 200, 400)], "b"),
    # a range launching GPU work in fewer than half of its instances does not qualify
    ([*steps("step {}", [0, 100, 200, 300], [90, 190, 290, 390])[0],
      *steps("fwd", [0, 100, 200, 300], [50, 150, 250, 350], tid=2)[0]],
     [kern(0, 5), *steps("fwd", [0, 100, 200, 300], [50, 150, 250, 350], tid=2)[1]], "fwd"),
])
def test_iterations_picks_the_step_range(ranges, kernels, name):
    assert run(make_model(nvtx=ranges, kernels=kernels)).method == f"nvtx:{name}"


def test_iterations_ranges_without_gpu_work_do_not_qualify():
    ranges, _ = steps("step {}", [0, 100, 200, 300], [90, 190, 290, 390])
    result = run(make_model(nvtx=ranges, kernels=[kern(1000, 1010)]))
    assert (result.candidates, result.method, result.iteration_count) == ([], None, 0)
    assert "no kernel runs 3+ times on device 0" in result.note


def test_iterations_counts_launches_anywhere_inside_a_long_range():
    """The launch join's buckets follow the average range (short ones here), so a step spans a hundred of them: a
    launch late in a step counts, one at its very end or just before it does not."""
    ms = 1_000_000
    starts = [k * 20 * ms for k in range(4)]
    step_ranges, _ = steps("step {}", starts, [s + 10 * ms for s in starts])
    tiny = [rng_("tiny", s + i * 50_000, s + i * 50_000 + 1_000, depth=1) for s in starts for i in range(100)]
    launches = [s + 9_500_000 for s in starts[:3]] + [starts[3] + 10 * ms, starts[3] - 1]
    result = run(make_model(nvtx=step_ranges + tiny, kernels=[kern(at + 1_000, at + 2_000, launch=at)
                                                              for at in launches]))
    assert [(c.name, c.ranges, c.gpu_ranges_pct) for c in result.candidates] == [("step N", 4, 75.0)]


@pytest.mark.parametrize("name, basis, rows", [
    ("step {}", "range", [(0, 100), (150, 200), (400, 450), (500, 600)]),  # a step: its own span
    ("fwd", "start_to_start", [(0, 150), (150, 400), (400, 500), (500, 600)]),  # a phase: where steps start
])
def test_iterations_step_ranges_are_their_own_span_other_ranges_run_start_to_start(name, basis, rows):
    ranges, kernels = steps(name, [0, 150, 400, 500], [100, 200, 450, 600])
    result = run(make_model(nvtx=ranges, kernels=kernels))
    assert (result.duration_basis, [(r.start_ns, r.end_ns) for r in result.rows]) == (basis, rows)


def test_iterations_a_step_runs_on_the_device_while_the_host_runs_ahead():
    """The host enqueues each step in 10 ns and the GPU takes 100 per step: step k starts on the device when step
    k-1's work ends (its own first kernel waits for it), and ends with its last kernel."""
    ranges = [rng_(f"step {k}", 10 * k, 10 * k + 10) for k in range(4)]
    kernels = [kern(100 * k + 5 * j, 100 * k + 5 * j + 5, launch=10 * k + j // 2) for k in range(4) for j in range(20)]
    result = run(make_model(nvtx=ranges, kernels=kernels))
    assert [(r.start_ns, r.end_ns, r.gpu_busy_pct) for r in result.rows] == [
        (0, 100, 100.0), (100, 200, 100.0), (200, 300, 100.0), (300, 400, 100.0)]
    assert (result.steady_median_ns, it.steady_window(result)) == (100, (0, 400))


def test_iterations_one_profiler_step_is_the_step():
    ranges, kernels = steps("ProfilerStep#{}", [100], [400])
    result = run(make_model(nvtx=ranges + [rng_("ReluBackward0", 150, 160, depth=1)] * 3, kernels=kernels))
    assert (result.method, result.iteration_count, [(r.start_ns, r.end_ns) for r in result.rows]) == (
        "nvtx:ProfilerStep#0", 1, [(100, 400)])
    assert result.note == ("only 1 step(s) by nvtx:ProfilerStep#0 (the program's own step marker: triage analyses "
                           "them): too few to tell warmup from steady state (needs 3); capture more steps")
    assert (it.steady_window(result), result.findings) == ((100, 400), [])


@pytest.mark.parametrize("text", ["Optimizer.step#SGD.step", "ReluBackward0", "CudnnBatchNormBackward0",
                                  "BackwardWithAuxiliaryLossBackward"])
def test_iterations_optimizer_and_autograd_ranges_are_per_op(text):
    ranges, kernels = steps(text, [0, 100, 200, 300], [90, 190, 290, 390])
    assert run(make_model(nvtx=ranges, kernels=kernels)).candidates == []


@pytest.mark.parametrize("last_end, rows", [
    (260, [(0, 90), (100, 190), (200, 260)]),  # 60 >= half the others' median (90): a step, to its own end
    (240, [(0, 90), (100, 190)]),  # 40: the start of a step the window cut off
])
def test_iterations_last_range_counts_only_when_it_covers_a_step(last_end, rows):
    ranges, kernels = steps("step {}", [0, 100, 200], [90, 190, last_end])
    assert [(r.start_ns, r.end_ns) for r in run(make_model(nvtx=ranges, kernels=kernels)).rows] == rows


def test_iterations_too_few_iterations_say_so_and_draw_no_finding():
    ranges, kernels = steps("step {}", [0, 500, 600], [400, 590, 610])  # the last, 10 of 400 and 90: cut off
    result = run(make_model(nvtx=ranges, kernels=kernels))
    assert (result.iteration_count, result.first_vs_steady, result.findings) == (2, 4.444, [])
    assert result.note == ("only 2 step(s) by nvtx:step N (the program's own step marker: triage analyses them): "
                           "too few to tell warmup from steady state (needs 3); capture more steps")
    fwd, kernels = steps("fwd", [0, 500, 600], [400, 590, 610])
    assert run(make_model(nvtx=fwd, kernels=kernels)).note.startswith("only 2 iteration(s) by nvtx:fwd: too few")


def test_iterations_small_warmup_excess_draws_no_finding():
    starts = [0, 2_000] + [2_000 + 1_000 * k for k in range(1, 200)]
    ranges, kernels = steps("step {}", starts, [1_900] + [s + 900 for s in starts[1:]])
    result = run(make_model(nvtx=ranges, kernels=kernels))
    assert (result.first_vs_steady, result.findings) == (2.111, [])  # 1 us more than steady, of a 202 us span
    assert it.steady_window(result) == (2_000, 201_900)  # still the warmup outlier: steady state skips it


def test_iterations_steady_window_starts_at_the_first_iteration_without_warmup():
    ranges, kernels = steps("step {}", [0, 100, 200, 300], [90, 190, 290, 390])
    result = run(make_model(nvtx=ranges, kernels=kernels))
    assert (result.findings, it.steady_window(result)) == ([], (0, 390))
    empty = run(make_model(kernels=[kern(0, 10)]))
    assert (empty.iteration_count, it.steady_window(empty)) == (0, None)


def test_iterations_lists_slow_later_iterations_as_data_only():
    durations = [100, 100, 100, 350, 100, 100, 250]
    bounds = [sum(durations[:i]) for i in range(len(durations) + 1)]
    ranges, kernels = steps("step {}", bounds[:-1], [e - 1 for e in bounds[1:]])
    result = run(make_model(nvtx=ranges, kernels=kernels), limit=2)
    assert (result.iteration_count, len(result.rows), result.truncated, result.steady_median_ns) == (7, 2, True, 99)
    assert result.outliers == [it.Outlier(index=3, duration_ns=349, vs_steady=3.525),
                               it.Outlier(index=6, duration_ns=249, vs_steady=2.515)]
    assert result.findings == []


@pytest.mark.parametrize("range_name, name", [("iteration", "iteration N"), ("Iteration 7", "iteration N"),
                                              ("aten::mm", "aten::mm")])
def test_iterations_range_name_picks_a_range(range_name, name):
    ranges, kernels = steps("iteration {}", [0, 100, 200, 300], [90, 190, 290, 390])
    ops = [rng_("aten::mm", s, s + 60, depth=1) for s in (0, 100, 200, 300)]
    result = run(make_model(nvtx=ranges + ops, kernels=kernels), range_name=range_name)
    assert (result.method, result.iteration_count) == (f"nvtx:{name}", 4)
    assert result.reason.startswith(f"'{name}' (requested by range_name)")


@pytest.mark.parametrize("kw, message", [
    ({"range_name": "epoch"}, "no NVTX range 'epoch' in this window"),
    ({"method": "nvtx"}, "no NVTX range that occurs 3\\+ times on a thread with GPU work"),
])
def test_iterations_missing_nvtx_range_is_an_error(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(nvtx=[rng_("aten::add", 0, 10)], kernels=[kern(0, 5)]), **kw)


def test_iterations_kernel_pattern_takes_the_coarsest_stable_period():
    kernels = [kern(0, 50, "warmup")]
    for i in range(6):  # A once per step of 1000 ns, B four times, at uneven offsets C twice
        t = 100 + 1000 * i
        kernels += [kern(t, t + 100, "A"), kern(t + 300, t + 350, "C"), kern(t + 400, t + 450, "C")]
        kernels += [kern(t + 150 + 250 * j, t + 200 + 250 * j, "B") for j in range(4)]
    result = run(make_model(kernels=kernels))
    assert (result.method, result.iteration_count, result.candidates) == ("kernel_pattern:A", 5, [])
    assert result.reason == ("no NVTX range occurs 3+ times on a thread with GPU work; kernel 'A' on device 0: 6 runs, "
                             "median period 0.001 ms, 100% of periods within 25% of it, filling 100% of the time "
                             "after the first; the coarsest stable rhythm")
    assert [(r.start_ns, r.end_ns, r.gpu_busy_pct) for r in result.rows] == [
        (100 + 1000 * i, 1100 + 1000 * i, 35.0) for i in range(5)]  # A 100, 4 B 200, C 50 (the other C overlaps a B)
    ranges = [rng_(f"step {i}", 100 + 1000 * i, 1000 + 1000 * i) for i in range(6)]
    assert run(make_model(kernels=kernels, nvtx=ranges), method="kernel_pattern").method == "kernel_pattern:A"


def test_iterations_kernel_pattern_marks_steps_by_their_first_kernel():
    kernels = [kern(t + offset, t + offset + 100, name) for t in range(0, 5000, 1000)
               for offset, name in ((500, "late"), (0, "early"), (200, "middle"))]
    result = run(make_model(kernels=kernels))
    assert (result.method, [r.start_ns for r in result.rows]) == ("kernel_pattern:early", [0, 1000, 2000, 3000])


@pytest.mark.parametrize("starts, closest", [
    ([0, 100, 200, 5_000, 5_100, 20_000], "60% of periods within 25% of it"),  # irregular
    # bursts of 20 launches 10 ns apart after a long pause each (a JIT compile per step): steady only 3% of the time
    ([b * 10_000 + 10 * i for b in range(3) for i in range(20)], "filling 3% of the time after the first"),
])
def test_iterations_unstable_kernel_period_is_rejected(starts, closest):
    result = run(make_model(kernels=[kern(s, s + 5, "A") for s in starts]))
    assert (result.method, result.iteration_count, result.rows, result.findings) == (None, 0, [], [])
    assert "no kernel on device 0 recurs with a stable period" in result.note and closest in result.note
    assert it.render(result).startswith("No iterations found: no NVTX range occurs 3+ times on a thread with GPU "
                                        "work; no kernel on device 0 recurs")


# --- golden on real exports ----------------------------------------------------------------------------
def raw(stem: str, sql: str, *args) -> list[tuple]:
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    rows = con.execute(sql, args).fetchall()
    con.close()
    return rows


NVTX_RAW = """SELECT e.globalTid, e.start, e."end" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
              WHERE coalesce(e.text, s.value) LIKE ? ORDER BY e.globalTid, e.start"""


def raw_busy_pct(stem: str, devices: list[int], lo: int, hi: int) -> float:
    """Union of kernel, memcpy and memset intervals per device inside [lo, hi), over devices x duration."""
    tables = {name for (name,) in raw(stem, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    busy = 0
    for device in devices:
        intervals = [(max(s, lo), min(e, hi)) for table in ("KERNEL", "MEMCPY", "MEMSET")
                     if f"CUPTI_ACTIVITY_KIND_{table}" in tables
                     for s, e in raw(stem, f'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_{table} '
                                           'WHERE deviceId = ? AND "end" > ? AND start < ?', device, lo, hi)]
        busy += union_ns(intervals)
    return round(100 * busy / ((hi - lo) * len(devices)), 2)


def per_thread(rows: list[tuple]) -> list[list[tuple[int, int]]]:
    threads: dict[int, list[tuple[int, int]]] = {}
    for gtid, s, e in rows:
        threads.setdefault(gtid, []).append((s, e))
    return list(threads.values())


def raw_device_side(stem: str, rows: list[tuple]) -> list[list[tuple[int, int]]]:
    """Per thread, each NVTX range as the device lived it, read from the raw export: it starts when the GPU work
    its thread launched before it ends (if later, and no later than its own first GPU work starts) and ends when
    the last GPU work launched inside it ends (if later). Work = kernels, copies and memsets joined to their
    launch call by correlation id."""
    work = raw(stem, " UNION ALL ".join(
        f'SELECT r.globalTid, r.start, w.start, w."end" FROM CUPTI_ACTIVITY_KIND_{t} w JOIN CUPTI_ACTIVITY_KIND_RUNTIME'
        " r ON r.correlationId = w.correlationId AND w.globalPid = r.globalTid - r.globalTid % 16777216"  # per process
        for t in ("KERNEL", "MEMCPY", "MEMSET")))
    threads: dict[int, list[tuple[int, int]]] = {}
    for gtid, start, end in rows:
        mine = [w for w in work if w[0] == gtid]
        before = [w[3] for w in mine if w[1] < start]
        inside = [w for w in mine if start <= w[1] < end]
        if before and inside:
            start = max(start, min(max(before), min(w[2] for w in inside)))
        threads.setdefault(gtid, []).append((start, max([end, *(w[3] for w in inside)])))
    return list(threads.values())


@pytest.mark.parametrize("stem, steady_ms", [("nsysai_mfu_2gpu_before", 16.7), ("nsysai_mfu_2gpu_after", 19.5)])
def test_iterations_mfu_step_is_the_fsdp_pre_forward_spacing(open_fixture, stem, steady_ms):
    threads = raw_device_side(stem, raw(stem, NVTX_RAW, "FSDP::pre_forward (blocks.%"))
    lags = [b[0] - a[0] for t in threads for a, b in zip(t, t[1:], strict=False)]
    # every rank's last pre_forward is a sliver of a step (the window ends inside it): dropped
    assert all(t[-1][1] - t[-1][0] < statistics.median(lags) / 2 for t in threads)
    starts = [sum(t[k][0] for t in threads) // 2 for k in range(len(threads[0]))]  # median of 2 ranks
    result = run_skill(open_fixture(stem).con, it, it.Params(profile=stem, limit=500))
    assert (result.method, result.duration_basis) == (
        "nvtx:FSDP::pre_forward (blocks.N._checkpoint_wrapped_module)", "start_to_start")  # a phase, not a step
    assert [c.name for c in result.candidates] == ["FSDP::pre_forward (blocks.N._checkpoint_wrapped_module)"]
    assert [(r.start_ns, r.end_ns) for r in result.rows] == list(zip(starts, starts[1:], strict=False))
    assert result.steady_median_ns == statistics.median(b - a for a, b in zip(starts[1:], starts[2:], strict=False))
    assert result.steady_median_ns / 1e6 == pytest.approx(steady_ms, abs=0.6)  # 'after' mixes 18-19 and 23 ms steps
    row = result.rows[3]
    assert row.gpu_busy_pct == raw_busy_pct(stem, [0, 1], row.start_ns, row.end_ns)



def test_iterations_boundaries_are_found_once_for_every_limit(open_fixture, monkeypatch):
    """Callers asking for different `limit`s (iterations, triage, show_timeline) share one search per model and
    window; each gets its own copy, so a caller changing its result changes no other's."""
    con = open_fixture("nsysai_mfu_2gpu_before").con
    lo, hi = con.execute("SELECT capture_start_ns, capture_end_ns - 1 FROM meta").fetchone()  # a window of its own
    searches = []
    find = sb._find
    monkeypatch.setattr(sb, "_find", lambda *a: searches.append(a) or find(*a))
    few, every = (it.run(con, it.Params(profile="p", start_ns=lo, end_ns=hi, limit=n)) for n in (3, 500))
    assert len(searches) == 1 and every.iteration_count > 3
    assert few.rows == every.rows[:3] and few.candidates == every.candidates and few.method == every.method
    few.candidates[0].name = "changed"
    assert it.run(con, it.Params(profile="p", start_ns=lo, end_ns=hi)).candidates[0].name == every.candidates[0].name

def test_iterations_mfu_after_is_slower_and_less_busy(open_fixture):
    before, after = (run_skill(open_fixture(f"nsysai_mfu_2gpu_{s}").con, it, it.Params(profile=s, limit=500))
                     for s in ("before", "after"))
    assert after.steady_median_ns > 1.15 * before.steady_median_ns
    mean_busy = [statistics.fmean(r.gpu_busy_pct for r in x.rows) for x in (before, after)]
    assert mean_busy[1] < mean_busy[0] - 5


def test_iterations_op_ranges_only_never_mark_the_step(open_fixture):
    stem = "nsysai_h100_2gpu_1s"
    fsdp = Counter((re.sub(r", op_id = [0-9]+$", "", text), gtid) for text, gtid in raw(stem, """
        SELECT coalesce(e.text, s.value) AS t, e.globalTid FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
        WHERE t LIKE 'FSDP::%'"""))
    assert max(fsdp.values()) == 2  # block numbers restart: each FSDP text at most twice per thread
    result = run_skill(open_fixture(stem).con, it, it.Params(profile=stem))
    assert result.candidates == [] and result.method.startswith("kernel_pattern:")


def test_iterations_mpi_calls_never_mark_the_step(open_fixture):
    stem = "pipit_saxpy_mpi_a100"
    [saxpy] = raw_device_side(stem, raw(stem, NVTX_RAW, "saxpy"))
    result = run_skill(open_fixture(stem).con, it, it.Params(profile=stem))
    assert (result.method, [c.name for c in result.candidates]) == ("nvtx:saxpy", ["saxpy"])
    starts = [s for s, _ in saxpy]  # the last saxpy range (42 us of a 252 ms period) is dropped
    assert [(r.start_ns, r.end_ns) for r in result.rows] == list(zip(starts, starts[1:], strict=False))


def test_iterations_kernel_pattern_matches_raw_export(open_fixture):
    stem, marker = "clue_t4_report4", "kernel_compute_histogram"  # the first of the kernels run once per event
    starts = [s for (s,) in raw(stem, """SELECT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                                         ON s.id = k.shortName WHERE s.value = ? ORDER BY k.start""", marker)]
    result = run_skill(open_fixture(stem).con, it, it.Params(profile=stem, limit=500))
    assert result.method == f"kernel_pattern:{marker}"
    assert [(r.start_ns, r.end_ns) for r in result.rows] == list(zip(starts, starts[1:], strict=False))
    assert [r.gpu_busy_pct for r in result.rows] == [raw_busy_pct(stem, [0], s, e)
                                                     for s, e in zip(starts, starts[1:], strict=False)]


def test_iterations_snapshot(open_fixture, snapshot):
    assert dump(run_skill(open_fixture("clue_t4_report4").con, it, it.Params(profile="p", limit=5))) == snapshot


# --- synthetic samples ------------------------------------------------------------------------------
def test_iterations_finds_the_planted_slow_first_iteration(demo):
    profile, truth = demo
    result = run_skill(profile.con, it, it.Params(profile="demo"))
    assert (result.method, result.iteration_count) == ("nvtx:iteration N", len(truth["iterations"]))
    lived = lived_iterations(truth)
    assert [(r.start_ns, r.end_ns) for r in result.rows] == lived
    starts, ends = [s for s, _ in lived], [e for _, e in lived]
    slow = planted(truth, "slow_first_iteration")
    assert result.first_vs_steady == pytest.approx(statistics.fmean(p["ratio"] for p in slow), abs=0.05)
    warm = {f.device: f.time_at_stake_ns for f in result.findings if f.root_cause == "profiler-window-on-warmup"}
    assert warm == {p["device"]: pytest.approx(p["duration_ns"] - p["median_other_iteration_ns"], rel=0.02)
                    for p in slow}
    assert it.steady_window(result) == (starts[1], ends[-1])
    assert result.outliers == []


def test_iterations_quiet_on_clean(clean):
    profile, truth = clean
    result = run_skill(profile.con, it, it.Params(profile="clean"))
    assert result.iteration_count == len(truth["iterations"]) and result.findings == []


# --- errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    ({"device": 2}, "device 2 is not in this profile"),
    ({"start_ns": 300, "end_ns": 300}, "is empty"),
    ({"start_ns": 9_000, "end_ns": 9_500}, "outside the capture"),
])
def test_iterations_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(two_ranks(), **kw)


def test_iterations_rejects_the_empty_export(open_fixture):
    with pytest.raises(InvalidRequest):
        run_skill(open_fixture("dynamicvit_empty_export").con, it, it.Params(profile="e"))
