"""Whose GPU ran the work, from what the trace records, and the kernel profiler that measures a kernel on it.

AMD when the host's runtime calls are mostly HIP's (hipLaunchKernel, hipMemcpyAsync: ROCm's torch.profiler keeps
CUDA's field names but not its call names) or a device's name says AMD (Instinct, Radeon); else NVIDIA (nsys and
CUPTI trace only NVIDIA GPUs). On AMD the recorded compute capability is the gfx version (9.0 an MI200, 9.4 an MI300),
not NVIDIA's, so nothing NVIDIA-specific may be read from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from stallhound.model.duck import one_row

VENDOR_SQL = """
SELECT (SELECT count(*) FILTER (WHERE name LIKE 'hip%') > count(*) FILTER (WHERE regexp_matches(name, '^cu'))
        FROM cuda_api)
    OR EXISTS (SELECT 1 FROM gpus WHERE regexp_matches(coalesce(name, ''), '(^|[^A-Za-z])(AMD|Instinct|Radeon)'))"""


@dataclass(frozen=True)
class Vendor:
    name: str
    profiler: str  # the kernel profiler that measures FLOP/s, bytes/s and stalls of one kernel
    units: str  # what its GPUs call the units a block (workgroup) runs on


NVIDIA = Vendor("NVIDIA", "Nsight Compute", "SMs")
AMD = Vendor("AMD", "the ROCm Compute Profiler (rocprof-compute, formerly Omniperf)", "compute units")


def of(con: duckdb.DuckDBPyConnection) -> Vendor:
    """AMD or NVIDIA, by the runtime calls and device names the trace records."""
    return AMD if one_row(con.execute(VENDOR_SQL))[0] else NVIDIA
