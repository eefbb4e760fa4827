"""Call sites: events grouped by the frame of their stack where the user's code made them.

A stack's site is its first user frame: the innermost frame with no layer (formats.frames marks the profiler,
CUDA, the C/C++ runtime, the Python interpreter and PyTorch). A stack with no user frame (a Python program
captured without Python frames, where every native frame is a library's) falls back, innermost first, to a
PyTorch frame, then a runtime or interpreter frame, then any frame: the frame nearest the user that the stack
has, never a dropped event. Its `user_frame` says which it was. A symbol nsys did not resolve stays its module
and address.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

# Preference of a frame as a call site, lower first: the user's code, PyTorch, the runtime or interpreter,
# then the CUDA stack and profiler (its depth breaks ties: innermost first).
RANK_SQL = ("CASE WHEN layer IS NULL THEN 0 WHEN layer = 'framework' THEN 1 "
            "WHEN layer IN ('system', 'interpreter') THEN 2 ELSE 3 END")
MAX_DEPTH = 1_000_000  # deeper than any recorded stack: rank * MAX_DEPTH + depth orders by rank, then depth

# The sites of `events(stack_id, time_ns)` (a CTE the caller puts first), largest first, each with the frame it
# called (the next inner one: Kineto records a Python function's first line, so its callee says which call), one row
# per site and callee ({callee} = callee, {group} = ', callee') or per site with its largest callee ({callee} =
# BIGGEST_CALLEE, {group} empty); events without a stack are left to the caller's coverage. Binds $limit.
SITES_SQL = f"""
site_of AS (
  SELECT stack_id, arg_min({{{{'function': function, 'module': module, 'line': line, 'layer': layer,
                             'resolved': resolved, 'depth': depth}}}}, ({RANK_SQL}) * {MAX_DEPTH} + depth) AS site
  FROM stacks WHERE stack_id IN (SELECT stack_id FROM events) GROUP BY stack_id),
per_stack AS (
  SELECT e.stack_id, s.site, c.function AS callee, count(*) AS n, sum(e.time_ns) AS time_ns
  FROM events e JOIN site_of s USING (stack_id)
  LEFT JOIN stacks c ON c.stack_id = e.stack_id AND c.depth = s.site.depth - 1 GROUP BY ALL),
per_callee AS (
  SELECT site, callee, sum(n) AS n, sum(time_ns) AS time_ns, arg_max(stack_id, n) AS stack_id FROM per_stack
  GROUP BY site, callee)
SELECT site.function, site.module, site.line, site.layer, site.resolved, {{callee}} AS callee, sum(n) AS events,
       sum(time_ns) AS time_ns, arg_max(stack_id, n) AS stack_id
FROM per_callee GROUP BY site.function, site.module, site.line, site.layer, site.resolved{{group}}
ORDER BY time_ns DESC NULLS LAST, events DESC, site.function, site.module, callee LIMIT $limit"""
BIGGEST_CALLEE = "arg_max_null(callee, coalesce(time_ns, n))"  # by time, by count for samples (no time)

# Over a CTE `chosen(stack_id, time_ns)`, one row per event of a set: the events with a stack (what SITES_SQL reads),
# and the coverage (events, those with a stack, their time).
EVENTS = "events AS (SELECT * FROM chosen WHERE stack_id IS NOT NULL)"
COVERAGE = "SELECT count(*), count(stack_id), sum(time_ns) FILTER (WHERE stack_id IS NOT NULL) FROM chosen"

FRAMES_SQL = """SELECT depth, function, module, line, layer, resolved FROM stacks WHERE stack_id = $stack
ORDER BY depth"""


@dataclass(frozen=True)
class Frame:
    function: str | None
    module: str | None
    line: int | None
    layer: str | None
    resolved: bool


def where(frame: Frame) -> str:
    """A frame in one phrase: `function` in file:line, or in the module's file name; an unresolved symbol as
    module@address."""
    module = frame.module.rsplit("/", 1)[-1] if frame.module else None
    if not frame.resolved:
        return f"{module or '?'}@{frame.function}"
    place = f"{module}:{frame.line}" if module and frame.line is not None else module
    return f"`{frame.function}` in {place}" if place else f"`{frame.function}`"


def sites(con: duckdb.DuckDBPyConnection, events: str, args: dict[str, object], limit: int,
          by_callee: bool = True) -> list[tuple]:
    """(frame, the function it called or None, events, time_ns or None, its most frequent stack_id) for the top
    `limit` + 1 sites of `events`, a CTE text `events AS (...)` over the bound `args`; by_callee: a site per frame
    and callee, else per frame, with the callee of most of its time (of most of its events when they have none)."""
    sql = SITES_SQL.format(callee="callee", group=", callee") if by_callee else SITES_SQL.format(
        callee=BIGGEST_CALLEE, group="")
    rows = con.execute(f"WITH {events},\n{sql}", {**args, "limit": limit + 1}).fetchall()
    return [(Frame(*row[:5]), *row[5:]) for row in rows]


def stack(con: duckdb.DuckDBPyConnection, stack_id: int) -> list[Frame]:
    """The frames of one stack, innermost first."""
    return [Frame(*row[1:]) for row in con.execute(FRAMES_SQL, {"stack": stack_id}).fetchall()]
