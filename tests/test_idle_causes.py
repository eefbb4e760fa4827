"""idle_causes: which root cause claims which idle time, under which precondition; claims never overlap."""

from __future__ import annotations

from dataclasses import replace

import pytest
from modeldb import make_model

from stallhound import book
from stallhound.analysis import common, idle_causes, launch_pace, trace_quality
from stallhound.analysis.attribution import CauseTime, DeviceIdle
from stallhound.analysis.common import UNSEEN
from stallhound.analysis.program import FIX_CHAINS, Program
from stallhound.analysis.step_repeats import SameSteps
from stallhound.analysis.trace_quality import LostKernels, SampledCalls

MS = 1_000_000
WINDOW = 100 * MS


def prog(kind: str = "cuda", frameworks: tuple[str, ...] = ()) -> Program:
    return Program(kind=kind, fix_chain=list(FIX_CHAINS[kind]), frameworks=list(frameworks), process="p",
                   evidence=[], decided_by="test")


def device(busy_pct: float = 50.0, **causes: CauseTime) -> DeviceIdle:
    idle = int(WINDOW * (100 - busy_pct) / 100)
    return DeviceIdle(device=0, window_ns=WINDOW, idle_ns=idle, causes=causes)


def found(d: DeviceIdle, p: Program | None = None, in_loop: bool = False) -> list[tuple]:
    return [(f.root_cause, f.severity, f.time_at_stake_ns, f.tags)
            for f in idle_causes.findings({0: d}, p or prog(), in_loop)]


@pytest.mark.parametrize("causes, expected", [
    ({"sync": CauseTime(5 * MS, 40, api="cudaDeviceSynchronize", calls=40)},
     [("excessive-synchronization", "medium", 5 * MS, ["device-sync"])]),
    ({"sync": CauseTime(MS // 2, 4, api="cudaDeviceSynchronize", calls=4)}, []),  # half a percent of the window
    ({"sync": CauseTime(MS, 9, api="cudaStreamSynchronize", calls=9), "sync_copy": CauseTime(2 * MS, 9, calls=9)},
     [("excessive-synchronization", "medium", 3 * MS, ["sync-copy"])]),
    ({"readback": CauseTime(12 * MS, 30, api="cudaStreamSynchronize")},
     [("blocking-d2h-sync", "high", 12 * MS, [])]),
    ({"launch_tiny": CauseTime(20 * MS, 99)}, []),  # fewer than TINY_MIN_GAPS launches
    ({"launch_tiny": CauseTime(20 * MS, 100)}, [("small-kernel-overhead", "high", 20 * MS, [])]),
    ({"alloc": CauseTime(5 * MS, 2)}, [("profiler-window-on-warmup", "low", 5 * MS, ["setup"])]),  # twice: setup
    ({"alloc": CauseTime(5 * MS, 3)}, [("alloc-in-loop", "medium", 5 * MS, [])]),
    ({"host_comm": CauseTime(30 * MS, 4)}, [("host-communication", "high", 30 * MS, [])]),
    ({"input_wait": CauseTime(8 * MS, 4)}, [("dataloader-starvation", "medium", 8 * MS, [])]),
    ({"host_wait": CauseTime(8 * MS, 4)}, []),  # OS waits alone name no data loader (nor a bubble: all short)
    # twice in a window not known to be the loop: setup; paid once per run, under rules.ONE_RUN_LOW_NS: low
    ({"jit": CauseTime(40 * MS, 2)}, [("profiler-window-on-warmup", "low", 40 * MS, ["setup"])]),
    ({"jit": CauseTime(40 * MS, 3)}, [("module-loading-hot-path", "low", 40 * MS, ["module-load"])]),
    ({"jit": CauseTime(MS // 2, 3)}, []),  # half a percent of the window
    ({"profiler": CauseTime(6 * MS, 1)}, [("profiler-overhead", "medium", 6 * MS, [])]),
])
def test_idle_causes_each_cause_claims_its_idle(causes, expected):
    assert found(device(**causes)) == expected


@pytest.mark.parametrize("in_loop, expected", [(True, [("module-loading-hot-path", "high", 40 * MS, ["module-load"])]),
                                               (False, [("profiler-window-on-warmup", "low", 40 * MS, ["setup"])])])
def test_idle_causes_a_single_compile_counts_only_inside_the_loop(in_loop, expected):
    """One compile in a steady-state window happened between steps (a recompilation); in a window that may hold
    the setup, once is the program's start."""
    assert found(device(jit=CauseTime(40 * MS, 1)), in_loop=in_loop) == expected


@pytest.mark.parametrize("busy, launch, cpu, expected", [
    (50.0, 10 * MS, 2 * MS, [("cpu-bottleneck", "high", 12 * MS, ["launch"])]),
    (50.0, MS, 6 * MS, [("cpu-bottleneck", "medium", 7 * MS, ["host-cpu"])]),
    (85.0, 10 * MS, 2 * MS, []),  # the device is busy 85%: not starved, the host is not its bottleneck
])
def test_idle_causes_cpu_bottleneck_needs_a_starved_device(busy, launch, cpu, expected):
    d = device(busy, launch=CauseTime(launch, 500), host_cpu=CauseTime(cpu, 3, long_ns=cpu))
    assert found(d) == expected


@pytest.mark.parametrize("loader, tags, dataloader", [
    ((), ["host-cpu"], False),  # a benchmark or test with no input pipeline: no DataLoader advice
    (("NVTX range 'enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__'",), ["host-cpu", "input-pipeline"],
     True),  # the trace shows a loader (input_pipeline.evidence)
])
def test_idle_causes_cpu_bottleneck_fix_fits_the_programs_input_pipeline(loader, tags, dataloader):
    [f] = idle_causes.findings({0: device(50.0, host_cpu=CauseTime(20 * MS, 3, long_ns=20 * MS))},
                               prog("pytorch", ("PyTorch (ATen)",)), seen=idle_causes.Seen(loader=loader))
    fix = book.get_entry(f.root_cause).fix_for(tuple(FIX_CHAINS["pytorch"]), f.tags)
    assert (f.root_cause, f.tags, "DataLoader" in fix.text) == ("cpu-bottleneck", tags, dataloader)


@pytest.mark.parametrize("p, root, tags", [
    (prog("pytorch", ("PyTorch (ATen)", "Triton")), "torch-compile-recompilation", ["jit"]),
    (prog("pytorch", ("PyTorch (ATen)",)), "module-loading-hot-path", ["module-load"]),
    (prog("python", ("CuPy",)), "module-loading-hot-path", ["jit"]),
    (prog("cuda"), "module-loading-hot-path", ["module-load"]),
])
def test_idle_causes_run_time_compiles_by_program(p, root, tags):
    [(cause, _, _, got)] = found(device(jit=CauseTime(20 * MS, 3)), p)
    assert (cause, got) == (root, tags)


def test_idle_causes_gc_pauses_only_in_python_programs():
    pauses = CauseTime(30 * MS, 10, long_ns=30 * MS, periodic_ns=24 * MS, periodic_gaps=8, period_ns=10 * MS)
    in_python = found(device(host_untraced=pauses), prog("python"))
    assert in_python == [("gc-pauses", "high", 24 * MS, []), ("gpu-bubbles", "medium", 6 * MS, [UNSEEN])]
    assert found(device(host_untraced=pauses), prog("cuda")) == [("gpu-bubbles", "high", 30 * MS, [UNSEEN])]


@pytest.mark.parametrize("busy, long_ns, expected", [
    (50.0, 20 * MS, [("gpu-bubbles", "high", 20 * MS, [UNSEEN])]),
    (85.0, 5 * MS, []),  # a busy device with a little unexplained idle: not worth chasing
    (85.0, 12 * MS, [("gpu-bubbles", "high", 12 * MS, [UNSEEN])]),  # ... unless it passes a tenth of the window
])
def test_idle_causes_bubbles_are_what_stays_unexplained(busy, long_ns, expected):
    d = device(busy, host_untraced=CauseTime(long_ns + 3 * MS, 50, long_ns=long_ns),
               queued=CauseTime(MS, 900, long_ns=0))
    assert found(d) == expected


def test_idle_causes_claims_never_exceed_the_idle_time():
    every = {c: CauseTime(3 * MS, 200, long_ns=2 * MS, periodic_ns=MS, periodic_gaps=3, period_ns=MS,
                          api="cudaDeviceSynchronize")
             for c in ("queued", "sync", "readback", "sync_copy", "launch_tiny", "launch", "jit", "alloc",
                       "host_comm", "host_wait", "host_cpu", "host_untraced")}
    d = DeviceIdle(device=0, window_ns=WINDOW, idle_ns=sum(c.ns for c in every.values()), causes=every)
    for p in (prog("pytorch", ("Triton",)), prog("cuda")):
        findings = idle_causes.findings({0: d}, p)
        assert len({f.root_cause for f in findings}) == len(findings)
        assert sum(f.time_at_stake_ns for f in findings) <= d.idle_ns


LOADER = ("4 thread(s) pt_data_worker",)


@pytest.mark.parametrize("seen, expected", [
    (idle_causes.Seen(loader=LOADER), [("dataloader-starvation", "high", 20 * MS, [])]),
    # no data loader in the trace: the OS waits are on something the trace does not show
    (idle_causes.Seen(), [("dataloader-starvation", "medium", 8 * MS, []), ("gpu-bubbles", "medium", 9 * MS, [])]),
])
def test_idle_causes_os_waits_are_the_data_loader_only_when_the_program_has_one(seen, expected):
    d = device(input_wait=CauseTime(8 * MS, 3, long_ns=8 * MS), host_wait=CauseTime(12 * MS, 6, long_ns=9 * MS))
    got = idle_causes.findings({0: d}, prog("pytorch"), seen=seen)
    assert [(f.root_cause, f.severity, f.time_at_stake_ns, f.tags) for f in got] == expected
    assert ("OS waits" in got[-1].title) and ("pt_data_worker" in got[0].title) == bool(seen.loader)


@pytest.mark.parametrize("in_loop, expected", [
    (False, [("profiler-window-on-warmup", "low", 33 * MS, ["setup"])]),
    (True, [("alloc-in-loop", "medium", 3 * MS, []), ("module-loading-hot-path", "high", 30 * MS, ["module-load"])]),
])
def test_idle_causes_a_cost_paid_once_outside_the_loop_is_setup(in_loop, expected):
    """Named causes seen once or twice outside the loop are one-time setup, under their own names: never bubbles."""
    d = device(alloc=CauseTime(3 * MS, 2, long_ns=3 * MS), jit=CauseTime(30 * MS, 1, long_ns=30 * MS))
    got = idle_causes.findings({0: d}, prog(), in_loop)
    assert [(f.root_cause, f.severity, f.time_at_stake_ns, f.tags) for f in got] == expected
    assert in_loop or "allocating or freeing device or pinned memory 3.000 ms in 2 gaps" in got[0].title


@pytest.mark.parametrize("longest, expected", [
    # one 30 ms gap of 40 ms of allocation outside the loop: paid once (setup); the other 4 gaps recur
    (30 * MS, [("alloc-in-loop", "high", 10 * MS, []), ("profiler-window-on-warmup", "low", 30 * MS, ["setup"])]),
    (19 * MS, [("alloc-in-loop", "high", 40 * MS, [])]),  # no gap holds half of it: all of it recurs
])
def test_idle_causes_a_recurring_cost_with_one_dominant_gap_is_setup_once(longest, expected):
    d = replace(device(alloc=CauseTime(40 * MS, 5, long_ns=40 * MS)), longest={"alloc": longest})
    got = idle_causes.findings({0: d}, prog())
    assert [(f.root_cause, f.severity, f.time_at_stake_ns, f.tags) for f in got] == expected
    assert got[0].title.endswith(f"({5 - (longest == 30 * MS)} gaps)")
    assert found(d, in_loop=True) == [("alloc-in-loop", "high", 40 * MS, [])]  # in the loop every gap is the loop's


@pytest.mark.parametrize("gaps, longest, in_loop, expected", [
    (2, 30, False, [("profiler-window-on-warmup", "low", 40 * MS, ["setup"])]),  # paid twice: setup
    (5, 30, False, [("profiler-window-on-warmup", "low", 30 * MS, ["setup"]),  # one dominant gap: setup once,
                    ("gpu-bubbles", "high", 10 * MS, [UNSEEN])]),  # the rest recurs and no finding claims it
    (5, 19, False, [("gpu-bubbles", "high", 40 * MS, [UNSEEN])]),  # recurs: no gap holds half of it
    (2, 30, True, [("gpu-bubbles", "high", 40 * MS, [UNSEEN])]),  # in the loop nothing is setup
])
def test_idle_causes_initialisation_is_setup_only_when_paid_once(gaps, longest, in_loop, expected):
    """Streams, events or contexts created (init) outside the loop, once or with one gap holding half of it, are
    one-time setup under their own words; recurring, or in the loop, they stay a bubble: no finding claims them."""
    d = replace(device(init=CauseTime(40 * MS, gaps, long_ns=40 * MS)), longest={"init": longest * MS})
    got = idle_causes.findings({0: d}, prog(), in_loop)
    assert [(f.root_cause, f.severity, f.time_at_stake_ns, f.tags) for f in got] == expected
    setup = [f for f in got if f.root_cause == "profiler-window-on-warmup"]
    assert all("creating streams, events or contexts (a library's first use)" in f.title for f in setup)


UNTRACED_2MS = {"host_untraced": 2 * MS}


@pytest.mark.parametrize("init_gap, untraced_gaps, where", [
    ((7, {"alloc": 30 * MS, "init": 10 * MS, **UNTRACED_2MS}), 1, "the same setup gap"),  # both in gap 7
    ((9, {"init": 10 * MS, **UNTRACED_2MS}), 2, "those setup gaps"),  # gap 9 has an untraced rest too
    ((9, {"init": 10 * MS}), 1, "the same setup gap"),  # two setup gaps, the rest in one of them
])
def test_idle_causes_setup_says_how_many_gaps_its_rest_lies_in(init_gap, untraced_gaps, where):
    """Allocation paid once in gap 7 (2 ms untraced beside it), stream creation once in gap 7 too or in gap 9: the
    rest is said to lie in the same setup gap, or in those setup gaps, as many as hold some of it."""
    alloc_gap = init_gap if init_gap[0] == 7 else (7, {"alloc": 30 * MS, **UNTRACED_2MS})
    untraced = 2 * untraced_gaps * MS
    d = replace(device(busy_pct=20.0, alloc=CauseTime(30 * MS, 1, long_ns=30 * MS),
                       init=CauseTime(10 * MS, 1, long_ns=10 * MS),
                       host_untraced=CauseTime(untraced, untraced_gaps, long_ns=untraced)),
                longest={"alloc": 30 * MS, "init": 10 * MS, "host_untraced": 2 * MS},
                longest_gap={"alloc": alloc_gap, "init": init_gap, "host_untraced": (7, UNTRACED_2MS)})
    [setup] = idle_causes.findings({0: d}, prog())
    assert setup.time_at_stake_ns == 40 * MS + untraced
    assert setup.title.endswith(f"ms more in {where}), not in a loop: a window over the steady state leaves it out")


@pytest.mark.parametrize("own_longest", [7, 8])  # the untraced rest's own longest gap: the setup gap or another
def test_idle_causes_a_gap_paid_once_takes_its_untraced_rest_with_it(own_longest):
    # the 42 ms setup gap 7: 30 ms allocating, then 12 ms with nothing traced; 8 ms more untraced in other gaps
    d = replace(device(busy_pct=20.0, alloc=CauseTime(40 * MS, 5, long_ns=40 * MS),
                       host_untraced=CauseTime(20 * MS, 3, long_ns=20 * MS)),
                longest={"alloc": 30 * MS, "host_untraced": 12 * MS},
                longest_gap={"alloc": (7, {"alloc": 30 * MS, "host_untraced": 12 * MS}),
                             "host_untraced": (own_longest, {"host_untraced": 12 * MS})})
    got = idle_causes.findings({0: d}, prog())
    assert [(f.root_cause, f.time_at_stake_ns) for f in got] == [
        ("alloc-in-loop", 10 * MS), ("profiler-window-on-warmup", 42 * MS), ("gpu-bubbles", 8 * MS)]
    assert "30.000 ms in 1 gap, and 12.000 ms more in the same setup gap" in got[1].title
    assert [(f.root_cause, f.time_at_stake_ns) for f in idle_causes.findings({0: d}, prog(), in_loop=True)] == [
        ("alloc-in-loop", 40 * MS), ("gpu-bubbles", 20 * MS)]  # in the loop nothing is setup


def test_idle_causes_setup_says_no_rest_too_small_to_print():
    """mcts2048: the module load's gap had 0.2 us untraced beside it, once printed as '0.000 ms more in the same
    setup gap'; the time stays counted, the clause goes."""
    d = replace(device(busy_pct=20.0, jit=CauseTime(30 * MS, 1, long_ns=30 * MS),
                       host_untraced=CauseTime(200, 1, long_ns=200)),
                longest={"jit": 30 * MS, "host_untraced": 200},
                longest_gap={"jit": (7, {"jit": 30 * MS, "host_untraced": 200}),
                             "host_untraced": (7, {"host_untraced": 200})})
    [setup] = idle_causes.findings({0: d}, prog())
    assert setup.time_at_stake_ns == 30 * MS + 200
    assert "loading or compiling GPU code 30.000 ms in 1 gap), not in a loop" in setup.title


@pytest.mark.parametrize("in_loop, expected", [
    (False, [("gpu-bubbles", "medium", 5 * MS, [UNSEEN])]),  # the 20 ms before the device's first work is start-up
    (True, [("gpu-bubbles", "high", 25 * MS, [UNSEEN])]),  # in a steady window, the first step's own host time
])
def test_idle_causes_the_window_edges_are_no_bubbles_outside_the_loop(in_loop, expected):
    d = replace(device(host_untraced=CauseTime(25 * MS, 3, long_ns=25 * MS)),
                edges={"host_untraced": CauseTime(20 * MS, 1, long_ns=20 * MS)})
    assert found(d, in_loop=in_loop) == expected


def test_idle_causes_operators_without_launches_are_host_work():
    d = device(launch=CauseTime(2 * MS, 90), host_op=CauseTime(9 * MS, 4, long_ns=9 * MS))
    [f] = idle_causes.findings({0: d}, prog("pytorch"))
    assert (f.root_cause, f.time_at_stake_ns, f.tags) == ("cpu-bottleneck", 11 * MS, ["host-ops"])
    assert f.title.endswith("launching 2.000 ms, inside framework operators that launched no GPU work 9.000 ms")


@pytest.mark.parametrize("lost, demoted", [(LostKernels(10, 100), True), (LostKernels(9, 100), False),
                                           (LostKernels(0, 0), False)])
def test_idle_causes_idle_is_not_ranked_when_the_trace_lost_its_kernels(lost, demoted):
    d = device(sync=CauseTime(12 * MS, 5, api="cudaDeviceSynchronize", calls=5),
               host_untraced=CauseTime(30 * MS, 3, long_ns=30 * MS))
    got = idle_causes.findings({0: d}, prog(), seen=idle_causes.Seen(lost=lost))
    assert [f.severity for f in got] == (["info", "info"] if demoted else ["high", "high"])
    assert all(("not ranked: 10 of the 100 kernels" in f.title) == demoted for f in got)


@pytest.mark.parametrize("program, api_ns, tags, words", [
    # launch calls of 2 ms for 20 ms of kernels: a tenth, fast enough to pace the device in bursts
    ("pytorch", 2 * MS, ["launch"], "launching 10.000 ms"),
    ("cuda", 2 * MS, ["launch"], "launching 10.000 ms"),
    # 1 ms for 20 ms: they issue the work twenty times faster than it runs, so other host work keeps them late
    ("pytorch", MS, ["host-cpu"], "before late launches 10.000 ms (the launch calls take 1.000 ms for 20.000 ms"),
    ("cuda", MS, ["host-cpu"], "before late launches 10.000 ms (the launch calls take 1.000 ms for 20.000 ms"),
])
def test_idle_causes_the_launch_fix_only_where_the_launches_can_pace_the_device(program, api_ns, tags, words):
    """A CUDA graph or fused kernels (the launch fix) save launch calls: no help where they are not the bottleneck."""
    [f] = idle_causes.findings({0: device(launch=CauseTime(10 * MS, 500))}, prog(program),
                               seen=idle_causes.Seen(launches={0: (api_ns, 20 * MS)}))
    fix = book.get_entry(f.root_cause).fix_for(tuple(FIX_CHAINS[program]), f.tags)
    assert (f.root_cause, f.tags, words in f.title, "graph" in fix.text.lower()) == (
        "cpu-bottleneck", tags, True, tags == ["launch"])


def test_idle_causes_launches_count_each_launch_call_once():
    """Per device: a call launching two kernels (correlation 1) counts once; an untraced launch is left out, with its
    kernel; a kernel starting outside the window too. Figures by hand from the rows below."""
    def k(corr: int, start: int, end: int, launch: tuple[int, int] | None, dev: int = 0) -> dict:
        return {"device_id": dev, "pid": 1, "tid": 7, "correlation_id": corr, "start_ns": start, "end_ns": end,
                "short_name": "k", "name": "k", "category": "compute",
                **({"launch_start_ns": launch[0], "launch_end_ns": launch[1]} if launch else {})}
    con = make_model(kernels=[k(1, 100, 300, (10, 40)), k(1, 300, 350, (10, 40)), k(2, 400, 900, (350, 360)),
                              k(3, 950, 990, None), k(4, 2_000, 2_100, (1_900, 1_990)), k(5, 500, 600, (450, 470), 1)])
    scope = common.Scope(profile="t", start_ns=0, end_ns=1_000, duration_ns=1_000, devices=[0, 1],
                         window_basis="requested")
    assert launch_pace.launches(con, scope) == {0: (30 + 10, 200 + 50 + 500), 1: (20, 100)}


@pytest.mark.parametrize("calls, step_ns, fires", [
    (1, 40 * MS, False),  # one call in a window of 2.5 steps: paid once, as a sync at the loop's end
    (2, 40 * MS, True),  # two calls recur
    (1, 51 * MS, True),  # a window of less than two steps: the one call may be the step's own
    (1, 50 * MS, False),  # exactly two steps
    (1, None, True),  # no loop known: the trace cannot tell
])
def test_idle_causes_one_sync_in_a_window_of_several_steps_is_not_excessive(calls, step_ns, fires):
    d = device(sync=CauseTime(8 * MS, 7, api="cudaDeviceSynchronize", calls=calls))
    got = idle_causes.findings({0: d}, prog(), in_loop=True, step_ns=step_ns)
    assert [f.root_cause for f in got] == (["excessive-synchronization"] if fires else [])


@pytest.mark.parametrize("held_ns, words", [
    (0, "reads (cudaMemcpyAsync) that drained its queue: "),
    (9 * MS, "that drained its queue or waited for work it held (9.000 ms of it while the device waited on work the "
             "trace does not show"),
])
def test_idle_causes_reads_held_by_work_the_trace_does_not_show_say_so(held_ns, words):
    d = device(readback=CauseTime(12 * MS, 3, api="cudaMemcpyAsync", calls=3, held_ns=held_ns))
    [f] = idle_causes.findings({0: d}, prog())
    assert (f.root_cause, f.time_at_stake_ns, words in f.title + ": ") == ("blocking-d2h-sync", 12 * MS, True)


@pytest.mark.parametrize("sampled, demoted", [(SampledCalls(25, 100), True), (SampledCalls(24, 100), False),
                                              (SampledCalls(50, 99), False), (SampledCalls(0, 0), False)])
def test_idle_causes_idle_is_not_ranked_when_the_trace_holds_a_sample_of_the_calls(sampled, demoted):
    d = device(host_untraced=CauseTime(30 * MS, 3, long_ns=30 * MS))
    [f] = idle_causes.findings({0: d}, prog(), seen=idle_causes.Seen(sampled=sampled))
    assert (f.root_cause, f.severity) == ("gpu-bubbles", "info" if demoted else "high")
    assert ("not ranked: the trace holds a sample of the CUDA calls (25 of the window's 100" in f.title) == demoted


@pytest.mark.parametrize("step, share, sampled", [(50, 25, True), (49, 25, False), (50, 24, False)])
def test_trace_quality_a_trace_that_skips_correlation_ids_holds_a_sample_of_the_calls(step, share, sampled):
    """101 launch calls of one process, `share` of the 100 after the first following the one before by `step` ids
    (the others by 2: the driver call inside each): a filtered trace when a quarter skip 50 ids or more."""
    ids = [0]
    for i in range(100):
        ids.append(ids[-1] + (step if i < share else 2))
    con = make_model(cuda_api=[{"pid": 1, "tid": 7, "correlation_id": c, "name": "cudaLaunchKernel",
                                "kind": "launch", "start_ns": 1000 * i, "end_ns": 1000 * i + 500}
                               for i, c in enumerate(ids)])
    got = trace_quality.sampled_calls(con, 0, 10**9)
    assert got == (share if step >= 50 else 0, 100)
    assert got.significant == sampled


SAME = {0: SameSteps(steps=3, kernels=480)}


@pytest.mark.parametrize("tiny, launch, same, tagged", [
    (50 * MS, 0, SAME, True),  # the tiny kernels' launch gaps hold half the window: launches pace the step
    (50 * MS - 1, 0, SAME, False),  # a nanosecond less: not launch-paced, the generic fix stays
    (30 * MS, 20 * MS, SAME, True),  # launch gaps before bigger kernels count as launching too
    (90 * MS, 0, {}, False),  # launch-paced, but the steps do not all run the same kernels
    (90 * MS, 0, {1: SameSteps(3, 480)}, False),  # another device's steps repeat, not this one's
])
def test_idle_causes_graph_replay_needs_repeated_steps_paced_by_launches(tiny, launch, same, tagged):
    """small-kernel-overhead offers a CUDA graph first (tag same-steps) only where every step runs the same kernels
    (step_repeats) and launch gaps hold GRAPH_LAUNCH_SHARE of the window; the title says what shows it."""
    d = device(5.0, launch_tiny=CauseTime(tiny, 1_000), **({"launch": CauseTime(launch, 10)} if launch else {}))
    [small] = [f for f in idle_causes.findings({0: d}, prog("pytorch"), seen=idle_causes.Seen(same_steps=same))
               if f.root_cause == "small-kernel-overhead"]
    assert small.tags == (["same-steps"] if tagged else [])
    assert ("each of the 3 steps in the window launches the same 480 kernels" in small.title) == tagged
    fix = book.get_entry("small-kernel-overhead").fix_for(tuple(FIX_CHAINS["pytorch"]), small.tags).text
    assert ("torch.cuda.CUDAGraph" in fix) == tagged


@pytest.mark.parametrize("family, words", [("pytorch", "torch.cuda.graph(g)"), ("python", "end_capture()"),
                                           ("cuda", "cudaGraphLaunch"), ("generic", "CUDA graph")])
def test_idle_causes_graph_fix_per_family(family, words):
    fix = book.get_entry("small-kernel-overhead").fix_for((family, "generic"), ["same-steps"])
    assert fix.when == "same-steps" and words in fix.text


@pytest.mark.parametrize("held_ms, tagged", [(6, True), (5.999, False), (0, False)])
def test_idle_causes_reads_mostly_held_take_the_held_fix(held_ms, tagged):
    """blocking-d2h-sync is tagged held when half its idle or more waited on work the device held (attribution's held
    gaps): its PyTorch fix is then the asynchronous read, not the loss-accumulation advice."""
    d = device(readback=CauseTime(12 * MS, 3, api="cudaMemcpyAsync", calls=3, held_ns=int(held_ms * MS)))
    [f] = idle_causes.findings({0: d}, prog())
    assert f.tags == (["held"] if tagged else [])
    fix = book.get_entry("blocking-d2h-sync").fix_for(tuple(FIX_CHAINS["pytorch"]), f.tags).text
    assert ("queued behind something the trace does not show" in fix) == tagged
