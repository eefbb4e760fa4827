"""A large Kineto trace's batches parsed in worker processes, one per core (issue 33).

This process still reads the file through the reader's bounds and cuts it into batches (batches.split_raw: a check
of the JSON, no objects made); each batch goes to a worker, which parses it (batches.DECODE, the very objects the
in-process path makes), turns its events into rows with read.py's own code and sends back each staged column as
JSON text, the form the staging insert takes. Results are taken in the order of the batches, at most IN_FLIGHT per
worker at a time, so memory stays bounded and rows, names and counts come as the in-process path gives them. Workers
are spawned, not forked (a fork would copy DuckDB's threads' locks mid-use), and only where the trace is large enough
to repay their start, this process is not itself a worker (a job's pool of builds already fills the cores), and the
machine has more than one core; otherwise the batches are parsed in this process.
"""

from __future__ import annotations

import io
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import ijson
import msgspec

from stallhound.formats.kineto import batches
from stallhound.formats.kineto import read as kineto_read

# JSON size from which a trace is parsed by workers. They add 10-30% to the work in all (starting each Python,
# sending batches and columns between processes) and pay only with a free core: a 146 MB trace loaded 1-2 s slower
# with them on a busy 2-core machine, a 1 GB one 34% faster (BENCHMARKS.md).
WORKERS_FROM_BYTES = 256 << 20
GZIP_LOW_RATIO = 8  # Kineto's JSON gzips 8 to 15 times smaller (read.MAX_GZIP_RATIO): a gzipped trace's JSON is larger
MAX_WORKERS = 8  # a 4 MB batch's rows take this process about as long to insert as a worker takes to parse it
IN_FLIGHT = 2  # batches per worker sent ahead: one parsing, one waiting, so that no worker idles
ROW_SINKS = ("gpu", "host", "comms", "python", "range")  # read.events' sinks of staged rows; 'name' comes back as rows
ENCODE = msgspec.json.encode  # a column (ints, strings, None) as JSON, 2.5x faster than json.dumps


@dataclass
class Parsed:
    """One batch as a worker sends it back: per row sink its columns as JSON text (None when it has no rows), the
    process and thread names it gives, its events read and dropped."""

    columns: dict[str, list[str] | None]
    names: list[tuple]
    read: int
    dropped: int


def encode_columns(rows: list[tuple]) -> list[str]:
    """Each column of `rows` as one JSON array, the form a staging insert takes (stage.Stage)."""
    return [ENCODE(col).decode() for col in zip(*rows, strict=True)]


def parse(body: bytes) -> Parsed:
    """Run in a worker: the rows of one batch (a JSON array of events). A batch msgspec cannot build (one nested
    past its recursion limit) is parsed by ijson, as the in-process path hands such a stretch to ijson."""
    try:
        events = batches.DECODE.decode(body)
    except batches.DECODE_ERRORS:
        events = list(ijson.items(io.BytesIO(body), "item"))
    rows: dict[str, list[tuple]] = {sink: [] for sink in ROW_SINKS}
    names: list[tuple] = []
    fed = kineto_read.feed_all(events, {**{sink: got.append for sink, got in rows.items()}, "name": names.append})
    return Parsed({sink: encode_columns(got) if got else None for sink, got in rows.items()}, names, fed,
                  len(events) - fed)


def workers_for(path: Path) -> int:
    """Worker processes for the trace at `path`: 0 (parse in this process) unless it is worth them."""
    cores = min(os.cpu_count() or 1, MAX_WORKERS)
    with path.open("rb") as fh:
        ratio = GZIP_LOW_RATIO if fh.read(len(kineto_read.GZIP_MAGIC)) == kineto_read.GZIP_MAGIC else 1
    if cores < 2 or multiprocessing.parent_process() is not None or path.stat().st_size * ratio < WORKERS_FROM_BYTES:
        return 0
    return cores


class Pool:
    """Worker processes that parse batches; `put(sink, columns)` takes each batch's encoded rows, `name(row)` its
    names, in batch order."""

    def __init__(self, workers: int, put: Callable[[str, list[str]], None], name: Callable[[tuple], None]):
        self.put, self.name, self.workers, self.broken = put, name, workers, False
        self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))

    def parse_all(self, bodies: Iterator[bytes]) -> tuple[int, int]:
        """Parse every batch of `bodies` and hand on its rows; return the events read and dropped."""
        pending: deque[tuple[Future | None, bytes]] = deque()
        read = dropped = 0
        for body in bodies:
            pending.append((self._submit(body), body))
            while len(pending) >= self.workers * IN_FLIGHT or (pending and self._ready(pending[0][0])):
                read, dropped = self._take(self._result(*pending.popleft()), read, dropped)
        while pending:
            read, dropped = self._take(self._result(*pending.popleft()), read, dropped)
        return read, dropped

    def _submit(self, body: bytes) -> Future | None:
        """The batch sent to a worker; None once the pool is broken (a worker was killed, or could not start)."""
        try:
            return None if self.broken else self.executor.submit(parse, body)
        except BrokenProcessPool:
            self.broken = True
            return None

    @staticmethod
    def _ready(future: Future | None) -> bool:
        return future is None or future.done()

    def _result(self, future: Future | None, body: bytes) -> Parsed:
        """The worker's result, or the batch parsed here when the pool broke: the load goes on, slower."""
        try:
            if future is not None:
                return future.result()
        except BrokenProcessPool:
            self.broken = True
        return parse(body)

    def _take(self, parsed: Parsed, read: int, dropped: int) -> tuple[int, int]:
        for sink, columns in parsed.columns.items():
            if columns is not None:
                self.put(sink, columns)
        for row in parsed.names:
            self.name(row)
        return read + parsed.read, dropped + parsed.dropped

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
