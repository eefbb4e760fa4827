"""What the host was doing in the idle time the attribution leaves unexplained (gpu-bubbles), and the finding's words.

A piece of a long gap whose cause names nothing the host did (UNEXPLAINED: nothing traced on the launching thread, or
work already queued) may still overlap what the launching process did on any of its threads: CUDA calls of any kind
(a device-wide synchronize or an allocation on another thread holds every stream), or ranges (NVTX, a framework's
operators) that launched no GPU work. The bubble names the largest such activity with the time it overlaps, and the
time the process was seen doing anything in the pieces; only where nothing overlaps does it say nothing was seen, and
then what to capture to see it, and it is tagged UNSEEN (common.leads_first ranks it after findings with evidence).
A bubble mostly queued (its gaps' next work launched before the device ran dry: the device waited on something the
trace does not show, not on the host) with the host seen in less than MOSTLY of it is tagged UNSEEN too: the trace
holds no evidence of most of its cause. A copy call's stall (call_stall: the launching thread sat in it past its
transfer's time, launching and moving nothing) is said as such, with what to capture to see inside it.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np

from stallhound.analysis.attribution import CALL_STALL, HOST_PROBE_BUCKET_NS, Attribution, CauseTime
from stallhound.analysis.common import UNSEEN, Scope, ms
from stallhound.model.sql_files import sql_beside

UNEXPLAINED = ("host_untraced", "queued")  # causes that name nothing the host did (pageable_copy, small_copy:
# memory_transfers')
CAPTURE = ("to see what the host did, capture CPU samples with call stacks (nsys `-s cpu --cudabacktrace=all`, or "
           "torch.profiler with `with_stack=True`)")
IN_BUBBLES = (*UNEXPLAINED, "init", CALL_STALL)  # what gpu-bubbles takes (init: where it recurs, idle_causes)
STALL_CAPTURE = ("to see inside the call, capture its CUDA and OS-runtime calls with CPU samples and call stacks, nsys "
                 "`-t cuda,osrt -s cpu --cudabacktrace=all`")
MOSTLY = 0.5  # a share of the bubble above half is most of it
QUEUED = "queued"  # the tag of a bubble mostly queued: the fix looks for what the device waited on (book gpu-bubbles)
SQL = sql_beside(__package__, "idle_bubbles.sql")
Interval = tuple[int, int]


@dataclass(frozen=True)
class HostSeen:
    """What the launching process was inside during a device's wholly unexplained gaps: the union of it all (seen_ns),
    and the activity (a CUDA call's or a range's name) whose calls or ranges overlap them the most, with that time."""
    seen_ns: int = 0
    top: str = ""
    top_ns: int = 0


def _union_ns(spans: list[Interval]) -> int:
    total, reach = 0, None
    for s, e in sorted(spans):
        if reach is None or s >= reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def _pieces(attr: Attribution, scope: Scope) -> list[tuple[int, int, int, int, bool]]:
    """(device, pid, start, end, at_edge) of the UNEXPLAINED pieces of the long gaps whose thread is known, but for
    the gaps that are a claimed cause's longest on their device: one-time setup may take such a gap whole
    (idle_causes._one_time), and the bubble then leaves its rest out, so what the host did there is not its."""
    setup = {gap_id for d in attr.devices.values() for cause, (gap_id, _) in d.longest_gap.items()
             if cause not in UNEXPLAINED}
    out = []
    for g in (g for g in attr.long_gaps if g.gap_id not in setup):
        at = g.start_ns
        for cause, ns in g.pieces():
            if cause in UNEXPLAINED and ns > 0 and g.pid is not None:
                out.append((g.device, g.pid, at, at + ns, g.at_edge(scope)))
            at += ns
    return out


LAUNCHES_SQL = """SELECT pid, tid, start_ns FROM cuda_api WHERE kind IN ('launch', 'graph', 'memcpy', 'memset')
  AND pid IN (SELECT unnest($pids)) ORDER BY pid, tid, start_ns"""  # the calls that put work on a device


def _launched(con: duckdb.DuckDBPyConnection, pids: set[int]) -> Callable[[int, int, int, int], bool]:
    """Whether a thread launched GPU work (a launch, copy or memset call began) in [start, end)."""
    got = con.execute(LAUNCHES_SQL, {"pids": sorted(pids)}).fetchnumpy()
    starts: dict[tuple[int, int], np.ndarray] = {}
    for key in {(int(p), int(t)) for p, t in zip(got["pid"], got["tid"], strict=True)}:
        starts[key] = got["start_ns"][(got["pid"] == key[0]) & (got["tid"] == key[1])]
    def launched(pid: int, tid: int, start: int, end: int) -> bool:
        at = starts.get((pid, tid), np.empty(0, np.int64))
        i = np.searchsorted(at, start)
        return bool(i < len(at) and at[i] < end)
    return launched


def host_seen(con: duckdb.DuckDBPyConnection, scope: Scope, attr: Attribution) -> dict[tuple[int, bool], HostSeen]:
    """Per (device, edges included): what its launching process was inside during its unexplained pieces (the
    pieces at the window's edges counted only with edges included; a device absent: nothing seen)."""
    pieces = _pieces(attr, scope)
    if not pieces:
        return {}
    devices, pids, starts, ends, edges = (list(c) for c in zip(*pieces, strict=True))
    rows = con.execute(SQL, {"devices": devices, "pids": pids, "starts": starts, "ends": ends, "edges": edges,
                             "bucket_ns": HOST_PROBE_BUCKET_NS}).fetchall()
    launched = _launched(con, set(pids)) if any(r[2] == "range" for r in rows) else None
    spans = [(d, edge, f"CUDA call {name}" if what == "call" else f"range {name}", s, e)
             for d, edge, what, pid, tid, name, ev_s, ev_e, s, e in rows
             if what == "call" or not (launched and launched(pid, tid, ev_s, ev_e))]
    out = {}
    for device in set(devices):
        for with_edges in (False, True):
            by_name: dict[str, list[Interval]] = defaultdict(list)
            for _, _, name, s, e in (x for x in spans if x[0] == device and (with_edges or not x[1])):
                by_name[name].append((s, e))
            if by_name:
                top, top_spans = max(by_name.items(), key=lambda kv: (_union_ns(kv[1]), kv[0]))
                every = [span for named in by_name.values() for span in named]
                out[device, with_edges] = HostSeen(_union_ns(every), top, _union_ns(top_spans))
    return out


def words(ns: int, waits_ns: int, queued_ns: int, seen: HostSeen,
          stall: CauseTime | None = None) -> tuple[str, dict, list[str]]:
    """What the bubble's title says was seen on the host in its `ns` (waits_ns of it in OS waits of the launching
    thread, queued_ns in gaps whose next work was queued, stall's in copy calls stalled past their transfers), its
    evidence and tags; the seen times clipped to ns (a one-time cost or a collection pause took part)."""
    stall_ns = min(stall.ns, ns) if stall else 0
    waits_ns = min(waits_ns, ns - stall_ns)
    seen_ns, top_ns = min(seen.seen_ns, ns - waits_ns - stall_ns), min(seen.top_ns, ns - waits_ns - stall_ns)
    parts = ([f"{ms(waits_ns)} of it with the launching thread in OS waits (futex, poll, read, ...), on what the "
              "trace does not show: no data loader is seen"] if waits_ns else [])
    if seen_ns:
        parts.append(f"{ms(seen_ns)} of it{' more' if waits_ns else ''} with a thread of the launching process inside "
                     "a CUDA call or a range that launched no GPU work; the most, in all its calls or ranges: "
                     f"{seen.top}, {ms(top_ns)}")
    elif not (waits_ns or stall_ns):
        parts.append(f"nothing of the launching process seen on the host: {CAPTURE}")
    parts += [_stalled(stall, stall_ns)] if stall and stall_ns else []
    queued_ns = min(queued_ns, ns)
    queued = queued_ns >= MOSTLY * ns
    if queued:
        parts.append(f"{ms(queued_ns)} of it before work already queued: the device waited on something the trace "
                     "does not show (an event of another stream, another process or rank), not on the host")
    evidence = {"host_seen_ns": seen_ns, **({"host_top": seen.top, "host_top_ns": top_ns} if seen_ns else {}),
                **({"queued_ns": queued_ns} if queued else {}),
                **({"stall_ns": stall_ns, "stall_calls": stall.calls} if stall and stall_ns else {})}
    unseen = not (waits_ns or seen_ns or stall_ns) or (queued and waits_ns + seen_ns + stall_ns < MOSTLY * ns)
    return "; ".join(parts), evidence, [*([UNSEEN] if unseen else []), *([QUEUED] if queued else [])]


def _stalled(stall: CauseTime, ns: int) -> str:
    """The stalled copy calls' part of a bubble: how many, which API, and that the trace cannot show why."""
    api, one = stall.api or "copy", stall.calls == 1
    calls = (f"once, inside one {api} call past the time its" if one
             else f"inside {stall.calls:,} {api} calls past the time their")
    return (f"{ms(ns)} of it with the launching thread stalled {calls} "
            "transfer takes, launching and moving nothing; what held it there, the driver's work at a first use, "
            f"faults on untouched memory or a lock, the trace cannot show: {STALL_CAPTURE}")
