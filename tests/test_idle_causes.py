"""idle_causes: which root cause claims which idle time, under which precondition; claims never overlap."""

from __future__ import annotations

import pytest

from stallhound import book
from stallhound.analysis import idle_causes
from stallhound.analysis.attribution import CauseTime, DeviceIdle
from stallhound.analysis.program import FIX_CHAINS, Program

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
    ({"sync": CauseTime(5 * MS, 40, api="cudaDeviceSynchronize")},
     [("excessive-synchronization", "medium", 5 * MS, ["device-sync"])]),
    ({"sync": CauseTime(MS // 2, 4, api="cudaDeviceSynchronize")}, []),  # half a percent of the window
    ({"sync": CauseTime(MS, 9, api="cudaStreamSynchronize"), "sync_copy": CauseTime(2 * MS, 9)},
     [("excessive-synchronization", "medium", 3 * MS, ["sync-copy"])]),
    ({"readback": CauseTime(12 * MS, 30, api="cudaStreamSynchronize")},
     [("blocking-d2h-sync", "high", 12 * MS, [])]),
    ({"launch_tiny": CauseTime(20 * MS, 99)}, []),  # fewer than TINY_MIN_GAPS launches
    ({"launch_tiny": CauseTime(20 * MS, 100)}, [("small-kernel-overhead", "high", 20 * MS, [])]),
    ({"alloc": CauseTime(5 * MS, 2)}, []),  # twice is setup
    ({"alloc": CauseTime(5 * MS, 3)}, [("alloc-in-loop", "medium", 5 * MS, [])]),
    ({"host_comm": CauseTime(30 * MS, 4)}, [("host-communication", "high", 30 * MS, [])]),
    ({"host_wait": CauseTime(8 * MS, 4)}, [("dataloader-starvation", "medium", 8 * MS, [])]),
    ({"jit": CauseTime(40 * MS, 3)}, [("module-loading-hot-path", "high", 40 * MS, ["module-load"])]),
    ({"jit": CauseTime(MS // 2, 3)}, []),  # half a percent of the window
    ({"profiler": CauseTime(6 * MS, 1)}, [("profiler-overhead", "medium", 6 * MS, [])]),
])
def test_idle_causes_each_cause_claims_its_idle(causes, expected):
    assert found(device(**causes)) == expected


@pytest.mark.parametrize("in_loop", [True, False])
def test_idle_causes_a_single_compile_inside_the_window_is_a_finding(in_loop):
    """One compile in a steady-state window happened between steps (a recompilation); in a window that may hold
    the setup it is the program's first-use cost, which the window measures all the same (a test or benchmark that
    compiles for 313 ms around a few ms of GPU work is slow because of it)."""
    expected = [("module-loading-hot-path", "high", 40 * MS, ["module-load"])]
    assert found(device(jit=CauseTime(40 * MS, 1)), in_loop=in_loop) == expected


@pytest.mark.parametrize("busy, launch, cpu, expected", [
    (50.0, 10 * MS, 2 * MS, [("cpu-bottleneck", "high", 12 * MS, ["launch"])]),
    (50.0, MS, 6 * MS, [("cpu-bottleneck", "medium", 7 * MS, ["host-cpu"])]),
    (85.0, 10 * MS, 2 * MS, []),  # the device is busy 85%: not starved, the host is not its bottleneck
])
def test_idle_causes_cpu_bottleneck_needs_a_starved_device(busy, launch, cpu, expected):
    d = device(busy, launch=CauseTime(launch, 500), host_cpu=CauseTime(cpu, 3, long_ns=cpu))
    assert found(d) == expected


@pytest.mark.parametrize("frameworks, tags, dataloader", [
    (("PyTorch (ATen)",), ["host-cpu"], False),  # a benchmark or test with no input pipeline: no DataLoader advice
    (("PyTorch (ATen)", "PyTorch DataLoader"), ["host-cpu", "input-pipeline"], True),  # its loader's ranges show one
])
def test_idle_causes_cpu_bottleneck_fix_fits_the_programs_input_pipeline(frameworks, tags, dataloader):
    [f] = idle_causes.findings({0: device(50.0, host_cpu=CauseTime(20 * MS, 3, long_ns=20 * MS))},
                               prog("pytorch", frameworks))
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
    assert in_python == [("gc-pauses", "high", 24 * MS, []), ("gpu-bubbles", "medium", 6 * MS, [])]
    assert found(device(host_untraced=pauses), prog("cuda")) == [("gpu-bubbles", "high", 30 * MS, [])]


@pytest.mark.parametrize("busy, long_ns, expected", [
    (50.0, 20 * MS, [("gpu-bubbles", "high", 20 * MS, [])]),
    (85.0, 5 * MS, []),  # a busy device with a little unexplained idle: not worth chasing
    (85.0, 12 * MS, [("gpu-bubbles", "high", 12 * MS, [])]),  # ... unless it passes a tenth of the window
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
