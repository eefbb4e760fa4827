"""Memory limits (the build's, and each open model's), and the one sentence a build or a tool call gets when
memory or disk for spilling runs out.

DuckDB keeps the build within STALLHOUND_BUILD_MEMORY_MB and spills what does not fit to a temporary folder
beside the model being built (in the cache folder); tools on an open model likewise stay within
STALLHOUND_MODEL_MEMORY_MB and spill beside the model (see profiles.duck). When neither suffices the load or
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
# MB DuckDB may hold while building; it spills past it. Peak RSS of the 1 GB benchmark export runs about
# 400 MB above it (880 MB at 500 MB, 1,500 MB at 1,200 MB); spilling costs about 8% more CPU than 700 MB.
BUILD_MEMORY_MB = 500
MODEL_MEMORY_ENV = "STALLHOUND_MODEL_MEMORY_MB"
# MB DuckDB may hold per open model while tools run; it spills past it. Unlimited, DuckDB takes 80% of RAM: the
# 10 GB export's first triage reached 16.7 GB RSS. On the 1 GB export (bench/model_memory.py, BENCHMARKS.md): first
# triage peak RSS 710-769 MB at 500, 954-990 MB at 750, 1,203-1,246 MB at 1,000, ~1,560 MB unlimited; warm
# nvtx_breakdown 3.2-4.0 s at 500, 1.8-1.9 s at 750, 1.5 s unlimited (it spills below ~750). Since then the tools
# spill less: at 600-750 the 1 GB export's tools take as long (nvtx_breakdown 0.85-0.90 s, all 2.6 s). The 10 GB
# export's first triage (after a cached reopen) peaked at 855 MB RSS at 600 (20.8 s), 886-905 MB at 650
# (17.5-19.4 s), 966-971 MB at 700 (16.9-17.3 s), and its first answer, load included, at 956-1,055 MB at 700.
# Since the build's smaller depth updates the triage sets the first answer's peak: 904-953 MB at 650; after a cached
# reopen 879 MB at 600 (13.7-14.2 s) against 899-929 MB at 650 (13.4-13.7 s), with the 1 GB tools as fast at 600
# (all 2.60 s, nvtx_breakdown 0.79-0.80 s) and slower at 550 (2.65-2.75 s, 0.83-0.87 s).
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
