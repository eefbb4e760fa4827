"""Nsight Systems: SQLite exports (and .nsys-rep/.qdrep reports, converted by `nsys export`) as the nsys Format."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

import duckdb

from stallhound.formats.base import Format
from stallhound.formats.nsys.hardware import OPTIONS
from stallhound.formats.nsys.raw import (
    ROLLBACK_MODE,
    SQLITE_MAGIC,
    WAL_VERSION_OFFSET,
    RawExport,
    damaged,
    is_wal_mode,
    raw_malformed,
)
from stallhound.formats.nsys.report import REPORT_SUFFIXES, convert_report
from stallhound.model.cache import Progress

COMMAND = "nsys profile"
TRACE = "--trace="  # the option whose values one capture lists together: --trace=cuda,nvtx
# What DuckDB or SQLite raise when the export's content cannot be read (truncated pages, invalid text or
# values of the wrong type); our own SQL errors (binder, catalog) are not among them.
DAMAGE_ERRORS = (sqlite3.DatabaseError, duckdb.IOException, duckdb.InvalidInputException,
                 duckdb.TypeMismatchException, duckdb.ConversionException, duckdb.OutOfRangeException)
# Builds of one export at most: the first as it is, then read loosely (RawExport.recover), then without the tables
# whose pages are damaged; each retry leaves out more, so the last one either loads what is readable or is refused.
BUILD_TRIES = 3


def _content_error(exc: Exception) -> bool:
    """Whether a failed build's error is about the export's content (a damaged page, a cell of the wrong type)."""
    return isinstance(exc, DAMAGE_ERRORS) or raw_malformed(exc)


def is_export(path: Path) -> bool:
    """A report nsys converts, or a file with an SQLite header (RawExport tells an nsys export from another)."""
    if path.suffix.lower() in REPORT_SUFFIXES:
        return True
    with path.open("rb") as fh:
        return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def _scan_copy(sqlite_path: Path, directory: Path) -> Path:
    """A private copy of a WAL-mode export, marked as a rollback-journal database so that reading it writes
    nothing beside it (DuckDB's scanner cannot open a file `immutable`)."""
    fd, name = tempfile.mkstemp(prefix=".wal-copy-", suffix=".sqlite", dir=directory)
    with os.fdopen(fd, "wb") as out, sqlite_path.open("rb") as src:
        shutil.copyfileobj(src, out)
        out.seek(WAL_VERSION_OFFSET)
        out.write(ROLLBACK_MODE)
    return Path(name)


def build_export(sqlite_path: Path, out: Path, key: str, progress: Progress | None = None,
                 cancelled: threading.Event | None = None) -> None:
    """Build the model of an nsys export into `out`, through a private copy when the export is in WAL mode."""
    from stallhound.formats.nsys import build as export_build  # here: opening a cached model needs none of it

    raw = RawExport(sqlite_path, cancelled)
    try:
        if is_wal_mode(sqlite_path):
            raw.scan_path = _scan_copy(sqlite_path, out.parent)
        for tries_left in reversed(range(BUILD_TRIES)):
            try:
                export_build.build(raw, out, key, progress, cancelled)
                return
            except Exception as exc:
                if isinstance(exc, sqlite3.OperationalError) and (stopped := raw.interrupted()) is not None:
                    raise stopped from exc  # a read the cancel interrupted: nothing to retry
                if not tries_left or not _content_error(exc) or not raw.recover(exc):
                    raise
                for leftover in (out, out.with_name(out.name + ".wal")):
                    leftover.unlink(missing_ok=True)
    finally:
        raw.close()
        if raw.scan_path != sqlite_path:
            raw.scan_path.unlink(missing_ok=True)


def _prepare(path: Path, cache_dir: Path) -> Path:
    """The export to build from: a report converted into the cache, an export as it is."""
    return convert_report(path, cache_dir) if path.suffix.lower() in REPORT_SUFFIXES else path


def _damaged(path: Path, exc: Exception) -> Exception | None:
    return damaged(path, exc) if _content_error(exc) else None


def merged(options: list[str]) -> str:
    """The options as one capture's: every --trace= value in one list where the first stood, repeats dropped."""
    out: list[str] = []
    traced: list[str] = []
    for token in (t for option in options for t in option.split()):
        if token.startswith(TRACE):
            if not traced:
                out.append(TRACE)
            traced += [v for v in token.removeprefix(TRACE).split(",") if v not in traced]
        elif token not in out:
            out.append(token)
    return " ".join(TRACE + ",".join(traced) if t == TRACE else t for t in out)


def say(options: list[str], bare: bool) -> str:
    return merged(options) if bare else f"`{COMMAND} {merged(options)}`"


def written_by(version: str | None, schema: str) -> str:
    return f"nsys {version or '?'} (export schema {schema})"


FORMAT = Format(
    name="nsys", writer="nsys", detect=is_export, build=build_export, damaged=_damaged,
    read_errors=(sqlite3.Error,), options=OPTIONS, say=say, written_by=written_by,
    expects=("an SQLite file (its first bytes are not an SQLite header)",
             "export the report with `nsys export --type sqlite report.nsys-rep`"),
    converts=REPORT_SUFFIXES, prepare=_prepare, suffixes=(".sqlite", *REPORT_SUFFIXES))
