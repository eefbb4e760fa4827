"""Which root causes explain the devices' idle time? Findings built from the idle attribution.

Every idle finding comes from here, whichever tool shows it (gpu_idle_gaps shows them all, sync_analysis
and kernel_launch_overhead the ones they measure), so the figures always agree. Each root cause claims the
idle time of its gap causes (analysis/attribution.py) on one device; causes never share nanoseconds, so
findings never count the same nanoseconds twice and a device's findings never exceed its idle time. A finding
fires only when its claim is worth reporting (rules.MIN_STAKE_PCT of the window) and its own precondition
holds; gpu-bubbles takes what stays unexplained in gaps of 1 ms or more. gc-pauses (book gc-pauses) needs a
Python program and periodic gaps of 1 ms or more in which the host did nothing traced (no blocking call, copy or
launch), recurring less often than every step when the loop's step is known: a gap in every step is the step's
own work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import duckdb

from stallhound.analysis import attribution, program, rules
from stallhound.analysis.attribution import DeviceIdle
from stallhound.analysis.common import Finding, Scope, ScopedParams, counted, ms, pct, resolve_scope
from stallhound.analysis.program import Program
from stallhound.analysis.step_boundaries import durations, steady_median_ns

STARVED_BUSY_PCT = 80.0  # book cpu-bottleneck: a device busy less than this over the window is starved
BUBBLES_PCT = 10.0  # book gpu-bubbles: unexplained idle above a tenth of the window is worth chasing
RECURRING_MIN_GAPS = 3  # outside a steady window, a cost paid three times or more recurs; once or twice is setup
TINY_MIN_GAPS = 100  # launch gaps between tiny kernels: a pattern of many launches, not a handful
INPUT_PIPELINE = "PyTorch DataLoader"  # the NVTX family (analysis/nvtx_texts.py) that shows an input pipeline
JIT_FRAMEWORKS = {"Triton", "nvFuser", "XLA (JAX/TensorFlow)", "CuPy", "Numba"}  # compile kernels at run time
BLOCKING = {"sync", "sync_copy", "readback", "pageable_copy"}  # causes that name a blocking call (they count calls)
UNEXPLAINED = ("host_untraced", "queued")  # causes no specific finding claims (pageable_copy: memory_transfers')
GC_MIN_STEPS = 1.5  # a collection that idles a device for 1 ms is an older-generation pass, which fires on every
# 10th younger one at most (CPython's thresholds 700/10/10): every other step or rarer, never in every step


@dataclass(frozen=True)
class Claim:
    """One root cause's share of a device's idle time."""
    root_cause: str
    causes: tuple[str, ...]
    applies: Callable[[DeviceIdle, Program, bool], bool]  # (device, program, window is inside the loop)
    title: Callable[[DeviceIdle, int], str]
    tags: Callable[[DeviceIdle, Program], list[str]] = lambda d, p: []
    ns: Callable[[DeviceIdle, tuple[str, ...]], int] = lambda d, causes: d.ns(*causes)


def _python(program: Program) -> bool:
    return "python" in program.fix_chain


def _sync_tags(d: DeviceIdle, _: Program) -> list[str]:
    if d.ns("sync_copy") > d.ns("sync"):
        return ["sync-copy"]
    scope = rules.sync_scope(d.causes["sync"].api) if "sync" in d.causes else "other"
    return [] if scope == "other" else [f"{scope}-sync"]


def _jit_cause(program: Program) -> str:
    torch_compile = program.kind == "pytorch" and "Triton" in program.frameworks
    return "torch-compile-recompilation" if torch_compile else "module-loading-hot-path"


def _jit_tags(_: DeviceIdle, program: Program) -> list[str]:
    jit = JIT_FRAMEWORKS & set(program.frameworks) or any("driver API" in e for e in program.evidence)
    return ["jit" if jit else "module-load"]


def _cpu_tags(d: DeviceIdle, program: Program) -> list[str]:
    """launch or host-cpu, whichever took more; and input-pipeline when the program shows one (its loader's NVTX
    ranges), so that only a program with an input pipeline is told to move work into it."""
    pipeline = ["input-pipeline"] if INPUT_PIPELINE in program.frameworks else []
    return ["launch" if d.ns("launch") >= d.ns("host_cpu") else "host-cpu", *pipeline]


def _periodic(d: DeviceIdle, causes: tuple[str, ...]) -> int:
    return sum(d.causes[c].periodic_ns for c in causes if c in d.causes)


def _gc_applies(d: DeviceIdle, program: Program, _: bool) -> bool:
    return _python(program)


def _off_step(d: DeviceIdle, step_ns: int | None) -> DeviceIdle:
    """d without the periodic host gaps that recur once or more per step (period under GC_MIN_STEPS steps):
    those sit at a fixed place in the step, the step's own work, and no collection pause can claim them."""
    if step_ns is None:
        return d
    causes = {c: t if t.period_ns is None or t.period_ns >= GC_MIN_STEPS * step_ns
              else replace(t, periodic_ns=0, periodic_gaps=0, period_ns=None) for c, t in d.causes.items()}
    return replace(d, causes=causes)


def _cpu_ns(d: DeviceIdle, causes: tuple[str, ...], gc_claimed: bool) -> int:
    return d.ns(*causes) - (_periodic(d, ("host_cpu",)) if gc_claimed else 0)


def _api(d: DeviceIdle, cause: str) -> str:
    return (d.causes[cause].api if cause in d.causes else None) or "blocking"


def _gaps(d: DeviceIdle, *causes: str) -> int:
    return sum(d.causes[c].gaps for c in causes if c in d.causes)


def _calls(d: DeviceIdle, *causes: str) -> int:
    return sum(d.causes[c].calls for c in causes if c in d.causes)


CLAIMS: tuple[Claim, ...] = (
    Claim("excessive-synchronization", ("sync", "sync_copy"), lambda d, p, loop: True,
          lambda d, ns: f"device {d.device} idles {ms(ns)} in and right after {_calls(d, 'sync', 'sync_copy'):,} "
                        f"{_api(d, 'sync' if 'sync' in d.causes else 'sync_copy')} calls that drained its queue",
          _sync_tags),
    Claim("blocking-d2h-sync", ("readback",), lambda d, p, loop: True,
          lambda d, ns: f"device {d.device} idles {ms(ns)} after {_calls(d, 'readback'):,} small device-to-host "
                        f"reads ({_api(d, 'readback')}) drained its queue"),
    Claim("small-kernel-overhead", ("launch_tiny",), lambda d, p, loop: _gaps(d, "launch_tiny") >= TINY_MIN_GAPS,
          lambda d, ns: f"device {d.device} idles {ms(ns)} in {_gaps(d, 'launch_tiny'):,} gaps between tiny "
                        "kernels, waiting for their launches"),
    Claim("alloc-in-loop", ("alloc",), lambda d, p, loop: _gaps(d, "alloc") >= RECURRING_MIN_GAPS,
          lambda d, ns: f"device {d.device} idles {ms(ns)} while the host allocates or frees device memory "
                        f"({_gaps(d, 'alloc')} gaps)"),
    Claim("module-loading-hot-path", ("jit",), lambda d, p, loop: True,
          lambda d, ns: f"device {d.device} idles {ms(ns)} while the host loads or compiles GPU code "
                        f"(inside {counted(_gaps(d, 'jit'), 'gap')})", _jit_tags),
    Claim("profiler-overhead", ("profiler",), lambda d, p, loop: True,
          lambda d, ns: f"device {d.device} idles {ms(ns)} while the profiler flushes its buffers in the launching "
                        f"process (inside {counted(_gaps(d, 'profiler'), 'gap')}): the capture's overhead, not the "
                        "program's"),
    Claim("gc-pauses", ("host_untraced", "host_cpu"), _gc_applies,
          lambda d, ns: f"device {d.device}: periodic idle gaps ({ms(ns)}) with the host outside CUDA calls: "
                        "garbage-collection-like pauses", ns=_periodic),
    Claim("cpu-bottleneck", ("launch", "host_cpu"), lambda d, p, loop: d.busy_pct < STARVED_BUSY_PCT,
          lambda d, ns: f"device {d.device} (busy {d.busy_pct:.1f}%) idles {ms(ns)} waiting for the host: "
                        f"launching {ms(d.ns('launch'))}, CPU work {ms(d.ns('host_cpu'))}",
          _cpu_tags),
    Claim("host-communication", ("host_comm",), lambda d, p, loop: True,
          lambda d, ns: f"device {d.device} idles {ms(ns)} while its launching thread communicates "
                        f"({_gaps(d, 'host_comm')} gaps inside MPI or other communication ranges)"),
    Claim("dataloader-starvation", ("host_wait",), lambda d, p, loop: True,
          lambda d, ns: f"device {d.device} idles {ms(ns)} while its launching thread waits for input (OS "
                        "waits, data-loading ranges): the next batch or another thread is late"),
)


def step_ns(con: duckdb.DuckDBPyConnection, profile: str, device: int | None) -> int | None:
    """The loop's steady step over the capture (iterations' steady median), None when no loop is found."""
    steady = steady_median_ns(durations(con, resolve_scope(con, ScopedParams(profile=profile, device=device))))
    return None if steady is None else int(steady)


def findings(idle: dict[int, DeviceIdle], program: Program, in_loop: bool = False,
             step_ns: int | None = None) -> list[Finding]:
    """All idle findings, per device, in CLAIMS order; then gpu-bubbles for what stays unexplained. in_loop: the
    window lies inside the program's loop (a steady state), so even a one-off cost recurs per run of it. step_ns:
    the loop's steady step, when known (iterations), so that a gap recurring every step is not taken for a
    collection pause."""
    out: list[Finding] = []
    for d in (_off_step(d, step_ns) for d in idle.values()):
        fired: set[str] = set()
        for claim in CLAIMS:
            root = _jit_cause(program) if claim.root_cause == "module-loading-hot-path" else claim.root_cause
            ns = (_cpu_ns(d, claim.causes, "gc-pauses" in fired) if claim.root_cause == "cpu-bottleneck"
                  else claim.ns(d, claim.causes))
            if not rules.worth_reporting(ns, d.window_ns) or not claim.applies(d, program, in_loop):
                continue
            fired.add(claim.root_cause)
            out.append(_finding(d, root, ns, claim.title(d, ns), claim.tags(d, program),
                                {"gaps": _gaps(d, *claim.causes),
                                 **({"calls": _calls(d, *claim.causes)} if BLOCKING & set(claim.causes) else {})}))
        out.extend(_bubbles(d, fired))
    return out


def _bubbles(d: DeviceIdle, fired: set[str]) -> list[Finding]:
    claimed = {c for claim in CLAIMS if claim.root_cause in fired and claim.ns is not _periodic for c in claim.causes}
    mapped = [c for claim in CLAIMS for c in claim.causes]
    causes = tuple(c for c in dict.fromkeys((*UNEXPLAINED, *mapped)) if c not in claimed)
    ns = sum(d.causes[c].long_ns for c in causes if c in d.causes)
    if "gc-pauses" in fired:
        ns -= _periodic(d, tuple(c for c in causes if c in ("host_untraced", "host_cpu")))
    worth_chasing = d.busy_pct < STARVED_BUSY_PCT or pct(ns, d.window_ns) >= BUBBLES_PCT
    if not (rules.worth_reporting(ns, d.window_ns) and worth_chasing):
        return []
    title = (f"device {d.device} (busy {d.busy_pct:.1f}%) idles {ms(ns)} in gaps of 1 ms or more that the trace "
             "cannot explain (no blocking call, launch, load or wait seen on the host)")
    return [_finding(d, "gpu-bubbles", ns, title, [], {"device_idle_ns": d.idle_ns})]


def _finding(d: DeviceIdle, root: str, ns: int, title: str, tags: list[str], extra: dict) -> Finding:
    return Finding(root_cause=root, severity=rules.severity(ns, d.window_ns), title=title,
                   evidence={"window_pct": pct(ns, d.window_ns), "device_busy_pct": d.busy_pct, **extra},
                   time_at_stake_ns=ns, device=d.device, tags=tags)


@dataclass(frozen=True)
class IdleBasis:
    """What a window's idle findings follow from: its idle attribution per device, the program, the loop's step
    (None: not used). A tool that lists idle findings keeps it in its Result for its findings(result)."""
    devices: dict[int, DeviceIdle]
    program: Program
    step_ns: int | None = None

    def findings(self, in_loop: bool = False) -> list[Finding]:
        return findings(self.devices, self.program, in_loop, self.step_ns)

    def shown(self, causes: set[str]) -> list[Finding]:
        """The findings with these root causes: what a tool showing one part of the idle time (sync, launches,
        host threads) lists, from the one attribution and rule set triage ranks."""
        return [f for f in self.findings() if f.root_cause in causes]


def basis(con: duckdb.DuckDBPyConnection, scope: Scope, step_ns: int | None = None) -> IdleBasis:
    """The idle basis of a window (no device in scope: nothing idles)."""
    idle = attribution.attribute(con, scope).devices if scope.devices else {}
    return IdleBasis(idle, program.detect(con), step_ns)
