"""DuckDB connections: the bundled SQLite scanner, no downloads, read-only model files."""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import duckdb

from stallhound.model.errors import NotAProfile
from stallhound.model.limits import model_memory_mb

Settings = dict[str, str | bool | int | float | list[str]]  # what duckdb.connect takes as `config`
OFFLINE: Settings = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
# DuckDB hands freed memory back to the OS after a bulk free larger than this (default 512 MB); until then it stays
# in RSS beyond the model memory limit. A small threshold lowers a large profile's peak RSS at no cost in time.
RETURN_FREED_MEMORY: Settings = {"allocator_bulk_deallocation_flush_threshold": "16MB"}
# DuckDB parts a query's work among its threads by row group (122,880 rows): on a model whose largest table fits in
# one, a second thread has nothing to take, and waking it for each of a triage's ~120 queries costs more CPU than it
# saves (on a busy machine, ms of wall time a query). Such a model gets one thread; a larger one, DuckDB's default.
ROW_GROUP_ROWS = 122_880
# DuckDB checks an extension's signature on LOAD by hashing the whole file: for the 35 MB scanner that took longer
# than the rest of a small export's build (BENCHMARKS-HISTORY.md). The scanner comes from the installed package, as
# trusted as DuckDB itself beside it; a connection made with these settings loads it unchecked and then refuses
# unsigned extensions for good (load_sqlite_scanner): any other LOAD is checked as ever.
SCANNER_SETTINGS: Settings = {"allow_unsigned_extensions": True}


def _scanner_path() -> Path:
    import duckdb_extension_sqlite_scanner as pkg
    version = duckdb.__version__
    path = Path(pkg.__file__).parent / "extensions" / f"v{version}" / "sqlite_scanner.duckdb_extension"
    if not path.exists():
        found = sorted((Path(pkg.__file__).parent / "extensions").glob("*/sqlite_scanner.duckdb_extension"))
        raise NotAProfile(f"the bundled DuckDB SQLite scanner does not match duckdb {version} "
                          f"(found {', '.join(p.parent.name for p in found) or 'none'}); "
                          f"reinstall with `pip install duckdb-extension-sqlite-scanner=={version}`")
    return path


def load_sqlite_scanner(con: duckdb.DuckDBPyConnection) -> None:
    """Load the scanner from the PyPI package: never from the network. Then unsigned extensions are refused: DuckDB
    lets this setting be turned off, never on again, while the database is open (SCANNER_SETTINGS)."""
    con.execute(f"LOAD '{_scanner_path()}'")
    con.execute("SET allow_unsigned_extensions = false")


_shared: dict[Path, tuple[duckdb.DuckDBPyConnection, int]] = {}
_shared_lock = threading.Lock()


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def spill_folder(model: Path) -> Path:
    """Where DuckDB spills for this process's connection to `model`: beside the model (in the cache folder, never
    the profile's), one per host and process so that two processes never share spill files. DuckDB makes it on the
    first spill and removes it when the connection closes; a process that is killed leaves it (remove_dead_spills)."""
    return model.with_name(f"{model.name}.spill-{_host()}-{os.getpid()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_dead_spills(model: Path) -> list[Path]:
    """Remove the spill folders that processes of this host left beside `model` when they were killed (a client
    stopping its stdio server does that), and return them. Folders of other hosts sharing the cache folder (a
    network home) are left: their processes cannot be checked from here."""
    pattern = re.compile(re.escape(f"{model.name}.spill-{_host()}-") + r"(\d+)")
    removed = []
    for folder in model.parent.glob(f"{model.name}.spill-*"):
        found = pattern.fullmatch(folder.name)
        if found and int(found[1]) != os.getpid() and not _alive(int(found[1])):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def open_model(path: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to a built model, with file and network access from SQL switched off, within the
    model memory limit (model.limits).

    DuckDB allows one configuration per database file in a process, so every open of the same
    model shares one base connection and gets its own cursor; `close_model` releases it.
    """
    with _shared_lock:
        base, users = _shared.get(path, (None, 0))
        if base is None:
            remove_dead_spills(path)
            base = duckdb.connect(str(path), read_only=True, config={
                **OFFLINE, **RETURN_FREED_MEMORY, "enable_external_access": False,
                "memory_limit": f"{model_memory_mb()}MB", "temp_directory": str(spill_folder(path))})
            base.execute("SET enable_progress_bar = false")
            largest = one_row(base.execute("SELECT coalesce(max(estimated_size), 0) FROM duckdb_tables()"))[0]
            if largest <= ROW_GROUP_ROWS:
                base.execute("SET threads = 1")
            base.execute("SET lock_configuration = true")
        _shared[path] = (base, users + 1)
        return base.cursor()


def close_model(path: Path, con: duckdb.DuckDBPyConnection) -> None:
    con.close()
    with _shared_lock:
        base, users = _shared.pop(path, (None, 0))
        if base is not None and users > 1:
            _shared[path] = (base, users - 1)
        elif base is not None:
            base.close()


def one_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (an aggregate without GROUP BY, the one-row meta table):
    DuckDB's fetchone types it as maybe absent."""
    row = result.fetchone()
    assert row is not None, "an aggregate or meta query returned no row"
    return row
