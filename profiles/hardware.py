"""Devices, metadata and capabilities: the small records derived from an export's TARGET_INFO/META tables."""

from __future__ import annotations

from pathlib import Path

from nsightful.profiles.raw import RawExport

# data -> (model table, the nsys option that records it)
CAPTURE_FLAGS: dict[str, tuple[str, str]] = {
    "kernels": ("kernels", "--trace=cuda"),
    "memcpy": ("memcpy", "--trace=cuda"),
    "memset": ("memset", "--trace=cuda"),
    "cuda_api": ("cuda_api", "--trace=cuda"),
    "sync": ("sync", "--trace=cuda"),
    "nvtx": ("nvtx", "--trace=nvtx (and annotate the code with NVTX ranges, e.g. torch.cuda.nvtx.range)"),
    "os_runtime": ("os_runtime", "--trace=osrt"),
    "cpu_samples": ("cpu_samples", "--sample=process-tree"),
    "sched": ("sched", "--cpuctxsw=process-tree"),
    "gpu_info": ("gpus", "a newer nsys (2021+) records GPU hardware in TARGET_INFO_GPU"),
}

GPU_FIELDS = ("name", "chipName", "smCount", "totalMemory", "memoryBandwidth", "clockRate", "computeMajor",
              "computeMinor", "busLocation")


def _by_id(raw: RawExport) -> dict[int, dict[str, object]]:
    """TARGET_INFO_GPU rows that describe CUDA devices, keyed by their `id`."""
    cols = raw.columns("TARGET_INFO_GPU")
    if "id" not in cols:
        return {}
    wanted = [c for c in ("id", "cuDevice", *GPU_FIELDS) if c in cols]
    rows = [dict(zip(wanted, r, strict=True)) for r in raw.rows("TARGET_INFO_GPU", ", ".join(f'"{c}"' for c in wanted))]
    # Windows exports list every adapter; a CUDA device has SMs.
    return {int(r["id"]): r for r in rows if (r.get("smCount") or 0) > 0}


def _device_map(raw: RawExport, gpus: dict[int, dict[str, object]]) -> dict[int, dict[str, object]]:
    """CUDA device id -> TARGET_INFO_GPU row: through TARGET_INFO_CUDA_DEVICE (nsys 2025.1+), else cuDevice."""
    if {"gpuId", "cudaId"} <= set(raw.columns("TARGET_INFO_CUDA_DEVICE")):
        pairs = raw.rows("TARGET_INFO_CUDA_DEVICE", "gpuId, cudaId")
        return {int(cuda): gpus[int(gpu)] for gpu, cuda in pairs if int(gpu) in gpus}
    by_cuda: dict[int, dict[str, object]] = {}
    for row in gpus.values():
        if row.get("cuDevice") is not None:
            by_cuda.setdefault(int(row["cuDevice"]), row)
    return by_cuda


def gpu_rows(raw: RawExport, devices: list[int]) -> list[tuple]:
    mapping = _device_map(raw, _by_id(raw))
    out = []
    for device in devices:
        g = mapping.get(device, {})
        cc = f"{g['computeMajor']}.{g['computeMinor']}" if g.get("computeMajor") else None
        out.append((device, g.get("name") or None, g.get("chipName") or None, g.get("smCount"), g.get("totalMemory"),
                    g.get("memoryBandwidth") or None, g.get("clockRate") or None, cc, g.get("busLocation") or None))
    return out


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
            cap_start, cap_end, duration, gpu_start, gpu_end)
