"""Read-only look at a raw nsys SQLite export: its tables, metadata and ENUM tables."""

from __future__ import annotations

import re
import sqlite3
import threading
from functools import cached_property
from pathlib import Path
from typing import overload
from urllib.parse import quote

from stallhound.formats.nsys.checks import (
    ESSENTIAL_TABLES,
    MAX_TIME_NS,
    REQUIRED_COLUMNS,
    damaged_note,
    left_out_note,
    missing_columns,
)
from stallhound.model.errors import LoadCancelled, NotAProfile, echo

SQLITE_MAGIC = b"SQLite format 3\x00"
# Header bytes 18 and 19 (file format write and read versions): 2 means WAL journal mode, 1 the rollback journal.
WAL_VERSION_OFFSET = 18
WAL_MODE = b"\x02\x02"
ROLLBACK_MODE = b"\x01\x01"
# Tables whose presence marks a file as an nsys export (every version has at least one).
NSYS_MARKERS = ("StringIds", "TARGET_INFO_SESSION_START_TIME", "ThreadNames", "CUPTI_ACTIVITY_KIND_KERNEL")
# Misspellings seen in real exports, mapped to the name we look up.
TABLE_ALIASES = {"ENUM_CUDA_KRENEL_LAUNCH_TYPE": "ENUM_CUDA_KERNEL_LAUNCH_TYPE"}
# The schema rows of what the build may read: nsys writes plain tables only. A view, a virtual table or a column
# computed on read (generated VIRTUAL) runs SQL of the file's author on every read (a recursive view never ends,
# and neither SQLite nor DuckDB's scanner can be interrupted inside it), so none is ever read.
SCHEMA_SQL = "SELECT name, type, sql FROM sqlite_master WHERE type IN ('table', 'view')"
COMPUTED_COLUMN = 2  # PRAGMA table_xinfo's `hidden` of a generated VIRTUAL column (3, STORED, is stored data)
# SQLite virtual-machine steps between checks that the load was cancelled: about a millisecond of work.
CANCEL_CHECK_STEPS = 10_000
# Characters kept of one string of StringIds. Names are shared: one string may name every kernel or call, and the
# build copies it into each row that uses it, so one 50 MB string under 3,119 kernels took 9 GB and more. Names stay
# far below (the longest kernel name in our corpus has 5,835 characters); longer strings are program output that
# nsys keeps (an OpenACC present-table dump of 271,919) which the model does not use.
MAX_STRING_CHARS = 16_384

# nsys' own codes, used only when an export lacks the ENUM table (older exports).
BUILTIN_ENUMS: dict[str, dict[int, str]] = {
    "ENUM_CUDA_MEMCPY_OPER": {0: "CUDA_MEMCPY_KIND_UNKNOWN", 1: "CUDA_MEMCPY_KIND_HTOD", 2: "CUDA_MEMCPY_KIND_DTOH",
                              3: "CUDA_MEMCPY_KIND_HTOA", 4: "CUDA_MEMCPY_KIND_ATOH", 5: "CUDA_MEMCPY_KIND_ATOA",
                              6: "CUDA_MEMCPY_KIND_ATOD", 7: "CUDA_MEMCPY_KIND_DTOA", 8: "CUDA_MEMCPY_KIND_DTOD",
                              9: "CUDA_MEMCPY_KIND_HTOH", 10: "CUDA_MEMCPY_KIND_PTOP",
                              11: "CUDA_MEMCPY_KIND_UVM_HTOD", 12: "CUDA_MEMCPY_KIND_UVM_DTOH",
                              13: "CUDA_MEMCPY_KIND_UVM_DTOD"},
    "ENUM_CUDA_UNIF_MEM_MIGRATION": {0: "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_UNKNOWN",
                                     1: "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_USER",
                                     2: "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE",
                                     3: "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_PREFETCH",
                                     4: "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_EVICTION",
                                     5: "CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_ACCESS_COUNTERS"},
    "ENUM_CUDA_MEM_KIND": {0: "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", 1: "CUDA_MEMOPR_MEMORY_KIND_PINNED",
                           2: "CUDA_MEMOPR_MEMORY_KIND_DEVICE", 3: "CUDA_MEMOPR_MEMORY_KIND_ARRAY",
                           4: "CUDA_MEMOPR_MEMORY_KIND_MANAGED", 5: "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC",
                           6: "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", 7: "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN"},
    "ENUM_CUPTI_SYNC_TYPE": {0: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN",
                             1: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE",
                             2: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT",
                             3: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE",
                             4: "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE"},
    "ENUM_CUDA_DEV_MEM_EVENT_OPER": {0: "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", 1: "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION"},
    "ENUM_DIAGNOSTIC_SEVERITY_LEVEL": {0: "UnknownLevel", 1: "Info", 2: "Warning", 3: "Error", 4: "Verbose"},
    "ENUM_DIAGNOSTIC_SOURCE_TYPE": {0: "UnknownSource", 1: "Injection", 2: "Daemon", 3: "Analysis"},
    "ENUM_NSYS_EVENT_TYPE": {34: "NvtxMark", 59: "NvtxPushPopRange", 60: "NvtxStartEndRange",
                             65: "NvtxtMark", 70: "NvtxtPushPopRange", 71: "NvtxtStartEndRange",
                             75: "NvtxDomainCreate"},
}


# Read loosely (every cell as text, then cast as its column declares: a cell of the wrong type reads as NULL and its
# row is dropped and counted by checks.drop_damaged_rows), columns declared with no type that hold text.
TEXT_COLUMNS = ("text", "value", "name")
TIME_COLUMNS = ("start", "end", "timestamp")  # bounded by checks.MAX_TIME_NS, so that no duration overflows
LOOSE_NOTE = ("some cells of the export's tables hold values of another type than their column's (text or a fraction "
              "where nsys writes whole numbers), or columns declare no type: it was read cell by cell, and rows whose "
              "times or ids did not read are counted below")
MALFORMED = "malformed"  # in SQLite's (and DuckDB's scanner's) message for a damaged page


def raw_malformed(exc: Exception) -> bool:
    """Whether SQLite (or DuckDB's scanner) found a damaged page."""
    return MALFORMED in str(exc)


def typed(name: str, declared: str) -> str:
    """The SELECT item that reads a loosely read (text) column as the type it declares."""
    quoted, decl = f'"{name}"', declared.upper()
    if any(k in decl for k in ("CHAR", "CLOB", "TEXT")) or (not decl and name in TEXT_COLUMNS):
        return quoted
    if any(k in decl for k in ("REAL", "FLOA", "DOUB")):
        return f"TRY_CAST({quoted} AS DOUBLE) AS {quoted}"
    number = f"TRY_CAST({quoted} AS BIGINT)"
    if name in TIME_COLUMNS:
        return f"CASE WHEN {number} BETWEEN -{MAX_TIME_NS} AND {MAX_TIME_NS} THEN {number} END AS {quoted}"
    return f"{number} AS {quoted}"


@overload
def decode_text(value: bytes | str) -> str: ...
@overload
def decode_text(value: object) -> object: ...
def decode_text(value: object) -> object:
    """Bytes from SQLite as str: UTF-8 when valid, else Latin-1 (every byte kept)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.decode("latin-1")
    return value


def damaged(path: Path, exc: Exception) -> NotAProfile:
    """The one-sentence error for an export SQLite or DuckDB failed to read part of."""
    lines = str(exc).strip().splitlines()
    return NotAProfile(f"{path} is not a readable SQLite database ({echo(lines[0]) if lines else type(exc).__name__}): "
                       "it may be truncated, damaged or still being written; re-export it with "
                       "`nsys export --type sqlite`")


def computed_note(table: str, kind: str) -> str:
    what = "a view" if kind == "view" else "a table computed on read"
    return (f"the export's {table} is {what}, not a table as nsys writes it, so it was left out unread and that "
            "data reads as missing; re-export the report with `nsys export --type sqlite` to get it back")


def is_wal_mode(path: Path) -> bool:
    """Whether the export is in WAL journal mode: SQLite (and DuckDB's scanner) opening it without
    `immutable` would create -wal/-shm files beside it."""
    with path.open("rb") as fh:
        fh.seek(WAL_VERSION_OFFSET)
        return fh.read(len(WAL_MODE)) == WAL_MODE


class RawExport:
    """The raw export, opened read-only (immutable: nothing, not even a lock, is written).

    Tables lacking a column the nsys build reads are hidden (see formats.nsys.checks) and named in `notes`;
    `scan_path` is the file DuckDB's scanner reads (a private copy when the export is in WAL mode).
    """

    def __init__(self, path: Path, cancelled: threading.Event | None = None):
        self.path = path
        self.scan_path = path
        self.notes: list[str] = []
        self.loose = False  # read every table cell by cell (see `typed`): some cells or columns are not as declared
        self.cancelled = cancelled or threading.Event()
        uri = f"file:{quote(str(path))}?mode=ro&immutable=1"
        try:
            self.con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        except sqlite3.Error as exc:
            raise damaged(path, exc) from exc
        try:
            self.con.text_factory = bytes
            self.con.set_progress_handler(self.cancelled.is_set, CANCEL_CHECK_STEPS)
            self.table_names: dict[str, str] = self._stored_tables()
            if not any(m in self.table_names for m in NSYS_MARKERS):
                raise NotAProfile(f"{path} is an SQLite database but not an Nsight Systems export "
                                  "(no StringIds/CUPTI/TARGET_INFO tables); export one with "
                                  "`nsys export --type sqlite report.nsys-rep`")
            self._hide_unreadable_tables()
        except sqlite3.DatabaseError as exc:
            self.con.close()
            raise (self.interrupted() or damaged(path, exc)) from exc
        except NotAProfile:
            self.con.close()
            raise

    def interrupted(self) -> LoadCancelled | None:
        """The error of a read the load's cancel interrupted (through the progress handler), else None."""
        return LoadCancelled(f"loading {self.path} was cancelled") if self.cancelled.is_set() else None

    def _stored_tables(self) -> dict[str, str]:
        """Name looked up -> name in the file, of the plain tables (see SCHEMA_SQL); each view, virtual table or
        table with a computed column where the build reads a table is noted as left out, unread."""
        tables: dict[str, str] = {}
        for name, kind, sql in ((decode_text(n), t, decode_text(q or b"")) for n, t, q in self.con.execute(SCHEMA_SQL)):
            looked_up = TABLE_ALIASES.get(name, name)
            if kind == b"table" and not sql.lstrip().upper().startswith("CREATE VIRTUAL") \
                    and not self._computed_columns(name):
                tables[looked_up] = name
            elif looked_up in REQUIRED_COLUMNS:
                self.notes.append(computed_note(looked_up, kind.decode()))
        return tables

    def _computed_columns(self, table: str) -> bool:
        quoted = table.replace('"', '""')
        return any(r[-1] == COMPUTED_COLUMN for r in self.con.execute(f'PRAGMA table_xinfo("{quoted}")'))

    def _hide_unreadable_tables(self) -> None:
        for table in ESSENTIAL_TABLES:
            if not self.has(table) or missing_columns(table, self.columns(table)):
                raise NotAProfile(f"{self.path} has no readable {table} table, which every nsys export uses to "
                                  "name kernels, API calls and threads: the file is incomplete or was altered; "
                                  "re-export the report with `nsys export --type sqlite`")
        for table in sorted(self.table_names):
            missing = missing_columns(table, self.columns(table))
            if missing:
                self.notes.append(left_out_note(table, missing, self.count(table)))
                del self.table_names[table]
        # Only the tables the build reads: other tools add their own (Extra-P's EXTRAP_* declare no types); a table
        # read beyond these that fails to cast still gets the loose retry (recover).
        if any(not declared for t in self.table_names if t in REQUIRED_COLUMNS for _, declared in self.declared(t)):
            self.read_loosely()

    def read_loosely(self) -> None:
        self.loose = True
        self.notes.append(LOOSE_NOTE)

    def recover(self, exc: Exception) -> bool:
        """After a build failed with `exc` on the export's content: whether reading it otherwise may succeed, having
        set that up (damaged tables left out and noted, or cells read loosely); False when nothing is left to try."""
        if raw_malformed(exc):
            damaged = [t for t in sorted(self.table_names) if t not in ESSENTIAL_TABLES and not self._readable(t)]
            for table in damaged:
                self.notes.append(damaged_note(table))
                del self.table_names[table]
            return bool(damaged)
        if self.loose:
            return False
        self.read_loosely()
        return True

    def _readable(self, table: str) -> bool:
        """Whether every row of `table` reads (SQLite reports a damaged page of it only when it reaches it)."""
        try:
            for _ in self.con.execute(f'SELECT * FROM "{self.real_name(table)}"'):
                pass
        except sqlite3.DatabaseError:
            return False
        return True

    def declared(self, table: str) -> list[tuple[str, str]]:
        """(column, declared type) of `table`, as the export's schema has them."""
        return [(decode_text(r[1]), decode_text(r[2])) for r in
                self.con.execute(f'PRAGMA table_info("{self.real_name(table)}")')]

    def scan(self, table: str) -> str:
        """What DuckDB reads `table` from, `raw` being the export attached: the table, or, read loosely, a SELECT that
        casts each column as it declares."""
        name = f'raw."{self.real_name(table)}"'
        if not self.loose:
            return name
        return f"(SELECT {', '.join(typed(c, d) for c, d in self.declared(table))} FROM {name})"

    def close(self) -> None:
        self.con.close()

    def has(self, table: str) -> bool:
        return table in self.table_names

    def real_name(self, table: str) -> str:
        return self.table_names[table]

    def columns(self, table: str) -> list[str]:
        if not self.has(table):
            return []
        return [decode_text(r[1]) for r in self.con.execute(f'PRAGMA table_info("{self.real_name(table)}")')]

    def count(self, table: str) -> int:
        if not self.has(table):
            return 0
        return self.con.execute(f'SELECT count(*) FROM "{self.real_name(table)}"').fetchone()[0]

    def nonempty(self, table: str) -> bool:
        """True when the table exists and has a row (without counting them all)."""
        return self.has(table) and self.con.execute(
            f'SELECT 1 FROM "{self.real_name(table)}" LIMIT 1').fetchone() is not None

    def rows(self, table: str, columns: str = "*") -> list[tuple]:
        if not self.has(table):
            return []
        cur = self.con.execute(f'SELECT {columns} FROM "{self.real_name(table)}"')
        return [tuple(decode_text(v) for v in row) for row in cur]

    def strings(self) -> tuple[list[int], list[str | None]]:
        """StringIds' ids and values (None for a value that is not text), each cut to MAX_STRING_CHARS characters
        before it leaves SQLite; a note counts those cut."""
        rows = self.rows("StringIds", f"id, substr(value, 1, {MAX_STRING_CHARS}), length(value)")
        longer = [r[2] for r in rows if isinstance(r[2], int) and r[2] > MAX_STRING_CHARS]
        if longer:
            said = "1 string" if len(longer) == 1 else f"{len(longer):,} strings"
            self.notes.append(f"{said} of the export's StringIds table ran past {MAX_STRING_CHARS:,} characters "
                              f"(the longest had {max(longer):,}); each was cut there, so that memory holds however "
                              "many rows share one, and a name or text using one ends early")
        return [r[0] for r in rows], [r[1] if isinstance(r[1], str) else None for r in rows]

    @cached_property
    def metadata(self) -> tuple[str | None, dict[str, str]]:
        """(table name, name -> first value) from META_DATA_EXPORT or its older name."""
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            if self.has(table):
                out: dict[str, str] = {}
                for name, value in self.rows(table, "name, value"):
                    out.setdefault(name, value)
                return table, out
        return None, {}

    @cached_property
    def capture_metadata(self) -> list[tuple[str, str]]:
        return self.rows("META_DATA_CAPTURE", "name, value") if self.has("META_DATA_CAPTURE") else []

    def enum(self, table: str) -> tuple[dict[int, str], bool]:
        """code -> name from the profile's own ENUM table; (builtin values, False) when it lacks one."""
        if self.has(table):
            cols = self.columns(table)
            if "id" in cols and "name" in cols:
                return {int(i): str(n) for i, n in self.rows(table, "id, name")}, True
        return dict(BUILTIN_ENUMS.get(table, {})), False

    @cached_property
    def os_release(self) -> str | None:
        """The profiled machine's kernel release (TARGET_INFO_SYSTEM_ENV SoftwareReleaseVersion); None: not recorded."""
        if not {"name", "value"} <= set(self.columns("TARGET_INFO_SYSTEM_ENV")):
            return None
        found = [v for name, v in self.rows("TARGET_INFO_SYSTEM_ENV", "name, value")
                 if name == "SoftwareReleaseVersion" and isinstance(v, str) and v]
        return found[0] if found else None

    @cached_property
    def nsys_version(self) -> str | None:
        _, meta = self.metadata
        if meta.get("EXPORT_PRODUCT_VERSION"):
            return meta["EXPORT_PRODUCT_VERSION"]
        # The oldest exports have no metadata; the install path in the system env often holds the version.
        for row in self.rows("TARGET_INFO_SYSTEM_ENV") if self.has("TARGET_INFO_SYSTEM_ENV") else []:
            for value in row:
                if isinstance(value, str):
                    found = re.search(r"(20\d\d\.\d+\.\d+(?:\.\d+)?)", value)
                    if found and "nsight" in value.lower():
                        return found.group(1)
        return None
