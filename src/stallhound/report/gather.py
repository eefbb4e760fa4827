"""What a report shows about one profile, from the skills themselves: the timeline at report resolution, the top
kernels, triage's findings and the iterations."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from stallhound.analysis.common import MAX_LIMIT, as_result, run_once
from stallhound.tools import iterations, show_timeline, top_kernels, triage

# Columns per lane: four widths of a 2,000-pixel screen, so a 4x zoom still has a column per pixel; about 8 kB per
# lane, so even 8 devices x 6 lanes stay under half a MB.
REPORT_BUCKETS = 8_000
REPORT_SPANS = 200  # longest kernels and gaps kept exact (each): what a zoomed-in eye looks for
TOP_KERNELS = 15  # bars in the chart: beyond these the shares are small
FINDINGS = 10  # triage's costliest, as the triage command lists them


@dataclass(frozen=True)
class Side:
    label: str
    path: str
    timeline: show_timeline.Result
    kernels: top_kernels.Result
    triage: triage.Result
    iterations: iterations.Result


def gather(con: duckdb.DuckDBPyConnection, label: str, path: str) -> Side:
    """Each skill through run_once, so what the timeline and triage already computed (the iterations) is reused."""
    return Side(label=label, path=path,
                timeline=as_result(run_once(con, show_timeline, show_timeline.Params(
                    profile=label, buckets=REPORT_BUCKETS, limit=REPORT_SPANS)), show_timeline.Result),
                kernels=as_result(run_once(con, top_kernels, top_kernels.Params(profile=label, limit=TOP_KERNELS)),
                                  top_kernels.Result),
                triage=as_result(run_once(con, triage, triage.Params(profile=label, limit=FINDINGS)), triage.Result),
                iterations=as_result(run_once(con, iterations, iterations.Params(profile=label, limit=MAX_LIMIT)),
                                     iterations.Result))
