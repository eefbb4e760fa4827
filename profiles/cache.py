"""The model cache: one DuckDB file per export content, built once, shared by processes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from nsightful.profiles.ingest import Builder, Progress, build
from nsightful.profiles.model import MODEL_VERSION
from nsightful.profiles.raw import RawExport

CACHE_ENV = "NSIGHTFUL_CACHE_DIR"


def cache_dir() -> Path:
    """$NSIGHTFUL_CACHE_DIR, else $XDG_CACHE_HOME/nsightful, else ~/.cache/nsightful."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nsightful"


@contextmanager
def _lock(path: Path):
    """An exclusive lock file, so two processes opening one profile build it once."""
    try:
        import fcntl
    except ImportError:  # Windows: builds may duplicate, the atomic rename keeps them safe
        yield
        return
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def model_path(directory: Path, key: str) -> Path:
    return directory / f"{key}-m{MODEL_VERSION}.duckdb"


def build_cached(sqlite_path: Path, key: str, directory: Path, progress: Progress | None = None,
                 on_builder: Callable[[Builder], None] | None = None) -> Path:
    """The cached model for this content, building it first if needed (temp file, then atomic rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = model_path(directory, key)
    if final.exists():
        return final
    with _lock(directory / f"{key}.lock"):
        if final.exists():
            return final
        build_to(sqlite_path, key, final, progress, on_builder)
    return final


def build_to(sqlite_path: Path, key: str, final: Path, progress: Progress | None = None,
             on_builder: Callable[[Builder], None] | None = None) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{key}-", suffix=".duckdb.tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # DuckDB wants to create the file itself
    raw = RawExport(sqlite_path)
    try:
        build(raw, tmp, key, progress, on_builder)
        os.replace(tmp, final)
    finally:
        raw.close()
        for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
            leftover.unlink(missing_ok=True)
