"""Memory limits (the build's, and each open model's), and the one sentence a build or a tool call gets when
memory or disk for spilling runs out.

DuckDB keeps the build within STALLHOUND_BUILD_MEMORY_MB and spills what does not fit to a temporary folder
beside the model being built (in the cache folder); tools on an open model likewise stay within
STALLHOUND_MODEL_MEMORY_MB and spill beside the model (see model.duck). When neither suffices the load or
the call fails with one sentence.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from stallhound.model.errors import BuildOutOfMemory, MemorySettingInvalid, ModelOutOfMemory

BUILD_MEMORY_ENV = "STALLHOUND_BUILD_MEMORY_MB"
# MB DuckDB may hold while building; it spills past it. A build's peak RSS runs a few hundred MB above it, and
# spilling at this limit costs only a few percent more CPU than a larger one (BENCHMARKS-HISTORY.md).
BUILD_MEMORY_MB = 500
MODEL_MEMORY_ENV = "STALLHOUND_MODEL_MEMORY_MB"
# MB DuckDB may hold per open model while tools run; it spills past it. Unlimited, DuckDB takes 80% of RAM. The
# lowest limit at which the tools run as fast as with more: below it they spill and slow down, above it peak memory
# grows for no time won (bench/model_memory.py, BENCHMARKS-HISTORY.md).
MODEL_MEMORY_MB = 600
NO_SPACE = "No space left on device"  # the OS error text DuckDB passes on when a spill file cannot grow


def _megabytes(env: str, default: int) -> int:
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise MemorySettingInvalid(f"{env}={raw!r} is not a whole number of MB; set it to a size such "
                                   f"as 2000 (default {default}) or unset it")
    return int(raw)


def build_memory_mb() -> int:
    """The build's memory limit in MB: STALLHOUND_BUILD_MEMORY_MB, else BUILD_MEMORY_MB."""
    return _megabytes(BUILD_MEMORY_ENV, BUILD_MEMORY_MB)


def model_memory_mb() -> int:
    """Each open model's memory limit in MB: STALLHOUND_MODEL_MEMORY_MB, else MODEL_MEMORY_MB."""
    return _megabytes(MODEL_MEMORY_ENV, MODEL_MEMORY_MB)


@contextmanager
def model_memory() -> Iterator[None]:
    """Around a tool call on an open model: running out of memory there is one sentence."""
    try:
        yield
    except duckdb.OutOfMemoryException as exc:
        limit = model_memory_mb()
        raise ModelOutOfMemory(
            f"this call needed more than the {limit:,} MB each open profile may use, and could not spill the rest to "
            f"disk; set {MODEL_MEMORY_ENV} higher (e.g. {max(2 * limit, 2000):,}) and restart stallhound, or ask "
            "about a narrower part (one device, a time window)") from exc


def out_of_resources(exc: duckdb.Error, export: Path, spill_folder: Path) -> BuildOutOfMemory | None:
    """The sentence for a build that ran out of memory or of disk to spill to, or None for any other error."""
    size = _size(export.stat().st_size)
    if isinstance(exc, duckdb.OutOfMemoryException):
        limit = build_memory_mb()
        return BuildOutOfMemory(
            f"loading {export.name} ({size}) ran out of memory at the build's {limit:,} MB limit; free memory and "
            f"set {BUILD_MEMORY_ENV} higher (e.g. {max(2 * limit, 2000):,}), or free disk space in {spill_folder} "
            "where the build spills, then load it again")
    if NO_SPACE in str(exc):
        return BuildOutOfMemory(
            f"loading {export.name} ({size}) ran out of disk space in {spill_folder}, where the build writes the "
            "model and spills; free space there (about the export's size) or set STALLHOUND_CACHE_DIR to a folder "
            "on a larger disk, then load it again")
    return None


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:,.1f} MB"
