"""Devices, metadata and capabilities: the small records derived from an export's TARGET_INFO/META tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from stallhound.formats.derive import (
    DATA_TABLES,
    GPU_PHASE,
    KERNELS_IN_GRAPHS,
    PYTHON_SAMPLES,
    TIME_LIMIT_NOTE,
)
from stallhound.formats.derive import capability_rows as derive_capabilities
from stallhound.formats.nsys.raw import RawExport
from stallhound.model.duck import one_row

# need -> the nsys option that records it (every kind of model data but gpu_info, which no option adds).
OPTIONS: dict[str, str] = {
    "kernels": "--trace=cuda",
    "memcpy": "--trace=cuda",
    "memset": "--trace=cuda",
    "cuda_api": "--trace=cuda",
    "sync": "--trace=cuda",
    "nvtx": "--trace=nvtx",
    "os_runtime": "--trace=osrt",
    "cpu_samples": "--sample=process-tree",
    "sched": "--cpuctxsw=process-tree",
    "graph_exec": "--trace=cuda --cuda-graph-trace=graph",
    "memory_usage": "--cuda-memory-usage=true",
    "uvm_faults": "--cuda-um-cpu-page-faults=true --cuda-um-gpu-page-faults=true",
    "stacks": "--cudabacktrace=all --python-backtrace=cuda --sample=process-tree",
    KERNELS_IN_GRAPHS: "--cuda-graph-trace=node",
    GPU_PHASE: "--capture-range=cudaProfilerApi",
    PYTHON_SAMPLES: "--sample=process-tree --python-sampling=true",
}
# What the capabilities table adds to an option, for data the option alone does not guarantee.
FLAG_NOTES = {"nvtx": " (and mark each step of the program with an NVTX range)",
              "graph_exec": " (the default), when the program launches CUDA graphs"}
# data -> what the capabilities table says records it; gpu_info's text comes from gpu_info_flag().
CAPTURE_FLAGS: dict[str, str] = {data: OPTIONS[data] + FLAG_NOTES.get(data, "")
                                 for data in DATA_TABLES if data != "gpu_info"}
# nsys's diagnostic, per process, when its CUDA injection did not start (so in nsys 2023 to 2026). Its companion,
# 'No CUDA events collected. Does the process use CUDA?', comes as well from processes that never use CUDA.
CUDA_NOT_STARTED = "CUDA profiling might have not been started"
CUDA_DATA = ("kernels", "memcpy", "memset", "cuda_api", "sync", "graph_exec", "memory_usage", "uvm_faults")  # what
# nsys records with its CUDA tracing
NOT_STARTED_SQL = """SELECT min(text) FROM diagnostics WHERE contains(text, $words)
  AND NOT EXISTS (SELECT 1 FROM cuda_api) AND NOT EXISTS (SELECT 1 FROM kernels)
  AND NOT EXISTS (SELECT 1 FROM memcpy) AND NOT EXISTS (SELECT 1 FROM memset)"""
# TARGET_INFO_GPU replaced TARGET_INFO_CUDA_GPU in nsys 2021.2: an older export without either can be
# re-captured with a newer nsys; a newer one lacks it for a reason no capture option fixes.
GPU_TABLE_SINCE = (2021, 2)
NS_PER_MS = 1_000_000

GPU_FIELDS = ("name", "chipName", "smCount", "totalMemory", "memoryBandwidth", "clockRate", "computeMajor",
              "computeMinor", "busLocation", "maxWarpsPerSm", "maxBlocksPerSm", "maxRegistersPerSm", "maxShmemPerSm")
# TARGET_INFO_CUDA_GPU (older exports) mirrors CUPTI's device record: column -> the TARGET_INFO_GPU field it
# fills. Its bandwidth and clock columns are left out: CUPTI gives them in KB/s and kHz, and no export at hand
# confirms that nsys kept those units.
CUDA_GPU_FIELDS = {"name": "name", "numMultiprocessors": "smCount", "globalMemorySize": "totalMemory",
                   "computeCapabilityMajor": "computeMajor", "computeCapabilityMinor": "computeMinor"}
Hardware = dict[str, Any]  # a device's hardware record: field -> the SQLite value, of whatever type the export wrote


def _target_info_gpu(raw: RawExport) -> dict[int, Hardware]:
    """TARGET_INFO_GPU rows that describe CUDA devices, keyed by their `id`."""
    cols = raw.columns("TARGET_INFO_GPU")
    if "id" not in cols:
        return {}
    wanted = [c for c in ("id", "cuDevice", *GPU_FIELDS) if c in cols]
    rows = [dict(zip(wanted, r, strict=True)) for r in raw.rows("TARGET_INFO_GPU", ", ".join(f'"{c}"' for c in wanted))]
    # Windows exports list every adapter; a CUDA device has SMs.
    return {int(r["id"]): r for r in rows if (r.get("smCount") or 0) > 0}


def _target_info_cuda_gpu(raw: RawExport) -> dict[int, Hardware]:
    """TARGET_INFO_CUDA_GPU rows keyed by CUDA device id (its deviceId, the kernels' deviceId)."""
    cols = raw.columns("TARGET_INFO_CUDA_GPU")
    key = next((c for c in ("deviceId", "id") if c in cols), None)
    if key is None:
        return {}
    wanted = [c for c in CUDA_GPU_FIELDS if c in cols]
    rows = raw.rows("TARGET_INFO_CUDA_GPU", ", ".join(f'"{c}"' for c in (key, *wanted)))
    return {int(r[0]): {CUDA_GPU_FIELDS[c]: v for c, v in zip(wanted, r[1:], strict=True)} for r in rows}


def _device_map(raw: RawExport) -> dict[int, Hardware]:
    """CUDA device id -> hardware row: TARGET_INFO_GPU through TARGET_INFO_CUDA_DEVICE (nsys 2025.1+), else
    through its cuDevice column; exports without TARGET_INFO_GPU through TARGET_INFO_CUDA_GPU."""
    gpus = _target_info_gpu(raw)
    if not gpus:
        return _target_info_cuda_gpu(raw)
    if {"gpuId", "cudaId"} <= set(raw.columns("TARGET_INFO_CUDA_DEVICE")):
        pairs = raw.rows("TARGET_INFO_CUDA_DEVICE", "gpuId, cudaId")
        return {int(cuda): gpus[int(gpu)] for gpu, cuda in pairs if gpu is not None and int(gpu) in gpus}
    by_cuda: dict[int, Hardware] = {}
    for row in gpus.values():
        if row.get("cuDevice") is not None:
            by_cuda.setdefault(int(row["cuDevice"]), row)
    return by_cuda


def gpu_rows(raw: RawExport, devices: list[int]) -> list[tuple]:
    mapping = _device_map(raw)
    out = []
    for device in devices:
        g = mapping.get(device, {})
        cc = f"{g['computeMajor']}.{g['computeMinor']}" if g.get("computeMajor") else None
        out.append((device, g.get("name") or None, g.get("chipName") or None, g.get("smCount"), g.get("totalMemory"),
                    g.get("memoryBandwidth") or None, g.get("clockRate") or None, cc, g.get("busLocation") or None,
                    *(g.get(f) or None for f in ("maxWarpsPerSm", "maxBlocksPerSm", "maxRegistersPerSm",
                                                 "maxShmemPerSm")), None))  # warp size: not in the export
    return out


def machine_gpus(raw: RawExport) -> str | None:
    """Names of the CUDA GPUs the export lists for the machine, in its order, whether or not they ran work."""
    listed = _target_info_gpu(raw) or _target_info_cuda_gpu(raw)
    return ", ".join(str(r["name"]) for _, r in sorted(listed.items()) if r.get("name")) or None


def _version(nsys_version: str | None) -> tuple[int, int] | None:
    parts = (nsys_version or "").split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) > 1 and parts[0].isdigit() and parts[1].isdigit() else None


def gpu_info_flag(nsys_version: str | None, derived_from: str | None, devices: int, named: int) -> str:
    """What the gpu_info capability says: which devices lack hardware details and what (if anything) helps."""
    if devices == 0:
        return "no GPU work was recorded in the capture, so there is no device to describe"
    if named == devices:
        return "recorded (TARGET_INFO_GPU or TARGET_INFO_CUDA_GPU)"
    missing = (f"{devices - named} of {devices} devices have no hardware record in the export, so their GPU model "
               "is unknown")
    version = _version(nsys_version)
    if derived_from:
        return f"{missing}; this export is a derived copy ({derived_from}): the original export may hold it"
    if version is None:
        return (f"{missing}; the export does not record its nsys version either (nsys 2021.2 and later keep GPU "
                "hardware in TARGET_INFO_GPU)")
    if version < GPU_TABLE_SINCE:
        return f"{missing}; nsys {nsys_version} predates TARGET_INFO_GPU: a newer nsys (2021.2+) records it"
    return f"{missing}; nsys {nsys_version} writes TARGET_INFO_GPU when it can query the GPUs, and no option adds it"


def derived_from(raw: RawExport) -> str | None:
    """'<source> by <tool>, window <a>-<b> ns' when another tool cut or rewrote this export and said so in its
    metadata (DERIVED_FROM, DERIVED_BY, DERIVED_WINDOW_NS); None for an export as nsys wrote it."""
    _, meta = raw.metadata
    if not meta.get("DERIVED_FROM"):
        return None
    return (meta["DERIVED_FROM"] + (f" by {meta['DERIVED_BY']}" if meta.get("DERIVED_BY") else "")
            + (f", window {meta['DERIVED_WINDOW_NS']} ns" if meta.get("DERIVED_WINDOW_NS") else ""))


def _command_line(raw: RawExport) -> str | None:
    meta = raw.capture_metadata
    command = next((v for k, v in meta if k == "PROCESS_0:COMMAND"), None)
    if command is None:
        return None
    args = [v for k, v in meta if k.startswith("PROCESS_0:ARGUMENT_")]
    return " ".join([command, *args])


def meta_row(raw: RawExport, path: Path, size: int, fingerprint: str, model_version: int, enum_source: str,
             windows: tuple) -> tuple:
    table, meta = raw.metadata
    cap_start, cap_end, gpu_start, gpu_end = windows
    session = None
    if {"utcTime"} <= set(raw.columns("TARGET_INFO_SESSION_START_TIME")):
        first = raw.rows("TARGET_INFO_SESSION_START_TIME", "utcTime")
        session = first[0][0] if first else None
    duration = cap_end - cap_start if cap_start is not None and cap_end is not None else None
    return (str(path), size, fingerprint, model_version, raw.nsys_version, meta.get("EXPORT_SCHEMA_VERSION"), table,
            enum_source, meta.get("EXPORT_PLATFORM"), meta.get("EXPORT_HOST"), _command_line(raw), session,
            cap_start, cap_end, duration, gpu_start, gpu_end, machine_gpus(raw), derived_from(raw),
            None, None, None, None, None,  # nsys records no distributed rank
            raw.os_release, None)


def cuda_not_started(con: duckdb.DuckDBPyConnection) -> str | None:
    """nsys's diagnostic that its CUDA tracing did not start, when the capture holds no CUDA call or GPU work at all
    (a process beside the program's, with no CUDA in it, may carry the same message in a capture that has them)."""
    return one_row(con.execute(NOT_STARTED_SQL, {"words": CUDA_NOT_STARTED}))[0]


def not_started_note(diagnostic: str) -> str:
    """The trace note for a capture whose CUDA tracing did not start (cuda_not_started)."""
    return (f"nsys traced CUDA in this capture, but its CUDA tracing did not start (its diagnostics: {diagnostic!r}), "
            "so the export holds no CUDA call and no GPU work: re-capturing with --trace=cuda alone will not help; "
            "check in the program's output that it ran its GPU code in this run, and that nothing kept nsys's "
            "injection out of the process (a launcher that resets LD_PRELOAD, a sandboxed runtime)")


def time_limit_note(raw: RawExport) -> str | None:
    """The load note for a capture nsys's timer stopped while the program still ran, else None. nsys writes the run
    length in META_DATA_CAPTURE's RUN_DURATION_MS: when the program's exit ends the capture, the session's length
    rounded up to a millisecond (ANALYSIS_DETAILS.duration is below it in every export at hand); when --duration
    ends it, the limit itself, and the session runs past it while nsys stops."""
    limit_ms = next((v for k, v in raw.capture_metadata if k == "RUN_DURATION_MS"), None)
    if not (raw.has("ANALYSIS_DETAILS") and "duration" in raw.columns("ANALYSIS_DETAILS")):
        return None
    session = raw.rows("ANALYSIS_DETAILS", "duration")
    if not (limit_ms and str(limit_ms).isdigit() and int(limit_ms) > 0 and session and session[0][0]):
        return None
    limit_ns, session_ns = int(limit_ms) * NS_PER_MS, int(session[0][0])
    if session_ns <= limit_ns:
        return None
    return (f"{TIME_LIMIT_NOTE} ({int(limit_ms):,} ms, --duration; the session lasted "
            f"{session_ns / NS_PER_MS:,.3f} ms) while the program was still running: what it did after that is not "
            "in this export, and the CUDA records its process still held when it was stopped can be lost; let the "
            "program end the capture (`--capture-range=cudaProfilerApi` with cudaProfilerStop(), or a --duration "
            "longer than the run), or add `--cuda-flush-interval=1000` so nsys saves CUDA records as the program runs")


def capability_rows(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """The capability rows of an export's model in `con` (its meta row written), nsys options as what records each
    kind of data; a capture whose CUDA tracing did not start says so for the CUDA data instead."""
    version, derived = one_row(con.execute(
        "SELECT (SELECT nsys_version FROM meta), (SELECT derived_from FROM meta)"))
    flags = CAPTURE_FLAGS
    if cuda_not_started(con) is not None:
        failed = "CUDA tracing was on but did not start in this capture: see the trace notes"
        flags = {**flags, **dict.fromkeys(CUDA_DATA, failed)}
    return derive_capabilities(con, flags, lambda devices, named: gpu_info_flag(version, derived, devices, named))
