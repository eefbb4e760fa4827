"""Where each iteration begins and ends: the boundary methods the iterations tool describes (its 'method')."""

from __future__ import annotations

import copy
import re
import statistics
from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import Scope, ms, pct, per_model
from stallhound.analysis.span_busy import busy_ns
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest
from stallhound.model.sql_files import sql_beside

MIN_REPEATS = 3  # ranges (or marker kernels) per thread: fewer cannot show a period, let alone a steady one
MIN_GPU_SHARE = 0.5  # a step range launches GPU work most times; CPU-only ranges (logging, I/O) cannot time it
LAST_RANGE_MIN_SHARE = 0.5  # a last range shorter than half a period is the start of a step cut off by the window
PROFILER_STEP = "^ProfilerStep#"  # torch.profiler's own step range: the step by definition
STEP_NAMES = "(?i)step|iter|train|batch|forward"  # words people name one training or inference step with
# A range that says it is one step (step or iter[ation] as a word: 'train_step', 'TrainStep', 'iteration 3',
# ProfilerStep#3) is the program's own step marker: it counts however few times it occurs, even once
EXPLICIT_STEP = r"(^|[^A-Za-z])([Ss]tep|[Ii]ter(ation)?)([^a-z]|$)|[a-z](Step|Iter(ation)?)([^a-z]|$)"
METADATA = ", (seq|op_id|sizes|input_op_ids|input_dims) = .*$"  # PyTorch record_function / emit_nvtx suffix
AUTOGRAD = ", seq = "  # emit_nvtx tags autograd functions with their sequence number
PER_OP = "|".join((
    r"^(aten|prim|c10d|_c10d_functional|c10d_functional|flash_attn|autograd|torch::autograd|cub|thrust|cutlass"
    r"|triton|xformers|fbgemm|quantized|torchvision|inductor)::",  # operator namespaces
    r"^(cublas|cublasLt|cudnn|cusparse|cufft|curand|cusolver|nccl|nvshmem)[A-Z_:]",  # library calls
    r"^record_param_comms(,|$)",  # PyTorch's record of one collective call
    r"^Optimizer\.[A-Za-z_]+#",  # torch.optim's record of one optimizer call ('Optimizer.step#SGD.step')
    r"^[A-Za-z0-9_]*Backward[0-9]*$",  # one autograd node ('ReluBackward0', 'CudnnBatchNormBackward0')
    r"^P?MPI_[A-Za-z_]+$",  # one MPI call (MPI_Send, MPI_Recv, ...)
    r"^Thunk:",  # XLA: one range per HLO op executed
    r"\.(py|pyx|c|cc|cpp|cxx|cu|cuh|h|hpp|f|f90|jl)(\([0-9]+\)|:[0-9]+)",  # source-line markers
))
MAX_CANDIDATES = 5  # qualifying NVTX ranges listed, the chosen one first
MIN_LAUNCH_BUCKET_NS = 10_000  # 10 us: the launch join's buckets never shorter, even when most ranges are
PERIOD_TOLERANCE = 0.25  # a loop's period jitters by a few %; 25% still rejects a kernel run twice per step
STABLE_SHARE = 0.75  # a quarter of the periods may be disturbed (a recompilation, a GC pause, a checkpoint)
STABLE_TIME_SHARE = 0.25  # steady periods fill a quarter of the time after the first: a loop may pause at
#                           times (a checkpoint, a GC), but bursts between long pauses (a JIT compile each) are no loop
MIN_SPAN_SHARE = 0.5  # the marker recurs over at least half the device's kernel span: a loop, not a burst


class Candidate(BaseModel):
    name: str = Field(description="range text without PyTorch metadata; N for an instance counter")
    kind: Literal["push_pop", "start_end"]
    depth: int = Field(description="push/pop nesting depth on its thread, 0 = outermost (start/end: 0)")
    counter: bool = Field(description="true when texts differing in their N were taken as one range")
    ranges: int = Field(description="ranges on the qualifying threads")
    threads: int = Field(description="threads where it occurs 3+ times, half of them with GPU work")
    gpu_ranges_pct: float = Field(description="share of those ranges that launch GPU work")
    median_period_ns: float | None = Field(description="median over threads of the median start-to-start lag")


# NVTX candidates, in one pass over the ranges. `named` gives every range outside the per-op set its range name
# (counter families merged). 'aten::' and the autograd tag, most per-op ranges of PyTorch profiles, are tested
# first: DuckDB runs a conjunction's cheap string tests before the regex, which sees only the rest (the same
# tests inside a CASE cost more CPU). The metadata, template and number rewrites run
# once per distinct text (far fewer than the ranges), not once per range, and a
# text's numbers become their rank among its template's texts, so the counter test compares integers, not lists.
# `flagged` marks the ranges whose thread launches GPU work inside them: launches hash-joined to the ranges by (thread,
# time bucket), a range in every bucket it covers, the bucket about a range long (an ASOF join sorted every launch,
# slow when few threads make large partitions). Every candidate row carries the
# ranges of the best one (rank 1) on its qualifying threads.
LETTERS = "lower(regexp_replace(regexp_replace({}, '\\bN\\b|[0-9]+', '', 'g'), '[^A-Za-z]', '', 'g'))"
NVTX_SQL = (sql_beside(__package__, "nvtx_step_names.sql") + LETTERS.format("name") + " = " + LETTERS.format("$wanted")
            + ")," + sql_beside(__package__, "nvtx_step_candidates.sql"))

DEVICE_SIDE_SQL = sql_beside(__package__, "step_device_side.sql")
SHIFT_BUSY_SHARE = 0.75  # a thread's first step starts when the GPU's earlier work ends only if the GPU worked
#                          through that wait at least 3/4 as much as through the step: a device idle behind a stream
#                          wait on an untraced event leaves the step where it began (the stall is no earlier step's)
SHIFT_BUCKETS = 16  # overlap-join buckets per typical shift
FIRST_WORK_SQL = """
SELECT min(start_ns) FROM (
  SELECT start_ns FROM kernels WHERE device_id IN (SELECT unnest($devices)) UNION ALL
  SELECT start_ns FROM memcpy WHERE device_id IN (SELECT unnest($devices)) UNION ALL
  SELECT start_ns FROM memset WHERE device_id IN (SELECT unnest($devices)))
"""
PATTERN_SQL = sql_beside(__package__, "kernel_step_pattern.sql")
GRAPH_SQL = sql_beside(__package__, "step_graph_replays.sql")
GRAPH_LAUNCH = "(?i)graphlaunch"  # cudaGraphLaunch, cuGraphLaunch, hipGraphLaunch (nsys' version suffixes removed)
MIN_GRAPH_SHARE = 0.5  # replays holding half a device's GPU time are the program's unit of work (a decode step, a
#                        whole training step captured); a graph of one layer or a piece between eager ops holds less
MARKER_SQL = """
SELECT start_ns FROM kernels WHERE device_id = $device AND coalesce(short_name, name, '') = $kname
  AND start_ns >= $start AND end_ns <= $end ORDER BY start_ns
"""

Spans = list[tuple[int, int]]


def _candidates(con: duckdb.DuckDBPyConnection, scope: Scope, wanted: str | None
                ) -> tuple[list[Candidate], int | None, list[list]]:
    """(qualifying NVTX ranges best first, the best's tier, its [pid, tid, start_ns, end_ns] ranges)."""
    rows = con.execute(NVTX_SQL, {
        "start": scope.start_ns, "end": scope.end_ns, "devices": scope.devices, "wanted": wanted,
        "metadata": METADATA, "autograd": AUTOGRAD, "per_op": PER_OP, "min_repeats": 1 if wanted else MIN_REPEATS,
        "min_gpu_share": MIN_GPU_SHARE, "profiler_step": PROFILER_STEP, "step_names": STEP_NAMES,
        "min_bucket": MIN_LAUNCH_BUCKET_NS, "explicit_step": EXPLICIT_STEP,
        "limit": MAX_CANDIDATES}).fetchall()
    found = [Candidate(name=name, kind=kind, depth=depth, counter=counter, ranges=n, threads=threads,
                       gpu_ranges_pct=pct(n_gpu, n), median_period_ns=period)
             for name, kind, depth, counter, n, threads, n_gpu, period, _, _ in rows]
    return found, rows[0][8] if rows else None, rows[0][9] if rows else []


def _on_device(con: duckdb.DuckDBPyConnection, scope: Scope, ranges: list[list]) -> list[list]:
    """Each range as the device lived it, [pid, tid, start, end], ranges of a thread in time order. A host running
    ahead of a busy GPU enqueues step k+1 while step k still runs: the range then starts, on the device, when its
    thread's earlier GPU work ends (no later than its own first GPU work on its main stream starts: work it
    prefetches on a side stream may run ahead); for a thread's first range (no step before it to own that time)
    only when the devices worked through the wait (SHIFT_BUSY_SHARE). It ends when the last GPU work it launched
    ends, if later; then _apart."""
    rows = con.execute(DEVICE_SIDE_SQL, {
        "pids": [r[0] for r in ranges], "tids": [r[1] for r in ranges], "starts": [r[2] for r in ranges],
        "ends": [r[3] for r in ranges], "devices": scope.devices}).fetchall()
    device_side = {idx: rest for idx, *rest in rows}
    lived, firsts = [], {}
    for idx, (pid, tid, start, end) in enumerate(ranges):
        busy_until, first_start, last_end = device_side.get(idx, (None, None, None))
        end = end if last_end is None else max(end, last_end)
        to = start if busy_until is None or first_start is None else max(start, min(busy_until, first_start, end))
        if idx and ranges[idx - 1][:2] == [pid, tid]:
            start = to  # the time it moves over is the step before's, still running on the device
        elif to > start:
            firsts[idx] = (start, to, end)
        lived.append([pid, tid, start, end])
    # the wait counts from the devices' first recorded work: before it they show nothing, neither work nor a stall
    # (the host queued work the devices started later: work the trace missed, or a host/device clock offset)
    seen = one_row(con.execute(FIRST_WORK_SQL, {"devices": scope.devices}))[0] if firsts else None
    shown = {idx: (max(start, seen or start), to, end) for idx, (start, to, end) in firsts.items()}
    waits = busy_ns(con, scope.devices, [(s, t) for s, t, _ in shown.values()], SHIFT_BUCKETS)
    steps = busy_ns(con, scope.devices, [(t, e) for _, t, e in shown.values()], SHIFT_BUCKETS)
    for (idx, (start, to, end)), wait, step in zip(shown.items(), waits, steps, strict=True):
        if wait * (end - to) >= SHIFT_BUSY_SHARE * step * (to - start):
            lived[idx][2] = to
    return _apart(lived)


def _apart(lived: list[list]) -> list[list]:
    """The ranges of one thread never overlap on the device: each starts no earlier than the one before it, and
    ends where the next one starts there if that is earlier (its work that runs on into the next step, as a side
    stream's copy, counts in the next)."""
    for this, after in zip(lived, lived[1:], strict=False):
        if this[:2] == after[:2]:
            after[2] = max(after[2], this[2])
            this[3] = max(this[2], min(this[3], after[2]))
    return lived


def own_span(name: str) -> bool:
    """A range that says it is one step is timed by its own span; another (a phase or module range recurring once
    a step) only marks where steps start, so it is timed start to next start."""
    return re.search(EXPLICIT_STEP, name) is not None


def _thread_spans(ranges: Spans, own: bool) -> Spans:
    """Own spans, or start to next start; the last range counts (to its own end) only when it lasts at least half
    the others' median (else it is a step cut off by the window) or is the only one."""
    last_start, last_end = ranges[-1]
    spans = ranges[:-1] if own else list(zip([s for s, _ in ranges], [s for s, _ in ranges[1:]], strict=False))
    lengths = [e - s for s, e in spans]
    if not lengths or last_end - last_start >= LAST_RANGE_MIN_SHARE * statistics.median(lengths):
        spans.append((last_start, last_end))
    return spans


def _combine(per_thread: list[Spans], own: bool) -> Spans:
    """Iteration k starts at the median k-th start of the threads that have one; it ends at the median of their
    k-th ends (own spans) or where iteration k+1 starts, the last at the median end of the threads with all."""
    count = max(map(len, per_thread))
    starts = [int(statistics.median(t[k][0] for t in per_thread if len(t) > k)) for k in range(count)]
    if own:
        ends = [int(statistics.median(t[k][1] for t in per_thread if len(t) > k)) for k in range(count)]
    else:
        ends = [*starts[1:], int(statistics.median(t[-1][1] for t in per_thread if len(t) == count))]
    return [(s, e) for s, e in zip(starts, ends, strict=True) if e > s]


def _nvtx(con: duckdb.DuckDBPyConnection, scope: Scope, range_name: str | None
          ) -> tuple[list[Candidate], str | None, Spans]:
    """(qualifying candidates, reason, spans) from the best NVTX range; no candidates when none qualifies."""
    found, tier, ranges = _candidates(con, scope, range_name)
    if not found or tier is None:  # a candidate always has a tier
        return [], None, []
    per_thread: dict[tuple[int, int], Spans] = {}
    for pid, tid, start, end in _on_device(con, scope, ranges):
        per_thread.setdefault((pid, tid), []).append((start, end))
    best = found[0]
    why = ("requested by range_name" if range_name else
           ("torch.profiler's step range", "named like a step", "the outermost repeating range with GPU work")[tier])
    reason = (f"'{best.name}' ({why}): {best.ranges} ranges on {best.threads} thread(s), {best.gpu_ranges_pct}% "
              f"launching GPU work, median period {ms(best.median_period_ns)}"
              + (f"; {len(found) - 1} other range(s) qualified, see candidates" if len(found) > 1 else ""))
    own = own_span(best.name)
    return found, reason, _combine([_thread_spans(r, own) for r in per_thread.values()], own)


def _kernel_pattern(con: duckdb.DuckDBPyConnection, scope: Scope) -> tuple[str | None, str, Spans]:
    """(marker kernel, reason or why none, spans) on the first device in scope with kernels."""
    window = {"start": scope.start_ns, "end": scope.end_ns}
    device = one_row(con.execute("SELECT min(device_id) FROM kernels WHERE device_id IN (SELECT unnest($devices)) "
                                 "AND start_ns >= $start AND end_ns <= $end", {**window, "devices": scope.devices}
                                 ))[0]
    if device is None:
        return None, "no kernels on the devices in scope in this window", []
    best = con.execute(PATTERN_SQL, {**window, "device": device, "min_repeats": MIN_REPEATS,
                                     "tolerance": PERIOD_TOLERANCE, "min_span_share": MIN_SPAN_SHARE,
                                     "stable_share": STABLE_SHARE, "stable_time_share": STABLE_TIME_SHARE}
                       ).fetchone()
    if best is None:
        return None, f"no kernel runs {MIN_REPEATS}+ times on device {device}", []
    kname, n, period, stable, stable_time, recurs, marks = best
    rhythm = (f"{n} runs, median period {ms(period)}, {100 * stable:.0f}% of periods within {PERIOD_TOLERANCE:.0%} "
              f"of it, filling {100 * stable_time:.0f}% of the time after the first")
    if not marks:
        return None, (f"no kernel on device {device} recurs with a stable period over half its kernel span (needs "
                      f"{STABLE_SHARE:.0%} of periods within {PERIOD_TOLERANCE:.0%} of the median, filling "
                      f"{STABLE_TIME_SHARE:.0%} of the time; closest: '{kname}', {rhythm}"
                      f"{'' if recurs else ', over less than half the span'})"), []
    starts = [s for (s,) in con.execute(MARKER_SQL, {**window, "device": device, "kname": kname}).fetchall()]
    reason = f"kernel '{kname}' on device {device}: {rhythm}; the coarsest stable rhythm"
    return kname, reason, list(zip(starts, starts[1:], strict=False))


def _graph_replays(con: duckdb.DuckDBPyConnection, scope: Scope) -> tuple[str | None, str, Spans]:
    """(the launch call, reason or why none, spans): each replay of a CUDA graph starts a step on the threads whose
    replays hold MIN_GRAPH_SHARE of their device's GPU time; a step runs to the next replay's start (the eager work
    after a replay, a sampler or an optimizer, is the step's), the last to its own end."""
    rows = con.execute(GRAPH_SQL, {"start": scope.start_ns, "end": scope.end_ns, "devices": scope.devices,
                                   "graph_launch": GRAPH_LAUNCH}).fetchall()
    if not rows:
        return None, "no CUDA graph replays", []
    held = [r for r in rows if r[5] >= MIN_GRAPH_SHARE]
    if not held:
        return None, (f"CUDA graph replays hold at most {rows[0][5]:.0%} of a device's GPU time (a step's replays "
                      f"hold {MIN_GRAPH_SHARE:.0%} or more)"), []
    replays, api = sum(r[3] for r in held), held[0][4]
    reason = (f"CUDA graph replays ({api}): {replays} on {len(held)} thread(s), holding {min(r[5] for r in held):.0%} "
              "or more of their device's GPU time; each replay starts a step")
    return api, reason, _combine([_thread_spans([(s, e) for s, e in r[6]], own=False) for r in held], own=False)


def _unmatched(con: duckdb.DuckDBPyConnection, scope: Scope, range_name: str) -> str:
    """Why range_name picks no step, naming the ranges that do repeat as steps here (the auto-detected candidates)."""
    names = [c.name for c in _candidates(con, scope, None)[0]]
    there = (f"the ranges that qualify as steps here (repeating with GPU work, or named as one step) are "
             f"{', '.join(repr(n) for n in names)}" if names else
             f"no NVTX range qualifies as a step here (repeating {MIN_REPEATS}+ times with GPU work, or named as one)")
    return (f"no NVTX range '{range_name}' in this window: {there}; pass one of them as range_name, or omit it to "
            "auto-detect")


def boundaries(con: duckdb.DuckDBPyConnection, scope: Scope, range_name: str | None, method: str
               ) -> tuple[str | None, str | None, list[Candidate], Spans]:
    """(method, reason or why none, NVTX candidates, spans): NVTX when a range qualifies, else the kernels. Found
    once per model, window, devices and choice: the callers asking for different `limit`s (iterations, triage,
    show_timeline) share the costly part; each gets its own copy."""
    key = ("step_boundaries", scope.start_ns, scope.end_ns, tuple(scope.devices), range_name, method)
    return copy.deepcopy(per_model(con, key, lambda: _find(con, scope, range_name, method)))


def _find(con: duckdb.DuckDBPyConnection, scope: Scope, range_name: str | None, method: str
          ) -> tuple[str | None, str | None, list[Candidate], Spans]:
    """Explicit step ranges, then repeating ranges (NVTX), then CUDA graph replays, then the kernel pattern: a range
    that repeats with GPU work encloses what a graph replays (a step may replay one several times), and a replay
    holds the work that a kernel's rhythm only samples (one layer's kernel runs many times a replay)."""
    said = []
    if method in ("auto", "nvtx"):
        candidates, reason, spans = _nvtx(con, scope, range_name)
        if candidates:
            return f"nvtx:{candidates[0].name}", reason, candidates, spans
        if range_name is not None:
            raise InvalidRequest(_unmatched(con, scope, range_name))
        if method == "nvtx":
            raise InvalidRequest(f"no NVTX range that occurs {MIN_REPEATS}+ times on a thread with GPU work, outside "
                                 "per-op ranges, in this window; omit method to auto-detect, or use method='graph' "
                                 "or method='kernel_pattern'")
        said.append(f"no NVTX range occurs {MIN_REPEATS}+ times on a thread with GPU work")
    if method in ("auto", "graph"):
        api, why, spans = _graph_replays(con, scope)
        if api is not None:
            return f"graph:{api}", "; ".join([*said, why]), [], spans
        if method == "graph":
            raise InvalidRequest(f"{why} in this window; omit method to auto-detect")
        if why != "no CUDA graph replays":
            said.append(why)
    kname, reason, spans = _kernel_pattern(con, scope)
    return (f"kernel_pattern:{kname}" if kname else None), "; ".join([*said, reason]), [], spans


def duration_basis(method: str | None) -> str | None:
    """How a step's duration is taken: a step range's own span on the device, or start to next start (of another
    range, a graph replay or a marker kernel)."""
    if method is None:
        return None
    return "range" if method.startswith("nvtx:") and own_span(method[5:]) else "start_to_start"


def own_unit(method: str | None) -> bool:
    """The steps are the program's own: ranges that say they are one step, or the replays of its CUDA graph (the
    work it launches whole); these bound a window however few they are."""
    return method is not None and (method.startswith("graph:") or (method.startswith("nvtx:")
                                                                   and own_span(method[5:])))


def durations(con: duckdb.DuckDBPyConnection, scope: Scope, range_name: str | None = None, method: str = "auto"
              ) -> list[int]:
    """Each iteration's duration in time order, by boundaries(): what the step figures are taken from."""
    return [e - s for s, e in boundaries(con, scope, range_name, method)[3]]


def steady_median_ns(durations: list[int]) -> float | None:
    """The loop's steady step: the median duration of iterations 1..n-1 (the first may be warmup); None with one."""
    return statistics.median(durations[1:]) if len(durations) > 1 else None
