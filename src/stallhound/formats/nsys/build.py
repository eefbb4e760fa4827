"""Build the profile model (see model.schema) from a raw nsys SQLite export into a DuckDB file.

Small tables (strings, enums, threads, hardware, metadata) are read with the stdlib sqlite3 so
that text which is not UTF-8 survives; the large activity tables are scanned by DuckDB's SQLite
scanner, host and GPU tables side by side (each scan also splits its table into rowid ranges over every core,
as insertion order is not kept: BUILD_SETTINGS).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import duckdb

from stallhound.formats.build_steps import NO_PROGRESS_BAR, Progress, insert_rows
from stallhound.formats.comm_kernels import COLLECTIVE_SQL, FAMILY_SQL
from stallhound.formats.derive import API_KIND_SQL, KERNEL_CATEGORY_SQL, WINDOW_SQL
from stallhound.formats.nsys import checks, hardware, libraries, stacks
from stallhound.formats.nsys import nvtx as nvtx_build
from stallhound.formats.nsys.activity_join import PID_SQL, TID_SQL, ActivityJoins
from stallhound.formats.nsys.chunks import correlation_ranges, rows_per_range
from stallhound.formats.nsys.raw import RawExport
from stallhound.model.duck import SCANNER_SETTINGS, Settings, load_sqlite_scanner, one_row
from stallhound.model.limits import build_memory_mb
from stallhound.model.schema import MODEL_VERSION

NO_ID = 4294967295  # (uint32)-1: nsys' "no device/stream" in sync records
# A build's fixed cost (DuckDB's log synced at each of ~60 commits) dominates small exports only: up to this size an
# export is written in a few transactions; a larger one as before, statement by statement (BuildSteps.batch).
BATCHED_MAX_BYTES = 64 * 2**20


def _label(name: str, prefix: str) -> str:
    short = name[len(prefix):] if name.startswith(prefix) else name
    return short.lower()


def _unknown_or_lower(name: str) -> str:
    """Diagnostic enum names (Info, Warning, UnknownLevel, UnknownSource, ...) as labels."""
    return "unknown" if name.startswith("Unknown") else name.lower()


# Why the driver migrated unified memory (CUPTI's migration causes), in the words the tools use.
MIGRATION_CAUSES = {"USER": "user_prefetch", "COHERENCE": "page_fault", "PREFETCH": "speculative_prefetch"}


def _migration_cause(name: str) -> str:
    short = name.removeprefix("CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_")
    return MIGRATION_CAUSES.get(short, short.lower())


def _direction(name: str) -> str:
    short = name.removeprefix("CUDA_MEMCPY_KIND_")
    return "unknown" if short == "UNKNOWN" else re.sub(r"([A-Z])TO([A-Z])", r"\g<1>2\g<2>", short)


# The steps of an export's build as progress reports them; host and GPU tables build side by side, so the middle
# steps report in either order.
STEPS = ("strings and enums", "NVTX ranges", "OS runtime, CPU samples, scheduling, libraries", "CUDA API calls",
         "kernels", "memcpy, memset, sync", "CUDA graphs, device memory, UVM faults", "NVTX nesting",
         "devices, metadata, capabilities", "writing the model")


class Builder(ActivityJoins):
    """One build of one export."""

    steps = STEPS
    settings: ClassVar[Settings] = SCANNER_SETTINGS  # load_sqlite_scanner then refuses unsigned extensions

    def __init__(self, raw: RawExport, out: Path, progress: Progress | None = None,
                 cancelled: threading.Event | None = None):
        super().__init__(raw, out, progress, f"{build_memory_mb()}MB", cancelled)
        self.out = out
        self.enum_source = "profile"
        self.has_stacks: set[str] = set()  # the stacks.SOURCES the export has call stacks of
        self.chain_shift = 0  # added to a CUDA call's callchainId to find its chain (stacks.CUDA_SHIFT_SQL)

    # --- small tables, read with sqlite3 -------------------------------------------------------
    def strings(self) -> None:
        ids, values = self.raw.strings()
        self.sql("CREATE TABLE _strings (id BIGINT, value VARCHAR)")
        self.con.execute("INSERT INTO _strings SELECT unnest($ids), unnest($values)", {"ids": ids, "values": values})

    def enums(self) -> None:
        self.sql("CREATE TABLE enums (enum VARCHAR, code BIGINT, name VARCHAR, label VARCHAR)")
        labels = {
            "ENUM_CUDA_MEMCPY_OPER": _direction,
            "ENUM_CUDA_MEM_KIND": lambda n: _label(n, "CUDA_MEMOPR_MEMORY_KIND_"),
            "ENUM_CUDA_UNIF_MEM_MIGRATION": _migration_cause,
            "ENUM_CUPTI_SYNC_TYPE": lambda n: _label(n, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_"),
            "ENUM_NSYS_EVENT_TYPE": lambda n: n,
            "ENUM_CUDA_DEV_MEM_EVENT_OPER": lambda n: _label(n, "CUDA_DEV_MEM_EVENT_OPR_"),
            "ENUM_DIAGNOSTIC_SEVERITY_LEVEL": _unknown_or_lower,
            "ENUM_DIAGNOSTIC_SOURCE_TYPE": _unknown_or_lower,
        }
        for table, to_label in labels.items():
            codes, from_profile = self.raw.enum(table)
            if not from_profile and self.needs_enum(table):
                self.enum_source = "profile+builtin"
            rows = [(table, code, name, to_label(name)) for code, name in codes.items()]
            insert_rows(self.con, "enums", rows)

    def needs_enum(self, table: str) -> bool:
        """Whether the export has rows that this ENUM table decodes."""
        if table == "ENUM_CUDA_UNIF_MEM_MIGRATION":  # only the unified-memory rows of a copy table carry a cause
            return "migrationCause" in self.cols("CUPTI_ACTIVITY_KIND_MEMCPY") and self.raw.nonempty(
                "CUPTI_ACTIVITY_KIND_MEMCPY")
        users = {"ENUM_CUDA_MEMCPY_OPER": "CUPTI_ACTIVITY_KIND_MEMCPY",
                 "ENUM_CUDA_MEM_KIND": "CUPTI_ACTIVITY_KIND_MEMCPY",
                 "ENUM_CUPTI_SYNC_TYPE": "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "ENUM_NSYS_EVENT_TYPE": "NVTX_EVENTS",
                 "ENUM_CUDA_DEV_MEM_EVENT_OPER": "CUDA_GPU_MEMORY_USAGE_EVENTS",
                 "ENUM_DIAGNOSTIC_SEVERITY_LEVEL": "DIAGNOSTIC_EVENT",
                 "ENUM_DIAGNOSTIC_SOURCE_TYPE": "DIAGNOSTIC_EVENT"}
        return self.raw.nonempty(users[table])

    def processes_threads(self) -> None:
        procs = []
        if {"pid", "name"} <= self.cols("PROCESSES"):
            procs = sorted({(int(pid), name) for pid, name in self.raw.rows("PROCESSES", "pid, name")})
        self.load_list("processes", procs)
        self.create("threads")
        if {"nameId", "globalTid"} <= self.cols("ThreadNames"):
            self.sql(f"""INSERT INTO threads SELECT DISTINCT {PID_SQL.format(col='r.globalTid')},
                         {TID_SQL.format(col='r.globalTid')}, s.value
                         FROM {self.src('ThreadNames')} r LEFT JOIN _strings s ON s.id = r.nameId""")

    def diagnostics(self) -> None:
        t = "DIAGNOSTIC_EVENT"
        rows = []
        if {"timestamp", "severity", "source", "text"} <= self.cols(t):
            severity, source = (dict(self.con.execute("SELECT code, label FROM enums WHERE enum = ?", [e]).fetchall())
                                for e in ("ENUM_DIAGNOSTIC_SEVERITY_LEVEL", "ENUM_DIAGNOSTIC_SOURCE_TYPE"))
            pid = '"globalPid"' if "globalPid" in self.cols(t) else "NULL"
            for time, sev, src, text, gpid in self.raw.rows(t, f"timestamp, severity, source, text, {pid}"):
                # session-wide messages carry a globalPid whose process part is 0
                os_pid = (gpid >> 24) & 0xFFFFFF if gpid is not None else 0
                rows.append((time, severity.get(sev, "unknown"), source.get(src, "unknown"), os_pid or None, text))
        self.load_list("diagnostics", sorted(rows, key=lambda r: r[0]))

    # --- activity tables, scanned by DuckDB ------------------------------------------------------
    def cuda_api(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "CUPTI_ACTIVITY_KIND_RUNTIME"
        self.create("cuda_api", cur)
        if not self.raw.has(t):
            return
        # Every string classified (a few thousand to a few hundred thousand, against millions of calls): the calls
        # are then written in one pass of the SQLite scanner, with no copy to learn which names they use.
        self.sql(f"""CREATE TABLE _api_names AS SELECT id, name, {API_KIND_SQL} AS kind FROM (
              SELECT id, regexp_replace(value, '_v[0-9]+$', '') AS name FROM _strings)""", cur)
        stack, chains = stacks.link(self, "cuda", t, "callchainId")
        self.sql(f"""INSERT INTO cuda_api
            SELECT {PID_SQL.format(col='r.globalTid')}, {TID_SQL.format(col='r.globalTid')},
                r.correlationId, n.name, r.start, r."end", r."end" - r.start, coalesce(n.kind, 'other'),
                {self.col(t, 'returnValue')}, {stack}
            FROM {self.src(t)} r LEFT JOIN _api_names n ON n.id = r.nameId {chains}""", cur)
        self.ranges = correlation_ranges(cur, rows_per_range())

    def kernels(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "CUPTI_ACTIVITY_KIND_KERNEL"
        self.create("kernels", cur)
        if not self.raw.has(t):
            return
        self.sql(f"""CREATE TABLE _kernel_names AS
            SELECT id, value, {KERNEL_CATEGORY_SQL} AS category, {COLLECTIVE_SQL} AS nccl_collective,
                   {FAMILY_SQL} AS comm_family
            FROM _strings WHERE id IN (SELECT DISTINCT unnest([shortName, demangledName])
                                      FROM {self.activity(t, cur)})""", cur)  # one pass over the kernels
        self.joined(t, "kernels", lambda src, calls: f"""INSERT INTO kernels SELECT r.deviceId, r.contextId, r.streamId,
                {PID_SQL.format(col='r.globalPid')} AS pid, a.tid, r.correlationId, r.start, r."end", r."end" - r.start,
                s.value, coalesce(d.value, s.value), r.gridX, r.gridY, r.gridZ, r.blockX, r.blockY, r.blockZ,
                r.registersPerThread, r.staticSharedMemory, r.dynamicSharedMemory,
                {self.col(t, 'graphId')}, nullif({self.col(t, 'graphNodeId')}, 0),
                coalesce(d.category, s.category), coalesce(d.nccl_collective, s.nccl_collective),
                a.name, a.start_ns, a.end_ns, NULL, NULL, NULL, NULL, NULL, coalesce(d.comm_family, s.comm_family)
            FROM {src} r
            LEFT JOIN _kernel_names s ON s.id = r.shortName
            LEFT JOIN _kernel_names d ON d.id = r.demangledName
            {calls('launch', 'graph')}""", cur)

    def memcpy(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        self.create("memcpy", cur)
        if not self.raw.has(t):
            return
        self.joined(t, "memcpy", lambda src, calls: f"""INSERT INTO memcpy
            SELECT r.deviceId, r.streamId, {PID_SQL.format(col='r.globalPid')},
                a.tid, r.correlationId, r.start, r."end", r."end" - r.start, r.bytes,
                coalesce(op.label, 'unknown'), coalesce(sk.label, 'unknown'), coalesce(dk.label, 'unknown'),
                {self.col(t, 'srcDeviceId')}, {self.col(t, 'dstDeviceId')}, a.name, a.start_ns, a.end_ns,
                CASE WHEN op.label LIKE 'UVM%' THEN coalesce(mc.label, 'unknown') END
            FROM {src} r
            LEFT JOIN enums op ON op.enum = 'ENUM_CUDA_MEMCPY_OPER' AND op.code = r.copyKind
            LEFT JOIN enums mc ON mc.enum = 'ENUM_CUDA_UNIF_MEM_MIGRATION' AND mc.code = {self.col(t, 'migrationCause')}
            LEFT JOIN enums sk ON sk.enum = 'ENUM_CUDA_MEM_KIND' AND sk.code = r.srcKind
            LEFT JOIN enums dk ON dk.enum = 'ENUM_CUDA_MEM_KIND' AND dk.code = r.dstKind
            {calls('memcpy')}""", cur)

    def memset(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        self.create("memset", cur)
        if not self.raw.has(t):
            return
        self.joined(t, "memset", lambda src, calls: f"""INSERT INTO memset
            SELECT r.deviceId, r.streamId, {PID_SQL.format(col='r.globalPid')}, a.tid,
                r.correlationId, r.start, r."end", r."end" - r.start, r.bytes, coalesce(mk.label, 'unknown'),
                a.start_ns, a.end_ns
            FROM {src} r
            LEFT JOIN enums mk ON mk.enum = 'ENUM_CUDA_MEM_KIND' AND mk.code = {self.col(t, 'memKind')}
            {calls('memset')}""", cur)

    def sync(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
        self.create("sync", cur)
        if not self.raw.has(t):
            return
        self.joined(t, "sync", lambda src, calls: f"""INSERT INTO sync
            SELECT nullif(r.deviceId, {NO_ID}), nullif(r.streamId, {NO_ID}),
                {PID_SQL.format(col='r.globalPid')}, a.tid,
                r.correlationId, r.start, r."end", r."end" - r.start, coalesce(st.label, 'unknown'), a.name
            FROM {src} r
            LEFT JOIN enums st ON st.enum = 'ENUM_CUPTI_SYNC_TYPE' AND st.code = r.syncType
            {calls('sync', 'memcpy', 'other')}""", cur)

    def graph_exec(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
        self.create("graph_exec", cur)
        if not self.raw.has(t):
            return
        self.joined(t, "graph_exec", lambda src, calls: f"""INSERT INTO graph_exec
            SELECT r.deviceId, r.contextId, r.streamId,
                {PID_SQL.format(col='r.globalPid')}, a.tid, r.correlationId, r.start, r."end", r."end" - r.start,
                {self.col(t, 'graphId')}, {self.col(t, 'graphExecId')}, a.name, a.start_ns, a.end_ns
            FROM {src} r
            {calls('graph')}""", cur)

    def memory_usage(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "CUDA_GPU_MEMORY_USAGE_EVENTS"
        self.create("memory_usage", cur)
        if not self.raw.has(t):
            return
        self.sql(f"""INSERT INTO memory_usage SELECT r.deviceId, {PID_SQL.format(col='r.globalPid')}, r.start,
                coalesce(op.label, 'unknown'), coalesce(mk.label, 'unknown'), r.bytes, r.address,
                {self.col(t, 'correlationId')}
            FROM {self.src(t)} r
            LEFT JOIN enums op ON op.enum = 'ENUM_CUDA_DEV_MEM_EVENT_OPER' AND op.code = r.memoryOperationType
            LEFT JOIN enums mk ON mk.enum = 'ENUM_CUDA_MEM_KIND' AND mk.code = r.memKind""", cur)

    def uvm_faults(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.create("uvm_faults", cur)
        cpu, gpu = "CUDA_UM_CPU_PAGE_FAULT_EVENTS", "CUDA_UM_GPU_PAGE_FAULT_EVENTS"
        if self.raw.has(cpu):
            self.sql(f"""INSERT INTO uvm_faults SELECT 'cpu', NULL, {PID_SQL.format(col='r.globalPid')}, r.start,
                    NULL, r.address, 1 FROM {self.src(cpu)} r""", cur)
        if self.raw.has(gpu):
            self.sql(f"""INSERT INTO uvm_faults SELECT 'gpu', r.deviceId, {PID_SQL.format(col='r.globalPid')},
                    r.start, r."end", r.address, {self.col(gpu, 'numberOfPageFaults', '1')}
                FROM {self.src(gpu)} r""", cur)

    def profiler_overhead(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "PROFILER_OVERHEAD"
        self.create("profiler_overhead", cur)
        if {"start", "end", "globalTid"} <= self.cols(t):
            self.sql(f"""INSERT INTO profiler_overhead SELECT {PID_SQL.format(col='r.globalTid')},
                    {TID_SQL.format(col='r.globalTid')}, s.value, r.start, r."end", r."end" - r.start
                FROM {self.src(t)} r LEFT JOIN _strings s ON s.id = {self.col(t, 'nameId')}""", cur)

    def os_runtime(self, cur: duckdb.DuckDBPyConnection) -> None:
        t = "OSRT_API"
        self.create("os_runtime", cur)
        if self.raw.has(t):
            stack, chains = stacks.link(self, "osrt", t, "callchainId")
            self.sql(f"""INSERT INTO os_runtime SELECT {PID_SQL.format(col='r.globalTid')},
                    {TID_SQL.format(col='r.globalTid')}, s.value, r.start, r."end", r."end" - r.start, {stack}
                FROM {self.src(t)} r LEFT JOIN _strings s ON s.id = r.nameId {chains}""", cur)

    def cpu_samples(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.create("cpu_samples", cur)
        if {"start", "globalTid"} <= self.cols("COMPOSITE_EVENTS"):
            stack, chains = stacks.link(self, "sampling", "COMPOSITE_EVENTS", "id")
            self.sql(f"""INSERT INTO cpu_samples SELECT {PID_SQL.format(col='r.globalTid')},
                    {TID_SQL.format(col='r.globalTid')}, r.start, {self.col('COMPOSITE_EVENTS', 'cpu')}, {stack}
                FROM {self.src('COMPOSITE_EVENTS')} r {chains}""", cur)

    def sched(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.create("sched", cur)
        if {"start", "globalTid", "isSchedIn"} <= self.cols("SCHED_EVENTS"):
            self.sql(f"""INSERT INTO sched SELECT {PID_SQL.format(col='r.globalTid')},
                    {TID_SQL.format(col='r.globalTid')}, r.start, r.cpu, r.isSchedIn <> 0
                FROM {self.src('SCHED_EVENTS')} r""", cur)

    # --- derived: devices, metadata, capabilities ----------------------------------------------
    def gpus(self) -> None:
        devices = [r[0] for r in self.con.execute(
            """SELECT DISTINCT device_id FROM (SELECT device_id FROM kernels UNION ALL SELECT device_id FROM memcpy
               UNION ALL SELECT device_id FROM memset UNION ALL SELECT device_id FROM graph_exec)
               WHERE device_id IS NOT NULL ORDER BY 1""").fetchall()]
        self.load_list("gpus", hardware.gpu_rows(self.raw, devices))

    def meta(self, source_path: Path, source_bytes: int, fingerprint: str) -> None:
        windows = one_row(self.con.execute(WINDOW_SQL))
        row = hardware.meta_row(self.raw, source_path, source_bytes, fingerprint, MODEL_VERSION, self.enum_source,
                                windows)
        self.load_list("meta", [row])

    def capabilities(self) -> None:
        if (diagnostic := hardware.cuda_not_started(self.con)) is not None:
            checks.record(self.con, [hardware.not_started_note(diagnostic)])
        if (cut := hardware.time_limit_note(self.raw)) is not None:
            checks.record(self.con, [cut])
        self.load_list("capabilities", hardware.capability_rows(self.con))

    # --- the two sides the build writes at once, each on its own cursor --------------------------
    def host_side(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.step("NVTX ranges")
        nvtx_build.stage(self, cur)
        self.step("NVTX nesting")
        nvtx_build.write(self, cur)
        self.step("OS runtime, CPU samples, scheduling, libraries")
        self.os_runtime(cur)
        self.cpu_samples(cur)
        self.sched(cur)
        libraries.host_modules(self, cur)
        libraries.library_api(self, cur)
        self.profiler_overhead(cur)

    def gpu_side(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.step("CUDA API calls")
        self.cuda_api(cur)
        self.step("kernels")
        self.kernels(cur)
        self.step("memcpy, memset, sync")
        self.memcpy(cur)
        self.memset(cur)
        self.sync(cur)
        self.step("CUDA graphs, device memory, UVM faults")
        self.graph_exec(cur)
        self.memory_usage(cur)
        self.uvm_faults(cur)


def both_sides(b: Builder) -> None:
    """The host side and the GPU side of the model, written at once on two cursors of the build's connection, each
    side one batch (BuildSteps.batch)."""
    cursors = [b.con.cursor(), b.con.cursor()]
    for cur in cursors:
        cur.execute(NO_PROGRESS_BAR)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for future in [pool.submit(b.in_batch, fn, cur)
                           for fn, cur in zip((b.host_side, b.gpu_side), cursors, strict=True)]:
                future.result()
    finally:
        for cur in cursors:
            cur.close()


def build(raw: RawExport, out: Path, fingerprint: str, progress: Progress | None = None,
          cancelled: threading.Event | None = None) -> None:
    """Write the model of `raw` into the DuckDB file `out` (which must not exist); setting `cancelled` stops it
    with LoadCancelled. An export of up to BATCHED_MAX_BYTES is written in a few transactions (BuildSteps.batch)."""
    b = Builder(raw, out, progress, cancelled)
    b.batched = raw.path.stat().st_size <= BATCHED_MAX_BYTES
    with b.running():
        load_sqlite_scanner(b.con)
        if raw.loose:  # cells as text, cast as their columns declare (RawExport.scan)
            b.sql("SET GLOBAL sqlite_all_varchar = true")
        b.sql(f"ATTACH '{_quote(raw.scan_path)}' AS raw (TYPE sqlite, READ_ONLY)")
        b.step("strings and enums")
        with b.batch():  # committed before the sides start: they read these tables
            b.strings()
            b.enums()
            b.processes_threads()
            b.diagnostics()
            stacks.build(b)
        both_sides(b)
        with b.batch():
            _finish(b, raw, fingerprint)
        b.sql("DETACH raw")
        b.step("writing the model")
        b.sql("CHECKPOINT")


def _finish(b: Builder, raw: RawExport, fingerprint: str) -> None:
    """What is read from both sides: the damaged rows' checks, devices, metadata, capabilities; the helpers dropped."""
    checks.clean(b.con, raw.notes)
    b.step("devices, metadata, capabilities")
    b.gpus()
    b.meta(raw.path, raw.path.stat().st_size, fingerprint)
    b.capabilities()
    for helper in ("_strings", "_api_names", "_kernel_names", *nvtx_build.HELPERS, *stacks.HELPERS, "enums"):
        b.sql(f"DROP TABLE IF EXISTS {helper}")


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")
