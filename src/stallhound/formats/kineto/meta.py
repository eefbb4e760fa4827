"""The small records of a Kineto trace's model: devices (deviceProperties), distributed info, meta, capabilities."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb

from stallhound.formats import registry, remedy
from stallhound.formats.derive import DATA_TABLES, LOAD_SOURCE
from stallhound.formats.derive import capability_rows as derive_capabilities
from stallhound.formats.kineto.nccl import as_int
from stallhound.model.schema import MODEL_VERSION

PLATFORM = "torch.profiler (Kineto)"  # meta.platform of every Kineto trace: what wrote it
RANK_SOURCE = "distributedInfo"  # meta.rank_source: the trace's own distributedInfo block
EPOCH_FLOOR_NS = 946_684_800 * 10**9  # 2000-01-01: an earlier start is a clock that does not count from the epoch
EPOCH_CEILING_NS = 253_402_300_800 * 10**9  # year 10000: a later start is no date (datetime ends at 9999)
LOAD_SEVERITY = "warning"  # a dropped event's note: the figures still stand for the other events
DIAGNOSTIC_SOURCE = "kineto"  # diagnostics.source of what the trace says about its capture
NOT_IN_KINETO = "not recorded by torch.profiler; capture the run with {writer} {options} to get it"
CUDA_ACTIVITY = "torch.profiler with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"
# need -> what records it in a Kineto trace; what Kineto cannot record is absent (a remedy names nsys for it).
OPTIONS: dict[str, str] = {
    "kernels": CUDA_ACTIVITY, "memcpy": CUDA_ACTIVITY, "memset": CUDA_ACTIVITY, "cuda_api": CUDA_ACTIVITY,
    "nvtx": "torch.profiler with ProfilerActivity.CPU (CPU ops) and record_function ranges; prof.step() in the "
            "loop records ProfilerStep#N",
    "stacks": "torch.profiler with with_stack=True (the Python call stack of each op and CUDA call)",
}
DEVICES_SQL = """SELECT DISTINCT device_id FROM (SELECT device_id FROM kernels UNION ALL SELECT device_id FROM memcpy
    UNION ALL SELECT device_id FROM memset) WHERE device_id IS NOT NULL ORDER BY 1"""


def _properties(head: dict) -> dict[int, dict]:
    props = head.get("deviceProperties")
    if not isinstance(props, list):
        return {}
    return {device: p for p in props if isinstance(p, dict) and (device := as_int(p.get("id"))) is not None}


def gpu_rows(con: duckdb.DuckDBPyConnection, head: dict) -> list[tuple]:
    """A gpus row per device that ran work; Kineto records no chip, bandwidth, clock, bus or blocks per SM."""
    props = _properties(head)
    rows = []
    for (device,) in con.execute(DEVICES_SQL).fetchall():
        p = props.get(device, {})
        cc = f"{p['computeMajor']}.{p['computeMinor']}" if "computeMajor" in p and "computeMinor" in p else None
        threads, warp = as_int(p.get("maxThreadsPerMultiprocessor")), as_int(p.get("warpSize"))
        name = p.get("name")
        rows.append((device, None if name is None else str(name), None, as_int(p.get("numSms")),
                     as_int(p.get("totalGlobalMem")), None, None, cc, None,
                     threads // warp if threads and warp else None, None, as_int(p.get("regsPerMultiprocessor")),
                     as_int(p.get("sharedMemPerMultiprocessor")), warp))
    return rows


def diagnostic_rows(head: dict) -> list[tuple]:
    """The rank and world size (distributedInfo) of the process that wrote the trace, as one info row."""
    info = head.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info:
        return []
    extra = ", ".join(f"{k} {info[k]}" for k in ("backend", "nccl_version") if k in info)
    return [(None, "info", DIAGNOSTIC_SOURCE, None,
             f"torch.profiler trace of rank {info['rank']} of world size {info.get('world_size', '?')}"
             + (f" ({extra})" if extra else ""))]


def dropped_note(read: int, dropped: int) -> tuple:
    """The diagnostics row that says how many events the load dropped as unreadable (kineto_read.EVENT_ERRORS)."""
    total = read + dropped
    return (None, LOAD_SEVERITY, LOAD_SOURCE, None,
            f"{dropped:,} of {total:,} trace events were left out because they cannot be read (not an object, or "
            f"args or times unlike torch.profiler's), so figures cover the other {read:,}; capture the trace again "
            "if this persists")


def distributed(head: dict) -> tuple[int | None, int | None, str | None]:
    """(rank, world size, rank source) from the trace's distributedInfo; Nones without one."""
    info = head.get("distributedInfo")
    if not isinstance(info, dict):
        return None, None, None
    rank, world = as_int(info.get("rank")), as_int(info.get("world_size"))
    return rank, world, RANK_SOURCE if rank is not None else None


def process_groups(head: dict) -> tuple[str | None, list[int] | None]:
    """(backend, the size of each process group in pg_config) from the trace's distributedInfo; Nones without."""
    info = head.get("distributedInfo")
    if not isinstance(info, dict):
        return None, None
    groups = info.get("pg_config")
    sizes = [as_int(g.get("pg_size")) for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []
    backend = info.get("backend")
    return (str(backend) if backend is not None else None,
            [s for s in sizes if s is not None] or None)


def started_utc(head: dict, capture_start_ns: int | None) -> str | None:
    """The capture's wall-clock start as nsys writes utcTime (UTC, to the second): Kineto's times count from
    baseTimeNanoseconds (Unix epoch ns; traces without it count from the epoch itself). None before
    EPOCH_FLOOR_NS, a clock that is not the epoch's."""
    base = as_int(head.get("baseTimeNanoseconds")) or 0
    if capture_start_ns is None or not EPOCH_FLOOR_NS <= base + capture_start_ns < EPOCH_CEILING_NS:
        return None
    return datetime.fromtimestamp((base + capture_start_ns) // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def meta_row(path: Path, fingerprint: str, head: dict, windows: tuple, profiler_ranges: int) -> tuple:
    cap_start, cap_end, gpu_start, gpu_end = windows
    duration = cap_end - cap_start if cap_start is not None and cap_end is not None else None
    schema = head.get("schemaVersion")
    machine = ", ".join(str(p["name"]) for _, p in sorted(_properties(head).items()) if p.get("name")) or None
    return (str(path), path.stat().st_size, fingerprint, MODEL_VERSION, None, None if schema is None else str(schema),
            None, "profile", PLATFORM, None, None, started_utc(head, cap_start), cap_start,
            cap_end, duration, gpu_start, gpu_end, machine,
            None, *distributed(head), *process_groups(head), None, profiler_ranges)


def _gpu_info_flag(devices: int, named: int) -> str:
    if devices == 0:
        return "no GPU work was recorded in the capture, so there is no device to describe"
    if named == devices:
        return "recorded (the trace's deviceProperties)"
    return (f"{devices - named} of {devices} devices have no entry in the trace's deviceProperties (PyTorch writes "
            "them since 1.13), so their GPU model is unknown")


def _not_recorded(data: str) -> str:
    """What records `data`, which torch.profiler cannot: the first registered format that can, and its options."""
    kineto = registry.by_platform(PLATFORM)
    return NOT_IN_KINETO.format(writer=remedy.recorder(kineto, [data]).writer,
                                options=remedy.capture(kineto, [data], bare=True))


def capture_flags() -> dict[str, str]:
    """data -> what the capabilities table says records it, for a Kineto trace: the profiler setting where
    torch.profiler records it, else the capture of the format that does (read from the registry when called)."""
    return {data: OPTIONS.get(data) or _not_recorded(data) for data in DATA_TABLES if data != "gpu_info"}


def capability_rows(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """The capability rows of a trace's model in `con`, with what records each kind of data said for
    torch.profiler."""
    return derive_capabilities(con, capture_flags(), _gpu_info_flag)
