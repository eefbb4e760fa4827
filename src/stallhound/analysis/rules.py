"""Rules more than one tool applies, each decided here once, so two tools never judge the same thing two ways.

Kernels: what is tiny (TINY_KERNEL_NS) and what is a hotspot (HOTSPOT_PCT). Host calls: which synchronize
calls reach the whole device, a stream or an event (sync_scope, SYNC_SCOPE_SQL); which copy calls block the
host (BLOCKING_COPY_SQL), which synchronize belongs to the device-to-host copy before it (READBACK_FOLLOW_NS) and
how small such a read is (SMALL_READ_BYTES); from what size a copy from pageable memory pays for its staging
(PAGEABLE_STAGED_BYTES, staged_sql); which OS-runtime calls are waits (WAIT_CALLS). Unified memory: which
migrations the driver issued rather than the host (DRIVER_MIGRATION_SQL), and those a host thread's touch caused
(HOST_TOUCH_SQL). Findings: the least time at stake worth
reporting (MIN_STAKE_PCT) and the severity cutoff by share of the window, a one-time cost's by its time (severity).
Capture: what the profile lacks and the capture option that records it (Missing, missing).
"""

from __future__ import annotations

import re
from typing import Literal

import duckdb
from pydantic import BaseModel

from stallhound.analysis import vendor
from stallhound.analysis.common import Severity, pct
from stallhound.formats.kineto.meta import OPTIONS as KINETO_OPTIONS
from stallhound.formats.kineto.meta import capture_flags as kineto_flags

TINY_KERNEL_NS = 10_000  # 10 us: below this a kernel runs shorter than its launch costs (book small-kernel-overhead)
HOTSPOT_PCT = 30.0  # book kernel-hotspot: one kernel above this share of kernel time is worth a look on its own

SyncScope = Literal["device", "stream", "event", "other"]
# Synchronize calls by what they wait for, first match wins; cudaThreadSynchronize is the deprecated name of
# cudaDeviceSynchronize, cuCtxSynchronize the driver API's.
SYNC_SCOPES: tuple[tuple[SyncScope, str], ...] = (
    ("device", r"(Device|Ctx|Thread)Synchronize"),
    ("stream", r"StreamSynchronize"),
    ("event", r"EventSynchronize"),
)
SYNC_SCOPE_SQL = ("CASE " + " ".join(f"WHEN regexp_matches({{name}}, '{pattern}') THEN '{scope}'"
                                     for scope, pattern in SYNC_SCOPES) + " ELSE 'other' END")

# A copy call blocks the host when it is synchronous (no 'Async' in its name) or from pageable memory, which the
# driver stages through a pinned buffer before the call returns, Async or not.
BLOCKING_COPY_SQL = "({name} NOT LIKE '%Async%' OR {pageable})"
READBACK_FOLLOW_NS = 100_000  # 100 us: a synchronize this soon after a device-to-host copy waits for its result
SMALL_READ_BYTES = 1024  # a device-to-host copy this small reads back a scalar or a handful of values (.item(), a
# metric): the host wants a value, not data; larger blocking copies are plain synchronous copies
PAGEABLE_STAGED_BYTES = 64 << 10  # 64 KiB: below this a copy from pageable memory costs its fixed latency, as a pinned
# one does (on the corpus's and fixtures' exports copies up to 32 KiB take 1-3 us pageable and 1-5 us pinned), and
# staging it through the driver's pinned buffer at 5-15 GB/s adds under ~5 us; from 64 KiB up the staging bandwidth
# sets the time (pageable copies of MiBs run at 2-13 GB/s, pinned ones at 14-53 GB/s), so only there does pinning save
# time. The driver draws the same line: a pageable host-to-device copy of 64 KiB or less is staged and returned at once.
# A unified-memory migration the host did not start at that moment: a prefetch it asked for earlier, the driver's answer
# to a fault of GPU work, an eviction. Only pages a host thread itself touched (to the host, by a fault or the driver's
# speculation around it; an unknown cause may be one) are the host's doing. Before the others the device waits on the
# driver, not on the host.
HOST_TOUCH_SQL = ("(direction = 'UVM_D2H' AND coalesce(migration_cause, 'unknown') IN ('page_fault', "
                  "'speculative_prefetch', 'unknown'))")
DRIVER_MIGRATION_SQL = f"(direction LIKE 'UVM%' AND NOT {HOST_TOUCH_SQL})"
# OS-runtime calls in which a thread waits (for input, a lock, a child, a peer) rather than works.
WAIT_CALLS = "wait|poll|select|sleep|futex|pause|sem_|pthread_join|pthread_cond|accept|recv|read|epoll"

MIN_STAKE_PCT = 1.0  # a finding must be worth 1% of the window: less cannot move the step time noticeably
HIGH_STAKE_PCT = 10.0  # a tenth of the window or more at stake: among the first things to fix
ONE_RUN_LOW_NS = 100_000_000  # 100 ms: a one-time cost (setup, loading, first allocations) that a run pays once,
# not per step, below this is less than every CUDA process pays before its first GPU work anyway (creating the
# context: the first cudaMalloc takes 166-273 ms on the corpus' csc746 and reconstream captures), so in a toy of
# milliseconds it is worth a word (low), however much of its short window it fills, not among the first things to fix


def sync_scope(api: str | None) -> SyncScope:
    """What a synchronize call named `api` waits for (SYNC_SCOPES)."""
    return next((scope for scope, pattern in SYNC_SCOPES if re.search(pattern, api or "")), "other")


def sync_scope_sql(name: str) -> str:
    """SQL for the SyncScope of the call named by column `name`."""
    return SYNC_SCOPE_SQL.format(name=name)


def blocking_copy_sql(name: str, pageable: str) -> str:
    """SQL, true when the copy call named by column `name` blocks the host; `pageable` is a boolean SQL term."""
    return BLOCKING_COPY_SQL.format(name=name, pageable=pageable)


def staged_sql(nbytes: str) -> str:
    """SQL, true when a pageable copy of `nbytes` (a column) pays for its staging: PAGEABLE_STAGED_BYTES or more, or
    of unknown size (ROCm traces record copies without it), which the trace cannot show to be small."""
    return f"coalesce(nullif({nbytes}, 0) >= {PAGEABLE_STAGED_BYTES}, true)"


def worth_reporting(stake_ns: int, window_ns: int) -> bool:
    return pct(stake_ns, window_ns) >= MIN_STAKE_PCT


def severity(stake_ns: int, window_ns: int, once: bool = False) -> Severity:
    """high when the time at stake is HIGH_STAKE_PCT of the window or more, else medium; a one-time cost a run pays
    once (`once`: no loop repeats it) under ONE_RUN_LOW_NS is low, whatever its share of a short window."""
    if once and stake_ns < ONE_RUN_LOW_NS:
        return "low"
    return "high" if pct(stake_ns, window_ns) >= HIGH_STAKE_PCT else "medium"


class Missing(BaseModel):
    data: str
    capture_flag: str


# What torch.profiler cannot record on an AMD GPU, where the capture that would (nsys) does not run.
NOT_ON_AMD = ("not recorded by torch.profiler, and nsys, which records it, traces NVIDIA GPUs only: on this AMD GPU "
              "sample the host with py-spy or perf instead (stallhound reads neither)")
MISSING_SQL = ("SELECT data, capture_flag FROM capabilities c WHERE NOT present "
               "AND NOT EXISTS (SELECT 1 FROM capabilities o WHERE o.present AND o.capture_flag = c.capture_flag) "
               "AND ($data IS NULL OR list_contains($data, data)) ORDER BY data")


def missing(con: duckdb.DuckDBPyConnection, among: tuple[str, ...] | None = None) -> list[Missing]:
    """The data the capture lacks (only those in `among`, when given), each with the capture option that records it.
    Data whose option recorded other data here is not lacking: the option was on and the program made none of it
    (a capture with CUDA calls but no copy has no copy to record), so asking for the option again would mislead."""
    rows = con.execute(MISSING_SQL, {"data": None if among is None else list(among)}).fetchall()
    amd = bool(rows) and vendor.of(con) == vendor.AMD
    nsys_only = set(kineto_flags()) - set(KINETO_OPTIONS)  # what torch.profiler cannot record (gpu_info: it can)
    return [Missing(data=d, capture_flag=NOT_ON_AMD if amd and d in nsys_only else f) for d, f in rows]
