"""The facts of a trace that fit the book's fixes to it beyond the program's kind (book/__init__.py, `context`).

'amd' when an AMD GPU ran the work (vendor.of: HIP runtime calls or an AMD device name): CUDA's environment
variables, tools and libraries do nothing there, ROCm's do. 'kineto' when torch.profiler wrote the trace: its user
re-captures with torch.profiler's options, and nsys only for what torch.profiler cannot record (OS runtime calls,
CPU samples), said so.
"""

from __future__ import annotations

import duckdb

from stallhound.analysis import vendor
from stallhound.formats import registry

KINETO = "kineto"  # formats/kineto's FORMAT.name


def tags(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """The context tags of the trace in `con`."""
    return (("amd",) if vendor.of(con) == vendor.AMD else ()) + (
        (KINETO,) if registry.format_of(con).name == KINETO else ())
