"""The stacks of a Kineto trace: its python_function events (with_stack=True), staged as _k_py, as the model's
deduplicated `stacks`, and each CUDA API call's stack (_k_api_stack), for the CUDA_API mapping to join.

A frame's stack is its path to its outermost frame through 'Python parent id'. A call's stack is that of the
innermost frame open on its thread when it starts: the frames of one thread nest, so a sweep over their opens and
closes in time order (a close making the frame's parent the open one) finds it. Frames of no duration contain no
call and are left out. Names are 'file.py(line): function' or a built-in's '<built-in method x of y object at
0x...>', whose address is dropped so that one built-in is one frame.

The frames are also the thread's timed host work (python_frames), where no CUDA call or operator shows what the host
did (a pipeline's preprocessing, decoding, tokenizing): those of threads that launch GPU work, that launched none
themselves (a frame around a launch holds the GPU work, it does not keep it waiting: the outer frames of a program
hold all of it), and of PY_FRAME_MIN_NS or more, the longest MAX_PY_FRAMES of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stallhound.formats.frames import STDLIB_MODULES, python_layer_sql
from stallhound.model.duck import one_row
from stallhound.model.schema import ddl

if TYPE_CHECKING:
    from stallhound.formats.build_steps import BuildSteps

# Staged python_function rows, in the column order of kineto_read.python_row.
COLUMNS = (("pid", "BIGINT"), ("tid", "BIGINT"), ("python_id", "BIGINT"), ("parent_id", "BIGINT"),
           ("name", "VARCHAR"), ("start_ns", "BIGINT"), ("end_ns", "BIGINT"))
HELPERS = ("_k_frames", "_k_paths", "_k_api_frame", "_k_stack_keys", "_k_api_stack")
NAME = r"^(.*)\((\d+)\): (.*)$"  # file.py(line): function
# A frame explains host idle when it covers half a gap the host did not spend in one operation's overhead
# (analysis.attribution: OP_OVERHEAD_MAX_NS 0.5 ms, DOMINANT_SHARE): shorter frames never do.
PY_FRAME_MIN_NS = 250_000
MAX_PY_FRAMES = 100_000  # the model's bound: a long with_stack capture records millions of frames, few this long
LAUNCH_KINDS = ("launch", "graph", "memcpy", "memset")  # cuda_api kinds that put work on a device

FRAMES = r"""CREATE TABLE _k_frames AS SELECT pid, tid, python_id, parent_id, start_ns, end_ns,
    regexp_replace(name, ' at 0x[0-9a-fA-F]+>$', '>') AS name FROM _k_py WHERE end_ns > start_ns"""

# Every frame's path, innermost first, walked down from the frames whose parent is not in the trace.
PATHS = """CREATE TABLE _k_paths AS WITH RECURSIVE paths(pid, python_id, frames) AS (
  SELECT pid, python_id, [name] FROM _k_frames f
  WHERE NOT EXISTS (SELECT 1 FROM _k_frames p WHERE p.pid = f.pid AND p.python_id = f.parent_id)
  UNION ALL
  SELECT c.pid, c.python_id, list_prepend(c.name, p.frames) FROM _k_frames c
  JOIN paths p ON c.pid = p.pid AND c.parent_id = p.python_id)
SELECT * FROM paths"""

# At one time: closes first (inner, later-starting, first), then opens (outer, later-ending, first), then calls.
API_FRAME = """CREATE TABLE _k_api_frame AS WITH marks AS (
  SELECT pid, tid, start_ns AS t, 1 AS ord, -end_ns AS tie, python_id AS open, NULL::BIGINT AS rid FROM _k_frames
  UNION ALL SELECT pid, tid, end_ns, 0, -start_ns, coalesce(parent_id, -1), NULL FROM _k_frames
  UNION ALL SELECT pid, tid, start_ns, 2, 0, NULL, rowid FROM _k_host WHERE kind = 'api')
SELECT rid, pid, python_id FROM (
  SELECT rid, pid, last_value(open IGNORE NULLS) OVER (PARTITION BY pid, tid ORDER BY t, ord, tie
                                                       ROWS UNBOUNDED PRECEDING) AS python_id FROM marks)
WHERE rid IS NOT NULL AND python_id <> -1"""

STACK_KEYS = """CREATE TABLE _k_stack_keys AS SELECT frames, row_number() OVER (ORDER BY frames) AS stack_id
FROM (SELECT DISTINCT p.frames FROM _k_api_frame a JOIN _k_paths p USING (pid, python_id))"""

API_STACK = """CREATE TABLE _k_api_stack AS SELECT a.rid, k.stack_id FROM _k_api_frame a
JOIN _k_paths p USING (pid, python_id) JOIN _k_stack_keys k USING (frames)"""

STACKS = f"""INSERT INTO stacks SELECT stack_id, depth, coalesce(nullif(regexp_extract(name, '{NAME}', 3), ''), name),
    file, TRY_CAST(nullif(regexp_extract(name, '{NAME}', 2), '') AS INTEGER), 'python', true, NULL,
    {python_layer_sql('file')}
FROM (SELECT *, nullif(regexp_extract(name, '{NAME}', 1), '') AS file FROM (
      SELECT stack_id, unnest(frames) AS name, generate_subscripts(frames, 1) - 1 AS depth FROM _k_stack_keys))"""

# Each long frame with the first launch its thread began at or after its start: kept when that is past its end.
TIMED = f"""INSERT INTO python_frames SELECT pid, tid, start_ns, end_ns, depth,
    coalesce(nullif(regexp_extract(name, '{NAME}', 3), ''), name), nullif(regexp_extract(name, '{NAME}', 1), ''),
    TRY_CAST(nullif(regexp_extract(name, '{NAME}', 2), '') AS INTEGER)
FROM (SELECT f.pid, f.tid, f.start_ns, f.end_ns, f.name, len(p.frames) - 1 AS depth FROM _k_frames f
      JOIN _k_paths p USING (pid, python_id)
      ASOF LEFT JOIN (SELECT pid, tid, start_ns AS at FROM cuda_api WHERE kind IN (SELECT unnest($kinds))) l
        ON l.pid = f.pid AND l.tid = f.tid AND l.at >= f.start_ns
      WHERE f.end_ns - f.start_ns >= $min_ns AND coalesce(l.at >= f.end_ns, true)
        AND (f.pid, f.tid) IN (SELECT (pid, tid) FROM cuda_api WHERE kind IN (SELECT unnest($kinds))))
ORDER BY end_ns - start_ns DESC, start_ns LIMIT $max_frames"""


def timed(b: BuildSteps) -> None:
    """Write python_frames (after cuda_api, whose launch calls it reads; after build, whose _k_frames it reads)."""
    b.sql(ddl("python_frames"))
    if one_row(b.con.execute("SELECT count(*) FROM _k_py"))[0]:
        b.sql(TIMED, params={"kinds": list(LAUNCH_KINDS), "min_ns": PY_FRAME_MIN_NS, "max_frames": MAX_PY_FRAMES})


def build(b: BuildSteps) -> None:
    """Write `stacks` and _k_api_stack(rid: the _k_host rowid of a CUDA API call, stack_id) from _k_py."""
    b.sql(ddl("stacks"))
    if one_row(b.con.execute("SELECT count(*) FROM _k_py"))[0] == 0:  # no with_stack=True: no sweep over the calls
        b.sql("CREATE TABLE _k_api_stack (rid BIGINT, stack_id BIGINT)")
        return
    for query in (FRAMES, PATHS, API_FRAME, STACK_KEYS, API_STACK):
        b.sql(query)
    b.sql(STACKS, params={"stdlib": STDLIB_MODULES})
