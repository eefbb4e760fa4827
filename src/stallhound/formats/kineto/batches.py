"""The bulk of a Kineto trace's events, parsed a few MB at a time instead of event by event (issue 33).

traceEvents is an array of flat objects, so it is cut into batches between one object's closing brace and the next
one's opening brace, and each batch is parsed at once by msgspec. A cut found by a byte pattern may fall inside a
string or a nested list of objects; there the bytes before it are no complete JSON values and fail to parse, so an
earlier cut is tried. Numbers with a fraction are read as Decimal, exactly as ijson reads them, so times keep every
nanosecond at epoch scale (a double would not). What this step does not take (a trace smaller than a batch, the last
batch with the values after the events, a stretch no cut parses) is handed back to the reader for ijson to stream.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from stallhound.formats.kineto.read import BoundedReader

# ~20,000 events, ~30 MB of Python objects: parses are few and large, a batch stays far below MAX_VALUE_BYTES.
BATCH_BYTES = 4 << 20
CUT_TRIES = 3  # cuts tried from the end of a batch; a real trace's first cut parses
CUT_SEARCH_BYTES = 256 << 10  # how far back from a batch's end cuts are looked for first: events are a few KB
TRACE_EVENTS_KEY = b'"traceEvents"'
EVENTS_START = b'{"traceEvents": ['  # put before what is handed back, so that ijson reads it as the whole trace
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|["{}\[\]]')  # a whole string, a quote that opens an unfinished one, a bracket
ARRAY_OPEN = re.compile(rb"\s*:\s*\[")
DECODE = msgspec.json.Decoder(float_hook=Decimal)
CHECK = msgspec.json.Decoder(list[msgspec.Raw])  # checks that a stretch is complete JSON values, builds none of them
# What a stretch that is no complete JSON values raises while it is parsed: it is tried elsewhere, or streamed.
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def _array_start(head: bytes) -> int | None:
    """The offset just past the '[' that opens the top-level traceEvents array, None when `head` does not hold it."""
    if TRACE_EVENTS_KEY not in head:
        return None
    depth = 0
    for token in TOKEN.finditer(head):
        text = token.group()
        if text == b'"':
            return None  # a string goes on past these bytes
        if text[:1] != b'"':
            depth += 1 if text in b"{[" else -1
        elif depth == 1 and text == TRACE_EVENTS_KEY and (opened := ARRAY_OPEN.match(head, token.end())):
            return opened.end()
    return None


def _cut(buf: bytes, decoder: msgspec.json.Decoder = DECODE) -> tuple[list, int] | None:
    """The events before the last cut of `buf` at which they parse, and the offset of the next event's '{'."""
    cuts = list(BOUNDARY.finditer(buf, max(len(buf) - CUT_SEARCH_BYTES, 0))) or list(BOUNDARY.finditer(buf))
    cuts = [cut for cut in cuts if b"\n" in cut.group()] or cuts  # a string holds no line break: those cuts first
    for cut in reversed(cuts[-CUT_TRIES:]):
        try:
            return decoder.decode(b"[" + buf[:cut.start() + 1] + b"]"), cut.end() - 1
        except DECODE_ERRORS:
            continue
    return None


def split(fh: BoundedReader) -> Iterator[list]:
    """Yield the trace's events in parsed batches, in order, while the bulk of the file remains; then leave the rest
    unread in `fh` (fh.unread) as a whole JSON document whose traceEvents.item are the events not yet yielded."""
    for batch, _ in _batches(fh, DECODE):
        yield batch


def split_raw(fh: BoundedReader) -> Iterator[bytes]:
    """As split, but each batch unparsed, as the JSON array of its events (for a worker process to parse: its cuts
    are checked to parse and to be UTF-8, as split's parse checks them)."""
    for _, body in _batches(fh, CHECK):
        yield body


def _batches(fh: BoundedReader, decoder: msgspec.json.Decoder) -> Iterator[tuple[list, bytes]]:
    """(what `decoder` made of a batch, the batch as a JSON array) for each batch, as split says."""
    head = b""
    while (start := _array_start(head)) is None:
        data = fh.read()
        if not data or len(head) > BATCH_BYTES:
            fh.unread(head + data)  # traceEvents comes late, or is no array: streamed from the file's start
            return
        head += data
    pending, size = [head[start:]], len(head) - start
    while size >= BATCH_BYTES or (data := fh.read()):
        if size < BATCH_BYTES:
            pending.append(data)
            size += len(data)
            continue
        buf = b"".join(pending)
        cut = _cut(buf, decoder)
        if cut is None or (decoder is CHECK and not _utf8(buf, cut[1])):
            break
        batch, rest = cut
        fh.mark(len(buf) - rest)
        yield batch, (b"[" + buf[:rest].rstrip().removesuffix(b",") + b"]" if decoder is CHECK else b"")
        pending, size = [buf[rest:]], len(buf) - rest
    fh.unread(EVENTS_START + b"".join(pending))


def _utf8(buf: bytes, end: int) -> bool:
    """Whether buf[:end] is UTF-8, as the full parse requires of every string (CHECK skips their bytes)."""
    try:
        buf[:end].decode()
    except UnicodeDecodeError:
        return False
    return True
