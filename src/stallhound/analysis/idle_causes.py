"""Which root causes explain the devices' idle time? Every idle finding comes from here (tools agree): each root cause
claims its gap causes' idle time (attribution) on one device, and causes never share nanoseconds. A finding fires when
its claim is worth reporting (rules.MIN_STAKE_PCT) and its precondition holds: cpu-bottleneck's fix is about launching
only where launch calls can pace the device (PACING_RATIO); small-kernel-overhead offers a CUDA graph first where every
step runs the same kernels and launch gaps hold GRAPH_LAUNCH_SHARE of the window; dataloader-starvation needs evidence
of a loader (its ranges cover the gap, or OS waits in a program that shows one); excessive-synchronization needs
recurring calls; gc-pauses needs a Python program and periodic untraced gaps rarer than every step. Outside the loop's
steady state, the stretches before a device's first work and after its last are start-up and teardown, and an
allocation, code load or initialisation (a library's first use) paid once or twice is one-time setup
(profiler-window-on-warmup; the start-up of a program that repeats nothing: one_shot), never a bubble. gpu-bubbles takes
the gaps of 1 ms or more no cause explains and names what the launching process was inside meanwhile (idle_bubbles).
Idle findings are info where the window lost kernel records or sampled its calls (trace_quality). Blocking calls that
waited for work the device held say so (tag held)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import duckdb

from stallhound.analysis import (
    attribution,
    idle_bubbles,
    input_pipeline,
    launch_pace,
    program,
    python_work,
    rules,
    step_repeats,
    trace_quality,
)
from stallhound.analysis import idle_blocking as blocking
from stallhound.analysis.attribution import DeviceIdle
from stallhound.analysis.common import Finding, Scope, ScopedParams, counted, ms, pct, resolve_scope, shown
from stallhound.analysis.idle_bubbles import IN_BUBBLES, HostSeen
from stallhound.analysis.idle_seen import Seen
from stallhound.analysis.one_shot import ONE_SHOT, Fragment, OneShot, on_devices
from stallhound.analysis.program import Program
from stallhound.analysis.step_boundaries import durations, steady_median_ns
from stallhound.analysis.step_repeats import SameSteps
from stallhound.formats.remedy import remedy

STARVED_BUSY_PCT = 80.0  # book cpu-bottleneck: a device busy less than this over the window is starved
BUBBLES_PCT = 10.0  # book gpu-bubbles: unexplained idle above a tenth of the window is worth chasing
RECURRING_MIN_GAPS = 3  # outside a steady window, a cost paid three times or more recurs; once or twice is setup
ONCE_SHARE = 0.5  # ... and a gap holding half a recurring cost's time or more is that cost paid once (setup)
TINY_MIN_GAPS = 100  # launch gaps between tiny kernels: a pattern of many launches, not a handful
GRAPH_LAUNCH_SHARE = 0.5  # book small-kernel-overhead: launch gaps holding half the window or more pace the step, and
# when every step runs the same kernels (step_repeats) one graph replay per step removes them: offered first
JIT_FRAMEWORKS = {"Triton", "nvFuser", "XLA (JAX/TensorFlow)", "CuPy", "Numba"}  # compile kernels at run time
BLOCKING = {"sync", "sync_copy", "readback", "pageable_copy", "small_copy"}  # name a blocking call (count calls)
LOOP_STEPS = 2  # a window of two steps or more: a call seen once in it is not paid per step
GC_MIN_STEPS = 1.5  # a collection that idles a device for 1 ms is an older-generation pass, which fires on every
# 10th younger one at most (CPython's thresholds 700/10/10): every other step or rarer, never in every step
PACING_RATIO = 0.1  # book cpu-bottleneck: launch calls taking under a tenth of their kernels' time issue the work ten
# times faster than the device runs it, so they cannot pace it: what keeps launches late is other host work
INIT_DOING = "creating streams, events or contexts (a library's first use)"  # what the init cause is (attribution)
NOTHING_SEEN = Seen()  # a trace that shows nothing besides the attribution
HOST_WORK = {"host_cpu": "host-cpu", "host_op": "host-ops", "host_python": "host-python"}  # host causes: tags


@dataclass(frozen=True)
class Context:
    """What every claim is judged with besides its device: the program, whether the window lies inside its loop (a
    steady state), and what else the trace shows."""
    program: Program
    in_loop: bool = False
    seen: Seen = Seen()
    step_ns: int | None = None  # the loop's steady step, when known


@dataclass(frozen=True)
class Claim:
    """One root cause's share of a device's idle time. recurs: outside the loop, it fires only when seen in
    RECURRING_MIN_GAPS gaps or more; fewer are one-time setup (`doing` words it for the setup finding)."""
    root_cause: str
    causes: tuple[str, ...]
    applies: Callable[[DeviceIdle, Context], bool]
    title: Callable[[DeviceIdle, int, Context], str]
    tags: Callable[[DeviceIdle, Context], list[str]] = lambda d, c: []
    ns: Callable[[DeviceIdle, tuple[str, ...], Context], int] = lambda d, causes, c: d.ns(*causes)
    recurs: bool = False
    doing: str = ""


def _python(program: Program) -> bool:
    return "python" in program.fix_chain


def _jit_cause(program: Program) -> str:
    torch_compile = program.kind == "pytorch" and "Triton" in program.frameworks
    return "torch-compile-recompilation" if torch_compile else "module-loading-hot-path"


def _jit_tags(_: DeviceIdle, c: Context) -> list[str]:
    jit = JIT_FRAMEWORKS & set(c.program.frameworks) or any("driver API" in e for e in c.program.evidence)
    return ["jit" if jit else "module-load"]


def _periodic(d: DeviceIdle, causes: tuple[str, ...], _: Context | None = None) -> int:
    return sum(d.causes[c].periodic_ns for c in causes if c in d.causes)


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


def _gaps(d: DeviceIdle, *causes: str) -> int:
    return sum(d.causes[c].gaps for c in causes if c in d.causes)


def _calls(d: DeviceIdle, *causes: str) -> int:
    return sum(d.causes[c].calls for c in causes if c in d.causes)


def _recurring_syncs(d: DeviceIdle, c: Context) -> bool:
    """Synchronization recurs, as far as the trace shows: two calls or more, or one in a window not known to hold
    LOOP_STEPS of the loop's steps (it may be the step's own). One call in a window of several steps is paid once, as
    a sync at the loop's end is."""
    return (_calls(d, "sync", "sync_copy") >= 2 or c.step_ns is None
            or d.window_ns < LOOP_STEPS * c.step_ns)


def _paced(d: DeviceIdle, c: Context) -> bool:
    """Can the device's launch calls pace it: do they take PACING_RATIO of their kernels' time or more (unknown when
    its launches were not traced: they may)?"""
    api_ns, kernel_ns = c.seen.launches.get(d.device, (0, 0))
    return not kernel_ns or api_ns >= PACING_RATIO * kernel_ns


def _launching(d: DeviceIdle, c: Context) -> str:
    """The launch part, said as what it is: launching, or late launches (with why, where it is the largest part)."""
    if _paced(d, c):
        return f"launching {ms(d.ns('launch'))}"
    late = f"before late launches {ms(d.ns('launch'))}"
    if d.ns("launch") < d.ns(*HOST_WORK):
        return late
    api_ns, kernel_ns = c.seen.launches[d.device]
    return (f"{late} (the launch calls take {ms(api_ns)} for {ms(kernel_ns)} of kernels: other host work, not "
            "launching, keeps them late)")


def _graph_steps(d: DeviceIdle, c: Context) -> SameSteps | None:
    """The device's repeated steps when launch gaps hold GRAPH_LAUNCH_SHARE of the window: a graph replay fits."""
    launching = d.ns("launch_tiny", "launch") >= GRAPH_LAUNCH_SHARE * d.window_ns
    return c.seen.same_steps.get(d.device) if launching else None


def _tiny_title(d: DeviceIdle, ns: int, c: Context) -> str:
    same = _graph_steps(d, c)
    steps = (f"; each of the {same.steps} steps in the window launches the same {same.kernels:,} kernels in the same "
             "order, so one CUDA graph replay per step can replace them" if same else "")
    return (f"device {d.device} idles {ms(ns)} in {_gaps(d, 'launch_tiny'):,} gaps between tiny kernels, waiting for "
            f"their launches{steps}")


def _unseen_cpu(d: DeviceIdle, ns: int, c: Context) -> str:
    """Where most of the idle is CPU work the scheduler alone shows: its gaps, and that what it ran is unseen."""
    longest = f", the longest {ms(d.longest['host_cpu'])}" if d.longest.get("host_cpu") else ""
    return (f" in {counted(_gaps(d, 'host_cpu'), 'gap')}{longest}: the scheduler shows the launching thread on a CPU "
            "outside CUDA calls, but with no CPU samples the trace cannot say what it ran (capture with "
            f"{c.seen.unsampled})") if 2 * d.ns("host_cpu") >= ns and c.seen.unsampled else ""


def _host_title(d: DeviceIdle, ns: int, c: Context) -> str:
    ops = d.ns("host_op")
    parts = [_launching(d, c), *([f"CPU work {ms(d.ns('host_cpu'))}{_unseen_cpu(d, ns, c)}"]
                                 if shown(d.ns("host_cpu")) else []),
             *([f"inside framework operators that launched no GPU work {ms(ops)}"] if ops else [])]
    parts += [python_work.part(py, c.seen.python.get(d.device))] if (py := d.ns("host_python")) else []
    return f"device {d.device} (busy {d.busy_pct:.1f}%) idles {ms(ns)} waiting for the host: {', '.join(parts)}"


def _host_tag(d: DeviceIdle, c: Context) -> str:
    """What holds most of the host's time: launching (where its calls pace the device), CPU work, operators, Python."""
    if d.ns("launch") >= d.ns(*HOST_WORK):
        return "launch" if _paced(d, c) else "host-cpu"
    return HOST_WORK[max(HOST_WORK, key=lambda cause: (d.ns(cause), cause == "host_cpu"))]


def _host_tags(d: DeviceIdle, c: Context) -> list[str]:
    """_host_tag, and input-pipeline where the trace shows a data loader: only then is CPU work moved to its workers."""
    return [_host_tag(d, c), *(["input-pipeline"] if c.seen.loader else [])]


def _input_ns(d: DeviceIdle, _: tuple[str, ...], c: Context) -> int:
    """The loader's ranges always; the launching thread's OS waits only in a program with a data loader."""
    return d.ns("input_wait") + (d.ns("host_wait") if c.seen.loader else 0)


def _input_title(d: DeviceIdle, ns: int, c: Context) -> str:
    parts = [f"{ms(d.ns('input_wait'))} inside the data loader's ranges"] if d.ns("input_wait") else []
    if c.seen.loader and d.ns("host_wait"):
        parts.append(f"{ms(d.ns('host_wait'))} in OS waits")
    return (f"device {d.device} idles {ms(ns)} while its launching thread waits for input ({', '.join(parts)}; the "
            f"loader: {'; '.join(c.seen.loader) or 'its ranges'}): the next batch is late")


CLAIMS: tuple[Claim, ...] = (
    Claim("excessive-synchronization", ("sync", "sync_copy"), _recurring_syncs,
          lambda d, ns, c: f"device {d.device} idles {ms(ns)} in and right after {_calls(d, 'sync', 'sync_copy'):,} "
                           f"{blocking.api(d, 'sync' if 'sync' in d.causes else 'sync_copy')} calls "
                           f"{blocking.drained(d, 'sync_copy')}", blocking.sync_tags),
    Claim("blocking-d2h-sync", ("readback",), lambda d, c: True,
          lambda d, ns, c: f"device {d.device} idles {ms(ns)} in and after {_calls(d, 'readback'):,} small "
                           f"device-to-host reads ({blocking.api(d, 'readback')}) {blocking.drained(d, 'readback')}",
          blocking.held_tags),
    Claim("small-kernel-overhead", ("launch_tiny",), lambda d, c: _gaps(d, "launch_tiny") >= TINY_MIN_GAPS,
          _tiny_title, lambda d, c: ["same-steps"] if _graph_steps(d, c) else []),
    Claim("alloc-in-loop", ("alloc",), lambda d, c: True,
          lambda d, ns, c: f"device {d.device} idles {ms(ns)} in and right after the host's allocation or free "
                           f"calls of device or pinned memory ({counted(_gaps(d, 'alloc'), 'gap')})", recurs=True,
          doing="allocating or freeing device or pinned memory"),
    Claim("module-loading-hot-path", ("jit",), lambda d, c: True,
          lambda d, ns, c: f"device {d.device} idles {ms(ns)} while the host loads or compiles GPU code "
                           f"(inside {counted(_gaps(d, 'jit'), 'gap')})", _jit_tags, recurs=True,
          doing="loading or compiling GPU code"),
    Claim("profiler-overhead", ("profiler",), lambda d, c: True,
          lambda d, ns, c: f"device {d.device} idles {ms(ns)} while the profiler flushes its buffers in the launching "
                           f"process (inside {counted(_gaps(d, 'profiler'), 'gap')}): the capture's overhead, not "
                           "the program's"),
    Claim("gc-pauses", ("host_untraced", "host_cpu"), lambda d, c: _python(c.program),
          lambda d, ns, c: f"device {d.device}: periodic idle gaps ({ms(ns)}) with the host outside CUDA calls: "
                           "garbage-collection-like pauses", ns=_periodic),
    Claim("cpu-bottleneck", ("launch", *HOST_WORK), lambda d, c: d.busy_pct < STARVED_BUSY_PCT,
          _host_title, _host_tags),
    Claim("host-communication", ("host_comm",), lambda d, c: True,
          lambda d, ns, c: f"device {d.device} idles {ms(ns)} while its launching thread communicates "
                           f"({_gaps(d, 'host_comm')} gaps inside MPI or other communication ranges)"),
    Claim("dataloader-starvation", ("input_wait", "host_wait"), lambda d, c: True, _input_title, ns=_input_ns),
)


def step_ns(con: duckdb.DuckDBPyConnection, profile: str, device: int | None) -> int | None:
    """The loop's steady step over the capture (iterations' steady median), None when no loop is found."""
    steady = steady_median_ns(durations(con, resolve_scope(con, ScopedParams(profile=profile, device=device))))
    return None if steady is None else int(steady)


def findings(idle: dict[int, DeviceIdle], program: Program, in_loop: bool = False,
             step_ns: int | None = None, seen: Seen = NOTHING_SEEN) -> list[Finding]:
    """All idle findings, per device, in CLAIMS order; then one-time setup, and gpu-bubbles for what stays
    unexplained. in_loop: the window lies inside the program's loop (a steady state), so even a one-off cost recurs
    per run of it; outside it, the stretches before a device's first work and after its last are start-up and
    teardown, no cause's at all. step_ns: the loop's steady step, when known (iterations), so that a gap recurring
    every step is not taken for a collection pause. seen: the data loader, and the kernel records the window lost
    (then every idle finding is demoted: part of the idle time ran kernels the trace does not show)."""
    context = Context(program, in_loop, seen, step_ns)
    out: list[Finding] = []
    for d in (_off_step(d if in_loop else d.without_edges(), step_ns) for d in idle.values()):
        d, setup, rest = _one_time(d, in_loop)
        found, fired = _claimed(d, context)
        found += _setup(d, setup, *rest, seen.one_shot.get(d.device)) + _bubbles(d, fired, context)
        missing = trace_quality.missing_work(seen.lost, seen.sampled)
        out += [trace_quality.not_ranked(f, seen.lost, seen.sampled) for f in found] if missing else found
    return out


SetupCost = tuple[str, str, int, int]  # a one-time cost: (cause, what the host was doing, ns, gaps)
ONE_TIME = (*((c.causes[0], c.doing) for c in CLAIMS if c.recurs), ("init", INIT_DOING))  # (cause, doing)


def _one_time(d: DeviceIdle, in_loop: bool) -> tuple[DeviceIdle, list[SetupCost], tuple[int, int]]:
    """Outside the loop, the one-time part of each ONE_TIME cause taken out of d: all of it when seen in
    fewer than RECURRING_MIN_GAPS gaps, else its longest gap when that one holds ONCE_SHARE of its time (a cost paid
    once, and the rest recurring); and, returned apart, the rest of each such longest gap (attribution.rest_of_gaps)
    and how many gaps it lies in."""
    if in_loop:
        return d, [], (0, 0)
    causes, setup, took = dict(d.causes), [], {}  # took: cause -> the longest gap its setup took
    for cause, doing in ONE_TIME:
        if cause not in causes:
            continue
        t, longest = causes[cause], d.longest.get(cause, 0)
        ns, gaps = ((t.ns, t.gaps) if t.gaps < RECURRING_MIN_GAPS else
                    (longest, 1) if longest >= ONCE_SHARE * t.ns else (0, 0))
        if ns:
            setup.append((cause, doing, ns, gaps))
            causes[cause] = replace(t, ns=t.ns - ns, gaps=t.gaps - gaps, long_ns=max(0, t.long_ns - ns))
            took.update({cause: d.longest_gap[cause][0]} if cause in d.longest_gap else {})
    rests = []
    for gap_id in sorted(set(took.values())):  # gap by gap, to say in how many the rest lies
        causes, rest = attribution.rest_of_gaps(d, causes, {c: g for c, g in took.items() if g == gap_id})
        rests += [rest] if rest else []
    return replace(d, causes={c: t for c, t in causes.items() if t.ns > 0}), setup, (sum(rests), len(rests))


def _claimed(d: DeviceIdle, c: Context) -> tuple[list[Finding], set[str]]:
    """The claims' findings on a device, and the root causes that fired."""
    out: list[Finding] = []
    fired: set[str] = set()
    for claim in CLAIMS:
        root = _jit_cause(c.program) if claim.root_cause == "module-loading-hot-path" else claim.root_cause
        ns = (_cpu_ns(d, claim.causes, "gc-pauses" in fired) if claim.root_cause == "cpu-bottleneck"
              else claim.ns(d, claim.causes, c))
        recurs = not claim.recurs or c.in_loop or _gaps(d, *claim.causes) >= RECURRING_MIN_GAPS
        if not (recurs and rules.worth_reporting(ns, d.window_ns) and claim.applies(d, c)):
            continue
        fired.add(claim.root_cause)
        out.append(_finding(d, root, ns, claim.title(d, ns, c), claim.tags(d, c), {
            "gaps": _gaps(d, *claim.causes), **({"paid_once": True} if "jit" in claim.causes and not c.in_loop else {}),
            **({"calls": _calls(d, *claim.causes)} if BLOCKING & set(claim.causes) else {})}))
    return out, fired


def _setup(d: DeviceIdle, setup: list[SetupCost], rest_ns: int, rest_gaps: int,
           once: OneShot | Fragment | None) -> list[Finding]:
    """One-time costs the attribution names (allocation, loading or compiling code, paid once outside the loop), with
    the rest of a gap paid once (rest_ns): the window holds setup, or where nothing repeats (once) start-up, or in a
    capture that began mid-run (a Fragment) setup that is no start-up."""
    ns = sum(n for _, _, n, _ in setup) + (rest_ns if setup else 0)
    if not rules.worth_reporting(ns, d.window_ns):
        return []
    parts = ", ".join(f"{doing} {ms(n)} in {counted(gaps, 'gap')}" for _, doing, n, gaps in setup)
    where = "those setup gaps" if rest_gaps > 1 else "the same setup gap"
    parts += f", and {ms(rest_ns)} more in {where}" if shown(rest_ns) else ""
    title = (f"device {d.device} idles {ms(ns)} in one-time setup inside the window (the host {parts})" +
             (f"; {once.words()}" if once else ", not in a loop: a window over the steady state leaves it out"))
    loading = sum(n for cause, _, n, _ in setup if cause == "jit")
    one_shot = [ONE_SHOT] if isinstance(once, OneShot) else []
    return [_finding(d, "profiler-window-on-warmup", ns, title, ["setup", *one_shot],
                     {"gaps": sum(g for _, _, _, g in setup), "loading_ns": loading, "paid_once": True})]


def _bubbles(d: DeviceIdle, fired: set[str], c: Context) -> list[Finding]:
    """The long gaps no cause explains: nothing traced on the host, or waits on other work (queued), or OS waits of
    the launching thread in a program with no data loader (on what, the trace does not say), or initialisation that
    recurs (no finding claims it)."""
    causes = IN_BUBBLES if c.seen.loader else (*IN_BUBBLES, "host_wait")
    long = {cause: d.causes[cause].long_ns for cause in causes if cause in d.causes}
    ns = sum(long.values())
    if "gc-pauses" in fired:
        ns -= _periodic(d, ("host_untraced",))
    worth_chasing = d.busy_pct < STARVED_BUSY_PCT or pct(ns, d.window_ns) >= BUBBLES_PCT
    if not (rules.worth_reporting(ns, d.window_ns) and worth_chasing):
        return []
    seen, evidence, tags = idle_bubbles.words(ns, long.get("host_wait", 0), long.get("queued", 0), c.seen.host.get(
        (d.device, c.in_loop), HostSeen()), d.causes.get(attribution.CALL_STALL))
    title = (f"device {d.device} (busy {d.busy_pct:.1f}%) idles {ms(ns)} in gaps of 1 ms or more that the idle "
             f"attribution cannot explain ({seen})")
    return [_finding(d, "gpu-bubbles", ns, title, tags, {"device_idle_ns": d.idle_ns, **evidence})]


def _finding(d: DeviceIdle, root: str, ns: int, title: str, tags: list[str], extra: dict) -> Finding:
    return Finding(root_cause=root, severity=rules.severity(ns, d.window_ns, extra.get("paid_once", False)),
                   title=title, evidence={"window_pct": pct(ns, d.window_ns), "device_busy_pct": d.busy_pct, **extra},
                   time_at_stake_ns=ns, device=d.device, tags=tags)


@dataclass(frozen=True)
class IdleBasis:
    """What a window's idle findings follow from: its idle attribution per device, the program, the loop's step
    (None: not used), what else the trace shows. A tool that lists idle findings keeps it in its Result for its
    findings(result)."""
    devices: dict[int, DeviceIdle]
    program: Program
    step_ns: int | None = None
    seen: Seen = Seen()

    def findings(self, in_loop: bool = False) -> list[Finding]:
        return findings(self.devices, self.program, in_loop, self.step_ns, self.seen)

    def shown(self, causes: set[str]) -> list[Finding]:
        """The findings with these root causes: what a tool showing one part of the idle time (sync, launches,
        host threads) lists, from the one attribution and rule set triage ranks."""
        return [f for f in self.findings() if f.root_cause in causes]


def basis(con: duckdb.DuckDBPyConnection, scope: Scope, step_ns: int | None = None) -> IdleBasis:
    """The idle basis of a window (no device in scope: nothing idles)."""
    attr = attribution.attribute(con, scope) if scope.devices else None
    idle = attr.devices if attr else {}
    tiny = any(_gaps(d, "launch_tiny") >= TINY_MIN_GAPS for d in idle.values())
    found = program.detect(con)
    unsampled = (remedy(con, ("python_samples",) if _python(found) else ("cpu_samples",))
                 if rules.missing(con, ("cpu_samples",)) else None)
    seen = Seen(input_pipeline.evidence(con), trace_quality.lost_kernels(con, scope.start_ns, scope.end_ns),
                trace_quality.sampled_calls(con, scope.start_ns, scope.end_ns),
                launch_pace.launches(con, scope) if scope.devices else {},
                step_repeats.same_steps(con, scope) if tiny else {},
                idle_bubbles.host_seen(con, scope, attr) if attr else {}, unsampled, on_devices(con, scope),
                python_work.where(con, attr) if attr else {})
    return IdleBasis(idle, found, step_ns, seen)
