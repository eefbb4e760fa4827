"""memory_transfers' pageable-host-memory finding: the copies from pageable memory that pinning would speed up, and
what it would save.

The driver stages a copy from pageable memory through a pinned buffer; only a copy of rules.PAGEABLE_STAGED_BYTES or
more (or of unknown size) pays for that staging (staged), a smaller one costs its latency, pinned or not, and is left
out. Per (device, direction), Staged holds the staged copies' figures and those of the pinned copies of that size they
are compared with. A direction's saving is the staged copies' exposed time (no kernel running) that pinned copies would
not take: at the bandwidth measured for those pinned copies, else PINNED_SPEEDUP; less the share of their transfer time
that already runs at the pinned rate (at_link, pageable_link.sql), which pinning does not shorten: the copies as fast as
the device's DMAs from pinned memory, and an upload's part after its call returned (the call returns once the driver
has staged the data: what is left is a DMA from its pinned buffer). Pinning still saves such a copy's staging, the
device's idle while the host was in its call, which memory_transfers claims apart.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import rules
from stallhound.analysis.common import Finding, ms
from stallhound.model.sql_files import sql_beside

PINNED_SPEEDUP = 2.0  # without a pinned copy to compare: pinned copies run at least 2x pageable (no staging)
LINK_RATE_SHARE = 0.9  # a copy this close to the best pinned DMA rate runs at it: DMAs of one size vary by ~5%
# (cloverleaf_a100_sync_per_kernel's 600 KiB and 1.2 MiB uploads from the driver's pinned buffer: 23.7-24.7 GB/s)
LINK_REFERENCE_NS = 20_000  # a DMA this long shows the link's rate: its fixed start cost (~1-2 us) is under 10% of
# it (cloverleaf's 25 us and 51 us DMAs run at the same 24 GB/s), where a 4 us one of 80 KiB shows mostly that cost
LINK_SQL = sql_beside(__package__, "pageable_link.sql").replace("STAGED", rules.staged_sql("bytes"))
IDLE_HIGH_SHARE = 0.5  # pageable-host-memory is high when the devices sat idle in the copies for half the saving


def bandwidth(nbytes: int, ns: int) -> float | None:
    """GB/s, None when unknown: no time, or no byte count (ROCm traces record copies without their size)."""
    return round(nbytes / ns, 3) if ns and nbytes else None


class Staged(BaseModel):
    """Per (device, direction), the pageable copies that pay for their staging (rules.staged_sql) and the pinned
    copies of that size they are compared with, and how many smaller pageable copies were left out."""
    count: int
    bytes: int
    time_ns: int
    largest_ns: int
    async_count: int = Field(description="pageable copies issued with an *Async call: they block the host anyway")
    pinned_bytes: int
    pinned_time_ns: int
    small_count: int
    exposed_ns: int = 0
    at_link_ns: int = Field(0, description="transfer time of these copies already at the pinned rate (at_link)")

    @property
    def bandwidth_gb_per_s(self) -> float | None:
        return bandwidth(self.bytes, self.time_ns)


def at_link(con: duckdb.DuckDBPyConnection, args: dict) -> dict[tuple[int, str], int]:
    """Per (device, direction), the staged pageable copies' transfer time that already runs at the pinned rate."""
    rows = con.execute(LINK_SQL, {**args, "share": LINK_RATE_SHARE, "ref_ns": LINK_REFERENCE_NS}).fetchall()
    return {(device, direction): int(ns or 0) for device, direction, ns in rows}


def saving(x: Staged) -> int:
    """Exposed staged pageable copy time that pinned copies would not take (PINNED_SPEEDUP when none to compare), in
    the share of the copies' transfer time not already at the pinned rate."""
    pinned, pageable = bandwidth(x.pinned_bytes, x.pinned_time_ns), x.bandwidth_gb_per_s
    speedup = pinned / pageable if pinned and pageable and pinned > pageable else PINNED_SPEEDUP
    slower = 1 - x.at_link_ns / x.time_ns if x.time_ns else 1.0
    return int(x.exposed_ns * slower * (1 - 1 / speedup))


def finding(device: int, host: dict[str, Staged], times: tuple[int, int, int], small: int,
            tags: list[str]) -> Finding:
    """host: the staged copies per direction; times: the time at stake, the idle time in the copies' gaps, the time
    the copies and their calls take; small: the smaller pageable copies left out."""
    stake, idle, span = times
    count, nbytes = sum(x.count for x in host.values()), sum(x.bytes for x in host.values())
    moving = sum(x.time_ns for x in host.values())
    left = (f"; {small} smaller pageable copies left out: a copy that small costs its latency, which pinning does not "
            "shorten" if small else "")
    return Finding(
        root_cause="pageable-host-memory", severity="high" if stake and idle >= IDLE_HIGH_SHARE * stake else "medium",
        title=f"device {device}: {count} copies of {rules.PAGEABLE_STAGED_BYTES >> 10} KiB or more "
              f"({nbytes / 2**20:,.1f} MiB) from pageable memory at "
              f"{', '.join(f'{dr} {x.bandwidth_gb_per_s} GB/s' for dr, x in host.items())}; pinned memory "
              f"would save ~{ms(stake)} ({ms(idle)} of it the GPU idles in their calls); the copies take "
              f"{ms(moving)} on the device{left}",
        evidence={"pageable_count": count, "pageable_bytes": nbytes,
                  "largest_copy_ns": max(x.largest_ns for x in host.values()), "idle_in_pageable_copies_ns": idle,
                  "pageable_time_ns": moving, "pageable_span_ns": span,
                  "small_pageable_count": small,
                  "pinned_bandwidth_gb_per_s": max(bandwidth(x.pinned_bytes, x.pinned_time_ns) or 0
                                                   for x in host.values())},
        time_at_stake_ns=stake, device=device, tags=tags)
