"""The build's memory limit, and the one sentence a build gets when memory or disk for spilling runs out.

DuckDB keeps the build within NSIGHTFUL_BUILD_MEMORY_MB and spills what does not fit to a temporary folder
beside the model being built (in the cache folder); when neither suffices the load fails with one sentence.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from nsightful.profiles.errors import BuildOutOfMemory, BuildSettingInvalid

BUILD_MEMORY_ENV = "NSIGHTFUL_BUILD_MEMORY_MB"
# MB DuckDB may hold while building; it spills past it. Peak RSS of the 1 GB benchmark export runs about
# 400 MB above it (880 MB at 500 MB, 1,500 MB at 1,200 MB); spilling costs about 8% more CPU than 700 MB.
BUILD_MEMORY_MB = 500
NO_SPACE = "No space left on device"  # the OS error text DuckDB passes on when a spill file cannot grow


def build_memory_mb() -> int:
    """The build's memory limit in MB: NSIGHTFUL_BUILD_MEMORY_MB, else BUILD_MEMORY_MB."""
    raw = os.environ.get(BUILD_MEMORY_ENV, "").strip()
    if not raw:
        return BUILD_MEMORY_MB
    if not raw.isdigit() or int(raw) < 1:
        raise BuildSettingInvalid(f"{BUILD_MEMORY_ENV}={raw!r} is not a whole number of MB; set it to a size such "
                                  f"as 2000 (default {BUILD_MEMORY_MB}) or unset it")
    return int(raw)


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
            "model and spills; free space there (about the export's size) or set NSIGHTFUL_CACHE_DIR to a folder "
            "on a larger disk, then load it again")
    return None


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:,.1f} MB"
