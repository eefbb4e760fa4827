"""Why is each device idle? Every idle nanosecond of a device in the window, attributed to one cause.

A device's idle time is the window minus the union of its kernels, copies, memsets and whole CUDA graph
executions (as intervals.GPU_WORK),
cut into gaps (the stretches before its first and after its last operation in the window included). Each
gap gets one cause, or two for a late resume after a blocking call (below), so causes never share
nanoseconds and their sum is the device's idle time:

- queued: the operation after the gap had been launched before the gap began (its launch call returned
  first), or is a unified-memory migration the driver issued (rules.DRIVER_MIGRATION_SQL): the device waited on
  something other than the host (an event, another stream or device, the driver).
- sync / readback / pageable_copy / small_copy / sync_copy: the host was inside a blocking call when the device ran
  dry, so nothing more was queued: a synchronize call; a device-to-host copy, or a synchronize right after one
  (the .item() pattern); a copy from pageable host memory large enough to pay for its staging
  (rules.PAGEABLE_STAGED_BYTES), or a synchronize right after one; a smaller one (it costs its latency, which pinning
  does not shorten: no idle finding claims it, memory_transfers' small uploads may), or a synchronize right after
  one; another synchronous copy (a device-to-host read is one of rules.SMALL_READ_BYTES or less). The call keeps the
  idle inside it, and of the host's turnaround after it returned only what the call made idle: with the call gone, the
  host's work after it would have run while the device ran the work the call waited for, and no longer: past that the
  device would idle anyway with the host late. That work runs from the call's start to the gap, less the idle of the
  device's gaps in it that were not queued (counted from the run's start: never more than the work); a run of work the
  device began inside the call counts from there, but only when the host began to launch that work after the call
  began (work asked for before the call, such as a tiny kernel it then waits on, is the call's to wait for even when
  the device first idled before it), and a gap whose launch or copy call was already under way (a synchronous copy's
  own latency) does not end the run (gap_pass's run_from_ns, run_launch_ns, run_idle_ns; or, when closer, its
  busy_from_ns). So the turnaround runs up to SYNC_RESUME_MAX_NS after the return, or until the thread is seen doing
  its own work: an OS call (printing, I/O) or an activity claimed for its own time (below), and never longer than that
  work; a call thus claims at most its own time. Not so a copy from host memory (pageable_copy, small_copy): it waits
  on no earlier work, it is the work, and its turnaround, the cost of issuing such copies one by one, stays its own
  (short_gaps.UNCAPPED). What lies past that is the late resume (late_ns), judged by what the host did in the gap like
  a gap without a blocking call (sync, launch, host_cpu, host_untraced). A synchronize call covering most of a longer
  gap also counts as sync (the host waited on other work meanwhile). Each blocking cause counts the distinct calls
  whose gaps it holds (calls).
  A gap of HELD_MIN_NS or more that a blocking copy call (on any thread) spans to its end, for most of it, is held
  by the copy, before every rule here, queued included: the copy's transfer ran on the gap's device only after the
  gap, and the work after the gap was launched before the call began (or by no traced call), so the device waited
  on work the trace does not show (an event of another stream, another process or rank) while the host waited in
  the copy for it (held_ns, Gap.held). A synchronize call names no device and moves nothing: a queued gap inside
  one stays queued.
  A gap of HELD_MIN_NS or more that ends inside a blocking copy call its thread began in it, whose transfer starts
  the device's work after the gap, gives the time from the call's start to the gap's end to that copy's cause
  (lead_ns, Gap.lead_cause), out of the rest of the gap (its late resume, or a gap judged by what the host did): the
  device idled while the host staged a pageable copy or waited out a synchronous copy's latency, not while it did its
  own work. Where the host sits in that call STALL_MIN_NS or more past its transfer's time (the most its staging
  takes), the excess is call_stall (stall_ns): the call launched and moved nothing then, what held it (the driver's
  work at a first use, faults on untouched memory, a lock) the trace cannot show; and the gap's time before the call
  is judged by what the host did there, not by the call's.
  A short gap that starts in a blocking call's wake (after it returned, until the thread's first kernel launch
  after it has returned) is the call's too, for its turnaround as above: the call left the queue empty, so that
  launch's latency is exposed however fast the host launches (attribution_sql.CALLS_SQL). A short gap held by a call
  that allocates nothing, in which the thread then calls an allocation call, is cut: the call's piece ends where the
  allocation begins, the allocation calls claim their own time, and the rest is the late launch (short_gaps.ShortGaps).
- host_fault: the device's work on both sides of the gap is unified-memory migrations that a host thread's touch
  caused (rules.HOST_TOUCH_SQL: the host reads managed memory that lives on the device, page by page), and the gap
  lasts at most FAULT_CYCLE_MAX_NS: the host is stalled in page faults between them, not launching or computing.
- launch_tiny / launch: a short gap (<= LAUNCH_GAP_MAX_NS) before a work item the host launched only after
  the device had gone idle: the cost of launching, between tiny kernels or not. A gap of up to
  OP_OVERHEAD_MAX_NS before such a late launch, with no other host activity seen, counts too: the host was
  busy issuing work (a framework's per-operation overhead), not waiting.
- alloc: memory allocation or free calls (device, or pinned host memory) cover most of the gap; or the gap began
  inside (or in the wake of) one that is not stream-ordered, a blocking call like those above (cudaFree waits for
  the device; while the host allocates it launches nothing); or, in a gap of up to OP_OVERHEAD_MAX_NS before a late
  launch, allocating is the most the host is seen doing (the op's overhead was its allocation). For a gap begun in
  no blocking call, the allocation calls of every launching thread of the process count (a framework's other thread,
  such as autograd's, frees memory while the launching thread waits on it).
- jit: a module load or a run-time compile (module-loading calls, compile NVTX ranges, the first launch of a kernel
  when that call is long: lazy loading) inside the gap, unless allocation, communication, a loader or waits (below)
  cover most of it; charged for the time they run (their union within the gap), the rest of the gap judged like a
  gap without them (late_ns, late_cause). A long launch of a kernel launched before loads nothing.
- init: calls that create a stream, event or context, or initialise the driver or the device (INIT_CALLS: the first
  use of a library such as cuDNN creates its streams and handles) cover most of a gap of BUBBLE_MIN_NS or more;
  charged for their own time, the rest judged like a gap without them. Paid once, it is one-time setup, never a bubble
  (idle_causes).
- profiler: the profiler's own work in the launching process (profiler_overhead: CUPTI buffer flushes, which stall the
  process's CUDA calls) inside the gap, under the same proviso, for the time it runs; the rest of the gap likewise.
- host_comm: the launching threads were inside communication NVTX ranges (MPI_*, SHMEM) for most of the gap.
- input_wait: the launching threads were inside a data loader's NVTX ranges (DataLoader, _next_data, collate,
  get_batch, ...: nvtx_texts.LOADER_RANGES) for most of the gap.
- host_wait: the launching threads sat in OS-runtime waits (poll, read, futex, ...) for most of the gap; on
  what, the trace alone does not say (idle_causes names a data loader only where the program has one).
- host_cpu: scheduler data or CPU samples show the launching threads on a CPU, outside CUDA calls, for
  most of the gap.
- host_op: with no CPU data in the trace, the launching threads were inside framework operators (torch.profiler's
  CPU ops, nvtx_texts.OP_DOMAIN), outside CUDA calls, for most of the gap: the framework's own host work.
- host_python: with no more said above, the launching threads were inside Python frames that launched no GPU work
  (python_frames: torch.profiler with with_stack=True), outside CUDA calls, for most of the gap: Python host work
  (preprocessing, decoding, tokenizing), named by its frame (python_work).
- host_untraced: none of the above can be seen (no CUDA call, no host data).

A gap is judged by one host thread: the one that launched the operation after it (else the one before it,
else the thread that launched most work on the device, when those launches were not traced), since its
lateness is what kept the device idle. Longer gaps are judged by
what that thread did during the gap: a heavy activity (jit, alloc, waits) covering most of it outranks the
blocking call that began it, because removing the call alone would not remove the gap. Times are integer
ns clipped to the window.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import duckdb

from stallhound.analysis import gap_pass, nvtx_texts, rules
from stallhound.analysis.attribution_sql import CALLS_SQL, HOST_SQL, MAIN_THREAD_SQL, SPANS_SQL, THREADS_SQL, TOTALS_SQL
from stallhound.analysis.common import Scope, per_model
from stallhound.analysis.device_pass import DEFAULT_SLICES
from stallhound.analysis.short_gaps import ShortGaps
from stallhound.model.duck import one_row

LAUNCH_GAP_MAX_NS = 50_000  # 50 us: eager frameworks spend up to this much host time per op; longer is other work
DOMINANT_SHARE = 0.5  # a host activity covering half a gap explains it
BUBBLE_MIN_NS = 1_000_000  # 1 ms: shorter idle stretches are launch jitter, not bubbles (book gpu-bubbles)
PAUSE_MAX_NS = 100_000_000  # a collection pass takes ms to tens of ms; longer periodic gaps are other waits
SIMILAR_RATIO = 1.2  # gap lengths (and periods) within 20% of each other count as the same pattern
PERIODIC_MIN_GAPS = 3  # a pattern needs three gaps (two intervals) to show a period
STEADY_SHARE = 0.75  # share of start-to-start intervals within 20% of the median for a periodic group
OP_OVERHEAD_MAX_NS = 500_000  # 0.5 ms: an eager framework's host work for one op (Python, dispatch, launch)
SYNC_RESUME_MAX_NS = 1_000_000  # 1 ms: a step's host turnaround after a wait; past it the host is late
STALL_MIN_NS = 1_000_000  # 1 ms: a copy call's wait past its transfer's time that idles the device this long is a
# bubble of its own (BUBBLE_MIN_NS), not staging's jitter (0.1-0.3 ms seen on pageable copies of MiBs)
LAZY_LOAD_MIN_NS = 500_000  # 0.5 ms: a launch call this long on an idle device is loading its module (lazy loading)
LAZY_KERNEL_AFTER_SHARE = 0.5  # ...when its kernel began after half of the call: the driver loads the module before
# it submits the kernel (lazy loads seen start their kernel after the call returns); a kernel that starts near the
# call's start was submitted first, and the long rest of the call is host time after submission
FOLD_BELOW_NS = min(BUBBLE_MIN_NS, SYNC_RESUME_MAX_NS + 1)  # queued gaps this short are neither listed nor pauses:
# the pass only counts them (TOTALS_SQL's kept sums them into one row per device)
HELD_MIN_NS = FOLD_BELOW_NS  # a held gap (gap_causes.sql) is judged one by one: shorter queued gaps are only counted
HOST_PROBE_BUCKET_NS = 1_000_000  # equality-join buckets: long gaps x host events, gap starts x blocking calls
DEVICE_PASS_SLICES = DEFAULT_SLICES  # the device pass the gap pass fills
# in passing (same chunks): the one shares reads on every window attributed, and gpu_utilization by default
SHARE_CAUSES = ("alloc", "host_comm", "input_wait", "host_wait", "jit", "profiler", "init")  # in a longer gap,
# charged only while their activity runs inside it (gap_causes.sql)
FAULT_CYCLE_MAX_NS = 5_000_000  # 5 ms: a host fault on managed memory takes tens of us to ~2 ms of driver work
# (unmapping on the device, the migration, the speculative pages around it); a longer stretch between two touched
# pages is the host's own work
JIT_MODULE_CALLS = "^(cuModuleLoadData|cuModuleLoadDataEx|cuModuleLoadFatBinary|cuLibraryLoadData|cuLinkComplete)"
INIT_CALLS = ("^(cuda|cu|hip)(StreamCreate|EventCreate|CtxCreate|DevicePrimaryCtxRetain|Init|SetDevice"
              "|GetDeviceProperties|DeviceGetStreamPriorityRange)")  # create a stream, event or context, or set up
# the driver and device state (PyTorch asks the streams' priority range and the properties when it sets up a device):
# paid on a library's or the program's first use


def range_kinds(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(text, kind) of the NVTX range texts that count as jit, comm or wait (a text may be two kinds), each distinct
    text matched once (the regexes cost more than the scan): window-independent, so once per model."""
    return nvtx_texts.classified(con).range_kinds


def args(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[str, object]:
    """Bound parameters of LABELLED for a scope (callers add their own)."""
    kinds = range_kinds(con)
    return {"start": scope.start_ns, "end": scope.end_ns, "devices": scope.devices,
            "follow": rules.READBACK_FOLLOW_NS, "small_read": rules.SMALL_READ_BYTES,
            "launch_gap_max": LAUNCH_GAP_MAX_NS, "dominant": DOMINANT_SHARE,
            "waits": rules.WAIT_CALLS, "range_texts": [t for t, _ in kinds], "range_kinds": [k for _, k in kinds],
            "jit_calls": JIT_MODULE_CALLS, "bucket_ns": HOST_PROBE_BUCKET_NS, "lazy": LAZY_LOAD_MIN_NS,
            "lazy_after": LAZY_KERNEL_AFTER_SHARE,
            "resume_max": SYNC_RESUME_MAX_NS, "overhead_max": OP_OVERHEAD_MAX_NS, "held_min": HELD_MIN_NS,
            "op_domain": nvtx_texts.OP_DOMAIN, "fault_max": FAULT_CYCLE_MAX_NS, "init_calls": INIT_CALLS,
            "init_min": BUBBLE_MIN_NS, "stall_min": STALL_MIN_NS}


CALL_STALL = "call_stall"  # the cause of a Gap's stall_ns
PERIODIC_ARGS = {"similar": SIMILAR_RATIO, "min_gaps": PERIODIC_MIN_GAPS, "steady_share": STEADY_SHARE}
STAGED = ("gap_work_threads", "gap_blocking_calls", "gap_host")  # temp tables LABELLED reads beside idle_gaps


def bound(sql: str, params: dict[str, object]) -> dict[str, object]:
    """The entries of `params` that `sql` names ($name): DuckDB refuses parameters a statement does not use."""
    return {name: params[name] for name in set(re.findall(r"\$(\w+)", sql)) if name in params}


@contextmanager
def labelled_inputs(con: duckdb.DuckDBPyConnection, scope: Scope, fold_below_ns: int,
                    slices: int | None = None) -> Iterator[tuple[gap_pass.Folded, ShortGaps]]:
    """What LABELLED reads, as temp tables while the block runs: idle_gaps (gap_pass.idle_gaps, with its arguments;
    the short gaps judged in the pass by ShortGaps, returned with the pass's Folded) and STAGED, each written by its
    own statement. Inside one labelling query DuckDB took the blocking calls' spans and the long gaps' host activity
    for larger than the gaps and hashed every gap twice; written first, their sizes are known, and the short gaps
    judged in the pass are never written."""
    params = args(con, scope)
    try:
        for sql in (THREADS_SQL, CALLS_SQL):
            con.execute(sql, bound(sql, params))
        spans = con.execute(SPANS_SQL).fetchnumpy()
        main_threads = {d: (p, t) for d, p, t in con.execute(MAIN_THREAD_SQL).fetchall()}
        short = ShortGaps(spans, main_threads, min(fold_below_ns, LAUNCH_GAP_MAX_NS + 1), SYNC_RESUME_MAX_NS)
        with gap_pass.idle_gaps(con, scope, rules.TINY_KERNEL_NS, fold_below_ns, slices, short) as folded:
            con.execute(HOST_SQL, bound(HOST_SQL, params))
            yield folded, short
    finally:
        for table in STAGED:
            con.execute(f"DROP TABLE IF EXISTS {table}")


@dataclass(frozen=True)
class CauseTime:
    ns: int
    gaps: int
    long_ns: int = 0  # in gaps of at least BUBBLE_MIN_NS
    periodic_ns: int = 0  # in periodic host stretches (gaps or late resumes) of BUBBLE_MIN_NS..PAUSE_MAX_NS
    #                       (host_untraced/host_cpu only)
    periodic_gaps: int = 0
    period_ns: int | None = None
    api: str | None = None  # for the blocking causes: the API whose gaps hold the most of their idle time
    calls: int = 0  # for the blocking causes: the distinct blocking calls whose gaps they are
    held_ns: int = 0  # for the copy causes: the time in held gaps (the copy waited on work the trace does not show)


@dataclass(frozen=True)
class DeviceIdle:
    device: int
    window_ns: int
    idle_ns: int
    causes: dict[str, CauseTime] = field(default_factory=dict)
    # per cause, the time in the window's edges: the stretches before the device's first work and after its last in
    # the window, when they last BUBBLE_MIN_NS or more (their gaps, all long)
    edges: dict[str, CauseTime] = field(default_factory=dict)
    # per cause, its longest piece of a gap of BUBBLE_MIN_NS or more between the edges: a cost paid once
    longest: dict[str, int] = field(default_factory=dict)
    # per cause, its longest such gap: (gap_id, the gap's time by cause, all its pieces): a cost paid once in a gap
    # takes the rest of that gap with it (idle_causes)
    longest_gap: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)

    def ns(self, *causes: str) -> int:
        return sum(self.causes[c].ns for c in causes if c in self.causes)

    def without_edges(self) -> DeviceIdle:
        """The idle time between the device's first and last work in the window: the edges' time taken out of
        their causes (the device still idles then: idle_ns stays)."""
        causes = {c: replace(t, ns=t.ns - e.ns, gaps=t.gaps - e.gaps, long_ns=t.long_ns - e.long_ns)
                  if (e := self.edges.get(c)) else t for c, t in self.causes.items()}
        return replace(self, causes={c: t for c, t in causes.items() if t.ns > 0}, edges={})

    @property
    def busy_pct(self) -> float:
        return round(100.0 * (self.window_ns - self.idle_ns) / self.window_ns, 2) if self.window_ns else 0.0


@dataclass(frozen=True)
class Gap:
    """A gap of at least BUBBLE_MIN_NS, with its cause and the host thread it was judged by."""
    gap_id: int
    device: int
    start_ns: int
    end_ns: int
    cause: str
    blocked_in: str | None
    pid: int | None
    tid: int | None
    then_ns: int = 0  # after a blocking call's piece (cause), a SHARE_CAUSES activity's own time (then_cause)
    then_cause: str | None = None
    late_ns: int = 0  # the rest, with its own cause (late_cause): a blocking call's late resume past its share, or
    # the time of a gap in which its SHARE_CAUSES activity did not run
    late_cause: str | None = None
    lead_ns: int = 0  # at its end, the time in the blocking copy call it ends in, with the call's cause (lead_cause)
    lead_cause: str | None = None
    held: bool = False  # a blocking copy held it (cause): the device waited on work the trace does not show
    stall_ns: int = 0  # before lead_ns, the lead call's wait past its transfer's time (call_stall)

    def pieces(self) -> tuple[tuple[str | None, int], ...]:
        """(cause, ns) of the gap's pieces in time order; a piece of 0 ns has no cause."""
        rest = self.end_ns - self.start_ns - self.then_ns - self.late_ns - self.stall_ns - self.lead_ns
        return ((self.cause, rest), (self.then_cause, self.then_ns), (self.late_cause, self.late_ns),
                (CALL_STALL if self.stall_ns else None, self.stall_ns), (self.lead_cause, self.lead_ns))

    def at_edge(self, scope: Scope) -> bool:
        """The stretch before the device's first work in the window or after its last: only such a gap starts at
        the window's start or ends at its end."""
        return self.start_ns == scope.start_ns or self.end_ns == scope.end_ns


@dataclass(frozen=True)
class Attribution:
    devices: dict[int, DeviceIdle]
    long_gaps: list[Gap]  # every gap of at least BUBBLE_MIN_NS, in device and time order


def attribute(con: duckdb.DuckDBPyConnection, scope: Scope) -> Attribution:
    """Idle time per device and cause over the scope, and its long gaps (computed once per model and scope)."""
    key = ("attribution", tuple(scope.devices), scope.start_ns, scope.end_ns)
    return per_model(con, key, lambda: _attribute(con, scope))


def _attribute(con: duckdb.DuckDBPyConnection, scope: Scope) -> Attribution:
    params = {**args(con, scope), **PERIODIC_ARGS, "bubble_min": BUBBLE_MIN_NS, "min_gap": BUBBLE_MIN_NS,
              "gc_min": BUBBLE_MIN_NS, "gc_max": PAUSE_MAX_NS}
    with labelled_inputs(con, scope, FOLD_BELOW_NS, DEVICE_PASS_SLICES) as (folded, short):
        counted: list[tuple[int, str, str | None, int, int]] = [  # (device, cause, call, gaps, ns)
            (d, "queued", None, n, folded.ns[d]) for d, n in folded.gaps.items() if n]
        counted += [(d, cause, call, n, ns) for (d, cause, call), (n, ns) in short.counted.items()]
        params.update({f"folded_{name}": [row[i] for row in counted]
                       for i, name in enumerate(("devices", "causes", "calls", "gaps", "ns"))})
        totals, long_gaps = one_row(con.execute(TOTALS_SQL, bound(TOTALS_SQL, params)))
    found: dict[int, dict[str, CauseTime]] = {d: {} for d in scope.devices}
    for t in totals or []:
        found[t["device_id"]][t["cause"]] = CauseTime(
            ns=int(t["ns"]), gaps=t["gaps"], long_ns=int(t["long_ns"]), periodic_ns=int(t["periodic_ns"]),
            periodic_gaps=t["periodic_gaps"], period_ns=t["period_ns"], api=t["api"], held_ns=int(t["held_ns"]),
            calls=len({tuple(c) for c in t["calls"] or []} | short.calls.get((t["device_id"], t["cause"]), set())))
    gaps = [Gap(**g) for g in long_gaps or []]
    devices = {d: DeviceIdle(device=d, window_ns=scope.duration_ns, idle_ns=sum(c.ns for c in causes.values()),
                             causes=causes, **_edges(gaps, d, scope)) for d, causes in found.items()}
    return Attribution(devices=devices, long_gaps=gaps)


def rest_of_gaps(d: DeviceIdle, causes: dict[str, CauseTime], took: dict[str, int]) -> tuple[dict[str, CauseTime], int]:
    """causes less the other pieces of the longest gaps that one-time costs took (took: cause -> its longest gap's
    id, DeviceIdle.longest_gap), each gap once, and the time taken: a piece whose cause is gone (all of it taken) or
    whose own longest gap that is (taken already) is not taken again."""
    rest, causes = 0, dict(causes)
    for gap_id, pieces in {d.longest_gap[c][0]: d.longest_gap[c][1] for c in took}.items():
        for cause, ns in pieces.items():
            if cause in causes and causes[cause].ns > 0 and took.get(cause) != gap_id:
                t, rest = causes[cause], rest + ns
                causes[cause] = replace(t, ns=t.ns - ns, gaps=t.gaps - 1, long_ns=max(0, t.long_ns - ns),
                                        periodic_ns=min(t.periodic_ns, t.ns - ns))
    return causes, rest


def _edges(gaps: list[Gap], device: int, scope: Scope) -> dict[str, dict]:
    """A device's time per cause in the long gaps at the window's edges (Gap.at_edge), and each cause's longest piece
    of a long gap between them (DeviceIdle's edges and longest)."""
    edges: dict[str, list[int]] = {}
    longest: dict[str, int] = {}
    longest_gap: dict[str, tuple[int, dict[str, int]]] = {}
    for g in (g for g in gaps if g.device == device):
        pieces: dict[str, int] = {}
        for cause, ns in g.pieces():
            if cause is not None and ns > 0:
                pieces[cause] = pieces.get(cause, 0) + ns
        for cause, ns in pieces.items():
            if g.at_edge(scope):
                sums = edges.setdefault(cause, [0, 0])
                sums[0], sums[1] = sums[0] + ns, sums[1] + 1
            elif ns > longest.get(cause, 0):
                longest[cause], longest_gap[cause] = ns, (g.gap_id, pieces)
    return {"edges": {c: CauseTime(ns=ns, gaps=n, long_ns=ns) for c, (ns, n) in edges.items()}, "longest": longest,
            "longest_gap": longest_gap}
