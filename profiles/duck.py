"""DuckDB connections: the bundled SQLite scanner, no downloads, read-only model files."""

from __future__ import annotations

from pathlib import Path

import duckdb

from nsightful.profiles.errors import NotAProfile

OFFLINE = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


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
    """Load the scanner from the PyPI package: never from the network."""
    con.execute(f"LOAD '{_scanner_path()}'")


def open_model(path: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to a built model, with file and network access from SQL switched off."""
    con = duckdb.connect(str(path), read_only=True, config={**OFFLINE, "enable_external_access": False,
                                                            "enable_progress_bar": False})
    # A second open of one file in one process shares the first's (already locked) database.
    if not con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]:
        con.execute("SET lock_configuration = true")
    return con
