"""What is in this profile: hardware, processes, time windows, data captured and libraries used?

capture = first to last traced event of any kind; gpu_active = first to last kernel/memcpy/memset
(null without GPU activity). devices: the GPUs with hardware details where recorded, and per device the
kernels (count, summed duration_ns, streams), memcpy and memset counts over the whole capture.
top_processes: processes ranked by kernels they launched. table_rows: rows per model table; missing: data
the capture lacks, with the nsys flag that records it. libraries: frameworks and libraries recognised
from kernel names, each with the number of kernel executions and distinct names behind the guess.
"""

from __future__ import annotations

import duckdb
from pydantic import BaseModel, Field

from nsightful.profiles.model import TABLE_NAMES
from nsightful.tools.common import Finding, ProfileParams, ms

TOP_PROCESSES = 5  # a capture can hold hundreds of idle helper processes: the launching few matter

# (library, kernel-name regex, exclusion regex or None); RE2 syntax, matched on the demangled name.
LIBRARY_RULES: tuple[tuple[str, str, str | None], ...] = (
    ("PyTorch (ATen)", r"at::native::|vectorized_elementwise_kernel|unrolled_elementwise_kernel", None),
    ("Triton", r"(^|[^A-Za-z0-9])triton_", None),
    ("cuBLAS/CUTLASS GEMM", r"(?i)gemm|cublas|xmma|cutlass|nvjet", r"(?i)flash|fmha|attn|cudnn|fprop|dgrad|wgrad"),
    ("cuDNN", r"(?i)cudnn|xmma_(fprop|dgrad|wgrad)", None),
    ("FlashAttention / fused attention", r"(?i)flash_fwd|flash_bwd|flashattn|fmha|flash::", None),
    ("NCCL", r"(?i)nccl", None),
    ("nvFuser", r"nvfuser_", None),
)
# FlashAttention 3 (hopper/) kernels are flash::FlashAttn{Fwd,Bwd}Sm90 classes (early betas:
# flash::compute_attn_ws); FlashAttention 2 kernels are flash::flash_{fwd,bwd}_* templated on
# Flash_{fwd,bwd}_kernel_traits. Both live in namespace flash::, so the namespace alone decides nothing.
FA3_RE = r"FlashAttn(Fwd|Bwd)Sm\d+|flash::compute_attn_ws"
FA2_RE = r"Flash_(fwd|bwd)_kernel_traits|flash::flash_(fwd|bwd)"


class Params(ProfileParams):
    pass


class Window(BaseModel):
    start_ns: int
    end_ns: int
    duration_ns: int


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


class Process(BaseModel):
    pid: int
    name: str | None
    kernel_launches: int
    threads_launching: int = Field(description="threads that launched those kernels")


class Missing(BaseModel):
    data: str
    capture_flag: str


class Library(BaseModel):
    library: str
    kernel_count: int = Field(description="kernel executions whose name matched")
    distinct_names: int
    example: str = Field(description="short name of the most frequent matching kernel")
    version_hint: str | None = None


class Result(BaseModel):
    profile: str
    has_gpu_activity: bool
    note: str | None = Field(description="what the profile cannot answer, when something essential is missing")
    nsys_version: str | None
    schema_version: str | None
    host: str | None
    platform: str | None
    command_line: str | None
    capture: Window | None
    gpu_active: Window | None
    devices: list[Device]
    process_count: int
    top_processes: list[Process] = Field(description=f"at most {TOP_PROCESSES}, most kernel launches first")
    table_rows: dict[str, int]
    missing: list[Missing]
    libraries: list[Library]
    findings: list[Finding] = []


META_SQL = """SELECT nsys_version, schema_version, host, platform, command_line, capture_start_ns, capture_end_ns,
       gpu_start_ns, gpu_end_ns FROM meta"""

DEVICES_SQL = """
WITH k AS (SELECT device_id, count(*) AS n, sum(duration_ns) AS t, count(DISTINCT stream_id) AS st
           FROM kernels GROUP BY ALL),
c AS (SELECT device_id, count(*) AS n FROM memcpy GROUP BY ALL),
m AS (SELECT device_id, count(*) AS n FROM memset GROUP BY ALL)
SELECT g.device_id, g.name, g.chip, g.sm_count, g.memory_bytes, g.compute_capability, coalesce(k.n, 0),
       coalesce(k.t, 0), coalesce(k.st, 0), coalesce(c.n, 0), coalesce(m.n, 0)
FROM gpus g LEFT JOIN k USING (device_id) LEFT JOIN c USING (device_id) LEFT JOIN m USING (device_id)
ORDER BY g.device_id
"""

PROCESSES_SQL = """
WITH k AS (SELECT pid, count(*) AS n, count(DISTINCT tid) AS threads FROM kernels GROUP BY pid),
p AS (SELECT pid, min(name) AS name FROM processes GROUP BY pid)
SELECT k.pid, p.name, k.n, k.threads FROM k LEFT JOIN p USING (pid) ORDER BY k.n DESC, k.pid LIMIT $top
"""

COUNTED_TABLES = [t for t in TABLE_NAMES if t not in ("meta", "capabilities")]
TABLE_ROWS_SQL = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in COUNTED_TABLES)
PROCESS_COUNT_SQL = "SELECT count(DISTINCT pid) FROM processes"

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


def _window(start: int | None, end: int | None) -> Window | None:
    return None if start is None or end is None else Window(start_ns=start, end_ns=end, duration_ns=end - start)


def _version_hint(library: str, fa3: int | None, fa2: int | None) -> str | None:
    if not library.startswith("FlashAttention"):
        return None
    found = [label for label, n in (("flash-attn 2", fa2), ("flash-attn 3", fa3)) if n]
    if not found:
        return "no flash-attn 2/3 kernel names: another fused attention (e.g. fmha from cuDNN, xformers, TensorRT)"
    return " and ".join(found) + " (from kernel class names)"


def _libraries(con: duckdb.DuckDBPyConnection) -> list[Library]:
    args = {"libraries": [r[0] for r in LIBRARY_RULES], "includes": [r[1] for r in LIBRARY_RULES],
            "excludes": [r[2] for r in LIBRARY_RULES], "fa3": FA3_RE, "fa2": FA2_RE}
    return [Library(library=lib, kernel_count=int(n), distinct_names=names, example=example,
                    version_hint=_version_hint(lib, fa3, fa2))
            for lib, n, names, example, fa3, fa2 in con.execute(LIBRARIES_SQL, args).fetchall()]


def _note(capture: Window | None, gpu_active: Window | None, table_rows: dict[str, int]) -> str | None:
    if capture is None:
        return ("the export holds no timed events at all (no GPU activity, no CPU/API trace): nothing to "
                "analyse; re-capture with `nsys profile --trace=cuda,nvtx` around the workload")
    if gpu_active is None:
        return ("no GPU activity: the capture has no kernels, memcpy or memset"
                + (" although CUDA API calls were traced" if table_rows.get("cuda_api") else "")
                + "; check that the workload ran on the GPU inside the capture window (--trace=cuda)")
    return None


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    meta = con.execute(META_SQL).fetchone() or (None,) * 9
    capture, gpu_active = _window(meta[5], meta[6]), _window(meta[7], meta[8])
    table_rows = {name: n for name, n in con.execute(TABLE_ROWS_SQL).fetchall()}
    devices = [Device(device=r[0], name=r[1], chip=r[2], sm_count=r[3], memory_bytes=r[4], compute_capability=r[5],
                      kernel_count=r[6], kernel_time_ns=int(r[7]), stream_count=r[8], memcpy_count=r[9],
                      memset_count=r[10]) for r in con.execute(DEVICES_SQL).fetchall()]
    processes = [Process(pid=r[0], name=r[1], kernel_launches=r[2], threads_launching=r[3])
                 for r in con.execute(PROCESSES_SQL, {"top": TOP_PROCESSES}).fetchall()]
    missing = [Missing(data=d, capture_flag=f) for d, f in con.execute(
        "SELECT data, capture_flag FROM capabilities WHERE NOT present ORDER BY data").fetchall()]
    return Result(profile=params.profile, has_gpu_activity=gpu_active is not None,
                  note=_note(capture, gpu_active, table_rows), nsys_version=meta[0], schema_version=meta[1],
                  host=meta[2], platform=meta[3], command_line=meta[4], capture=capture, gpu_active=gpu_active,
                  devices=devices, process_count=con.execute(PROCESS_COUNT_SQL).fetchone()[0], top_processes=processes,
                  table_rows=table_rows, missing=missing, libraries=_libraries(con))


def findings(result: Result) -> list[Finding]:
    """A summary diagnoses nothing: the detectors live in the other tools."""
    return []


def render(result: Result) -> str:
    lines = [f"nsys {result.nsys_version or '?'} (export schema {result.schema_version or '?'}) on "
             f"{result.host or '?'}: {result.command_line or 'command line not recorded'}"]
    if result.note:
        lines.append(f"NOTE: {result.note}")
    if result.capture:
        active = f", GPU active {ms(result.gpu_active.duration_ns)}" if result.gpu_active else ""
        lines.append(f"capture {ms(result.capture.duration_ns)} "
                     f"({result.capture.start_ns}..{result.capture.end_ns} ns){active}")
    for d in result.devices:
        lines.append(f"device {d.device}: {d.name or 'GPU (no hardware info)'} {d.compute_capability or ''} - "
                     f"{d.kernel_count:,} kernels ({ms(d.kernel_time_ns)}) on {d.stream_count} streams, "
                     f"{d.memcpy_count:,} memcpy, {d.memset_count:,} memset")
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
    return "\n".join(lines)
