"""Which layer a call-stack frame belongs to when it is not the user's code, for every format's `stacks` table.

A frame's layer comes from its module (a native library's file name, a Python file's path) alone: the profiler's
injection libraries, the CUDA driver, runtime and libraries, the C/C++ runtime and loader (and MPI), the Python
interpreter (its eval loop, built-ins and standard library) and PyTorch (its dispatcher, autograd and modules).
A frame in none of them is the user's (layer NULL); tools skip to the innermost such frame (analysis.stacks).
"""

from __future__ import annotations

import sys

# Native modules by the file name's start (lower case), per layer. Bracketed names are nsys' marks for what it
# could not place ([Unknown], [vdso], [kernel.kallsyms], [Max depth]): never the user's code.
NATIVE_LAYERS = (
    ("profiler", r"^(libcupti|libtoolsinjection|libnvtoolsext|libnvtx|libnsys|libinterceptorinjection)"),
    ("cuda", r"^(libcuda\.|libcudart|libnvidia-|libcublas|libcudnn|libnccl|libnvrtc|libcufft|libcurand|"
             r"libcusparse|libcusolver|libnvjitlink|libcudadebugger)"),
    ("system", r"^(\[|libc\.|libc-|libpthread|ld-linux|ld-2\.|libstdc\+\+|libgcc_s|libm\.|libm-|libdl|librt|"
               r"libgomp|libmpi|libfabric|libucp|libucs|libuct|libopen-pal|libopen-rte|libpmi)"),
    ("interpreter", r"^(libpython|python[0-9.]*$|_ctypes|libffi)"),
    ("framework", r"^(libtorch|libc10|_c\.cpython|libshm)"),
)
# The CUDA runtime's C++ templates (cuda_runtime.h: cudaMalloc<T>, cudaLaunchKernel<T>) are compiled into the
# user's executable, yet are CUDA's code: known by their symbol.
CUDA_TEMPLATE = r"^cudaError(_t)? cuda[A-Z][A-Za-z]*<"
# Python files of PyTorch, as Kineto writes them (relative to their sys.path entry) or as a full path.
TORCH_FILE = r"(^|/site-packages/|/dist-packages/)torch/"
STDLIB_DIR = r"/lib/python3[0-9.]*/"  # a full path into the standard library (not its site-packages)
# The standard library's top-level modules, from the running interpreter: a Kineto trace names a standard
# module's file by its path below the library folder ('typing.py', 'concurrent/futures/thread.py').
STDLIB_MODULES = sorted(sys.stdlib_module_names)


def native_layer_sql(module: str, function: str) -> str:
    """SQL for a native frame's layer (NULL: the user's code) from its `module` (the library's path) and
    `function` (the symbol) columns."""
    base = f"lower(regexp_extract({module}, '[^/]*$'))"
    cases = " ".join(f"WHEN regexp_matches({base}, '{pattern}') THEN '{layer}'" for layer, pattern in NATIVE_LAYERS)
    cases = f"WHEN regexp_matches({function}, '{CUDA_TEMPLATE}') THEN 'cuda' {cases}"
    return f"CASE {cases} END"


def python_layer_sql(module: str) -> str:
    """SQL for a Python frame's layer (NULL: the user's code) from its `module` column (the file; NULL for a
    built-in); it binds $stdlib to STDLIB_MODULES."""
    top = f"regexp_extract({module}, '^([A-Za-z0-9_]+)(/|\\.py$)', 1)"
    return (f"CASE WHEN {module} IS NULL THEN 'interpreter' "
            f"WHEN regexp_matches({module}, '{TORCH_FILE}') THEN 'framework' "
            f"WHEN regexp_matches({module}, '{STDLIB_DIR}') AND NOT regexp_matches({module}, '-packages/') "
            "THEN 'interpreter' "
            f"WHEN list_contains($stdlib, {top}) THEN 'interpreter' END")

