"""What the NVTX range texts say, matched once per model over their distinct texts (far fewer than the ranges):
how many ranges each framework family has (analysis/program.py) and which texts the idle
attribution counts as compilation, host communication or a data loader's work (analysis/attribution.py). One
grouping of the ranges serves both; every pattern is a bound constant, so RE2 compiles it once.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from stallhound.analysis.common import per_model
from stallhound.model.duck import one_row

# Range texts (RE2) and the framework they show.
NVTX_FAMILIES: tuple[tuple[str, str], ...] = (
    ("PyTorch (ATen)", r"^aten::|, op_id = |^ProfilerStep#"),
    ("PyTorch FSDP", r"^FSDP::"),
    ("XLA (JAX/TensorFlow)", r"^(XlaModule|Thunk|XlaEmitGpuAsm|XlaOptimizeLlvmIr|XlaCompile):"),
    ("MPI", r"^MPI_"),
    ("Megatron-LM", r"(?i)megatron"),
    ("DeepSpeed", r"(?i)deepspeed"),
)
# Ranges of code compilation: one that says it compiles (compileFusion, compileNewKRT, compile_fx, backend_compile,
# CompiledKernel::compile), not one that runs compiled code (CompiledFunction, Torch-Compiled Region): "compile" not
# followed by "d". "jit" alone names none: torch::jit:: operators run TorchScript graphs, and JAX's jit_<fn> modules
# run compiled code; compiling shows as NVRTC, ptxas, a jit compile, XLA's and nvFuser's compile steps.
JIT_RANGES = (r"(?i)nvrtc|ptxas|jit_?compil|Xla(Emit|Optimize|Compile|Autotun)|compile([^d]|$)|"
              r"triton\.compile|inductor")
# A data loader's own ranges: PyTorch's DataLoader iterator (torch.profiler's "enumerate(DataLoader)#...__next__"),
# its _next_data and collate steps, a loop's batch fetch named as such, a "data_load" phase. A word alone names no
# loader: cuDF's DATAFRAME_COLUMNS_GETTER, TorchRec's sparse_data_dist (an all-to-all), DDP's
# DistributedDataParallel.forward, "prefetch" (of weights or memory) all contain one.
LOADER_RANGES = r"(?i)dataloader|_next_data|collate|(get|next|load)_?batch|(^|[^a-z])data_?load"
OP_DOMAIN = "cpu_op"  # the domain of torch.profiler's CPU operator ranges (aten::*, the Kineto build's nvtx.domain)
COMM_RANGES = r"^(MPI_|PMPI_|shmem_|nvshmem_|UCX|ucp_)"  # host-side communication libraries' NVTX ranges

# MATERIALIZED: the pattern tests stay on the distinct texts, never pushed below the grouping onto every range.
SQL = """
WITH texts AS MATERIALIZED (SELECT text, count(*) AS c FROM nvtx WHERE text IS NOT NULL GROUP BY 1),
kinds AS (
  SELECT text, 'jit' AS what FROM texts WHERE regexp_matches(text, $jit_ranges)
    AND NOT contains(text, 'Compiled Region')
  UNION ALL
  SELECT text, CASE WHEN regexp_matches(text, $comm_ranges) THEN 'comm' ELSE 'loader' END FROM texts
  WHERE regexp_matches(text, $comm_ranges) OR regexp_matches(text, $loader_ranges))
SELECT [""" + ", ".join(f"sum(c) FILTER (WHERE regexp_matches(text, $family{i}))::BIGINT"
                         for i in range(len(NVTX_FAMILIES))) + """],
       (SELECT list([text, what] ORDER BY text, what) FROM kinds)
FROM texts
"""


class Texts(NamedTuple):
    families: dict[str, int]  # NVTX ranges per family that has any, most first (ties in NVTX_FAMILIES order)
    range_kinds: list[tuple[str, str]]  # (text, 'jit' | 'comm' | 'loader'); a text may be two kinds


def classified(con: duckdb.DuckDBPyConnection) -> Texts:
    """The model's NVTX texts matched against every pattern above: window-independent, so once per model."""
    return per_model(con, ("nvtx_texts",), lambda: _classify(con))


def _classify(con: duckdb.DuckDBPyConnection) -> Texts:
    counts, kinds = one_row(con.execute(SQL, {
        "jit_ranges": JIT_RANGES, "comm_ranges": COMM_RANGES, "loader_ranges": LOADER_RANGES,
        **{f"family{i}": pattern for i, (_, pattern) in enumerate(NVTX_FAMILIES)}}))
    found = sorted((-n, rank, label) for rank, ((label, _), n) in enumerate(zip(NVTX_FAMILIES, counts, strict=True))
                   if n)
    return Texts(families={label: -n for n, _, label in found}, range_kinds=[(t, w) for t, w in kinds or []])
