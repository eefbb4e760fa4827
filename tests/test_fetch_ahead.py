"""analysis/fetch_ahead.py: chunks in order and equal to reading them one by one, the caller's statements between them,
a cursor's temporary views seen by the helper, errors and interrupts raised in the caller, early exits that leave
no thread behind."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from stallhound.analysis.fetch_ahead import FetchAhead

CHUNK_SQL = "SELECT i AS v, i % 7 AS k FROM t WHERE i >= $lo AND i < $hi"


def _con(rows: int = 10_000) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range($n)", {"n": rows})
    return con


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stallhound-fetch-ahead"]


@pytest.mark.parametrize("width", [1, 333, 10_000, 20_000])
def test_fetch_ahead_chunks_equal_direct_reads_in_order(width):
    con = _con()
    params = [{"lo": lo, "hi": lo + width} for lo in range(0, 10_000, width)]
    direct = [con.execute(CHUNK_SQL, p).fetchnumpy() for p in params]
    with FetchAhead(con, CHUNK_SQL, params) as ahead:
        got = list(ahead)
    assert [(c["v"].tolist(), c["k"].tolist()) for c in got] == [(c["v"].tolist(), c["k"].tolist()) for c in direct]
    assert not _helpers()


def test_fetch_ahead_caller_writes_between_chunks_and_sees_temp_views():
    con = _con(1_000)
    cur = con.cursor()  # a cursor's temp view, as a rank's view of a job: invisible to other connections
    cur.execute("CREATE TEMP VIEW tv AS SELECT i FROM t WHERE i % 2 = 0")
    cur.execute("CREATE TEMP TABLE sums (lo BIGINT, total BIGINT)")
    params = [{"lo": lo, "hi": lo + 100} for lo in range(0, 1_000, 100)]
    with FetchAhead(cur, "SELECT i FROM tv WHERE i >= $lo AND i < $hi ORDER BY i", params) as ahead:
        for p, chunk in zip(params, ahead, strict=False):
            with ahead.using() as locked:
                locked.execute("INSERT INTO sums VALUES ($lo, $total)", {"lo": p["lo"], "total": int(chunk["i"].sum())})
    assert cur.execute("SELECT lo, total FROM sums ORDER BY lo").fetchall() == [
        (lo, sum(range(lo, lo + 100, 2))) for lo in range(0, 1_000, 100)]


def test_fetch_ahead_failed_query_raises_in_caller():
    con = _con(100)
    params = [{"lo": 0, "hi": 50}, {"lo": "not a number", "hi": 100}, {"lo": 60, "hi": 100}]
    got = []
    with pytest.raises(duckdb.ConversionException), FetchAhead(con, CHUNK_SQL, params) as ahead:
        got.extend(c["v"].tolist() for c in ahead)
    assert got == [list(range(50))]
    assert not _helpers()


def test_fetch_ahead_early_exit_stops_helper():
    con = _con(100_000)
    params = [{"lo": lo, "hi": lo + 10} for lo in range(0, 100_000, 10)]
    with FetchAhead(con, CHUNK_SQL, params) as ahead:
        first = next(iter(ahead))
    assert first["v"].tolist() == list(range(10))
    assert not _helpers()
    assert con.execute("SELECT count(*) FROM t").fetchone() == (100_000,)  # the connection still serves


class _Counting:
    """A connection that counts the chunk queries run on it."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con, self.reads = con, 0

    def execute(self, sql: str, params: dict | None = None) -> duckdb.DuckDBPyConnection:
        self.reads += sql == CHUNK_SQL
        return self.con.execute(sql, params)


def test_fetch_ahead_caller_failing_between_chunks_stops_reads():
    con = _Counting(_con(1_000))
    params = [{"lo": lo, "hi": lo + 10} for lo in range(0, 1_000, 10)]
    with pytest.raises(ZeroDivisionError), FetchAhead(con, CHUNK_SQL, params) as ahead:
        for n, _ in enumerate(ahead):
            with ahead.using():
                _ = 1 / (3 - n)
    assert con.reads <= 5  # the 4 taken, and at most the one being read when the caller failed
    assert not _helpers()


def test_fetch_ahead_interrupt_raises_in_caller():
    con = duckdb.connect()
    slow = "SELECT count(*) AS n FROM range($n) a, range(1000) b WHERE (a.range * b.range) % 7 = $k"
    params = [{"n": 10_000_000, "k": k} for k in range(3)]
    done = threading.Event()

    def interrupt() -> None:  # until the pass ends, as the server does: one landing between statements is lost
        while not done.wait(0.2):
            con.interrupt()

    threading.Thread(target=interrupt, daemon=True).start()
    started = time.perf_counter()
    try:
        with pytest.raises(duckdb.InterruptException), FetchAhead(con, slow, params) as ahead:
            list(ahead)
    finally:
        done.set()
    assert time.perf_counter() - started < 10
    assert not _helpers()
