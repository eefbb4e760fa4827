"""Which device arrives last to a collective: NCCL kernels matched across devices (or, by analysis/rank_figures.py,
across the ranks of a job), their arrival skew, each device's wait, and the straggler when there is one.

The matching and the tests a straggler must pass are described in nccl_breakdown's docstring (the tool's
description); rank_imbalance applies the same thresholds to ranks.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import Scope, ms, pct
from stallhound.model.duck import one_row
from stallhound.model.sql_files import sql_beside

MAX_SHIFT = 3  # instances: a window or capture edge cuts the collective in flight at each end, with room to spare
MIN_MATCHED = 10  # below this, two evenly matched ranks show a 3-in-4 last share by chance in over 1 run in 10
LAST_SHARE_MIN_PCT = 75.0  # a clear majority: 1.5x the even share of two ranks, 3x that of four
MIN_SKEW_NS = 100_000  # 0.1 ms: below this, launch and host-scheduling jitter decide who arrives last
SKEW_TRANSFER_RATIO = 0.5  # a wait under half the collective's own transfer time is not worth chasing
WORST_SHOWN = 5  # most skewed collectives listed: enough to find them on a timeline


class DeviceArrival(BaseModel):
    device: int
    collectives: int = Field(description="matched collectives it took part in")
    last_count: int = Field(description="matched collectives it arrived last to")
    last_share_pct: float = Field(description="last_count / collectives")
    wait_ns: int = Field(description="its NCCL kernel time before the last rank arrived, in the window")
    straggler_wait_ns: int = Field(description="wait_ns over the collectives the straggler arrived last to")


class SkewedCollective(BaseModel):
    collective: str
    first_arrival_ns: int
    last_arrival_ns: int
    skew_ns: int
    last_device: int
    transfer_ns: int = Field(description="the last arriver's kernel duration")


class Arrival(BaseModel):
    matched: int = Field(description="collectives matched across their devices")
    matched_kernels: int
    unmatched_kernels: int = Field(description="NCCL kernels in the window left out of every matched collective")
    median_skew_ns: int
    p90_skew_ns: int
    median_transfer_ns: int
    skew_threshold_ns: int = Field(description="median skew needed to name a straggler")
    devices: list[DeviceArrival]
    worst: list[SkewedCollective] = Field(description=f"the {WORST_SHOWN} most skewed collectives at most")
    straggler_device: int | None = Field(description="the device that arrives last, when arrival is unbalanced")
    verdict: str = Field(description="why a straggler is or is not named")


MATCH = sql_beside(__package__, "nccl_matched.sql")

SUMMARY_SQL = MATCH + """
SELECT count(*), coalesce(sum(ranks), 0), median(last_ns - first_ns), quantile_cont(last_ns - first_ns, 0.9),
       median(transfer_ns), (SELECT count(*) FROM n)
FROM matched
"""

# Per (device, last arriver): collectives, and the device's wait inside them for that last arriver.
WAIT_SQL = MATCH + """
SELECT a.device_id, m.last_device, count(*),
       sum(greatest(0, least(m.last_ns, a.end_ns, $end) - greatest(a.start_ns, $start)))
FROM aligned a JOIN matched m USING (coll, idx) GROUP BY ALL ORDER BY ALL
"""

WORST_SQL = MATCH + """
SELECT coll, first_ns, last_ns, last_ns - first_ns AS skew, last_device, transfer_ns
FROM matched ORDER BY skew DESC, first_ns, coll LIMIT $limit
"""



def _verdict(arrival: Arrival, scope: Scope) -> tuple[int | None, str]:
    """The straggler, or None, and why."""
    if len(scope.devices) < 2:
        return None, "arrival compares devices and this scope has one: omit `device` to compare all of them"
    if arrival.matched < MIN_MATCHED:
        return None, (f"only {arrival.matched} collectives matched across devices: too few to tell a habit from "
                      f"chance (at least {MIN_MATCHED} needed)")
    top = max(arrival.devices, key=lambda a: (a.last_share_pct, a.last_count, -a.device))
    said = f"device {top.device} arrives last to {top.last_count} of {top.collectives} collectives " \
           f"({top.last_share_pct:.1f}%)"
    if top.last_share_pct < LAST_SHARE_MIN_PCT:
        return None, f"balanced: no device arrives last to {LAST_SHARE_MIN_PCT:.0f}% of collectives; most often {said}"
    if arrival.median_skew_ns < arrival.skew_threshold_ns:
        return None, (f"{said}, but the median skew {ms(arrival.median_skew_ns)} is below "
                      f"{ms(arrival.skew_threshold_ns)}: too small to matter")
    return top.device, f"straggler: {said}; median skew {ms(arrival.median_skew_ns)}"


def measure(con: duckdb.DuckDBPyConnection, args: dict[str, object], scope: Scope, limit: int) -> Arrival:
    """Arrival over the NCCL kernels of scope_args(scope) `args`; at most min(limit, WORST_SHOWN) skewed ones."""
    args = {**args, "max_shift": MAX_SHIFT}
    matched, matched_kernels, median_skew, p90_skew, transfer, kernels = one_row(con.execute(SUMMARY_SQL, args))
    waits = con.execute(WAIT_SQL, args).fetchall()
    devices = []
    for device in sorted({r[0] for r in waits}):
        mine = [r for r in waits if r[0] == device]
        taken, last = sum(r[2] for r in mine), sum(r[2] for r in mine if r[1] == device)
        devices.append(DeviceArrival(device=device, collectives=taken, last_count=last,
                                     last_share_pct=pct(last, taken), wait_ns=int(sum(r[3] for r in mine)),
                                     straggler_wait_ns=0))
    worst = [SkewedCollective(collective=r[0], first_arrival_ns=r[1], last_arrival_ns=r[2], skew_ns=r[3],
                              last_device=r[4], transfer_ns=r[5])
             for r in con.execute(WORST_SQL, {**args, "limit": min(limit, WORST_SHOWN)}).fetchall()]
    arrival = Arrival(
        matched=matched, matched_kernels=int(matched_kernels), unmatched_kernels=kernels - int(matched_kernels),
        median_skew_ns=round(median_skew or 0), p90_skew_ns=round(p90_skew or 0),
        median_transfer_ns=round(transfer or 0),
        skew_threshold_ns=max(MIN_SKEW_NS, round(SKEW_TRANSFER_RATIO * (transfer or 0))),
        devices=devices, worst=worst, straggler_device=None, verdict="")
    arrival.straggler_device, arrival.verdict = _verdict(arrival, scope)
    late = {r[0]: int(r[3]) for r in waits if r[1] == arrival.straggler_device and r[0] != r[1]}
    for a in arrival.devices:
        a.straggler_wait_ns = late.get(a.device, 0)
    return arrival
