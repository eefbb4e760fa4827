"""The model cache: one DuckDB file per export content, built once, shared by processes.

A cached file is used only when it opens and its meta row names this content and model version;
anything else (a corrupt file, one of another layout) is rebuilt. Builds write a temporary file under
an exclusive lock and rename it into place, so a build killed half way leaves only its temporary
file, which the next build of that content removes.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import duckdb

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from stallhound.formats import source
from stallhound.formats.nsys.build import Progress, build
from stallhound.formats.nsys.raw import ROLLBACK_MODE, WAL_VERSION_OFFSET, RawExport, damaged, is_wal_mode
from stallhound.model import allocator
from stallhound.model.duck import close_model, open_model
from stallhound.model.errors import CacheUnwritable, ProfileChanged
from stallhound.model.limits import out_of_resources
from stallhound.model.schema import MODEL_VERSION

CACHE_ENV = "STALLHOUND_CACHE_DIR"
SPILL_SUFFIX = ".tmp"  # DuckDB spills into a folder named after its database file plus this
# What DuckDB or SQLite raise when the export's content cannot be read (truncated pages, invalid text or
# values of the wrong type); our own SQL errors (binder, catalog) are not among them.
DAMAGE_ERRORS = (sqlite3.DatabaseError, duckdb.IOException, duckdb.InvalidInputException,
                 duckdb.TypeMismatchException, duckdb.ConversionException)


def cache_dir() -> Path:
    """$STALLHOUND_CACHE_DIR, else $XDG_CACHE_HOME/stallhound, else ~/.cache/stallhound."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stallhound"


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


def build_export(sqlite_path: Path, out: Path, key: str, progress: Progress | None = None,
                 cancelled: threading.Event | None = None) -> None:
    """Build the model of an nsys export into `out`, through a private copy when the export is in WAL mode."""
    raw = RawExport(sqlite_path)
    try:
        if is_wal_mode(sqlite_path):
            raw.scan_path = _scan_copy(sqlite_path, out.parent)
        build(raw, out, key, progress, cancelled)
    finally:
        raw.close()
        if raw.scan_path != sqlite_path:
            raw.scan_path.unlink(missing_ok=True)


BuildFn = Callable[..., None]  # (source file, output model, fingerprint, progress, cancelled), as build_export


def open_cached(sqlite_path: Path, key: str, directory: Path, progress: Progress | None = None,
                cancelled: threading.Event | None = None,
                build_fn: BuildFn = build_export) -> tuple[Path, duckdb.DuckDBPyConnection]:
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
        build_to(sqlite_path, key, final, progress, cancelled, build_fn)
    return final, open_model(final)


def _scan_copy(sqlite_path: Path, directory: Path) -> Path:
    """A private copy of a WAL-mode export, marked as a rollback-journal database so that reading it writes
    nothing beside it (DuckDB's scanner cannot open a file `immutable`)."""
    fd, name = tempfile.mkstemp(prefix=".wal-copy-", suffix=".sqlite", dir=directory)
    with os.fdopen(fd, "wb") as out, sqlite_path.open("rb") as src:
        shutil.copyfileobj(src, out)
        out.seek(WAL_VERSION_OFFSET)
        out.write(ROLLBACK_MODE)
    return Path(name)


def _changed(path: Path, before: tuple[int, int, int, int], key: str) -> bool:
    """Whether the file differs from when the build started, or from the content `key` was taken from."""
    try:
        return source.identity(path) != before or source.fingerprint(path) != key
    except OSError:  # removed or replaced meanwhile
        return True


def _changed_error(path: Path) -> ProfileChanged:
    return ProfileChanged(f"{path} changed while it was being loaded (is nsys or another program still writing "
                          "it?); load it again once the file is complete")


def build_to(sqlite_path: Path, key: str, final: Path, progress: Progress | None = None,
             cancelled: threading.Event | None = None, build_fn: BuildFn = build_export) -> None:
    """Build the model of `sqlite_path` (with `build_fn`: an nsys export, or a Kineto trace) into `final`
    (temporary file, then atomic rename). Raises ProfileChanged when the file changed while it was read,
    NotAProfile when part of it is unreadable."""
    before = source.identity(sqlite_path)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{key}-", suffix=".duckdb.tmp", dir=final.parent)
    except OSError as exc:
        raise unwritable(final.parent, exc) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # DuckDB wants to create the file itself
    try:
        build_fn(sqlite_path, tmp, key, progress, cancelled)
        if _changed(sqlite_path, before, key):
            raise _changed_error(sqlite_path)
        os.replace(tmp, final)
    except (duckdb.Error, sqlite3.Error) as exc:  # a file rewritten meanwhile can fail any query, binding included
        if _changed(sqlite_path, before, key):
            raise _changed_error(sqlite_path) from exc
        if isinstance(exc, duckdb.Error) and (exhausted := out_of_resources(exc, sqlite_path, final.parent)):
            raise exhausted from exc
        if isinstance(exc, DAMAGE_ERRORS):
            raise damaged(sqlite_path, exc) from exc
        raise
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".wal"), tmp.with_name(tmp.name + SPILL_SUFFIX)):
            _remove(leftover)
        allocator.release()  # what the build freed (its arrays, its connection's memory) before the tools run


def build_scratch(sqlite_path: Path, key: str, progress: Progress | None = None,
                  cancelled: threading.Event | None = None,
                  build_fn: BuildFn = build_export) -> tuple[Path, Path]:
    """(folder, model) of a build in a new temporary folder, which the caller removes when done with it."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix="stallhound-"))
    except OSError as exc:
        raise CacheUnwritable(f"the temporary folder {tempfile.gettempdir()} cannot be written ({exc.strerror}) "
                              f"to build the model in; set {CACHE_ENV} (or --cache-dir) to a writable folder") from exc
    model = model_path(scratch, key)
    try:
        build_to(sqlite_path, key, model, progress, cancelled, build_fn)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch, model
