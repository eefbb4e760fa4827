"""One side of a profile diff: every figure diff_profiles and verify_fix compare, measured on triage's window.

The window is the one triage analyses (steady iterations when found, by the steps of `range_name` when given, else
GPU-active), so a diff compares the
same kind of time on both sides and the findings it matches are the ones triage reports. Each figure comes from
the tool that owns it, run on that window (cached per model, so a later triage or tool call costs nothing); the
work the window launched (its kernels by name, their GPU-active span, the host's time issuing them) from
tools/diff/work.py.
"""

from __future__ import annotations

import statistics

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import attribution, program, step_boundaries
from stallhound.analysis.common import MAX_LIMIT, Scope, as_result, run_once
from stallhound.analysis.shares import Classification
from stallhound.model.errors import InvalidRequest
from stallhound.tools import (
    iterations,
    kernel_launch_overhead,
    memory_transfers,
    nccl_breakdown,
    sync_analysis,
    triage,
)
from stallhound.tools.diff.work import Work, launched

ROBUST_SIGMA_PER_MAD = 1.4826  # a normal distribution's standard deviation per median absolute deviation


class DeviceFigures(BaseModel):
    device: int
    busy_ns: int = Field(description="time with any GPU work in the window")
    kernel_ns: int = Field(description="summed durations of the kernels the window launched")
    nccl_exposed_ns: int = Field(description="NCCL kernel time with no compute kernel running beside it")
    launch_api_ns: int = Field(description="host time in kernel launch calls")
    tiny_kernels: int


class KernelFigures(BaseModel):
    name: str = Field(description="demangled name")
    short_name: str
    count: int
    total_ns: int


class CopyFigures(BaseModel):
    direction: str
    count: int
    bytes: int
    time_ns: int
    pageable_count: int


class FindingFigures(BaseModel):
    root_cause: str
    device: int | None
    severity: str
    title: str
    time_at_stake_ns: int
    evidence: dict[str, int | float | str]


class Side(BaseModel):
    """What one profile shows on its triage window."""
    profile: str
    gpus: list[str] = Field(description="GPU names by device ('unknown' where the export has none)")
    program: str = Field(description="program kind and main process")
    window: Scope | None = Field(description="triage's window; null when the export has no timed events")
    window_note: str
    classification: Classification
    iterations: int = Field(description="steady iterations in the window; 0 when the window is not steady state")
    step_method: str | None = Field(description="how the step finder found them (nvtx:ProfilerStep#N, graph:<call>, "
                                                "kernel_pattern:<kernel>); null without steady iterations")
    step_median_ns: float | None = Field(description="median steady iteration duration")
    step_sigma_ns: float | None = Field(description=f"{ROBUST_SIGMA_PER_MAD} x the median absolute deviation of the "
                                                    "steady iterations from it: their spread, which a warmup or a "
                                                    "profiler-stop step leaves alone")
    devices: list[DeviceFigures]
    work: Work = Field(description="the work the window launched")
    copies: list[CopyFigures]
    sync_calls: int
    sync_blocked_ns: int = Field(description="host time blocked in synchronizing calls")
    sync_gpu_idle_ns: int = Field(description="GPU idle time while the host waited")
    findings: list[FindingFigures]

    @property
    def busy_ns(self) -> int:
        return sum(d.busy_ns for d in self.devices)

    @property
    def kernels(self) -> list[KernelFigures]:
        """The work's kernels by name, summed over devices."""
        out: dict[str, KernelFigures] = {}
        for k in self.work.kernels:
            row = out.setdefault(k.name, KernelFigures(name=k.name, short_name=k.short_name, count=0, total_ns=0))
            row.count += k.launches
            row.total_ns += k.kernel_ns
        return list(out.values())

    @property
    def step_ns(self) -> tuple[float, float]:
        """(median, sigma) of the steady iterations, for a side that has some (the per-iteration basis)."""
        assert self.step_median_ns is not None and self.step_sigma_ns is not None, "no steady iterations"
        return self.step_median_ns, self.step_sigma_ns


Steps = tuple[int, str | None, float | None, float | None]


def _steady_steps(con: duckdb.DuckDBPyConnection, pid: str, window: Scope, range_name: str | None) -> Steps:
    """(count, method, median, sigma) of the iterations inside a steady-state window, all of them (the step
    finder's spans that the iterations tool pages through); (0, None, None, None) for any other window."""
    if window.window_basis != "steady_state":
        return 0, None, None, None
    found = as_result(run_once(con, iterations, iterations.Params(profile=pid, range_name=range_name, limit=1)),
                      iterations.Result)
    spans = step_boundaries.boundaries(con, found.scope, range_name, "auto")[3]
    steps = [e - s for s, e in spans if s >= window.start_ns and e <= window.end_ns]
    if not steps:
        return 0, None, None, None
    median = statistics.median(steps)
    return len(steps), found.method, median, ROBUST_SIGMA_PER_MAD * statistics.median(abs(d - median) for d in steps)


def _gpu_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [f"{d}: {name or 'unknown'}" for d, name in
            con.execute("SELECT device_id, name FROM gpus ORDER BY device_id").fetchall()]


def _on_window(con: duckdb.DuckDBPyConnection, module, pid: str, window: Scope, **extra):
    """The tool's result on the window, or None where it cannot run on this profile (no data for it)."""
    try:
        return run_once(con, module, module.Params(profile=pid, start_ns=window.start_ns, end_ns=window.end_ns,
                                                   limit=MAX_LIMIT, **extra))
    except InvalidRequest:
        return None


def measure(con: duckdb.DuckDBPyConnection, pid: str, range_name: str | None = None) -> Side:
    """Every figure of profile `pid` (already open on `con`) on its triage window, bounded by the steps of
    `range_name` when given."""
    found = as_result(run_once(con, triage, triage.Params(profile=pid, range_name=range_name,
                                                          limit=triage.MAX_FINDINGS)), triage.Result)
    prog = program.detect(con)
    common = dict(profile=pid, gpus=_gpu_names(con), program=f"{prog.kind} ({prog.process or 'unknown process'})",
                  window=found.window, window_note=found.window_note, classification=found.classification)
    window = found.window
    if window is None:
        return Side(**common, iterations=0, step_method=None, step_median_ns=None, step_sigma_ns=None, devices=[],
                    work=Work(kernels=[], span_ns=0, host_ns=None), copies=[], sync_calls=0, sync_blocked_ns=0,
                    sync_gpu_idle_ns=0, findings=[])
    count, method, median, sigma = _steady_steps(con, pid, window, range_name)
    work = launched(con, window)
    copies = _on_window(con, memory_transfers, pid, window)
    sync = _on_window(con, sync_analysis, pid, window)
    busy = _busy(con, window)
    nccl = _on_window(con, nccl_breakdown, pid, window)
    launch = _on_window(con, kernel_launch_overhead, pid, window)
    exposed = {d.device: d.exposed_ns for d in nccl.devices} if nccl else {}
    launches = {d.device: d for d in launch.devices} if launch else {}
    devices = [DeviceFigures(device=d, busy_ns=busy.get(d, 0), kernel_ns=work.kernel_ns_of(d),
                             nccl_exposed_ns=exposed.get(d, 0),
                             launch_api_ns=launches[d].launch_api_ns if d in launches else 0,
                             tiny_kernels=launches[d].tiny_count if d in launches else 0) for d in window.devices]
    return Side(
        **common, iterations=count, step_method=method, step_median_ns=median, step_sigma_ns=sigma, devices=devices,
        work=work,
        copies=[CopyFigures(direction=r.direction, count=r.count, bytes=r.bytes, time_ns=r.time_ns,
                            pageable_count=r.pageable_count) for r in (copies.rows if copies else [])],
        sync_calls=sync.call_count if sync else 0, sync_blocked_ns=sync.blocked_ns if sync else 0,
        sync_gpu_idle_ns=sync.gpu_idle_ns if sync else 0,
        findings=[FindingFigures(root_cause=f.root_cause, device=f.device, severity=f.severity, title=f.title,
                                 time_at_stake_ns=f.time_at_stake_ns, evidence=f.evidence) for f in found.findings])


def _busy(con: duckdb.DuckDBPyConnection, window: Scope) -> dict[int, int]:
    """Busy time per device: the complement of the idle attribution triage's classification uses."""
    return {d: f.window_ns - f.idle_ns for d, f in attribution.attribute(con, window).devices.items()}
