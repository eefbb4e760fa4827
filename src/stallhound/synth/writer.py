"""Writing a synthetic export: the static tables (processes, GPUs, enums, metadata), the SQLite file
(lazy: tables without rows are left out), and the ground truth beside it.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from pathlib import Path
from typing import Any

from .config import SynthConfig
from .rank import Rank
from .schema import (
    BUS_IDS,
    COLUMN_NAMES,
    ENUMS,
    EVENT_TABLES,
    GLOBAL_ID_HIGH,
    GPU,
    NSYS_EVENT_TYPES,
    NSYS_VERSION,
    SCHEMA,
    SCHEMA_VERSION,
    SESSION_START_UTC,
    SESSION_START_UTC_NS,
    SYNTH_HOST,
    Trace,
    global_pid,
)
from .simulate import simulate
from .truth import build_truth


def _add_static_tables(trace: Trace, cfg: SynthConfig, ranks: list[Rank], launcher_pid: int) -> None:
    rng = random.Random(f"{cfg.seed}:static")
    trace.add("PROCESSES", globalPid=global_pid(launcher_pid), pid=launcher_pid, name="torchrun")
    trace.add("ThreadNames", nameId=trace.sid("torchrun"), priority=20,
              globalTid=global_pid(launcher_pid) | launcher_pid)
    for rank in ranks:
        uuid = f"{rng.getrandbits(128):032x}"
        bus = BUS_IDS[rank.device] if rank.device < len(BUS_IDS) else f"{0xe0 + rank.device:02x}"
        trace.add("PROCESSES", globalPid=rank.gpid, pid=rank.pid, name="python3")
        trace.add("ThreadNames", nameId=trace.sid("pt_main_thread"), priority=20, globalTid=rank.gtid)
        trace.add("TARGET_INFO_GPU", vmId=GLOBAL_ID_HIGH, id=rank.device, busLocation=f"0000:{bus}:00.0",
                  pwGpuId=rank.device, cuDevice=rank.device,
                  uuid=f"{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}", **GPU)
        trace.add("TARGET_INFO_CUDA_DEVICE", gpuId=rank.device, cudaId=rank.device, pid=rank.pid)
    for table, (prefix, values) in ENUMS.items():
        for code, (name, label) in enumerate(values):
            trace.add(table, id=code, name=prefix + name, label=label)
    for code, name in enumerate(NSYS_EVENT_TYPES):
        trace.add("ENUM_NSYS_EVENT_TYPE", id=code, name=name, label=name)
    trace.add("TARGET_INFO_SESSION_START_TIME", utcEpochNs=SESSION_START_UTC_NS, utcTime=SESSION_START_UTC,
              localTime=SESSION_START_UTC)
    for name, value in _export_metadata():
        trace.add("META_DATA_EXPORT", name=name, value=value)
    for name, value in _capture_metadata(cfg):
        trace.add("META_DATA_CAPTURE", name=name, value=value)


def _export_metadata() -> list[tuple[str, str]]:
    major, minor, micro = SCHEMA_VERSION.split(".")
    return [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_PRODUCT_VERSION", NSYS_VERSION),
        ("EXPORT_PRODUCT_DATE", "2025.1"), ("EXPORT_SCHEMA_VERSION", SCHEMA_VERSION),
        ("EXPORT_SCHEMA_VERSION_MAJOR", major), ("EXPORT_SCHEMA_VERSION_MINOR", minor),
        ("EXPORT_SCHEMA_VERSION_MICRO", micro), ("EXPORT_PLATFORM", "linux-desktop"), ("EXPORT_ARCH", "x64"),
        ("EXPORT_TIME_UTC", "2025-06-02T10:01:40"), ("EXPORT_HOST", SYNTH_HOST), ("EXPORT_USER", ""),
        ("EXPORT_PARAM_INPUT_FILE", "synth.nsys-rep"), ("EXPORT_PARAM_OUTPUT_FILE", "synth.sqlite"),
        ("EXPORT_PARAM_LAZY", "true"), ("EXPORT_PARAM_TIME_NORMALIZE", "false"),
        ("EXPORT_PARAM_TIME_SHIFT", "0"), ("EXPORT_CONFIG_TIME_SHIFT", "0"), ("EXPORT_TIME", "0.05 sec"),
    ]


def _capture_metadata(cfg: SynthConfig) -> list[tuple[str, str]]:
    arguments = [f"--nproc_per_node={cfg.devices}", "train.py", f"--steps={cfg.iterations}"]
    return [
        ("DEVICE_ID", "Local (CLI)"), ("CAPTURE_EVENT_TYPE", "NvtxEvents"), ("CAPTURE_EVENT_TYPE", "Cuda"),
        ("CAPTURE_EVENT_TYPE", "OSRuntime"), ("START_TRIGGER", "Immediate"), ("DEVICE_TYPE", "Unix"),
        ("DEVICE_DISPLAY_NAME", SYNTH_HOST), ("PROCESS_0:HOW_TO_ATTACH", "LaunchAnother"),
        ("PROCESS_0:COMMAND", "torchrun"),
        *((f"PROCESS_0:ARGUMENT_{i}", a) for i, a in enumerate(arguments)),
        ("PROCESS_0:WORKING_DIR", "/workspace"), ("PROCESS_0:COLLECT_NVTX_TRACE", "true"),
        ("PROCESS_0:COLLECT_CUDA_TRACE", "true"), ("INCLUDE_CHILDREN", "true"),
    ]


# --- writing --------------------------------------------------------------------------------------
def truth_path(path: Path) -> Path:
    """Where write_sample puts the ground truth of the export at path."""
    return Path(f"{path}.truth.json")


def _check_overwritable(path: Path, force: bool) -> None:
    """Refuse to replace anything but a file this module wrote, unless forced (never a directory)."""
    if path.is_dir():
        raise FileExistsError(f"{path} is a directory; give the path of the .sqlite file to write")
    if force or not path.exists():
        return
    refusal = (f"{path} exists and is not a synthetic profile written by stallhound; choose another path "
               "or pass --force")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_HOST'").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise FileExistsError(refusal) from exc
    if row is None or row[0] != SYNTH_HOST:
        raise FileExistsError(refusal)


def _write_sqlite(path: Path, trace: Trace) -> None:
    trace.rows["StringIds"] = [(i, value) for value, i in trace.strings.items()]
    for table in EVENT_TABLES:
        trace.rows[table].sort(key=lambda row: row[0])
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("BEGIN")
        for table, columns in SCHEMA.items():
            rows = trace.rows[table]
            if not rows:  # lazy export
                continue
            con.execute(f"CREATE TABLE {table} (\n    " + ",\n    ".join(columns.split(", ")) + "\n)")
            marks = ", ".join("?" * len(COLUMN_NAMES[table]))
            con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        con.execute("COMMIT")
    finally:
        con.close()


def write_sample(path: Path, config: SynthConfig | None = None, *, force: bool = False) -> dict[str, Any]:
    """Write a synthetic export to path and its ground truth to `<path>.truth.json`; return the truth.

    An existing file at path is replaced only when this module wrote it, or when force is true.
    """
    path = Path(path)
    cfg = config or SynthConfig.demo()
    if not path.parent.is_dir():
        raise FileNotFoundError(f"directory {path.parent} does not exist; create it first")
    _check_overwritable(path, force)
    trace, ranks, collectives, launcher_pid = simulate(cfg)
    _add_static_tables(trace, cfg, ranks, launcher_pid)
    truth = build_truth(cfg, trace, ranks, collectives, launcher_pid)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_sqlite(tmp, trace)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    truth_path(path).write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


