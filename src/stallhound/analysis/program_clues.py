"""The clues a profile holds about the program that made it, each with the weight analysis/program.py gives it.

A clue supports a framework (the programming model whose fixes apply: PyTorch, JAX, CuPy, OpenACC, ...), a host
language (python, julia, native), both or neither (a library any program calls, such as cuBLAS or NCCL, only
named), and says in one line what was seen. They are read from the process that did the most GPU work (else the
profiled command): its name and command line, its thread names, the host modules in its call stacks, the NVTX
domains and range texts, the kernel name families by their share of kernel time, the library and runtime APIs
traced beside CUDA, how memory moves, and the format of the trace itself. Weights are the named constants below;
a kernel family's weight is its share of kernel time, so one stray kernel of a framework weighs almost nothing.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

import duckdb

from stallhound.analysis import nvtx_texts
from stallhound.formats.kineto.meta import PLATFORM as KINETO_PLATFORM
from stallhound.model.duck import one_row
from stallhound.model.sql_files import sql_beside

Framework = Literal["pytorch", "jax", "tensorrt", "cupy", "numba", "cudf", "julia", "stdpar", "offload"]
Language = Literal["python", "julia", "native"]

KERNEL_TIME_WEIGHT = 1.0  # x a family's share of kernel time: all of the GPU's work weighs as much as a process name
NVTX_WEIGHT = 0.5  # a framework's own NVTX ranges or domain: it marks itself, but other code can call into it
THREAD_WEIGHT = 0.5  # threads a framework names (pt_autograd_0): its runtime is loaded, maybe not driving the GPU
MODULE_WEIGHT = 0.5  # a framework's host library in the call stacks: loaded and used, maybe not for the GPU work
PROCESS_WEIGHT = 1.0  # the process is an interpreter (python, julia) or a framework's own tool (trtexec)
NATIVE_PROCESS_WEIGHT = 0.5  # a process that is no interpreter: interpreters may rename their process, so it is weaker
FORMAT_WEIGHT = 1.0  # a torch.profiler (Kineto) trace is written by PyTorch
FORMAT_LANGUAGE_WEIGHT = 0.5  # ... and torch.profiler is mostly run from Python (libtorch has it too)
DIRECTIVE_API_WEIGHT = 1.0  # OpenACC runtime events: only a directive-compiled program makes them
MIN_MODULE_STACKS = 1  # one call stack through a module shows the process ran it

# Kernel name families: (label, regex, exclusion regex or None, framework it shows or None for a library any program
# calls), RE2 syntax on the demangled name. profile_summary lists the same families as the libraries a profile used.
KERNEL_FAMILIES: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("PyTorch (ATen)", r"at::native::|\bc10::|vectorized_elementwise_kernel|unrolled_elementwise_kernel", None,
     "pytorch"),
    ("Triton", r"(^|[^A-Za-z0-9])triton_", None, None),
    ("cuBLAS/CUTLASS GEMM", r"(?i)gemm|cublas|xmma|cutlass|nvjet", r"(?i)flash|fmha|attn|cudnn|fprop|dgrad|wgrad",
     None),
    ("cuDNN", r"(?i)cudnn|xmma_(fprop|dgrad|wgrad)", None, None),
    ("FlashAttention / fused attention", r"(?i)flash_fwd|flash_bwd|flashattn|fmha|flash::", None, None),
    ("NCCL", r"(?i)nccl", None, None),
    ("nvFuser", r"nvfuser_", None, "pytorch"),
    ("Transformer Engine", r"transformer_engine::", None, None),
    ("vLLM", r"\bvllm::", None, "pytorch"),
    ("XLA (JAX/TensorFlow)", r"stream_executor::|^(loop|input|wrapped|gemm)_fusion|^fusion(_\d+)?$|xla_", None, "jax"),
    ("TensorRT", r"^__myl_|\btrt_|tensorrt", None, "tensorrt"),
    ("CuPy", r"^cupy_|cupy::", None, "cupy"),
    ("Numba", r"cudapy::|numba", None, "numba"),
    ("cuDF (RAPIDS)", r"\bcudf::", None, "cudf"),
    ("CUDA.jl (Julia)", r"julia_|CuKernelContext|CuDeviceArray", None, "julia"),
    ("OpenACC (nvc/nvfortran)", r"_\d+_gpu(__red)?(\(|$)|_gpu_\d+(\(|$)", r"__pgi_uacc_", "offload"),
    ("OpenMP offload", r"^nvkernel_|__omp_offloading_", None, "offload"),
    ("NVHPC runtime", r"__pgi_uacc_", None, "offload"),  # its fill and copy kernels, in OpenACC and OpenMP codes
    ("CUB/Thrust", r"\bcub::|\bthrust::", None, None),
)
STDPAR_FAMILY = "CUB/Thrust"  # nvc++ -stdpar runs the parallel algorithms as these kernels (see _stdpar)
MIN_KERNELS_FOR_FAMILY = 1  # a family is listed from one kernel; its weight is its share of kernel time


def _family(i: int, exclude: str | None) -> str:
    return f"regexp_matches(n, $pattern{i})" + (f" AND NOT regexp_matches(n, $exclude{i})" if exclude else "")


# Per kernel family (RE2 on the demangled name, else the short name), its kernels and their share of all kernel time
# (0 when no kernel has a duration); a kernel may belong to several. Each pattern is a parameter of its own, compiled
# once: patterns joined in from a list were compiled again for every distinct name (the query took 17 ms for 41 names
# and 42 ms for 170; 13 and 18 ms so).
KERNELS_SQL = """
WITH names AS (SELECT coalesce(name, short_name, '') AS n, count(*) AS c, sum(duration_ns) AS ns FROM kernels
               GROUP BY 1)
SELECT [""" + ", ".join(f"sum(c) FILTER (WHERE {_family(i, f[2])})::BIGINT"
                         for i, f in enumerate(KERNEL_FAMILIES)) + """],
       [""" + ", ".join(f"coalesce(sum(ns) FILTER (WHERE {_family(i, f[2])}) / nullif(sum(ns), 0), 0)::DOUBLE"
                         for i, f in enumerate(KERNEL_FAMILIES)) + """]
FROM names
"""

# NVTX range families (analysis/nvtx_texts.py) that show a framework.
NVTX_FRAMEWORKS: dict[str, str] = {"PyTorch (ATen)": "pytorch", "PyTorch FSDP": "pytorch", "Megatron-LM": "pytorch",
                                   "DeepSpeed": "pytorch", "XLA (JAX/TensorFlow)": "jax"}
# NVTX domains (RE2 on the domain's name): (label, pattern, framework or None, language or None).
NVTX_DOMAINS: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("MPI", r"^MPI$", None, None),
    ("XLA (JAX/TensorFlow)", r"^TSL$", "jax", None),
    ("TensorRT", r"^(TensorRT|myelin-exec)$", "tensorrt", None),
    ("CUB/Thrust", r"^CCCL$", None, None),
    ("NCCL", r"^NCCL$", None, None),
    ("cuDNN", r"^cuDNN$", None, None),
    ("cuBLAS", r"^cuBLAS$", None, None),
    ("cuDF (RAPIDS)", r"^libcudf$", "cudf", None),
    ("cuDF (RAPIDS)", r"^(dask_)?cudf_python", "cudf", "python"),
)

PYTHON_PROCESS = re.compile(r"(^|/)(python[\d.]*|pytest|torchrun|accelerate|deepspeed|ipython|jupyter.*|uvicorn|"
                            r"gunicorn|ray|vllm|pt_main_thread)( |$)", re.I)
# A title a program gave its own process (setproctitle: 'VLLM::EngineCore', 'ray::Worker', 'pyper:trainer:0:0'):
# interpreters do that, executables rarely, so such a name is no evidence of native code (a drive letter is no title).
RENAMED_PROCESS = re.compile(r"\w:(?![\\/])")
PYTHON_THREAD = re.compile(r"^(python[\d.]*|pt_main_thread)$")  # Python's main thread, or the one torch renames
JULIA_PROCESS = re.compile(r"(^|/)julia( |$)", re.I)
TRT_PROCESS = re.compile(r"(^|/)trtexec( |$)", re.I)
PYTORCH_THREADS = re.compile(r"^pt_(autograd|nccl|main_thread|thread_pool|tcpstore)")
NVHPC_RUNTIME = "NVHPC compiler runtime"  # nvc, nvc++ and nvfortran's own libraries: the program was built by them
# Host modules (RE2 on the path nsys recorded): (label, pattern, framework or None, language or None). Patterns name
# the file, or a package folder only where its modules are Python extensions: an install path says nothing.
MODULES: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("Python", r"(^|/)(libpython\d[\d.]*\w*\.so[\d.]*|python\d[\d.]*)$|\.cpython-\d+", None, "python"),
    ("Julia", r"(^|/)libjulia[-\w]*\.so", "julia", "julia"),
    ("PyTorch", r"(^|/)lib(torch(_cuda|_cpu|_python)?|c10(_cuda)?)\.so", "pytorch", None),
    ("CuPy", r"/cupy(_backends)?/.*\.cpython-", "cupy", "python"),
    ("Numba", r"/numba/.*\.cpython-", "numba", "python"),
    ("cuDF (RAPIDS)", r"(^|/)libcudf\.so", "cudf", None),
    ("JAX", r"(^|/)(xla_extension\.so|jaxlib/)", "jax", "python"),
    ("TensorRT", r"(^|/)libnvinfer\.so", "tensorrt", None),
    ("NVHPC OpenACC/OpenMP runtime", r"(^|/)libacc(host|device|devaux)\.so", "offload", None),
    (NVHPC_RUNTIME, r"(^|/)lib(nvc|nvf|nvcpumath[-\w]*|nvhpcatm)\.so", None, "native"),
)


class Clue(NamedTuple):
    line: str  # what was seen, one short line
    framework: str | None = None  # the framework it supports
    language: str | None = None  # the host language it supports
    weight: float = 0.0


class Facts(NamedTuple):
    clues: list[Clue]
    process: str | None  # name of the process that did the most GPU work
    frameworks: list[str]  # frameworks and libraries seen, most kernels first
    gpu_work: bool  # any kernels, copies, memsets, graph launches or CUDA calls


def gather(con: duckdb.DuckDBPyConnection) -> Facts:
    """Every clue of the model in `con`."""
    pid, process, gpu_work = one_row(con.execute(sql_beside(__package__, "program_process.sql")))
    command, platform = one_row(con.execute("SELECT command_line, platform FROM meta")) or (None, None)
    kernels = _kernel_families(con)
    nvtx = nvtx_texts.classified(con).families
    domains = _matches(con, "SELECT DISTINCT domain FROM nvtx WHERE domain IS NOT NULL", NVTX_DOMAINS)
    modules = _matches(con, "SELECT DISTINCT module FROM host_modules WHERE (pid = $pid OR $pid IS NULL) "
                            "AND stacks >= $min", MODULES, {"pid": pid, "min": MIN_MODULE_STACKS})
    threads = [t for (t,) in con.execute("SELECT DISTINCT name FROM threads WHERE pid = $pid AND name IS NOT NULL "
                                         "ORDER BY 1", {"pid": pid}).fetchall()]
    clues = [*_host(process, command, threads), *_kernels(kernels), *_stdpar(con, kernels, modules),
             *(Clue(f"NVTX ranges of {label}: {n:,}", NVTX_FRAMEWORKS.get(label), None,
                    NVTX_WEIGHT if label in NVTX_FRAMEWORKS else 0.0) for label, n in nvtx.items()),
             *(Clue(f"NVTX domain of {label}", fw, lang, NVTX_WEIGHT if fw or lang else 0.0)
               for label, fw, lang in domains),
             *(Clue(f"host module of {label} in the call stacks", fw, lang, MODULE_WEIGHT)
               for label, fw, lang in modules),
             *_apis(con)]
    if platform == KINETO_PLATFORM:
        clues += [Clue("a torch.profiler (Kineto) trace: written by PyTorch", "pytorch", None, FORMAT_WEIGHT),
                  Clue("torch.profiler is mostly run from Python", None, "python", FORMAT_LANGUAGE_WEIGHT)]
    seen = {**{label: n for label, (n, _) in kernels.items()}, **nvtx,
            **{label: 0 for label in sorted({label for label, _, _ in domains})}}  # a set's order changes per run
    return Facts(clues, process, sorted(seen, key=lambda k: -seen[k]), bool(gpu_work))


def _matches(con: duckdb.DuckDBPyConnection, sql: str, rules: tuple[tuple[str, str, str | None, str | None], ...],
             params: dict[str, object] | None = None) -> list[tuple[str, str | None, str | None]]:
    """(label, framework, language) of every rule whose pattern matches a value the query returns, once each, in
    the rules' order (a set's would change from one process to the next, and the clues' order with it)."""
    values = [v for (v,) in con.execute(sql, params).fetchall()]
    return list(dict.fromkeys((label, fw, lang) for label, pattern, fw, lang in rules
                              if any(re.search(pattern, v) for v in values)))


def _kernel_families(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, float]]:
    """Kernel family -> (kernels, share of all kernel time), most kernels first (ties in KERNEL_FAMILIES order)."""
    counts, shares = one_row(con.execute(KERNELS_SQL, {
        **{f"pattern{i}": pattern for i, (_, pattern, _, _) in enumerate(KERNEL_FAMILIES)},
        **{f"exclude{i}": exclude for i, (_, _, exclude, _) in enumerate(KERNEL_FAMILIES) if exclude}}))
    found = sorted((-n, rank, label, share) for rank, ((label, *_), n, share)
                   in enumerate(zip(KERNEL_FAMILIES, counts, shares, strict=True)) if n and n >= MIN_KERNELS_FOR_FAMILY)
    return {label: (-n, float(share or 0.0)) for n, _, label, share in found}


def _host(process: str | None, command: str | None, threads: list[str]) -> list[Clue]:
    clues = []
    if process:
        clues.append(Clue(f"process with the most GPU work: {process}"))
    if command:
        clues.append(Clue(f"command line: {command[:120]}"))
    program = process or (command.split()[0] if command else None)
    names = " ".join(filter(None, (process, command)))
    if PYTHON_PROCESS.search(process or "") or PYTHON_PROCESS.search(command or ""):
        clues.append(Clue(f"a Python interpreter runs it ({program})", None, "python", PROCESS_WEIGHT))
    elif JULIA_PROCESS.search(names):
        clues.append(Clue(f"the Julia runtime runs it ({program})", "julia", "julia", PROCESS_WEIGHT))
    elif TRT_PROCESS.search(names):
        clues.append(Clue(f"TensorRT's own tool runs it ({program})", "tensorrt", "native", PROCESS_WEIGHT))
    elif program and RENAMED_PROCESS.search(program):
        clues.append(Clue(f"the process named itself ({program}): no evidence of its language"))
    elif program:
        clues.append(Clue(f"the process is no interpreter ({program})", None, "native", NATIVE_PROCESS_WEIGHT))
    python_threads = [t for t in threads if PYTHON_THREAD.search(t)]
    if python_threads:
        clues.append(Clue(f"Python threads: {', '.join(python_threads[:3])}", None, "python", PROCESS_WEIGHT))
    pt_threads = [t for t in threads if PYTORCH_THREADS.search(t)]
    if pt_threads:
        clues.append(Clue(f"PyTorch threads: {', '.join(pt_threads[:4])}", "pytorch", None, THREAD_WEIGHT))
    return clues


def _kernels(kernels: dict[str, tuple[int, float]]) -> list[Clue]:
    by_label = {r[0]: r[3] for r in KERNEL_FAMILIES}
    return [Clue(f"kernels of {label}: {n:,}, {share:.1%} of kernel time", by_label[label],
                 _only_language(by_label[label]), share * KERNEL_TIME_WEIGHT if by_label[label] else 0.0)
            for label, (n, share) in kernels.items()]


def _only_language(framework: str | None) -> str | None:
    """The language a framework's kernels imply: CuPy, Numba and JAX run only under Python, CUDA.jl under Julia."""
    return {"cupy": "python", "numba": "python", "jax": "python", "julia": "julia"}.get(framework or "")


def _stdpar(con: duckdb.DuckDBPyConnection, kernels: dict[str, tuple[int, float]],
            modules: list[tuple[str, str | None, str | None]]) -> list[Clue]:
    """nvc++ -stdpar runs the C++ parallel algorithms as CUB/Thrust kernels on data the program never copies
    itself: the heap is managed memory that migrates on demand. CUB/Thrust kernels count for stdpar, by their
    time, only beside that way of moving data (managed memory, no explicit host-device copy calls) or the NVHPC
    compiler runtime; otherwise they are a library a CUDA program calls."""
    if STDPAR_FAMILY not in kernels:
        return []
    managed, explicit = one_row(con.execute(sql_beside(__package__, "program_memory.sql")))
    compiled_by_nvhpc = any(label == NVHPC_RUNTIME for label, _, _ in modules)
    if not (managed and not explicit) and not compiled_by_nvhpc:
        return []
    why = (f"managed memory ({managed:,} allocations or migrations) and no explicit host-device copy"
           if managed and not explicit else "the NVHPC compiler runtime in the call stacks")
    share = kernels[STDPAR_FAMILY][1]
    return [Clue(f"CUB/Thrust kernels ({share:.1%} of kernel time) with {why}: C++ parallel algorithms (nvc++ "
                 "-stdpar)", "stdpar", "native", share * KERNEL_TIME_WEIGHT)]


def _apis(con: duckdb.DuckDBPyConnection) -> list[Clue]:
    runtime, driver = one_row(con.execute(
        "SELECT count(*) FILTER (WHERE name LIKE 'cuda%'), count(*) FILTER (WHERE name LIKE 'cu%' AND name NOT LIKE "
        "'cuda%') FROM cuda_api WHERE kind IN ('launch', 'graph')"))
    clues = []
    if driver and not runtime:
        clues.append(Clue(f"launches only through the driver API ({driver:,}): run-time compiled kernels or a "
                          "compiler's runtime"))
    for library, calls in con.execute("SELECT library, count(*) FROM library_api GROUP BY 1 ORDER BY 1").fetchall():
        directive = library == "openacc"
        clues.append(Clue(f"{library} calls traced: {calls:,}", "offload" if directive else None,
                          "native" if directive else None, DIRECTIVE_API_WEIGHT if directive else 0.0))
    return clues
