"""The work one side of a diff ran in its window: the kernels it launched, by name, with their launch counts and
time; the GPU-active span of that work; and the host's own time issuing it (tools/diff/verdict.py compares them).

In a window of steps (timed on the host) work belongs to the step that launched it (its launch call began in the
window; its GPU start when no launch call was recorded), not to the one its GPU time falls in: a GPU that runs
behind its host (a CUDA graph replayed, a host that queues steps ahead) keeps the work its steps launched, so two
runs of the same steps count the same launches however far the GPU lags. In a window timed on the GPU (GPU-active),
whose launches come before it, work belongs to it by its GPU start.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import Scope
from stallhound.model.sql_files import sql_beside

KERNELS_SQL = sql_beside(__package__, "work_kernels.sql")
SPAN_HOST_SQL = sql_beside(__package__, "work_span_host.sql")


class WorkKernel(BaseModel):
    device: int
    name: str = Field(description="demangled name: what matches a kernel across the two sides")
    short_name: str
    launches: int
    kernel_ns: int


class Work(BaseModel):
    kernels: list[WorkKernel] = Field(description="per device and name, most kernel time first")
    span_ns: int = Field(description="first GPU start to last GPU end of the work (0 when it has none)")
    host_ns: int | None = Field(description="the first launch call's start to the last's end, less the time the "
                                            "launching threads spent in synchronizing calls: the host's own time "
                                            "issuing the work; null when no launch call was recorded")

    def launches_by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.kernels:
            out[k.name] = out.get(k.name, 0) + k.launches
        return out

    def kernel_ns_of(self, device: int) -> int:
        return sum(k.kernel_ns for k in self.kernels if k.device == device)


def launched(con: duckdb.DuckDBPyConnection, window: Scope) -> Work:
    """The work launched in `window` on its devices."""
    args = {"lo": window.start_ns, "hi": window.end_ns, "devices": window.devices,
            "by_launch": window.window_basis == "steady_state"}
    kernels = [WorkKernel(device=d, name=n, short_name=s, launches=c, kernel_ns=ns)
               for d, n, s, c, ns in con.execute(KERNELS_SQL, args).fetchall()]
    row = con.execute(SPAN_HOST_SQL, args).fetchone()
    first, last, host = row if row else (None, None, None)
    span = last - first if first is not None and last is not None else 0
    return Work(kernels=kernels, span_ns=span, host_ns=host)
