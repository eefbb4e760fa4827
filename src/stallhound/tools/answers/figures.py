"""The figures answer_questions needs that no triage detector computes, each computed alone on triage's window
instead of by running its whole tool: kernel_launch_overhead's tiny-kernel count and sync_analysis' device-wide
synchronize calls. Each reads its tool's own SQL (the kernels in the window; the sync calls found), so the answer
equals what the tool reports; each is computed once per model and window.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from stallhound.analysis.common import Scope, pct, per_model, scope_args
from stallhound.model.duck import one_row
from stallhound.tools import kernel_launch_overhead, sync_analysis

TINY_THRESHOLD_NS = kernel_launch_overhead.Params.model_fields["threshold_ns"].default  # the tool's default
TINY_SQL = kernel_launch_overhead.KERNELS + "\nSELECT count(*), count(*) FILTER (WHERE tiny) FROM k"
DEVICE_SYNCS_SQL = """
SELECT count(*) FILTER (WHERE scope_kind = 'device'),
       coalesce(sum(end_ns - start_ns) FILTER (WHERE scope_kind = 'device'), 0)::BIGINT
FROM sync_calls"""


@dataclass(frozen=True)
class TinyKernels:
    kernel_count: int
    tiny_count: int
    threshold_ns: int

    @property
    def tiny_kernel_pct(self) -> float:
        return pct(self.tiny_count, self.kernel_count)


@dataclass(frozen=True)
class DeviceSyncs:
    count: int
    blocked_ns: int  # host time blocked in them, clipped to the window


def tiny_kernels(con: duckdb.DuckDBPyConnection, scope: Scope) -> TinyKernels:
    """kernel_launch_overhead's kernel_count and tiny_count at its default threshold."""
    def compute() -> TinyKernels:
        row = one_row(con.execute(TINY_SQL, {**scope_args(scope), "threshold": TINY_THRESHOLD_NS}))
        n, tiny = row
        return TinyKernels(kernel_count=n, tiny_count=tiny, threshold_ns=TINY_THRESHOLD_NS)
    return per_model(con, ("tiny_kernels", tuple(scope.devices), scope.start_ns, scope.end_ns), compute)


def device_syncs(con: duckdb.DuckDBPyConnection, scope: Scope) -> DeviceSyncs:
    """sync_analysis' device_sync_count and device_sync_ns: its first stage alone (the calls, without the GPU idle
    time inside each, which these figures do not need)."""
    def compute() -> DeviceSyncs:
        try:
            sync_analysis.find(con, scope)
            row = one_row(con.execute(DEVICE_SYNCS_SQL))
            count, blocked = row
        finally:
            sync_analysis.drop_stages(con)
        return DeviceSyncs(count=count, blocked_ns=blocked)
    return per_model(con, ("device_syncs", tuple(scope.devices), scope.start_ns, scope.end_ns), compute)
