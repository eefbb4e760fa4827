"""What kind of program made this profile: PyTorch, JAX, TensorRT, other Python, CUDA C/C++, OpenMP/OpenACC
offload, Julia, or unknown; which frameworks it used; and which evidence decided it.

The kind picks the fix family of every finding (book/__init__.py): a C++ program never gets a PyTorch fix.
Evidence is read from the processes that did GPU work (the one with the most kernels, copies and memsets
first), the profiled command line, thread names, NVTX domains and range texts, kernel name families and the
CUDA API mix. Every rule is a named pattern below (the NVTX range texts' in analysis/nvtx_texts.py); `evidence`
lists what matched, `decided_by` the rule that set the kind.
"""

from __future__ import annotations

import re
from typing import Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import nvtx_texts
from stallhound.analysis.common import per_model
from stallhound.model.duck import one_row

Kind = Literal["pytorch", "jax", "tensorrt", "python", "cuda", "offload", "julia", "unknown"]

# Fix families to try, most specific first (see book/__init__.py); every chain ends with generic.
FIX_CHAINS: dict[str, tuple[str, ...]] = {
    "pytorch": ("pytorch", "python", "generic"),
    "jax": ("python", "generic"),
    "python": ("python", "generic"),
    "tensorrt": ("generic",),
    "cuda": ("cuda", "generic"),
    "offload": ("offload", "generic"),
    "julia": ("generic",),
    "unknown": ("generic",),
}

PYTHON_PROCESS = re.compile(r"(^|/)(python[\d.]*|pytest|torchrun|accelerate|deepspeed|ipython|jupyter.*|uvicorn|"
                            r"gunicorn|ray|vllm)( |$)", re.I)
JULIA_PROCESS = re.compile(r"(^|/)julia( |$)", re.I)
TRT_PROCESS = re.compile(r"(^|/)trtexec( |$)|tensorrt", re.I)
PYTORCH_THREADS = re.compile(r"^pt_(autograd|nccl|main_thread|thread_pool|tcpstore)")

# Kernel name families: (framework, regex, exclusion regex or None), RE2 syntax, matched on the demangled name.
# profile_summary lists the same families as the libraries a profile used.
KERNEL_FAMILIES: tuple[tuple[str, str, str | None], ...] = (
    ("PyTorch (ATen)", r"at::native::|\bc10::|vectorized_elementwise_kernel|unrolled_elementwise_kernel", None),
    ("Triton", r"(^|[^A-Za-z0-9])triton_", None),
    ("cuBLAS/CUTLASS GEMM", r"(?i)gemm|cublas|xmma|cutlass|nvjet", r"(?i)flash|fmha|attn|cudnn|fprop|dgrad|wgrad"),
    ("cuDNN", r"(?i)cudnn|xmma_(fprop|dgrad|wgrad)", None),
    ("FlashAttention / fused attention", r"(?i)flash_fwd|flash_bwd|flashattn|fmha|flash::", None),
    ("NCCL", r"(?i)nccl", None),
    ("nvFuser", r"nvfuser_", None),
    ("Transformer Engine", r"transformer_engine::", None),
    ("vLLM", r"\bvllm::", None),
    ("XLA (JAX/TensorFlow)", r"stream_executor::|^(loop|input|wrapped|gemm)_fusion|^fusion(_\d+)?$|xla_", None),
    ("TensorRT", r"^__myl_|\btrt_|tensorrt", None),
    ("CuPy", r"^cupy_|cupy::", None),
    ("Numba", r"cudapy::|numba", None),
    ("CUDA.jl (Julia)", r"julia_", None),
    ("OpenACC (nvc/nvfortran)", r"_\d+_gpu(__red)?$|_gpu_\d+$", None),
    ("OpenMP offload", r"^nvkernel_|__omp_offloading_", None),
    ("CUB/Thrust", r"\bcub::|\bthrust::", None),
)
# NVTX domains and the framework they show (range texts: analysis/nvtx_texts.py).
NVTX_DOMAINS: dict[str, str] = {"MPI": "MPI", "TSL": "XLA (JAX/TensorFlow)", "TensorRT": "TensorRT",
                                "CCCL": "CUB/Thrust", "NCCL": "NCCL", "cuDNN": "cuDNN", "cuBLAS": "cuBLAS"}
MIN_KERNELS_FOR_FAMILY = 1  # one kernel of a framework's family shows the framework ran


class Program(BaseModel):
    kind: Kind = Field(description="the program kind that picks the fix family of every finding")
    fix_chain: list[str] = Field(description="book fix families tried in order, most specific first")
    frameworks: list[str] = Field(description="frameworks and libraries seen, most kernels first")
    process: str | None = Field(description="name of the process that did the most GPU work")
    evidence: list[str] = Field(description="what was seen, one short line each")
    decided_by: str = Field(description="the evidence that set `kind`")


MAIN_PROCESS_SQL = """
WITH work AS (SELECT pid FROM kernels UNION ALL SELECT pid FROM memcpy UNION ALL SELECT pid FROM memset
              UNION ALL SELECT pid FROM graph_exec UNION ALL SELECT pid FROM cuda_api)
SELECT w.pid, any_value(p.name), count(*) AS n FROM work w LEFT JOIN processes p USING (pid)
GROUP BY w.pid ORDER BY n DESC, w.pid LIMIT 1
"""
KERNEL_FAMILY_SQL = """
WITH names AS (SELECT coalesce(name, short_name, '') AS n, count(*) AS c FROM kernels GROUP BY 1),
rules AS (SELECT unnest($labels) AS label, unnest($patterns) AS pattern, unnest($excludes) AS exclude,
                 generate_subscripts($labels, 1) AS rank)
SELECT label, sum(c)::BIGINT FROM names JOIN rules ON regexp_matches(n, pattern)
  AND NOT coalesce(regexp_matches(n, exclude), false)
GROUP BY label, rank HAVING sum(c) >= $min ORDER BY 2 DESC, rank
"""
THREADS_SQL = "SELECT DISTINCT name FROM threads WHERE pid = $pid AND name IS NOT NULL"
DOMAINS_SQL = "SELECT DISTINCT domain FROM nvtx WHERE domain IS NOT NULL"
LAUNCH_APIS_SQL = """SELECT count(*) FILTER (WHERE name LIKE 'cuda%'), count(*) FILTER (WHERE name LIKE 'cu%'
                     AND name NOT LIKE 'cuda%') FROM cuda_api WHERE kind IN ('launch', 'graph')"""


def _families(con: duckdb.DuckDBPyConnection, sql: str, rules: tuple[tuple, ...],
              extra: dict[str, object]) -> dict[str, int]:
    args = {"labels": [r[0] for r in rules], "patterns": [r[1] for r in rules], **extra}
    return dict(con.execute(sql, args).fetchall())


def detect(con: duckdb.DuckDBPyConnection) -> Program:
    """The program behind the profile (computed once per model)."""
    return per_model(con, ("program",), lambda: _detect(con))


def _detect(con: duckdb.DuckDBPyConnection) -> Program:
    main = con.execute(MAIN_PROCESS_SQL).fetchone()
    pid, process = (main[0], main[1]) if main else (None, None)
    command = con.execute("SELECT command_line FROM meta").fetchone()
    command = command[0] if command else None
    kernels = _families(con, KERNEL_FAMILY_SQL, KERNEL_FAMILIES,
                        {"min": MIN_KERNELS_FOR_FAMILY, "excludes": [r[2] for r in KERNEL_FAMILIES]})
    nvtx = nvtx_texts.classified(con).families
    domains = {NVTX_DOMAINS[d] for (d,) in con.execute(DOMAINS_SQL).fetchall() if d in NVTX_DOMAINS}
    threads = [t for (t,) in con.execute(THREADS_SQL, {"pid": pid}).fetchall()] if pid is not None else []
    runtime_launches, driver_launches = one_row(con.execute(LAUNCH_APIS_SQL))

    evidence = []
    if process:
        evidence.append(f"process with the most GPU work: {process}")
    if command:
        evidence.append(f"command line: {command[:120]}")
    evidence += [f"kernels of {label}: {n:,}" for label, n in kernels.items()]
    evidence += [f"NVTX ranges of {label}: {n:,}" for label, n in nvtx.items()]
    evidence += [f"NVTX domain of {label}" for label in sorted(domains)]
    pt_threads = sorted(t for t in threads if PYTORCH_THREADS.search(t))
    if pt_threads:
        evidence.append(f"PyTorch threads: {', '.join(pt_threads[:4])}")
    if driver_launches and not runtime_launches:
        evidence.append(f"launches only through the driver API ({driver_launches:,}): run-time compiled kernels")

    seen = {**kernels, **nvtx, **{d: 0 for d in sorted(domains)}}  # sorted: a set's order changes per process
    frameworks = sorted(seen, key=lambda k: -seen[k])
    kind, decided = _kind(process, command, seen, bool(pt_threads), driver_launches, runtime_launches)
    return Program(kind=kind, fix_chain=list(FIX_CHAINS[kind]), frameworks=frameworks, process=process,
                   evidence=evidence, decided_by=decided)


def _kind(process: str | None, command: str | None, seen: dict[str, int], pt_threads: bool,
          driver_launches: int, runtime_launches: int) -> tuple[Kind, str]:
    """The first rule that holds, in order of specificity."""
    names = " ".join(filter(None, (process, command)))
    python = bool(PYTHON_PROCESS.search(process or "") or PYTHON_PROCESS.search(command or ""))
    torch = "PyTorch (ATen)" in seen or "PyTorch FSDP" in seen or pt_threads
    rules: tuple[tuple[bool, Kind, str], ...] = (
        (process is None and not seen, "unknown", "no process did GPU work or traced CUDA calls"),
        (torch and (python or pt_threads), "pytorch", "PyTorch kernels, NVTX ranges or threads in a Python process"),
        ("XLA (JAX/TensorFlow)" in seen and python, "jax", "XLA kernels or NVTX ranges in a Python process"),
        (bool(TRT_PROCESS.search(names)) or "TensorRT" in seen, "tensorrt", "TensorRT process, kernels or NVTX"),
        (python, "python", f"Python process or command line ({process or command})"),
        (bool(JULIA_PROCESS.search(names)) or "CUDA.jl (Julia)" in seen, "julia", "Julia process or CUDA.jl kernels"),
        ("OpenACC (nvc/nvfortran)" in seen or "OpenMP offload" in seen, "offload",
         "kernels named by an OpenMP/OpenACC offload compiler"),
        (torch, "cuda", "PyTorch kernels in a native (C++) process: libtorch"),
        (process is not None, "cuda",
         f"native process ({process}) calling CUDA"),
    )
    return next(((kind, why) for holds, kind, why in rules if holds), ("unknown", "no rule matched"))
