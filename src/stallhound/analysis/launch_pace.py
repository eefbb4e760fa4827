"""How fast each device's kernels were issued: its launch calls' time against its kernels' time over a window."""

from __future__ import annotations

import duckdb

from stallhound.analysis.common import Scope
from stallhound.model.sql_files import sql_beside

PACE_SQL = sql_beside(__package__, "launch_pace.sql")


def launches(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[int, tuple[int, int]]:
    """Per device, its launch calls' time and their kernels' time over the window (PACE_SQL)."""
    rows = con.execute(PACE_SQL, {"devices": scope.devices, "start": scope.start_ns, "end": scope.end_ns}).fetchall()
    return {device: (api_ns, kernel_ns) for device, api_ns, kernel_ns in rows}
