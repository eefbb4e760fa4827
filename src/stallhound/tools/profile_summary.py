"""What is in this profile (hardware, processes, windows, data captured, libraries), and can its trace be trusted?

capture = first to last traced event of any kind; gpu_active = first to last kernel/memcpy/memset/graph
execution (null without GPU activity); gpu_active_pct = gpu_active duration / capture duration, in percent.
devices: the GPUs with hardware details where recorded, and per device over the whole capture the kernels
(count, summed duration_ns, streams), memcpy, memset and whole-graph executions (graph_count), and
peak_memory_bytes: the highest device memory in use (model.PEAK_MEMORY_SQL: running sum of device-resident
allocations minus frees, counting only what was allocated inside the capture; null without
--cuda-memory-usage data). top_processes: processes ranked by kernels they launched
(launching_process_count: how many launched any). table_rows: rows per model
table; missing: data the capture lacks, with the capture option that records it. libraries: frameworks and libraries
recognised from kernel names, each with the number of kernel executions and distinct names behind the guess.
diagnostics: nsys' own messages about the capture, counted per severity, with the error and warning texts
(errors first, then by first occurrence; each distinct text once with its count and the processes it names).
trace_quality: one sentence per problem of the trace itself, most severe first, each with its next action:
what loading left out of a damaged or altered export (tables lacking a column, rows with unusable times),
kernel launch calls without kernel records (launch calls made inside CUDA stream capture are not counted:
they record graph nodes and run as graph launches), graphs recorded as whole graphs, CUDA API calls or copies
without any kernel, GPU work covering a small part of the capture, devices without hardware records, exports
cut or rewritten by another tool, nsys errors.
"""

from __future__ import annotations

from typing import Any

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import program, rules, trace_quality
from stallhound.analysis.common import Output, ProfileParams, Window, fetch_capped, ms, pct
from stallhound.analysis.program import Program
from stallhound.analysis.program_clues import KERNEL_FAMILIES
from stallhound.analysis.rules import Missing
from stallhound.formats.derive import LOAD_SOURCE
from stallhound.formats.registry import by_platform
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row
from stallhound.model.schema import DEVICE_MEMORY_KINDS, PEAK_MEMORY_SQL, TABLE_NAMES

TOP_PROCESSES = 5  # a capture can hold hundreds of idle helper processes: the launching few matter
TOP_DIAGNOSTICS = 5  # distinct warning/error texts shown; real captures repeat one text per process
DIAGNOSTIC_TEXT_CHARS = 300  # nsys error texts can carry whole exception dumps

# FlashAttention 3 (hopper/) kernels are flash::FlashAttn{Fwd,Bwd}Sm90 classes (early betas:
# flash::compute_attn_ws); FlashAttention 2 kernels are flash::flash_{fwd,bwd}_* templated on
# Flash_{fwd,bwd}_kernel_traits. Both live in namespace flash::, so the namespace alone decides nothing.
FA3_RE = r"FlashAttn(Fwd|Bwd)Sm\d+|flash::compute_attn_ws"
FA2_RE = r"Flash_(fwd|bwd)_kernel_traits|flash::flash_(fwd|bwd)"


class Params(ProfileParams):
    pass


class Device(BaseModel):
    device: int
    name: str | None
    chip: str | None
    sm_count: int | None
    memory_bytes: int | None
    compute_capability: str | None
    kernel_count: int
    kernel_time_ns: int
    stream_count: int = Field(description="streams with kernels")
    memcpy_count: int
    memset_count: int
    graph_count: int = Field(description="whole CUDA graph executions (graphs traced at graph level)")
    peak_memory_bytes: int | None = Field(description="highest device memory in use during the capture; null "
                                                      "without memory usage data")


class Process(BaseModel):
    pid: int
    name: str | None
    kernel_launches: int
    threads_launching: int = Field(description="threads that launched those kernels")


class Library(BaseModel):
    library: str
    kernel_count: int = Field(description="kernel executions whose name matched")
    distinct_names: int
    example: str = Field(description="short name of the most frequent matching kernel")
    version_hint: str | None = None


class DiagnosticMessage(BaseModel):
    severity: str = Field(description="error | warning")
    source: str = Field(description="where nsys produced it: injection, daemon, analysis")
    text: str = Field(description=f"the message, cut to {DIAGNOSTIC_TEXT_CHARS} characters")
    count: int = Field(description="times it was recorded")
    processes: int = Field(description="distinct processes it was recorded for")
    first_ns: int = Field(description="first time it was recorded")


class Distributed(BaseModel):
    rank: int | None = Field(description="global rank of the process that wrote the profile")
    world_size: int | None = Field(description="ranks in its job")
    backend: str | None = Field(description="torch.distributed backend (nccl, gloo, ...)")
    process_group_sizes: list[int] = Field(description="ranks in each process group of the job")
    source: str = Field(description="where the profile records it (meta.rank_source)")


class Diagnostics(BaseModel):
    counts: dict[str, int] = Field(description="messages per severity")
    messages: list[DiagnosticMessage] = Field(description=f"errors, then warnings; at most {TOP_DIAGNOSTICS}")
    truncated: bool


class Result(Output):
    profile: str
    program: Program = Field(description="what kind of program ran, from which evidence (picks the fix family)")
    has_gpu_activity: bool
    note: str | None = Field(description="what the profile cannot answer, when something essential is missing")
    nsys_version: str | None
    schema_version: str | None
    host: str | None
    platform: str | None
    command_line: str | None
    machine_gpus: str | None = Field(description="GPUs the export lists for the machine, used or not")
    derived_from: str | None = Field(description="set when another tool cut or rewrote the export")
    rank: str | None = Field(None, description="'rank R of world size W (source)' when the profile records its rank")
    distributed: Distributed | None = Field(None, description="the job the profile is one rank of, where it records it")
    capture: Window | None
    gpu_active: Window | None
    gpu_active_pct: float | None = Field(description="gpu_active duration / capture duration, %")
    devices: list[Device]
    process_count: int
    launching_process_count: int = Field(description="processes that launched kernels")
    top_processes: list[Process] = Field(description=f"at most {TOP_PROCESSES}, most kernel launches first")
    table_rows: dict[str, int]
    missing: list[Missing]
    libraries: list[Library]
    diagnostics: Diagnostics
    trace_quality: list[str] = Field(description="problems of the trace itself, most severe first, each with "
                                                 "its next action")


META_SQL = """SELECT nsys_version, schema_version, host, platform, command_line, capture_start_ns, capture_end_ns,
       gpu_start_ns, gpu_end_ns, machine_gpus, derived_from FROM meta"""

DEVICES_SQL = """
WITH k AS (SELECT device_id, count(*) AS n, sum(duration_ns) AS t, count(DISTINCT stream_id) AS st
           FROM kernels GROUP BY ALL),
c AS (SELECT device_id, count(*) AS n FROM memcpy GROUP BY ALL),
m AS (SELECT device_id, count(*) AS n FROM memset GROUP BY ALL),
x AS (SELECT device_id, count(*) AS n FROM graph_exec GROUP BY ALL),
peak AS (""" + PEAK_MEMORY_SQL + """)
SELECT g.device_id, g.name, g.chip, g.sm_count, g.memory_bytes, g.compute_capability, coalesce(k.n, 0),
       coalesce(k.t, 0), coalesce(k.st, 0), coalesce(c.n, 0), coalesce(m.n, 0), coalesce(x.n, 0), peak.peak_bytes
FROM gpus g LEFT JOIN k USING (device_id) LEFT JOIN c USING (device_id) LEFT JOIN m USING (device_id)
LEFT JOIN x USING (device_id) LEFT JOIN peak USING (device_id)
ORDER BY g.device_id
"""

PROCESSES_SQL = """
WITH k AS (SELECT pid, count(*) AS n, count(DISTINCT tid) AS threads FROM kernels GROUP BY pid),
p AS (SELECT pid, min(name) AS name FROM processes GROUP BY pid)
SELECT k.pid, p.name, k.n, k.threads FROM k LEFT JOIN p USING (pid) ORDER BY k.n DESC, k.pid LIMIT $top
"""

RANK_SQL = """SELECT CASE WHEN rank IS NOT NULL THEN format('rank {} of world size {} ({})', rank,
    coalesce(world_size::VARCHAR, '?'), rank_source) END FROM meta"""
DISTRIBUTED_SQL = """SELECT rank, world_size, comm_backend, coalesce(process_group_sizes, []), rank_source FROM meta
    WHERE rank_source IS NOT NULL"""
COUNTED_TABLES = [t for t in TABLE_NAMES if t not in ("meta", "capabilities")]
TABLE_ROWS_SQL = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in COUNTED_TABLES)
PROCESS_COUNT_SQL = "SELECT count(DISTINCT pid) FROM processes"
LAUNCHING_COUNT_SQL = "SELECT count(DISTINCT pid) FROM kernels"

LIBRARIES_SQL = """
WITH names AS (SELECT coalesce(name, short_name) AS kname, any_value(short_name) AS short, count(*) AS n
               FROM kernels GROUP BY 1),
rules AS (SELECT unnest($libraries) AS library, unnest($includes) AS inc, unnest($excludes) AS exc,
                 generate_subscripts($libraries, 1) AS rank),
hits AS (SELECT library, rank, kname, short, n FROM names JOIN rules ON regexp_matches(kname, inc)
         AND NOT coalesce(regexp_matches(kname, exc), false))
SELECT library, sum(n), count(*), first(coalesce(short, kname) ORDER BY n DESC, kname),
       sum(n) FILTER (WHERE regexp_matches(kname, $fa3)), sum(n) FILTER (WHERE regexp_matches(kname, $fa2))
FROM hits GROUP BY library, rank ORDER BY rank
"""


# nsys' own messages; the notes loading wrote (source LOAD_SOURCE) are trace-quality notes instead.
DIAGNOSTIC_COUNTS_SQL = (f"SELECT severity, count(*) FROM diagnostics WHERE source <> '{LOAD_SOURCE}' "
                         "GROUP BY 1 ORDER BY 2 DESC, 1")
DIAGNOSTIC_MESSAGES_SQL = f"""
SELECT severity, any_value(source), text, count(*), count(DISTINCT pid), min(time_ns) FROM diagnostics
WHERE severity IN ('error', 'warning') AND source <> '{LOAD_SOURCE}' GROUP BY severity, text
ORDER BY severity = 'error' DESC, min(time_ns), text LIMIT $limit
"""



def _version_hint(library: str, fa3: int | None, fa2: int | None) -> str | None:
    if not library.startswith("FlashAttention"):
        return None
    found = [label for label, n in (("flash-attn 2", fa2), ("flash-attn 3", fa3)) if n]
    if not found:
        return "no flash-attn 2/3 kernel names: another fused attention (e.g. fmha from cuDNN, xformers, TensorRT)"
    return " and ".join(found) + " (from kernel class names)"


def _libraries(con: duckdb.DuckDBPyConnection) -> list[Library]:
    args = {"libraries": [r[0] for r in KERNEL_FAMILIES], "includes": [r[1] for r in KERNEL_FAMILIES],
            "excludes": [r[2] for r in KERNEL_FAMILIES], "fa3": FA3_RE, "fa2": FA2_RE}
    return [Library(library=lib, kernel_count=int(n), distinct_names=names, example=example,
                    version_hint=_version_hint(lib, fa3, fa2))
            for lib, n, names, example, fa3, fa2 in con.execute(LIBRARIES_SQL, args).fetchall()]


def _note(con: duckdb.DuckDBPyConnection, capture: Window | None, gpu_active: Window | None,
          table_rows: dict[str, int]) -> str | None:
    if capture is None:
        return ("the export holds no timed events at all (no GPU activity, no CPU/API trace): nothing to "
                f"analyse; re-capture with {remedy(con, ('kernels', 'nvtx'))} around the workload")
    if gpu_active is None:
        return ("no GPU activity: the capture has no kernels, memcpy, memset or graph executions"
                + (" although CUDA API calls were traced" if table_rows.get("cuda_api") else "")
                + "; check that the workload ran on the GPU inside the capture window "
                  f"({remedy(con, ('kernels',), bare=True)})")
    return None


def _diagnostics(con: duckdb.DuckDBPyConnection) -> Diagnostics:
    rows, truncated = fetch_capped(con, DIAGNOSTIC_MESSAGES_SQL, {}, TOP_DIAGNOSTICS)
    messages = [DiagnosticMessage(severity=sev, source=src, text=text[:DIAGNOSTIC_TEXT_CHARS], count=n, processes=p,
                                  first_ns=first) for sev, src, text, n, p, first in rows]
    return Diagnostics(counts=dict(con.execute(DIAGNOSTIC_COUNTS_SQL).fetchall()), messages=messages,
                       truncated=truncated)


def _value(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """The one value of a query that returns one row: a count, or a figure of the one-row meta table."""
    row = one_row(con.execute(sql))
    return row[0]


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    meta = con.execute(META_SQL).fetchone() or (None,) * 11
    capture, gpu_active = trace_quality.window(meta[5], meta[6]), trace_quality.window(meta[7], meta[8])
    active_pct = pct(gpu_active.duration_ns, capture.duration_ns) if capture and gpu_active else None
    counts = dict(con.execute(TABLE_ROWS_SQL).fetchall())
    table_rows = {name: counts[name] for name in COUNTED_TABLES}  # the model's order: UNION ALL promises none
    devices = [Device(device=r[0], name=r[1], chip=r[2], sm_count=r[3], memory_bytes=r[4], compute_capability=r[5],
                      kernel_count=r[6], kernel_time_ns=int(r[7]), stream_count=r[8], memcpy_count=r[9],
                      memset_count=r[10], graph_count=r[11], peak_memory_bytes=r[12])
               for r in con.execute(DEVICES_SQL, {"kinds": list(DEVICE_MEMORY_KINDS)}).fetchall()]
    processes = [Process(pid=r[0], name=r[1], kernel_launches=r[2], threads_launching=r[3])
                 for r in con.execute(PROCESSES_SQL, {"top": TOP_PROCESSES}).fetchall()]
    return Result(profile=params.profile, program=program.detect(con), has_gpu_activity=gpu_active is not None,
                  note=_note(con, capture, gpu_active, table_rows), nsys_version=meta[0], schema_version=meta[1],
                  host=meta[2], platform=meta[3], command_line=meta[4], machine_gpus=meta[9], derived_from=meta[10],
                  capture=capture, gpu_active=gpu_active, gpu_active_pct=active_pct, devices=devices,
                  process_count=_value(con, PROCESS_COUNT_SQL), top_processes=processes,
                  launching_process_count=_value(con, LAUNCHING_COUNT_SQL),
                  table_rows=table_rows, missing=rules.missing(con), libraries=_libraries(con),
                  diagnostics=_diagnostics(con),
                  trace_quality=trace_quality.of_model(con),
                  rank=_value(con, RANK_SQL), distributed=_distributed(con))


def _distributed(con: duckdb.DuckDBPyConnection) -> Distributed | None:
    found = con.execute(DISTRIBUTED_SQL).fetchone()
    return None if found is None else Distributed(rank=found[0], world_size=found[1], backend=found[2],
                                                  process_group_sizes=found[3], source=found[4])


def render(result: Result) -> str:
    schema = result.schema_version or "?"
    written_by = by_platform(result.platform).written_by(result.nsys_version, schema)
    lines = [f"{written_by} on {result.host or '?'}: {result.command_line or 'command line not recorded'}"
             + (f"; {result.rank}" if result.rank else "")]
    if result.note:
        lines.append(f"NOTE: {result.note}")
    lines.extend(f"TRACE: {note}" for note in result.trace_quality)
    p = result.program
    lines.append(f"program: {p.kind} ({p.decided_by}); frameworks: {', '.join(p.frameworks) or 'none seen'}")
    if result.capture:
        active = (f", GPU active {ms(result.gpu_active.duration_ns)} ({result.gpu_active_pct}%)"
                  if result.gpu_active else "")
        lines.append(f"capture {ms(result.capture.duration_ns)} "
                     f"({result.capture.start_ns}..{result.capture.end_ns} ns){active}")
    for d in result.devices:
        lines.append(f"device {d.device}: {d.name or 'GPU (no hardware info)'} {d.compute_capability or ''} - "
                     f"{d.kernel_count:,} kernels ({ms(d.kernel_time_ns)}) on {d.stream_count} streams, "
                     f"{d.memcpy_count:,} memcpy, {d.memset_count:,} memset"
                     + (f", {d.graph_count:,} graph executions" if d.graph_count else "")
                     + (f", peak device memory {d.peak_memory_bytes / 2**20:,.1f} MiB"
                        if d.peak_memory_bytes is not None else ""))
    lines.append(f"{result.process_count} processes; launching kernels: " + (", ".join(
        f"{p.name or '?'} pid {p.pid} ({p.kernel_launches:,})" for p in result.top_processes) or "none"))
    lines.append("rows: " + (", ".join(f"{k} {v:,}" for k, v in result.table_rows.items() if v) or "none"))
    by_flag: dict[str, list[str]] = {}
    for m in result.missing:
        by_flag.setdefault(m.capture_flag, []).append(m.data)
    lines.extend(f"not captured: {', '.join(data)} -> {flag}" for flag, data in by_flag.items())
    lines.extend(f"library {lib.library}: {lib.kernel_count:,} kernels, {lib.distinct_names} names, e.g. "
                 f"{lib.example[:60]}" + (f" [{lib.version_hint}]" if lib.version_hint else "")
                 for lib in result.libraries)
    diag = result.diagnostics
    if diag.counts:
        lines.append("nsys diagnostics: " + ", ".join(f"{n:,} {sev}" for sev, n in diag.counts.items()))
        lines.extend(f"  {m.severity} x{m.count} ({f'{m.processes} processes' if m.processes else 'session'}): "
                     f"{' '.join(m.text.split())[:160]}" for m in diag.messages)
        if diag.truncated:
            lines.append(f"  ... more distinct messages (first {TOP_DIAGNOSTICS} shown): query the diagnostics table")
    return "\n".join(lines)
