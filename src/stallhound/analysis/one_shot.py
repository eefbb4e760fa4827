"""Does the program run its GPU work once? A one-shot program (a test, a single solve, a benchmark of one launch)
repeats nothing: step_boundaries finds no step over the capture (no step range, no CUDA graph replays, no marker
kernel), and on the device no kernel name runs MIN_REPEATS times or more (one_shot.sql). Its one-time setup (context
creation, module loading, first allocations) is then no warmup that a later window could leave out: it is the
program's own start-up cost, paid again on every run (book profiler-window-on-warmup, tag ONE_SHOT).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from stallhound.analysis.common import Scope, ScopedParams, counted, resolve_scope
from stallhound.analysis.step_boundaries import MIN_REPEATS, boundaries
from stallhound.model.sql_files import sql_beside

ONE_SHOT = "one-shot"  # the tag of a one-time setup finding in a program that repeats nothing
ONE_SHOT_SQL = sql_beside(__package__, "one_shot.sql")


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


def on_devices(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[int, OneShot]:
    """Per device in scope that ran kernels, none of them MIN_REPEATS times, in a capture without steps."""
    if not scope.devices:
        return {}
    rows = con.execute(ONE_SHOT_SQL, {"devices": scope.devices}).fetchall()
    once = {device: OneShot(kernels, names, most) for device, kernels, names, most in rows if most < MIN_REPEATS}
    if not once:  # kernels repeat: the step search over the capture (the dearer test) is not needed
        return {}
    capture = resolve_scope(con, ScopedParams(profile=scope.profile))
    return {} if boundaries(con, capture, None, "auto")[3] else once
