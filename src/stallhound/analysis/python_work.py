"""Where in the code the host's Python work held a device idle (host_python: the launching thread inside Python frames
that launched no GPU work, python_frames), said as the frame the user can act on.

For each host_python piece of a long gap, the deepest frame of the gap's thread that covers MOSTLY of the piece names
it: the frames of a thread nest, so those covering most of one piece are one chain, whose deepest is the most
specific code that held the device idle (the pipeline's preprocess, not its caller's __call__; outer frames that
launched GPU work never reach python_frames). A piece no one frame covers most of (many short calls) names none. Per
device, the frame named over the most time, with its own time in those pieces (never more than the frame ran).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import duckdb

from stallhound.analysis.attribution import Attribution
from stallhound.analysis.common import ms

CAUSE = "host_python"
MOSTLY = 0.5  # a frame over half a piece is what the piece was spent in

FRAMES_SQL = """SELECT pid, tid, start_ns, end_ns, depth, function, file, line FROM python_frames
WHERE pid = $pid AND tid = $tid AND start_ns < $end AND end_ns > $start"""


@dataclass(frozen=True)
class PythonWhere:
    """The frame that held a device idle the longest: its function, file and first line, and that time."""
    function: str
    file: str | None
    line: int | None
    ns: int



def part(ns: int, top: PythonWhere | None) -> str:
    """cpu-bottleneck's words for its host_python time, with the frame that held the device idle the longest."""
    at = f" at {top.file}:{top.line}" if top and top.file else ""
    most = f" (the most in {top.function}{at}, {ms(top.ns)})" if top else ""
    return f"in Python code that launched no GPU work {ms(ns)}{most}"


Frame = tuple[str, str | None, int | None]  # function, file, line


def _deepest(con: duckdb.DuckDBPyConnection, pid: int, tid: int, start: int, end: int) -> tuple[Frame, int] | None:
    """((function, file, line), its ns in [start, end)) of the deepest frame covering MOSTLY of it; None: none does."""
    frames = con.execute(FRAMES_SQL, {"pid": pid, "tid": tid, "start": start, "end": end}).fetchall()
    covering = [(min(f[3], end) - max(f[2], start), f) for f in frames]
    covering = [(ns, f) for ns, f in covering if ns >= MOSTLY * (end - start)]
    if not covering:
        return None
    ns, best = max(covering, key=lambda c: (c[1][4], -c[0]))
    return (best[5], best[6], best[7]), ns


def where(con: duckdb.DuckDBPyConnection, attr: Attribution) -> dict[int, PythonWhere]:
    """Per device with host_python pieces in its long gaps: the frame that covers the most of them."""
    by_frame: dict[int, dict[Frame, int]] = defaultdict(lambda: defaultdict(int))
    for g in attr.long_gaps:
        at, pid, tid = g.start_ns, g.pid, g.tid
        for cause, ns in g.pieces():
            if (cause == CAUSE and ns > 0 and pid is not None and tid is not None
                    and (named := _deepest(con, pid, tid, at, at + ns)) is not None):
                by_frame[g.device][named[0]] += named[1]
            at += ns
    tops = {device: max(frames.items(), key=lambda kv: (kv[1], str(kv[0]))) for device, frames in by_frame.items()}
    return {device: PythonWhere(function, file, line, ns) for device, ((function, file, line), ns) in tops.items()}
