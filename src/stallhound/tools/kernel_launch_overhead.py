"""Are kernels so small that launching them costs more than running them?

Kernels whose start lies in the window, per device. tiny = duration_ns < threshold_ns; tiny_kernel_pct =
tiny / all kernels; tiny_time_pct = tiny kernel time / all kernel time. launch_end_ns is NULL when the
kernel's launch call was not traced (captured without `--trace=cuda`, or API tracing missed that process):
such kernels are left out of the launch and queue figures, and launch_traced_kernels says how many were
covered. launch_api_ns sums the durations of distinct launch calls (one cudaGraphLaunch counts once for
all its kernels), launched_kernel_ns the GPU time of their kernels, launch_to_kernel_ratio =
launch_api_ns / launched_kernel_ns. queue_delay = kernel start_ns - launch_end_ns over non-graph traced
launches (negative when the kernel starts before the call returns): median, p90, max. Graph launches:
cuda_api calls of kind 'graph' in the window by the processes in scope, and kernels with a graph id/node
id or a graph launch API. Findings: the idle time launching costs the devices (launch-bound gaps, between
tiny kernels or not), from the idle attribution (analysis/idle_causes.py). Times in ns.
"""

from __future__ import annotations

from typing import Annotated

import duckdb
from pydantic import BaseModel, Field, PrivateAttr

from stallhound.analysis import idle_causes, rules
from stallhound.analysis.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    Output,
    Scope,
    ScopedParams,
    fetch_capped,
    more_rows,
    ms,
    pct,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.idle_causes import IdleBasis
from stallhound.model.duck import one_row

ROOT_CAUSES = {"small-kernel-overhead", "cpu-bottleneck"}  # the idle findings this tool shows
TRIAGE = TriageRole("part", of="gpu_idle_gaps")  # ranked by triage among all the idle findings


class Params(ScopedParams):
    threshold_ns: Annotated[int, Field(description="Kernels shorter than this count as tiny, ns", ge=1)] = (
        rules.TINY_KERNEL_NS)
    limit: LimitParam = DEFAULT_LIMIT


class DeviceLaunch(BaseModel):
    device: int
    kernel_count: int
    kernel_time_ns: int
    tiny_count: int
    tiny_time_ns: int
    tiny_kernel_pct: float
    tiny_time_pct: float
    launch_traced_kernels: int = Field(description="kernels whose launch call was traced (launch figures use these)")
    launch_calls: int = Field(description="distinct traced launch calls")
    launch_api_ns: int
    launched_kernel_ns: int
    launch_to_kernel_ratio: float | None = Field(description="launch_api_ns / launched_kernel_ns; null without data")
    tiny_launch_api_ns: int = Field(description="host time in launch calls whose kernels were all tiny")
    queue_delay_median_ns: float | None
    queue_delay_p90_ns: float | None
    queue_delay_max_ns: int | None
    graph_kernels: int


class TinyKernel(BaseModel):
    name: str
    count: int
    total_ns: int
    mean_ns: float
    max_ns: int


class Result(Output):
    scope: Scope
    threshold_ns: int
    kernel_count: int
    tiny_count: int
    tiny_kernel_pct: float
    graph_launch_calls: int = Field(description="cuda_api calls of kind 'graph' (cudaGraphLaunch, ...)")
    devices: list[DeviceLaunch]
    top_tiny: list[TinyKernel] = Field(description="tiny kernels by count, at most `limit`")
    truncated: bool
    total_rows: int = Field(description="distinct tiny kernel names")
    findings: list[Finding] = []
    _idle: IdleBasis | None = PrivateAttr(None)  # what findings() reads: the window's idle attribution, not shown


# A graph launch API contains GraphLaunch or GraphExecLaunch: two substring tests instead of a regular
# expression per kernel, which costs more CPU.
KERNELS = """
WITH k AS (
  SELECT device_id, pid, correlation_id, short_name, duration_ns, duration_ns < $threshold AS tiny,
         launch_end_ns - launch_start_ns AS api_ns,
         (graph_id IS NOT NULL OR graph_node_id IS NOT NULL
          OR coalesce(contains(launch_api, 'GraphLaunch') OR contains(launch_api, 'GraphExecLaunch'), false))
           AS in_graph,
         start_ns - launch_end_ns AS queue_ns
  FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end)"""

DEVICES_SQL = KERNELS + """,
calls AS (
  SELECT device_id, pid, correlation_id, any_value(api_ns) AS api_ns, sum(duration_ns) AS gpu_ns,
         bool_and(tiny) AS all_tiny
  FROM k WHERE api_ns IS NOT NULL GROUP BY ALL),
per_call AS (
  SELECT device_id, count(*) AS calls, sum(api_ns) AS api_ns, sum(gpu_ns) AS gpu_ns,
         coalesce(sum(api_ns) FILTER (WHERE all_tiny), 0) AS tiny_api_ns
  FROM calls GROUP BY device_id),
per_kernel AS (
  SELECT device_id, count(*) AS n, sum(duration_ns) AS total, count(*) FILTER (WHERE tiny) AS tiny_n,
         coalesce(sum(duration_ns) FILTER (WHERE tiny), 0) AS tiny_ns, count(api_ns) AS traced,
         median(queue_ns) FILTER (WHERE NOT in_graph) AS q50,
         quantile_cont(queue_ns, 0.9) FILTER (WHERE NOT in_graph) AS q90,
         max(queue_ns) FILTER (WHERE NOT in_graph) AS qmax, count(*) FILTER (WHERE in_graph) AS graph_kernels
  FROM k GROUP BY device_id)
SELECT device_id, n, total, tiny_n, tiny_ns, traced, coalesce(c.calls, 0), coalesce(c.api_ns, 0),
       coalesce(c.gpu_ns, 0), coalesce(c.tiny_api_ns, 0), q50, q90, qmax, graph_kernels
FROM per_kernel LEFT JOIN per_call c USING (device_id) ORDER BY device_id
"""

TINY_SQL = KERNELS + """
SELECT coalesce(short_name, '(unnamed)') AS name, count(*) AS n, sum(duration_ns) AS total, avg(duration_ns),
       max(duration_ns), count(*) OVER () AS total_rows
FROM k WHERE tiny GROUP BY name ORDER BY n DESC, total DESC, name LIMIT $limit
"""

GRAPH_SQL = """
SELECT count(*) FROM cuda_api WHERE kind = 'graph' AND start_ns >= $start AND start_ns < $end
  AND pid IN (SELECT pid FROM kernels WHERE device_id IN (SELECT unnest($devices)))
"""


def _device(r: tuple) -> DeviceLaunch:
    (device, n, total, tiny_n, tiny_ns, traced, calls, api_ns, gpu_ns, tiny_api, q50, q90, qmax, graph) = r
    return DeviceLaunch(
        device=device, kernel_count=n, kernel_time_ns=int(total), tiny_count=tiny_n, tiny_time_ns=int(tiny_ns),
        tiny_kernel_pct=pct(tiny_n, n), tiny_time_pct=pct(tiny_ns, total), launch_traced_kernels=traced,
        launch_calls=calls, launch_api_ns=int(api_ns), launched_kernel_ns=int(gpu_ns),
        launch_to_kernel_ratio=round(api_ns / gpu_ns, 3) if gpu_ns else None, tiny_launch_api_ns=int(tiny_api),
        queue_delay_median_ns=None if q50 is None else float(q50),
        queue_delay_p90_ns=None if q90 is None else round(float(q90), 1), queue_delay_max_ns=qmax,
        graph_kernels=graph)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    args = {**scope_args(scope), "threshold": params.threshold_ns}
    devices = [_device(r) for r in con.execute(DEVICES_SQL, args).fetchall()]
    rows, truncated = fetch_capped(con, TINY_SQL, args, params.limit)
    graphs = one_row(con.execute(GRAPH_SQL, scope_args(scope)))
    graph_calls = graphs[0]
    count, tiny = sum(d.kernel_count for d in devices), sum(d.tiny_count for d in devices)
    result = Result(
        scope=scope, threshold_ns=params.threshold_ns, kernel_count=count, tiny_count=tiny,
        tiny_kernel_pct=pct(tiny, count), graph_launch_calls=graph_calls, devices=devices,
        top_tiny=[TinyKernel(name=r[0], count=r[1], total_ns=int(r[2]), mean_ns=round(r[3], 1), max_ns=r[4])
                  for r in rows],
        truncated=truncated, total_rows=rows[0][5] if rows else 0)
    result._idle = idle_causes.basis(con, scope)
    return result


def findings(result: Result) -> list[Finding]:
    """The window's idle findings of ROOT_CAUSES (analysis/idle_causes.py)."""
    return result._idle.shown(ROOT_CAUSES) if result._idle else []


def render(result: Result) -> str:
    lines = [f"{result.kernel_count:,} kernels, {result.tiny_count:,} under {result.threshold_ns:,} ns "
             f"({result.tiny_kernel_pct:.1f}%); {result.graph_launch_calls:,} graph launch calls"]
    for d in result.devices:
        ratio = "-" if d.launch_to_kernel_ratio is None else f"{d.launch_to_kernel_ratio:.2f}"
        queue = "-" if d.queue_delay_median_ns is None else ms(d.queue_delay_median_ns)
        lines.append(f"device {d.device}: tiny {d.tiny_count:,} ({d.tiny_kernel_pct:.1f}% of kernels, "
                     f"{d.tiny_time_pct:.1f}% of time); launch API {ms(d.launch_api_ns)} vs GPU "
                     f"{ms(d.launched_kernel_ns)} "
                     f"(ratio {ratio}, {d.launch_traced_kernels:,}/{d.kernel_count:,} launches traced); "
                     f"queue delay median {queue}, p90 {ms(d.queue_delay_p90_ns)}")
    lines.extend(f"  x{t.count:<8,} mean {t.mean_ns / 1000:.1f} us  {t.name[:100]}" for t in result.top_tiny)
    if result.truncated:
        lines.extend(more_rows(result, result.total_rows - len(result.top_tiny), "tiny kernel names"))
    lines.extend(f"finding [{f.severity}] {f.title}" for f in result.findings)
    return "\n".join(lines)
