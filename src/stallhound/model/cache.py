"""The model cache: one DuckDB file per profile content, built once, shared by processes.

A cached file is used only when it opens and its meta row names this content and model version;
anything else (a corrupt file, one of another layout) is rebuilt. Builds write a temporary file under
an exclusive lock and rename it into place, so a build killed half way leaves only its temporary
file, which the next build of that content removes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Protocol

import duckdb

from stallhound.model import allocator
from stallhound.model.duck import close_model, open_model
from stallhound.model.errors import CacheUnwritable, ProfileChanged
from stallhound.model.folders import CACHE_ENV as CACHE_ENV  # where callers have long found them
from stallhound.model.folders import cache_dir as cache_dir
from stallhound.model.limits import out_of_resources
from stallhound.model.schema import MODEL_VERSION

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

SPILL_SUFFIX = ".tmp"  # DuckDB spills into a folder named after its database file plus this
SAMPLE_BLOCK_BYTES = 64 * 1024  # fingerprint reads this much at each sampled offset
SAMPLE_BLOCKS = 64  # evenly spaced blocks: ~4 MiB read even for a multi-GB export

Progress = Callable[[int, int, str], None]  # (steps done, steps in all, the step's label)


class Recipe(Protocol):
    """How one input format builds a model (stallhound.formats gives each format's): the cache knows no format."""

    @property
    def writer(self) -> str:
        """What writes the format's files, named when a file changes while it is read."""

    @property
    def read_errors(self) -> tuple[type[Exception], ...]:
        """What reading a file raises besides duckdb.Error."""

    def build(self, source: Path, out: Path, key: str, progress: Progress | None,
              cancelled: threading.Event | None) -> None:
        """Write the model of `source` into the DuckDB file `out` (which does not exist yet)."""

    def damaged(self, source: Path, exc: Exception) -> Exception | None:
        """The error to raise when `exc` means that part of `source` is unreadable; None when it does not."""


def identity(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, size, modification time): any rewrite of the file while it is read changes it."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def fingerprint(path: Path) -> str:
    """Content key: size plus a hash of the first, last and evenly spaced blocks of the file.

    Reading every byte of a multi-GB profile would cost seconds on each reopen; sampled blocks
    catch any re-export (SQLite rewrites its header and pages on every write).
    """
    size = path.stat().st_size
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    step = max(size // SAMPLE_BLOCKS, 1)
    offsets = sorted({*range(0, size, step), max(size - SAMPLE_BLOCK_BYTES, 0)})
    with path.open("rb") as fh:
        for offset in offsets:
            fh.seek(offset)
            digest.update(fh.read(SAMPLE_BLOCK_BYTES))
    return digest.hexdigest()


def unwritable(directory: Path, exc: OSError) -> CacheUnwritable:
    return CacheUnwritable(f"the cache folder {directory} cannot be written ({exc.strerror or exc}); set "
                           f"{CACHE_ENV} (or --cache-dir) to a writable folder")


@contextmanager
def _lock(directory: Path, key: str):
    """An exclusive lock file, so two processes opening one profile build it once. The lock is the open file's
    flock: the kernel drops it when its process dies, so a killed build never leaves it held."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fh = (directory / f"{key}.lock").open("a")
    except OSError as exc:
        raise unwritable(directory, exc) from exc
    with fh:
        if fcntl is not None:  # Windows: builds may duplicate, the atomic rename keeps them safe
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def model_path(directory: Path, key: str) -> Path:
    return directory / f"{key}-m{MODEL_VERSION}.duckdb"


def _open_valid(path: Path, key: str) -> duckdb.DuckDBPyConnection | None:
    """A connection to the cached model at `path` if it is complete and current, else None."""
    if not path.exists():
        return None
    try:
        con = open_model(path)
    except duckdb.Error:
        return None
    try:
        row = con.execute("SELECT fingerprint, model_version FROM meta").fetchone()
    except duckdb.Error:
        row = None
    if row == (key, MODEL_VERSION):
        return con
    close_model(path, con)
    return None


def _remove_leftovers(final: Path, key: str) -> None:
    """Under the lock: the stale model at `final` and temporary files of builds that were killed (their spill
    folders included)."""
    for path in (final, final.with_name(final.name + ".wal"), *final.parent.glob(f".{key}-*.duckdb.tmp*")):
        _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def open_cached(source: Path, key: str, directory: Path, recipe: Recipe, progress: Progress | None = None,
                cancelled: threading.Event | None = None) -> tuple[Path, duckdb.DuckDBPyConnection]:
    """The cached model for this content and a connection to it, building it first if needed.

    Raises CacheUnwritable when the model must be built and `directory` cannot be written.
    """
    final = model_path(directory, key)
    con = _open_valid(final, key)
    if con is not None:
        return final, con
    with _lock(directory, key):
        con = _open_valid(final, key)
        if con is not None:
            return final, con
        _remove_leftovers(final, key)
        build_to(source, key, final, recipe, progress, cancelled)
    return final, open_model(final)


def _changed(path: Path, before: tuple[int, int, int, int], key: str) -> bool:
    """Whether the file differs from when the build started, or from the content `key` was taken from."""
    try:
        return identity(path) != before or fingerprint(path) != key
    except OSError:  # removed or replaced meanwhile
        return True


def _changed_error(path: Path, writer: str) -> ProfileChanged:
    return ProfileChanged(f"{path} changed while it was being loaded (is {writer} or another program still writing "
                          "it?); load it again once the file is complete")


def build_to(source: Path, key: str, final: Path, recipe: Recipe, progress: Progress | None = None,
             cancelled: threading.Event | None = None) -> None:
    """Build the model of `source` (with its format's `recipe`) into `final` (temporary file, then atomic rename).
    Raises ProfileChanged when the file changed while it was read, the recipe's error when part of it is
    unreadable."""
    before = identity(source)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{key}-", suffix=".duckdb.tmp", dir=final.parent)
    except OSError as exc:
        raise unwritable(final.parent, exc) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # DuckDB wants to create the file itself
    # a file rewritten meanwhile can fail any query, binding too
    failures: tuple[type[Exception], ...] = (duckdb.Error, *recipe.read_errors)
    try:
        recipe.build(source, tmp, key, progress, cancelled)
        if _changed(source, before, key):
            raise _changed_error(source, recipe.writer)
        os.replace(tmp, final)
    except failures as exc:
        if _changed(source, before, key):
            raise _changed_error(source, recipe.writer) from exc
        if isinstance(exc, duckdb.Error) and (exhausted := out_of_resources(exc, source, final.parent)):
            raise exhausted from exc
        if (damage := recipe.damaged(source, exc)) is not None:
            raise damage from exc
        raise
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".wal"), tmp.with_name(tmp.name + SPILL_SUFFIX)):
            _remove(leftover)
        allocator.release()  # what the build freed (its arrays, its connection's memory) before the tools run


def build_scratch(source: Path, key: str, recipe: Recipe, progress: Progress | None = None,
                  cancelled: threading.Event | None = None) -> tuple[Path, Path]:
    """(folder, model) of a build in a new temporary folder, which the caller removes when done with it."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix="stallhound-"))
    except OSError as exc:
        raise CacheUnwritable(f"the temporary folder {tempfile.gettempdir()} cannot be written ({exc.strerror}) "
                              f"to build the model in; set {CACHE_ENV} (or --cache-dir) to a writable folder") from exc
    model = model_path(scratch, key)
    try:
        build_to(source, key, model, recipe, progress, cancelled)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch, model
