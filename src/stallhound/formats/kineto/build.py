"""Build the profile model (see model.schema) from a PyTorch profiler (Kineto) trace into a DuckDB file.

Events are staged in batches (formats.kineto.stage) into three tables (GPU activity, host events, NCCL
record_param_comms ops), then mapped with SQL into the same model tables an nsys export fills. Kineto writes no
OS runtime calls, CPU samples, scheduling, synchronization records, CUDA graph executions, device-memory events
or UVM faults: those tables stay empty and `capabilities` says so. CPU ops and user annotations
(record_function, ProfilerStep#N) become push/pop NVTX ranges with domain 'cpu_op' or 'user_annotation';
Kineto's GPU copies of the annotations (gpu_user_annotation) are left out, so a step is counted once, on the
thread that ran it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from stallhound.formats.build_steps import BuildSteps, Progress
from stallhound.formats.derive import WINDOW_SQL
from stallhound.formats.kineto import read as kineto_read
from stallhound.formats.kineto import stacks
from stallhound.formats.kineto.meta import (
    capability_rows,
    diagnostic_rows,
    distributed,
    dropped_note,
    gpu_rows,
    meta_row,
)
from stallhound.formats.kineto.sql import COMMS_COLUMNS, GPU_COLUMNS, HOST_COLUMNS, MAPPING, RANGE_COLUMNS
from stallhound.formats.kineto.stage import Stage, Writer
from stallhound.formats.kineto.workers import Pool, workers_for
from stallhound.model.duck import one_row
from stallhound.model.schema import ddl

# DuckDB's share of a build, past which it spills to disk: staging only appends (128MB suffices), the mapping
# joins and sorts need more (at 128MB DuckDB fails to allocate). A trace is held as a staged copy, so its limits stay
# below an export's, whose tables DuckDB scans in place.
STAGE_MEMORY_LIMIT = "128MB"
MAP_MEMORY_LIMIT = "256MB"
# sink of kineto_read.events -> the staging table its rows go to, and its columns
STAGES = (("gpu", "_k_gpu", GPU_COLUMNS), ("host", "_k_host", HOST_COLUMNS), ("comms", "_k_comms", COMMS_COLUMNS),
          ("python", "_k_py", stacks.COLUMNS), ("range", "_k_range", RANGE_COLUMNS))
STEPS = ("reading trace events", "kernels, copies, CUDA API calls, CPU ops", "devices, metadata, capabilities",
         "writing the model")  # as progress reports them


class KinetoBuilder(BuildSteps):
    """One build of one trace."""

    steps = STEPS

    def __init__(self, path: Path, out: Path, progress: Progress | None = None,
                 cancelled: threading.Event | None = None):
        super().__init__(path, out, progress, STAGE_MEMORY_LIMIT, cancelled)
        self.path = path
        self.names: dict[tuple[str, int | None, int | None], str] = {}
        self.notes: list[tuple] = []  # diagnostics rows about what the load left out

    def on_name(self, row: tuple[str, int | None, int | None, str]) -> None:
        kind, pid, tid, name = row
        self.names[(kind, pid, tid if kind == "thread_name" else None)] = name  # the last name given wins

    def stage(self) -> dict:
        """Stream the events into _k_gpu, _k_host, _k_comms, _k_py and _k_range, the bulk parsed by worker processes
        where that pays (kineto.workers); return the top-level values after the events, and a load note (in `notes`)
        when events were dropped as unreadable."""
        writer, failed, pool = Writer(self), True, None
        try:
            stages = {sink: Stage(writer, table, columns) for sink, table, columns in STAGES}
            if workers := workers_for(self.path):
                pool = Pool(workers, lambda sink, columns: writer.put_columns(stages[sink].insert, columns),
                            self.on_name)
            after, read, dropped = kineto_read.events(
                self.path, {**{k: s.add for k, s in stages.items()}, "name": self.on_name},
                pool.parse_all if pool is not None else None)
            for s in stages.values():
                s.flush()
            failed = False
        finally:
            if pool is not None:
                pool.close()
            writer.close(failed)
        if dropped:
            self.notes.append(dropped_note(read, dropped))
        return after

    def names_tables(self) -> None:
        """Processes and threads that ran host events (Kineto also names each GPU and stream as a 'process')."""
        hosts = {pid for (pid,) in self.con.execute("SELECT DISTINCT pid FROM _k_host").fetchall()}
        self.load_list("processes", sorted((pid, name) for (kind, pid, _), name in self.names.items()
                                           if kind == "process_name" and pid in hosts))
        self.load_list("threads", sorted((pid, tid, kineto_read.thread_name(name))
                                         for (kind, pid, tid), name in self.names.items()
                                         if kind == "thread_name" and pid in hosts))

    def model(self, rank: int | None) -> None:
        """The model tables from the staged events; `rank` (meta.rank) places NCCL kernels in their groups."""
        self.sql(f"SET memory_limit = '{MAP_MEMORY_LIMIT}'")
        stacks.build(self)
        for table, query in MAPPING:
            self.sql(ddl(table))
            if query:
                self.sql(query, params={"rank": rank} if "$rank" in query else None)
        stacks.timed(self)


def build(path: Path, out: Path, fingerprint: str, progress: Progress | None = None,
          cancelled: threading.Event | None = None) -> None:
    """Write the model of the Kineto trace at `path` into the DuckDB file `out` (which must not exist); setting
    `cancelled` stops it with LoadCancelled."""
    head = kineto_read.header(path)
    b = KinetoBuilder(path, out, progress, cancelled)
    with b.running():
        b.step("reading trace events")
        head = {**b.stage(), **head}  # values some Kineto versions write after the events
        b.step("kernels, copies, CUDA API calls, CPU ops")
        b.names_tables()
        b.model(distributed(head)[0])
        b.step("devices, metadata, capabilities")
        b.load_list("gpus", gpu_rows(b.con, head))
        b.load_list("diagnostics", [*diagnostic_rows(head), *b.notes])
        ranges = one_row(b.con.execute("SELECT count(*) FROM _k_range"))[0]
        b.load_list("meta", [meta_row(path, fingerprint, head, one_row(b.con.execute(WINDOW_SQL)), ranges)])
        b.load_list("capabilities", capability_rows(b.con))
        for helper in ("_k_gpu", "_k_host", "_k_comms", "_k_py", "_k_range", *stacks.HELPERS):
            b.sql(f"DROP TABLE IF EXISTS {helper}")
        b.step("writing the model")
        b.sql("CHECKPOINT")
