"""One side of a profile diff: every figure diff_profiles and verify_fix compare, measured on triage's window.

The window is the one triage analyses (steady iterations when found, else GPU-active), so a diff compares the
same kind of time on both sides and the findings it matches are the ones triage reports. Each figure comes from
the tool that owns it, run on that window (cached per model, so a later triage or tool call costs nothing).
"""

from __future__ import annotations

import statistics

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import attribution, program
from stallhound.analysis.common import MAX_LIMIT, Scope, as_result, run_once
from stallhound.analysis.shares import Classification
from stallhound.model.errors import InvalidRequest
from stallhound.tools import (
    iterations,
    kernel_launch_overhead,
    memory_transfers,
    nccl_breakdown,
    sync_analysis,
    top_kernels,
    triage,
)


class DeviceFigures(BaseModel):
    device: int
    busy_ns: int = Field(description="time with any GPU work in the window")
    kernel_ns: int = Field(description="summed kernel durations")
    nccl_exposed_ns: int = Field(description="NCCL kernel time with no compute kernel running beside it")
    launch_api_ns: int = Field(description="host time in kernel launch calls")
    tiny_kernels: int


class KernelFigures(BaseModel):
    name: str
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
    step_mean_ns: float | None = Field(description="mean steady iteration duration")
    step_std_ns: float | None = Field(description="standard deviation of the steady iteration durations")
    devices: list[DeviceFigures]
    kernels: list[KernelFigures] = Field(description=f"kernel time by name, at most {MAX_LIMIT} names")
    copies: list[CopyFigures]
    sync_calls: int
    sync_blocked_ns: int = Field(description="host time blocked in synchronizing calls")
    sync_gpu_idle_ns: int = Field(description="GPU idle time while the host waited")
    findings: list[FindingFigures]

    @property
    def busy_ns(self) -> int:
        return sum(d.busy_ns for d in self.devices)

    @property
    def step_ns(self) -> tuple[float, float]:
        """(mean, standard deviation) of the steady iterations, for a side that has some (the per-iteration basis)."""
        assert self.step_mean_ns is not None and self.step_std_ns is not None, "no steady iterations"
        return self.step_mean_ns, self.step_std_ns


def _steady_steps(con: duckdb.DuckDBPyConnection, pid: str, window: Scope) -> tuple[int, float | None, float | None]:
    """(count, mean, std) of the iterations inside a steady-state window; (0, None, None) for any other window."""
    if window.window_basis != "steady_state":
        return 0, None, None
    found = as_result(run_once(con, iterations, iterations.Params(profile=pid, limit=MAX_LIMIT)), iterations.Result)
    steps = [r.duration_ns for r in found.rows if r.start_ns >= window.start_ns and r.end_ns <= window.end_ns]
    if found.truncated or len(steps) < iterations.MIN_ITERATIONS:  # more rows than one call returns: its stats
        assert found.mean_ns is not None, "a steady-state window lies over iterations found, so they have a mean"
        count = max(1, round(window.duration_ns / found.mean_ns))
        return count, window.duration_ns / count, found.std_ns
    return len(steps), statistics.fmean(steps), statistics.pstdev(steps)


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


def measure(con: duckdb.DuckDBPyConnection, pid: str) -> Side:
    """Every figure of profile `pid` (already open on `con`) on its triage window."""
    found = as_result(run_once(con, triage, triage.Params(profile=pid, limit=triage.MAX_FINDINGS)), triage.Result)
    prog = program.detect(con)
    common = dict(profile=pid, gpus=_gpu_names(con), program=f"{prog.kind} ({prog.process or 'unknown process'})",
                  window=found.window, window_note=found.window_note, classification=found.classification)
    window = found.window
    if window is None:
        return Side(**common, iterations=0, step_mean_ns=None, step_std_ns=None, devices=[], kernels=[], copies=[],
                    sync_calls=0, sync_blocked_ns=0, sync_gpu_idle_ns=0, findings=[])
    count, mean, std = _steady_steps(con, pid, window)
    kernels = _on_window(con, top_kernels, pid, window)
    copies = _on_window(con, memory_transfers, pid, window)
    sync = _on_window(con, sync_analysis, pid, window)
    busy = _busy(con, window)
    nccl = _on_window(con, nccl_breakdown, pid, window)
    launch = _on_window(con, kernel_launch_overhead, pid, window)
    exposed = {d.device: d.exposed_ns for d in nccl.devices} if nccl else {}
    launches = {d.device: d for d in launch.devices} if launch else {}
    kernel_ns = {g.device: g.kernel_time_ns for g in kernels.gemms} if kernels else {}
    devices = [DeviceFigures(device=d, busy_ns=busy.get(d, 0), kernel_ns=kernel_ns.get(d, 0),
                             nccl_exposed_ns=exposed.get(d, 0),
                             launch_api_ns=launches[d].launch_api_ns if d in launches else 0,
                             tiny_kernels=launches[d].tiny_count if d in launches else 0) for d in window.devices]
    return Side(
        **common, iterations=count, step_mean_ns=mean, step_std_ns=std, devices=devices,
        kernels=[KernelFigures(name=r.display_name, count=r.count, total_ns=r.total_ns)
                 for r in (kernels.rows if kernels else [])],
        copies=[CopyFigures(direction=r.direction, count=r.count, bytes=r.bytes, time_ns=r.time_ns,
                            pageable_count=r.pageable_count) for r in (copies.rows if copies else [])],
        sync_calls=sync.call_count if sync else 0, sync_blocked_ns=sync.blocked_ns if sync else 0,
        sync_gpu_idle_ns=sync.gpu_idle_ns if sync else 0,
        findings=[FindingFigures(root_cause=f.root_cause, device=f.device, severity=f.severity, title=f.title,
                                 time_at_stake_ns=f.time_at_stake_ns, evidence=f.evidence) for f in found.findings])


def _busy(con: duckdb.DuckDBPyConnection, window: Scope) -> dict[int, int]:
    """Busy time per device: the complement of the idle attribution triage's classification uses."""
    return {d: f.window_ns - f.idle_ns for d, f in attribution.attribute(con, window).devices.items()}
