"""Message sizes and bandwidth of NCCL kernels, where the profile records them (kernels.nccl_message_bytes).

Over the NCCL kernels of the devices in scope that overlap the window, grouped by (collective, message bytes,
process group, group size, the trace field the size came from: kernels.nccl_size_field): count, total_ns and
mean_ns of the kernels' whole (unclipped) durations, and
algbw_gb_per_s = message bytes x count / total_ns (bytes per ns = GB/s). That is the algorithm bandwidth of the
kernels, as nccl-tests' algbw: not bus bandwidth (AllReduce moves 2(n-1)/n times its message over the links of n
ranks), and a kernel's duration includes the time it waited for the last rank, so a straggler lowers it.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import ms
from stallhound.model.duck import one_row

NOT_RECORDED = ("message sizes are not recorded in this profile: torch.profiler traces give them in 'In/Out msg "
                "nelems' (recent PyTorch, on record_param_comms and the NCCL kernels) or, with record_shapes=True, in "
                "the 'Input Dims' of the collective's c10d:: and nccl:* ops; nsys exports do not")
MEANING = ("algbw_gb_per_s = message bytes / kernel duration: the kernel's algorithm bandwidth, not bus bandwidth, "
           "and lowered by any wait for a late rank inside the kernel")


class MessageSize(BaseModel):
    collective: str
    message_bytes: int = Field(description="the collective's whole buffer (kernels.nccl_message_bytes)")
    group: str | None = Field(description="process group name")
    group_size: int | None
    size_field: str = Field(description="the trace field the size came from (kernels.nccl_size_field): 'msg "
                                        "nelems', 'Input Dims' or 'split size'")
    count: int
    total_ns: int = Field(description="sum of the kernels' whole durations")
    mean_ns: float
    algbw_gb_per_s: float = Field(description="message_bytes x count / total_ns: algorithm, not bus, bandwidth")


class Sizes(BaseModel):
    rows: list[MessageSize]
    groups: int = Field(description="(collective, size, group, field) groups, before the limit")
    sized_kernels: int
    unsized_kernels: int
    note: str


SQL = """
SELECT coalesce(nccl_collective, 'other'), nccl_message_bytes, nccl_group, nccl_group_size,
       nccl_size_field, count(*), sum(duration_ns), avg(duration_ns)
FROM kernels WHERE category = 'nccl' AND nccl_message_bytes IS NOT NULL AND device_id IN (SELECT unnest($devices))
  AND end_ns > $start AND start_ns < $end AND duration_ns > 0
GROUP BY ALL ORDER BY 7 DESC, 1, 2, 3, 5
"""
UNSIZED_SQL = """
SELECT count(*) FROM kernels WHERE category = 'nccl' AND nccl_message_bytes IS NULL
  AND device_id IN (SELECT unnest($devices)) AND end_ns > $start AND start_ns < $end AND duration_ns > 0
"""


def run(con: duckdb.DuckDBPyConnection, args: dict[str, object], limit: int) -> Sizes:
    """The message-size groups of the NCCL kernels in scope (`args`: scope_args), most kernel time first."""
    groups = con.execute(SQL, args).fetchall()
    rows = [MessageSize(collective=r[0], message_bytes=r[1], group=r[2], group_size=r[3], size_field=r[4],
                        count=r[5], total_ns=int(r[6]), mean_ns=round(r[7], 1),
                        algbw_gb_per_s=round(r[1] * r[5] / r[6], 3))
            for r in groups]
    return Sizes(rows=rows[:limit], groups=len(rows), sized_kernels=sum(r.count for r in rows),
                 unsized_kernels=one_row(con.execute(UNSIZED_SQL, args))[0],
                 note=MEANING if rows else NOT_RECORDED)


def render(sizes: Sizes) -> list[str]:
    if not sizes.rows:
        return [f"sizes: {sizes.note}"]
    lines = [f"sizes: {sizes.sized_kernels:,} NCCL kernels with a message size"
             + (f" ({sizes.unsized_kernels:,} without)" if sizes.unsized_kernels else "") + f"; {sizes.note}"]
    lines.extend(f"  {r.collective:<14} {r.message_bytes:>14,} B (from {r.size_field})"
                 + ("" if r.group is None else f" group {r.group}")
                 + ("" if r.group_size is None else f" ({r.group_size} ranks)")
                 + f": x{r.count}, mean {ms(r.mean_ns)}, algbw {r.algbw_gb_per_s:.2f} GB/s" for r in sizes.rows)
    if sizes.groups > len(sizes.rows):
        lines.append(f"  ... {sizes.groups - len(sizes.rows)} more size groups: raise `limit` to see them")
    return lines
