"""Does the program run its GPU work once? A one-shot program (a test, a single solve, a benchmark of one launch)
repeats nothing: step_boundaries finds no step over the capture (no step range, no CUDA graph replays, no marker
kernel), and on the device no kernel name runs MIN_REPEATS times or more (one_shot.sql). Its one-time setup (context
creation, module loading, first allocations) is then no warmup that a later window could leave out: it is the
program's own start-up cost, paid again on every run (book profiler-window-on-warmup, tag ONE_SHOT). Unless the
capture is a fragment of a longer run (Fragment): CUDA calls are numbered by their correlation id from the process's
start, so a first id far above the ids the capture holds shows the calls that came before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from stallhound.analysis.common import Scope, ScopedParams, counted, resolve_scope
from stallhound.analysis.step_boundaries import MIN_REPEATS, boundaries
from stallhound.model.sql_files import sql_beside

ONE_SHOT = "one-shot"  # the tag of a one-time setup finding in a program that repeats nothing
ONE_SHOT_SQL = sql_beside(__package__, "one_shot.sql")
FRAGMENT_MIN_PRIOR_IDS = 10_000  # a program's start-up takes tens to hundreds of ids before its first recorded call
# (driver calls take ids too: 409 before extrap_exgpu's first, 116 before hta_rocm_mi250's); ten thousand is a run
FRAGMENT_PRIOR_RATIO = 100  # ...and a hundred times the ids the capture spans: a long capture of a whole run can
# begin at a high id only by far fewer calls than it holds
FRAGMENT_SQL = """
SELECT min(first_id), sum(calls), bool_and(first_id - 1 >= $min_prior
                                           AND first_id - 1 >= $ratio * (last_id - first_id + 1))
FROM (SELECT pid, min(correlation_id) AS first_id, max(correlation_id) AS last_id, count(*) AS calls
      FROM cuda_api WHERE correlation_id > 0 GROUP BY pid)
"""


@dataclass(frozen=True)
class Fragment:
    """The capture began mid-run: the first recorded CUDA call has id `first_id`, `calls` calls were recorded."""
    first_id: int
    calls: int

    def words(self) -> str:
        """'the capture is a fragment of a longer run (...)': what the setup in its window is not."""
        return (f"the capture is a fragment of a longer run (its first CUDA call has correlation id {self.first_id:,},"
                f" and {counted(self.calls, 'call')} recorded: the process made CUDA calls before the capture began), "
                "so this is not the program's start-up: a window over its steady state leaves it out")


def fragment(con: duckdb.DuckDBPyConnection) -> Fragment | None:
    """The capture's first CUDA call and its calls when every process's first id lies far past the ids it spans."""
    first, calls, mid_run = con.execute(FRAGMENT_SQL, {"min_prior": FRAGMENT_MIN_PRIOR_IDS,
                                                       "ratio": FRAGMENT_PRIOR_RATIO}).fetchone() or (None, 0, None)
    return Fragment(first, calls) if mid_run else None


@dataclass(frozen=True)
class OneShot:
    """On one device: `kernels` kernels of `names` names over the capture, none run MIN_REPEATS times, no steps."""
    kernels: int
    names: int
    most_runs: int

    def words(self) -> str:
        """'the program repeats nothing (2 kernels, each run once; no steps): ...'."""
        kernels = counted(self.kernels, "kernel")
        ran = (f"{kernels}, {'each ' if self.kernels > 1 else ''}run once" if self.most_runs == 1 else
               f"{kernels} of {counted(self.names, 'name')}, none run more than {counted(self.most_runs, 'time')}")
        return (f"the program repeats nothing ({ran}; no steps), so no steady state exists to capture: this is its "
                "own start-up cost, paid on every run")


def on_devices(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[int, OneShot | Fragment]:
    """Per device in scope that ran kernels, none of them MIN_REPEATS times, in a capture without steps; in a capture
    that began mid-run (fragment), which shows no start of the program at all, its Fragment on those devices."""
    if not scope.devices:
        return {}
    rows = con.execute(ONE_SHOT_SQL, {"devices": scope.devices}).fetchall()
    once: dict[int, OneShot | Fragment] = {device: OneShot(kernels, names, most) for device, kernels, names, most
                                           in rows if most < MIN_REPEATS}
    if not once:  # kernels repeat: the step search over the capture (the dearer test) is not needed
        return {}
    if mid_run := fragment(con):
        return {device: mid_run for device in once}
    capture = resolve_scope(con, ScopedParams(profile=scope.profile))
    return {} if boundaries(con, capture, None, "auto")[3] else once
