"""Does every step of the loop run the same kernels? The evidence that a step can be captured once as a CUDA graph and
replayed (book small-kernel-overhead): the steps step_boundaries finds over the capture (the ones iterations shows)
whose middle lies in the window, and per device the kernels each step runs, by stream in start order
(step_kernels.sql). A device qualifies when MIN_STEPS steps or more lie in the window, every one of them ran kernels on
it, and all ran one sequence of kernel names: the same launches in the same order, step after step. A step whose
kernels vary (another shape, a data-dependent branch, an extra kernel every few steps) does not: a graph replays
only what it captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from stallhound.analysis.common import Scope, ScopedParams, resolve_scope
from stallhound.analysis.step_boundaries import MIN_REPEATS, boundaries
from stallhound.model.sql_files import sql_beside

MIN_STEPS = MIN_REPEATS  # fewer steps in the window cannot show that every step repeats the others
MIN_GRAPH_KERNELS = 2  # a graph of one kernel replaces one launch with one replay: it saves nothing
STEP_KERNELS_SQL = sql_beside(__package__, "step_kernels.sql")


@dataclass(frozen=True)
class SameSteps:
    """On one device: `steps` steps in the window, each running the same sequence of `kernels` kernels."""
    steps: int
    kernels: int


def steps_in(con: duckdb.DuckDBPyConnection, scope: Scope) -> list[tuple[int, int]]:
    """The steps found over the capture (as iterations finds them, once per model) whose middle lies in the window."""
    capture = resolve_scope(con, ScopedParams(profile=scope.profile))
    spans = boundaries(con, capture, None, "auto")[3]
    return [(s, e) for s, e in spans if scope.start_ns <= (s + e) // 2 < scope.end_ns]


def same_steps(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[int, SameSteps]:
    """Per device in scope whose steps in the window all run one sequence of MIN_GRAPH_KERNELS kernels or more: the
    steps and kernels per step (what a CUDA graph replay per step could replace)."""
    found = repeated(con, steps_in(con, scope), scope.devices)
    return {device: same for device, same in found.items() if same.kernels >= MIN_GRAPH_KERNELS}


def repeated(con: duckdb.DuckDBPyConnection, steps: list[tuple[int, int]], devices: list[int]) -> dict[int, SameSteps]:
    """Per device of `devices` on which every one of `steps` (MIN_STEPS or more, in time order) ran kernels, all the
    same sequence (step_kernels.sql)."""
    if len(steps) < MIN_STEPS or not devices:
        return {}
    rows = con.execute(STEP_KERNELS_SQL, {"starts": [s for s, _ in steps], "ends": [e for _, e in steps],
                                          "devices": devices}).fetchall()
    return {device: SameSteps(ran, kernels) for device, ran, sequences, kernels in rows
            if ran == len(steps) and sequences == 1}
