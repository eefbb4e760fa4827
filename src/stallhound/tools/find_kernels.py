"""Where and when did a given kernel run, who launched it, and under which NVTX ranges?

Matches kernels whose demangled or short name contains `pattern` (case-insensitive), or, with
regex=true, matches the RE2 regular expression (case-insensitive), among kernels on the chosen devices
whose start lies in the window (default: whole capture). Each instance: GPU start/end/duration_ns,
device, stream, launching pid/tid, grid/block, launch API, and nvtx_path = the push/pop NVTX ranges open
on the launching thread when the launch call started (outermost first, joined with ' > '; null when the
launch call was not traced, empty when no range was open). count/total_ns/mean_ns/min_ns/max_ns cover
ALL matches, not just the rows returned.
"""

from __future__ import annotations

from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import (
    DEFAULT_LIMIT,
    LimitParam,
    OffsetParam,
    Paged,
    Scope,
    ScopedParams,
    fetch_capped,
    more_rows,
    ms,
    next_page,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.kernel_kinds import NAME_CHARS
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest

NAME_LIMIT = 10  # distinct matched names listed: enough to see whether the pattern was too broad
PATH_CHARS = 300  # deep NVTX stacks: keep the innermost end of the path, which names the op


class Params(ScopedParams):
    pattern: Annotated[str, Field(description="Text to look for in kernel names (case-insensitive), e.g. "
                                              "'gemm' or 'flash_fwd'", min_length=1, max_length=500)]
    regex: Annotated[bool, Field(description="Treat pattern as a regular expression (RE2 syntax, "
                                             "case-insensitive) instead of plain text")] = False
    order: Annotated[Literal["time", "duration"], Field(
        description="time: chronological; duration: longest first")] = "time"
    limit: LimitParam = DEFAULT_LIMIT
    offset: OffsetParam = 0


class KernelInstance(BaseModel):
    name: str = Field(description="short name")
    start_ns: int
    end_ns: int
    duration_ns: int
    device: int
    stream: int | None
    pid: int | None
    tid: int | None
    grid: list[int | None] = Field(description="[x, y, z]")
    block: list[int | None] = Field(description="[x, y, z]")
    launch_api: str | None
    launch_start_ns: int | None
    nvtx_path: str | None


class MatchedName(BaseModel):
    name: str = Field(description=f"demangled name, cut at {NAME_CHARS} characters")
    count: int
    total_ns: int


class Result(Paged):
    scope: Scope
    pattern: str
    regex: bool
    count: int = Field(description="matching kernel executions in scope")
    total_ns: int
    mean_ns: float
    min_ns: int | None
    max_ns: int | None
    matched_names: list[MatchedName] = Field(description=f"at most {NAME_LIMIT}, most total time first")
    distinct_names: int
    rows: list[KernelInstance]
    truncated: bool
    total_rows: int = Field(description="matching instances before the limit (= count)")
    note: str | None = None


# Names are matched once per distinct name (the filter sits on an aggregate, so it cannot be pushed
# down to every kernel row, where a regex per kernel row would cost far more), then kernels by name.
KEYS_SQL = """
SELECT list(key ORDER BY key) FROM (
  SELECT coalesce(name, short_name) AS key, any_value(short_name) AS short FROM kernels GROUP BY 1)
WHERE CASE WHEN $regex THEN regexp_matches(coalesce(key, ''), $pattern, 'i')
                            OR regexp_matches(coalesce(short, ''), $pattern, 'i')
           ELSE contains(lower(coalesce(key, '')), lower($pattern)) OR contains(lower(coalesce(short, '')),
                                                                              lower($pattern)) END
"""

MATCH = """
m AS (
  SELECT * FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end
    AND coalesce(name, short_name) IN (SELECT unnest($keys)))
"""

NAMES_SQL = "WITH " + MATCH + """
SELECT left(coalesce(name, short_name, '(unnamed)'), $chars) AS n, count(*), sum(duration_ns),
       count(*) OVER (), sum(count(*)) OVER (), sum(sum(duration_ns)) OVER (), min(min(duration_ns)) OVER (),
       max(max(duration_ns)) OVER ()
FROM m GROUP BY coalesce(name, short_name, '(unnamed)') ORDER BY 3 DESC, 1 LIMIT $names
"""

# The capped rows first, then one range join to the push/pop NVTX ranges of their launching threads.
ROWS_SQL = "WITH " + MATCH + """,
top AS (
  SELECT row_number() OVER (ORDER BY o, start_ns, device_id, stream_id) AS rn, * FROM (
    SELECT CASE WHEN $by_duration THEN -duration_ns END AS o, * FROM m
    ORDER BY o, start_ns, device_id, stream_id LIMIT $limit OFFSET $offset)),
paths AS (
  SELECT t.rn, string_agg(coalesce(n.text, '(unnamed)'), ' > ' ORDER BY n.depth, n.start_ns) AS path
  FROM top t JOIN nvtx n ON n.pid = t.pid AND n.tid = t.tid AND n.kind = 'push_pop'
    AND n.start_ns <= t.launch_start_ns AND (n.end_ns > t.launch_start_ns OR n.end_ns IS NULL)
  GROUP BY t.rn)
SELECT t.short_name, t.start_ns, t.end_ns, t.duration_ns, t.device_id, t.stream_id, t.pid, t.tid,
       t.grid_x, t.grid_y, t.grid_z, t.block_x, t.block_y, t.block_z, t.launch_api, t.launch_start_ns,
       CASE WHEN length(p.path) > $path_chars THEN '...' || right(p.path, $path_chars - 3) ELSE p.path END
FROM top t LEFT JOIN paths p USING (rn) ORDER BY t.rn LIMIT $limit
"""


def _check_regex(con: duckdb.DuckDBPyConnection, pattern: str) -> None:
    try:
        con.execute("SELECT regexp_matches('', $pattern)", {"pattern": pattern}).fetchall()
    except duckdb.InvalidInputException as err:
        problem = str(err).split("Error: ", 1)[-1]
        raise InvalidRequest(f"pattern {pattern!r} is not a valid RE2 regular expression ({problem}); fix it, "
                             "or pass regex=false to search for the plain text") from err


def _instance(r: tuple) -> KernelInstance:
    path = r[16] if r[16] is not None or r[15] is None else ""  # launch traced, no range open
    return KernelInstance(name=r[0] or "(unnamed)", start_ns=r[1], end_ns=r[2], duration_ns=r[3], device=r[4],
                          stream=r[5], pid=r[6], tid=r[7], grid=list(r[8:11]), block=list(r[11:14]),
                          launch_api=r[14], launch_start_ns=r[15], nvtx_path=path)


def _note(con: duckdb.DuckDBPyConnection, params: Params, count: int) -> str | None:
    if count == 0:
        return (f"no kernel name {'matches' if params.regex else 'contains'} {params.pattern!r} in this scope; "
                "top_kernels lists the names present")
    has_nvtx = con.execute("SELECT present FROM capabilities WHERE data = 'nvtx'").fetchone()
    if not (has_nvtx and has_nvtx[0]):
        return ("the profile has no NVTX ranges, so nvtx_path is empty; capture with "
                f"{remedy(con, ('nvtx',), bare=True)} to get them")
    return None


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    if params.regex:
        _check_regex(con, params.pattern)
    found = one_row(con.execute(KEYS_SQL, {"pattern": params.pattern, "regex": params.regex}))
    keys = found[0] or []
    args = {**scope_args(scope), "keys": keys}
    names = con.execute(NAMES_SQL, {**args, "chars": NAME_CHARS, "names": NAME_LIMIT}).fetchall()
    distinct, count, total, low, high = names[0][3:8] if names else (0, 0, 0, None, None)
    rows, truncated = fetch_capped(con, ROWS_SQL, {**args, "by_duration": params.order == "duration",
                                                   "path_chars": PATH_CHARS, "offset": params.offset}, params.limit)
    instances = [_instance(r) for r in rows]
    return Result(scope=scope, pattern=params.pattern, regex=params.regex, count=int(count), total_ns=int(total),
                  mean_ns=round(total / count, 1) if count else 0.0, min_ns=low, max_ns=high,
                  matched_names=[MatchedName(name=n[0], count=n[1], total_ns=int(n[2])) for n in names],
                  distinct_names=distinct, rows=instances, truncated=truncated, total_rows=int(count),
                  offset=params.offset, next_offset=next_page(params.offset, len(instances), truncated),
                  note=_note(con, params, int(count)))


def render(result: Result) -> str:
    kind = "regex" if result.regex else "text"
    lines = [f"{result.count:,} kernels match {kind} {result.pattern!r} on device(s) {result.scope.devices}: "
             f"total {ms(result.total_ns)}, mean {ms(result.mean_ns)}, min {ms(result.min_ns)}, "
             f"max {ms(result.max_ns)}; {result.distinct_names} distinct names"]
    if result.note:
        lines.append(f"NOTE: {result.note}")
    lines.extend(f"  name x{n.count:,} {ms(n.total_ns)}: {n.name[:100]}" for n in result.matched_names[:3])
    for r in result.rows:
        lines.append(f"{r.start_ns} +{ms(r.duration_ns)} dev {r.device} stream {r.stream} tid {r.tid} "
                     f"grid {r.grid} block {r.block} {r.name[:60]}"
                     + (f"  [{r.nvtx_path[:120]}]" if r.nvtx_path else ""))
    if result.truncated:
        lines.extend(more_rows(result, result.rows_after(result.total_rows), "instances",
                               "raise `limit` or narrow the window/pattern"))
    return "\n".join(lines)
