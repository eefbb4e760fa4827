"""Does the program have a data loader? The evidence the trace holds of one, never a word alone.

A loader shows as its own NVTX ranges (nvtx_texts.LOADER_RANGES: PyTorch's DataLoader iterator, _next_data,
collate, a batch fetch named as such) on any thread, or as its worker threads: PyTorch names its DataLoader worker
processes' threads pt_data_worker and its pin-memory thread pt_data_pin. Only then do OS waits of the launching
thread stand for a late input pipeline (book dataloader-starvation); without it they are waits on something the trace
does not name.
"""

from __future__ import annotations

import duckdb

from stallhound.analysis import nvtx_texts
from stallhound.analysis.common import per_model

LOADER_THREADS = r"^pt_data_(worker|pin)$|(?i:data_?loader)"  # thread names of loader workers (PyTorch's own)
SHOWN = 2  # thread names and range texts quoted as evidence, most frequent first
THREADS_SQL = """SELECT name, count(*) AS n FROM threads WHERE regexp_matches(name, $pattern)
GROUP BY name ORDER BY n DESC, name LIMIT $shown"""


def evidence(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """What shows a data loader in the trace (empty: nothing does), a few short lines: once per model."""
    return per_model(con, ("input_pipeline",), lambda: _evidence(con))


def _evidence(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    threads = con.execute(THREADS_SQL, {"pattern": LOADER_THREADS, "shown": SHOWN}).fetchall()
    ranges = [text for text, kind in nvtx_texts.classified(con).range_kinds if kind == "loader"]
    return (*(f"{n:,} thread(s) {name}" for name, n in threads),
            *(f"NVTX range {text[:60]!r}" for text in ranges[:SHOWN]))
