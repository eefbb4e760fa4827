"""Where in the program were these events made: the call sites that issued them, from their call stacks.

Events, those starting in the window: launches (kernels of the devices in scope, `kernel` matching their name,
each with its launch call's stack; time = the kernels' GPU time), copies (memcpy rows of the devices in scope,
`copy_kind` matching their direction or a side's memory kind; time = the copies' GPU time), syncs and allocations
(CUDA API calls of kind sync, or alloc: allocations and frees; time = the calls' host time), api_calls (every CUDA
API call; time = host time), os_calls (OS runtime calls; host time) and idle_samples (CPU samples taken while a
device in scope was idle between two pieces of its work; samples have no time: shares count samples). `api`
narrows the API-call sets to names containing it. A call that an older export records twice under one
correlation id (the runtime call and the driver call inside it) is one event, with the stack either has.
A site is the first user frame of an event's stack (analysis.stacks); events = the events whose stack has that
site; share_pct = their time (their count for samples) over that of every event of the set with a stack.
Coverage: events of the set in the window, those with a stack, and their share (coverage_pct).
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import stacks
from stallhound.analysis.common import (
    DEFAULT_LIMIT,
    LimitParam,
    Output,
    Scope,
    ScopedParams,
    more_rows,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.intervals import BUSY, gaps
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest

EventSet = Literal["launches", "copies", "syncs", "allocations", "api_calls", "os_calls", "idle_samples"]
API_KINDS = {"syncs": ["sync"], "allocations": ["alloc"]}  # CUDA API sets by cuda_api.kind; api_calls: any
MAX_FULL_STACKS = 5  # full stacks a result carries: each can be tens of frames

# One row per call: calls an older export records twice under one correlation id count once.
API_CALLS = """chosen AS (
  SELECT max(stack_id) AS stack_id, max(duration_ns) AS time_ns FROM cuda_api
  WHERE start_ns >= $start AND start_ns < $end AND ($kinds IS NULL OR list_contains($kinds, kind))
    AND ($api IS NULL OR contains(lower(name), lower($api)))
  GROUP BY pid, correlation_id, CASE WHEN correlation_id IS NULL THEN start_ns END)"""
DEVICE_WORK = """chosen AS (
  SELECT a.stack_id, w.duration_ns AS time_ns FROM {table} w
  LEFT JOIN (SELECT pid, correlation_id, max(stack_id) AS stack_id FROM cuda_api WHERE kind IN ({kinds})
             AND ($api IS NULL OR contains(lower(name), lower($api))) GROUP BY ALL) a
    ON a.pid = w.pid AND a.correlation_id = w.correlation_id
  WHERE w.start_ns >= $start AND w.start_ns < $end AND w.device_id IN (SELECT unnest($devices)) AND {match}
    AND ($api IS NULL OR a.pid IS NOT NULL))"""
LAUNCHES = DEVICE_WORK.format(table="kernels", kinds="'launch', 'graph'", match=(
    "($kernel IS NULL OR contains(lower(w.name), lower($kernel)) OR contains(lower(w.short_name), lower($kernel)))"))
COPIES = DEVICE_WORK.format(table="memcpy", kinds="'memcpy'", match=(
    "($copy_kind IS NULL OR lower($copy_kind) IN (lower(w.direction), w.src_kind, w.dst_kind))"))
OS_CALLS = """chosen AS (SELECT stack_id, duration_ns AS time_ns FROM os_runtime
  WHERE start_ns >= $start AND start_ns < $end AND ($api IS NULL OR contains(lower(name), lower($api))))"""
IDLE_SAMPLES = BUSY + ",\n" + gaps("idle", "busy", "device_id") + """,
chosen AS (SELECT s.stack_id, NULL::BIGINT AS time_ns FROM cpu_samples s
  WHERE s.time_ns >= $start AND s.time_ns < $end
    AND EXISTS (SELECT 1 FROM idle g WHERE s.time_ns >= g.start_ns AND s.time_ns < g.end_ns))"""
CHOSEN = {"launches": LAUNCHES, "copies": COPIES, "syncs": API_CALLS, "allocations": API_CALLS,
          "api_calls": API_CALLS, "os_calls": OS_CALLS, "idle_samples": IDLE_SAMPLES}
# Which filter each set reads: one given to a set that ignores it is a mistake, said at once.
FILTERS = {"kernel": ("launches",), "copy_kind": ("copies",),
           "api": ("launches", "copies", "syncs", "allocations", "api_calls", "os_calls")}


class Params(ScopedParams):
    events: Annotated[EventSet, Field(description=(
        "which events: launches (kernels), copies (memcpy), syncs, allocations (allocations and frees), api_calls "
        "(every CUDA API call), os_calls (OS runtime calls), idle_samples (CPU samples while a device idles)"))]
    kernel: Annotated[str | None, Field(description="launches: text in the kernel's name (case-insensitive)")] = None
    copy_kind: Annotated[str | None, Field(description=(
        "copies: a direction (H2D, D2H, D2D, ...) or a memory kind of either side (pageable, pinned, device)"))] = None
    api: Annotated[str | None, Field(description=(
        "text in the API or OS call's name (case-insensitive), e.g. cudaMemcpyAsync, pthread_cond_wait"))] = None
    full_stacks: Annotated[int, Field(ge=0, le=MAX_FULL_STACKS, description=(
        "how many of the top sites to show with a whole stack (innermost frame first)"))] = 0
    limit: LimitParam = DEFAULT_LIMIT


class Site(BaseModel):
    where: str = Field(description="`function` in file:line (Python) or in the module's file name (native); "
                                   "module@address for a symbol nsys did not resolve")
    function: str | None
    module: str | None = Field(description="file (Python) or library/executable path (native)")
    line: int | None = Field(description="nsys: none; Kineto: the line the function starts at (what torch.profiler "
                                         "records), so `calls` says which call in it")
    calls: str | None = Field(description="the function the site called on the way to the events (the next frame "
                                          "inward); null when the site is the innermost frame")
    user_frame: bool = Field(description="false when the stack has no frame of the user's code and the site is "
                                         "the library frame nearest it (analysis.stacks)")
    layer: str | None = Field(description="the site's layer when not the user's: framework, system, interpreter, "
                                          "cuda, profiler")
    events: int
    time_ns: int | None = Field(description="the events' time (null for samples)")
    share_pct: float = Field(description="of the time (samples: the count) of the set's events with a stack")
    stack: list[str] | None = Field(None, description="the whole stack of the site's most frequent stack, innermost "
                                                       "first (only for the top `full_stacks` sites)")


class Result(Output):
    scope: Scope
    events: str
    matched_events: int = Field(description="events of the set in the window")
    with_stack: int = Field(description="those with a call stack")
    coverage_pct: float = Field(description="with_stack / matched_events")
    coverage_note: str | None = Field(description="what the coverage means and, when stacks are missing, the "
                                                  "capture that records them")
    sites: list[Site]
    truncated: bool = Field(description="more sites exist than `limit`")


def _check(params: Params) -> None:
    for name, sets in FILTERS.items():
        if getattr(params, name) is not None and params.events not in sets:
            raise InvalidRequest(f"`{name}` narrows only events={' or '.join(sets)}, not events={params.events}; "
                                 f"leave it out or pick one of those sets")


def _note(con: duckdb.DuckDBPyConnection, params: Params, matched: int, with_stack: int) -> str | None:
    """One sentence on missing stacks with the capture that records them; None when every event has one."""
    if matched == 0:
        return f"no {params.events} in the window, so there is nothing to place"
    if with_stack == matched:
        return None
    if one_row(con.execute("SELECT count(*) FROM stacks"))[0] == 0:
        return (f"this profile has no call stacks, so no call site can be named; capture them with "
                f"{remedy(con, ('stacks',))}")
    if with_stack == 0:
        return (f"none of the {matched:,} {params.events} has a call stack (the profile has stacks of other events); "
                f"capture with {remedy(con, ('stacks',))}")
    return (f"{matched - with_stack:,} of {matched:,} {params.events} have no call stack: the capture recorded none "
            "for them (calls below nsys' backtrace options, or on a thread running no Python code under "
            "torch.profiler, such as autograd's backward thread)")


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    _check(params)
    scope = resolve_scope(con, params)
    args = {**scope_args(scope), "kinds": API_KINDS.get(params.events), "api": params.api, "kernel": params.kernel,
            "copy_kind": params.copy_kind}
    chosen = CHOSEN[params.events]
    if params.events not in ("launches", "copies", "idle_samples"):
        args.pop("devices")
    used = {k: v for k, v in args.items() if f"${k}" in chosen}
    matched, with_stack, stacked_ns = one_row(con.execute(f"WITH {chosen}\n{stacks.COVERAGE}", used))
    found = stacks.sites(con, f"{chosen},\n{stacks.EVENTS}", used, params.limit)
    whole = stacked_ns if params.events != "idle_samples" else with_stack
    rows = [_site(con, frame, callee, n, time_ns, stack_id, whole, params.events, rank < params.full_stacks)
            for rank, (frame, callee, n, time_ns, stack_id) in enumerate(found[:params.limit])]
    return Result(scope=scope, events=params.events, matched_events=matched, with_stack=with_stack,
                  coverage_pct=pct(with_stack, matched), coverage_note=_note(con, params, matched, with_stack),
                  sites=rows, truncated=len(found) > params.limit)


def _site(con: duckdb.DuckDBPyConnection, frame: stacks.Frame, callee: str | None, n: int, time_ns: int | None,
          stack_id: int, whole: int | None, events: str, full: bool) -> Site:
    share = pct(n if events == "idle_samples" else time_ns or 0, whole or 0)
    return Site(where=stacks.where(frame), function=frame.function, module=frame.module, line=frame.line,
                calls=callee, user_frame=frame.layer is None, layer=frame.layer, events=n,
                time_ns=None if events == "idle_samples" else time_ns, share_pct=share,
                stack=[stacks.where(f) for f in stacks.stack(con, stack_id)] if full else None)


def render(result: Result) -> str:
    lines = [f"{result.events}: {result.matched_events:,} in the window, {result.with_stack:,} with a call stack "
             f"({result.coverage_pct:.1f}%)"]
    if result.coverage_note:
        lines.append(result.coverage_note)
    for s in result.sites:
        time = "" if s.time_ns is None else f" {ms(s.time_ns)}"
        called = f" -> {s.calls}" if s.calls else ""
        lines.append(f"{s.share_pct:5.1f}% x{s.events:<6,}{time}  {s.where}{called}"
                     + ("" if s.user_frame else f"  (no user frame: {s.layer})"))
        lines.extend(f"        {frame}" for frame in s.stack or [])
    if result.truncated:
        lines.extend(more_rows(result, None, "call sites"))
    return "\n".join(lines)
