"""Stream a PyTorch profiler (Kineto) Chrome trace, plain or gzipped, into rows for the profile model.

The file is read twice, never whole: once up to its `traceEvents` key for the header (deviceProperties,
distributedInfo, schemaVersion, which most Kineto versions write before the events), then the events, their bulk in
batches of a few MB (formats.kineto.batches) and the rest event by event with ijson's C backend, keeping the last
TAIL_BYTES read: the values some versions write after the events
(baseTimeNanoseconds, and deviceProperties or distributedInfo) are parsed from those bytes, not by a third pass.
Times are converted from Kineto's microseconds (decimal fractions, read exactly as Decimal) to integer
nanoseconds once, here: ns = round(us * 1000), halves to even; an end is round((ts + dur) * 1000),
so it is never rounded twice. Kineto writes at most 3 decimals, so no rounding happens in practice.

Both passes read through BoundedReader, which refuses a file in one sentence, as its bytes arrive and before the parser
builds anything from them, when it nests deeper than any trace, holds one value too large to build, or unpacks like
a gzip bomb (the limits below). An event whose row cannot be made (EVENT_ERRORS) is dropped and counted.
"""

from __future__ import annotations

import collections
import functools
import gc
import gzip
import io
import json
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import ijson

from stallhound.formats.comm_kernels import NCCL_COLLECTIVES
from stallhound.formats.kineto import batches
from stallhound.formats.kineto import nccl as kineto_nccl
from stallhound.formats.kineto.nccl import as_int
from stallhound.model.errors import NotAProfile

GZIP_MAGIC = b"\x1f\x8b"
HEAD_BYTES = 64  # enough to see past leading whitespace to the opening brace
TRACE_EVENTS = "traceEvents"
# Kineto's event categories (current lower-case names and the capitalised ones of 2021-era traces) -> staging kind.
CATEGORIES = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset",
    "cuda_runtime": "api", "cuda_driver": "api", "runtime": "api", "driver": "api",
    "cpu_op": "cpu_op", "operator": "cpu_op", "user_annotation": "user_annotation",
    "python_function": "python_function", "cuda_profiler_range": "profiler_range",
}
PYTHON_FUNCTION = "python_function"  # a Python frame, written with with_stack=True: staged apart, as stacks
# A kernel measured by CUPTI's range profiler (torch.profiler's profiler_metrics), which then records no kernel
# activity: staged apart, by name, so that a trace without kernels can say why (meta.profiler_ranges).
PROFILER_RANGE = "profiler_range"
THREAD_NAME = re.compile(r"^thread \d+ \((.*)\)$")  # Kineto's 'thread <tid> (<OS thread name>)'
# Kineto's collective names (allreduce, _allgather_base, reduce_scatter_tensor_coalesced, ...) are matched, letters
# only, by their longest leading model name: the model's nccl_collective labels, longest first.
COLLECTIVES = sorted(NCCL_COLLECTIVES, key=len, reverse=True)
# Bytes kept from the end of the file for the values after traceEvents: Kineto's own trailing block (device
# properties of 8 GPUs, distributedInfo with its process groups, its log lines) is tens of KB.
TAIL_BYTES = 1 << 20
STRUCTURE = re.compile(rb'["{}\[\],]')  # the bytes that decide JSON nesting, and quotes, which hide them
BACKSLASHES = re.compile(rb"\\*")  # before a quote: an odd count escapes it
EVENTS_KEY = re.compile(rb'\s*"traceEvents"\s*:')
# What a damaged file raises while it is decompressed or parsed.
READ_ERRORS = (ijson.JSONError, gzip.BadGzipFile, EOFError, zlib.error, UnicodeDecodeError, OSError)
# What one bad event raises while its row is made (an event that is no object, args that are a list or a string, a
# time that is no number or out of range): the event is dropped and counted, the rest of the trace still loads.
EVENT_ERRORS = (AttributeError, TypeError, ValueError, ArithmeticError)
# Limits checked on the bytes as they are read, before the parser builds anything from them (issue 30's attacks).
# Kineto nests 8 deep at most (an event's args' Input Dims); ijson's paths grow with the square of the depth (30,000
# levels in 60 KB took 2.3 GB). Counted over brackets, those inside strings too, so far above any real trace.
MAX_DEPTH = 1000
REDUCE_PASSES = 16  # passes that drop adjacent bracket pairs from a chunk: a real trace's need fewer than 10
# A real event is a few KB and the values around traceEvents (8 GPUs' properties, a large job's process groups)
# under a MB; more bytes than this read with no event finished is one value too large to build in memory.
MAX_VALUE_BYTES = 8 << 20
# The header before traceEvents is read token by token in Python (ijson.parse, about a microsecond a token), so it is
# held to less: 8 GPUs' properties are 3 KB, a large job's process groups some hundred KB.
MAX_HEADER_BYTES = 4 << 20
# Kineto's JSON gzips 8 to 15 times smaller; past this many times its packed size, an archive is a bomb. Small
# archives may unpack to GZIP_FLOOR_BYTES whatever their ratio.
MAX_GZIP_RATIO = 100
GZIP_FLOOR_BYTES = 16 << 20
READ_BYTES = 64 << 10  # what ijson asks for at a time; a read of everything is never made
INT64 = 1 << 63  # times past it do not fit the model's BIGINT nanoseconds
BRACKETS = bytes(range(256)).translate(None, b"{}[]")  # every byte but a bracket, to delete


PASS_A_TRACE = "pass a trace written by torch.profiler (export_chrome_trace or tensorboard_trace_handler)"


def _refusal(path: Path, what: str, advice: str = PASS_A_TRACE) -> NotAProfile:
    return NotAProfile(f"{path} is refused: {what}, which no torch.profiler trace does; {advice}")


class BoundedReader:
    """A binary reader that refuses, as the bytes arrive, what would exhaust the parser (MAX_DEPTH, MAX_VALUE_BYTES,
    MAX_GZIP_RATIO), and keeps the last TAIL_BYTES it read (and a chunk more at most)."""

    def __init__(self, fh: io.BufferedIOBase, path: Path, packed_bytes: int | None, value_bytes: int):
        self.fh, self.path, self.value_bytes = fh, path, value_bytes
        self.unpacked_limit = None if packed_bytes is None else max(MAX_GZIP_RATIO * packed_bytes, GZIP_FLOOR_BYTES)
        self.total = self.marked = self.depth = self.kept = self.unread_at = 0
        self.chunks: collections.deque[bytes] = collections.deque()
        self.unread_bytes = b""

    def read(self, size: int = -1) -> bytes:
        size = READ_BYTES if size < 0 else min(size, READ_BYTES)  # ijson asks for 0 bytes first
        if self.unread_at < len(self.unread_bytes):
            self.unread_at += size
            return self.unread_bytes[self.unread_at - size:self.unread_at]
        data = self.fh.read(size)
        self.total += len(data)
        if self.unpacked_limit is not None and self.total > self.unpacked_limit:
            raise _refusal(self.path, f"it unpacks to over {MAX_GZIP_RATIO} times its packed size (a gzip bomb)",
                           "if it is a real trace, unpack it and pass the .json")
        if self.total - self.marked > self.value_bytes:
            raise _refusal(self.path, f"it holds a JSON value over {self.value_bytes >> 20} MB")
        self._nest(data)
        self.chunks.append(data)
        self.kept += len(data)
        while self.kept - len(self.chunks[0]) >= TAIL_BYTES:
            self.kept -= len(self.chunks.popleft())
        return data

    def unread(self, data: bytes) -> None:
        """Serve `data` (bytes already read and checked, or a few of the reader's own) before the rest of the file."""
        self.unread_bytes, self.unread_at = data, 0

    def mark(self, ahead: int = 0) -> None:
        """A value was finished `ahead` bytes before the last byte handed out: MAX_VALUE_BYTES counts from there."""
        self.marked = self.total - ahead - max(len(self.unread_bytes) - self.unread_at, 0)

    def _nest(self, data: bytes) -> None:
        """Follow the depth over the chunk's brackets: pairs that close at once are dropped first (a real trace's
        chunk reduces in a few passes to a few unclosed brackets), the rest are counted one by one."""
        brackets = data.translate(None, BRACKETS)
        for _ in range(REDUCE_PASSES):
            reduced = brackets.replace(b"[]", b"").replace(b"{}", b"")
            if len(reduced) == len(brackets):
                break
            brackets = reduced
        for byte in brackets:
            self.depth = max(self.depth + (1 if byte in b"{[" else -1), 0)
            if self.depth > MAX_DEPTH:
                raise _refusal(self.path, f"its JSON nests deeper than {MAX_DEPTH} levels")

    def after_events(self) -> bytes:
        """The last bytes read, from shortly before the end of the last value marked (the last event): ijson reads
        a chunk ahead at most, so the traceEvents array closes in them, and scanning them for the values after it
        costs a few chunks, not TAIL_BYTES."""
        ahead = self.total - self.marked + 2 * READ_BYTES if self.marked else TAIL_BYTES
        return b"".join(self.chunks)[-min(ahead, TAIL_BYTES):]


@contextmanager
def _open(path: Path, value_bytes: int = MAX_VALUE_BYTES) -> Iterator[BoundedReader]:
    """The file's bytes, unpacked when gzipped, read through BoundedReader: no more than `value_bytes` with no value
    finished (BoundedReader.mark)."""
    with path.open("rb") as raw:
        gzipped = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        raw.seek(0)
        if not gzipped:
            yield BoundedReader(raw, path, None, value_bytes)
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            yield BoundedReader(unzipped, path, path.stat().st_size, value_bytes)


def is_trace(path: Path) -> bool:
    """Whether the file's content (decompressed when gzipped) starts like a JSON object: a candidate Kineto trace.
    Whether it holds traceEvents is decided when it is read."""
    try:
        with _open(path) as fh:
            head = fh.read(HEAD_BYTES)
    except READ_ERRORS:
        return False
    return head.lstrip()[:1] == b"{"


def broken(path: Path, exc: Exception) -> NotAProfile:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return NotAProfile(f"{path} is not a complete torch.profiler (Kineto) trace ({detail}); check that the file was "
                       "fully written (export_chrome_trace or tensorboard_trace_handler) and load it again")


def header(path: Path) -> dict:
    """The top-level values Kineto writes before traceEvents; NotAProfile when there is no traceEvents array."""
    values: dict = {}
    key, builder = None, None
    try:
        with _open(path, MAX_HEADER_BYTES) as fh:
            for prefix, event, value in ijson.parse(fh):
                if prefix == "" and event == "map_key":
                    if builder is not None:
                        values[key] = builder.value
                    if value == TRACE_EVENTS:
                        return values
                    key, builder = value, ijson.ObjectBuilder()
                elif prefix != "" and builder is not None:
                    builder.event(event, value)
                elif prefix == "" and event != "start_map":
                    break
    except READ_ERRORS as exc:
        raise broken(path, exc) from exc
    raise NotAProfile(f"{path} is JSON but has no top-level traceEvents array, so it is not a torch.profiler (Kineto) "
                      "trace; pass a trace written by torch.profiler (export_chrome_trace) or an nsys .sqlite export")


def ns(us) -> int:
    """Kineto microseconds (int or exact Decimal) as integer nanoseconds, halves to even; ValueError past INT64."""
    value = round(us * 1000)
    if not -INT64 <= value < INT64:
        raise ValueError(f"a time of {us} us is out of range")
    return value


def _dims(args: dict, key: str) -> tuple:
    dims = args.get(key)
    return tuple(as_int(d) for d in dims[:3]) if isinstance(dims, list) and len(dims) >= 3 else (None, None, None)


def thread_name(name: str) -> str:
    match = THREAD_NAME.match(name)
    return match.group(1) if match else name


@functools.cache
def collective(name: str) -> str | None:
    """A Kineto collective name as the model's nccl_collective label (AllReduce, ...), None when none matches."""
    letters = re.sub("[^a-z]", "", name.lower())
    return next((c for c in COLLECTIVES if letters and letters.startswith(c.lower())), None)


def gpu_row(kind: str, ev: dict, args: dict) -> tuple:
    """(kind, device, context, stream, correlation, start, end, name, grid xyz, block xyz, registers, bytes,
    Kineto's collective name, External id, kineto_nccl.fields)."""
    start, name = ev["ts"], str(ev.get("name"))
    coll = collective(str(args.get("Collective name") or ""))
    return (kind, as_int(args.get("device")), as_int(args.get("context")), as_int(args.get("stream")),
            as_int(args.get("correlation")), ns(start), ns(start + ev.get("dur", 0)), ev.get("name"),
            *_dims(args, "grid"), *_dims(args, "block"), as_int(args.get("registers per thread")),
            as_int(args.get("bytes")), coll, as_int(args.get("External id")), *kineto_nccl.fields(name, args, coll))


def comms_row(ev: dict, args: dict) -> tuple:
    """(op name, External id, pid, tid, start, end, Kineto's collective name, kineto_nccl.fields) of a comms op
    (kineto_nccl.COMM_OPS); its collective from 'Collective name', else from an nccl:<collective> range's name."""
    start, name = ev["ts"], str(ev.get("name"))
    coll = collective(str(args.get("Collective name") or name.removeprefix("nccl:")))
    return (name, as_int(args.get("External id")), as_int(ev.get("pid")), as_int(ev.get("tid")), ns(start),
            ns(start + ev.get("dur", 0)), coll, *kineto_nccl.fields(name, args, coll))


def python_row(ev: dict, args: dict) -> tuple:
    """(pid, tid, Python id, Python parent id, name, start, end) of a python_function event (with_stack=True)."""
    start = ev["ts"]
    return (as_int(ev.get("pid")), as_int(ev.get("tid")), as_int(args.get("Python id")),
            as_int(args.get("Python parent id")), ev.get("name"), ns(start), ns(start + ev.get("dur", 0)))


def host_row(kind: str, ev: dict, args: dict) -> tuple:
    """(kind, pid, tid, correlation, name, start, end) of a CPU-side event."""
    start = ev["ts"]
    return (kind, as_int(ev.get("pid")), as_int(ev.get("tid")), as_int(args.get("correlation")), ev.get("name"),
            ns(start), ns(start + ev.get("dur", 0)))


def trailing(tail: bytes) -> dict:
    """The top-level values after traceEvents in `tail`, the last bytes of a well-formed trace. Scanned backwards
    from the closing brace: each comma at depth 1 outside strings starts a key; the values after the key
    traceEvents are parsed as one object. Values that start before the tail (BoundedReader.after_events) are left
    out."""
    end = tail.rfind(b"}")
    reverse = tail[:end][::-1]
    depth, quoted, start = 1, False, None
    for match in STRUCTURE.finditer(reverse):
        char, at = match.group(), end - 1 - match.start()
        if char == b'"':
            escapes = BACKSLASHES.match(reverse, match.end())
            assert escapes is not None  # `\\*` matches anywhere, if only the empty string
            quoted ^= len(escapes.group()) % 2 == 0
        elif quoted:
            continue
        elif char in b"}]":
            depth += 1
        elif char in b"{[":
            depth -= 1
            if depth == 0:
                break
        elif depth == 1:
            if EVENTS_KEY.match(tail, at + 1):
                break
            start = at
    return {} if start is None else json.loads(b"{" + tail[start + 1:end + 1])


def _feed(ev: dict, sinks: dict[str, Callable[[tuple], None]]) -> None:
    """Hand the event's rows to `sinks` (see events); an unreadable event raises one of EVENT_ERRORS before any of
    its rows is handed."""
    ph, args = ev.get("ph"), ev.get("args") or {}
    if ph == "X" and "ts" in ev:
        kind = CATEGORIES.get(str(ev.get("cat", "")).lower())
        if kind == PYTHON_FUNCTION:
            sinks["python"](python_row(ev, args))
        elif kind == PROFILER_RANGE:
            sinks["range"]((str(ev.get("name")),))
        elif kind in ("kernel", "memcpy", "memset"):
            sinks["gpu"](gpu_row(kind, ev, args))
        elif kind is not None:
            host = host_row(kind, ev, args)
            if str(ev.get("name")).startswith(kineto_nccl.COMM_OPS):
                sinks["comms"](comms_row(ev, args))
            sinks["host"](host)
    elif ph == "M" and ev.get("name") in ("process_name", "thread_name") and "name" in args:
        sinks["name"]((ev["name"], as_int(ev.get("pid")), as_int(ev.get("tid")), str(args["name"])))


def feed_all(evs: Iterable, sinks: dict[str, Callable[[tuple], None]]) -> int:
    """Feed each event (_feed); return how many were read, the others being dropped as unreadable (EVENT_ERRORS)."""
    fed = 0
    for ev in evs:
        try:
            _feed(ev, sinks)
            fed += 1
        except EVENT_ERRORS:
            pass
    return fed


def events(path: Path, sinks: dict[str, Callable[[tuple], None]],
           parse_batches: Callable[[Iterator[bytes]], tuple[int, int]] | None = None) -> tuple[dict, int, int]:
    """Feed every complete ('X') event of a known category (sinks 'gpu', 'host', 'python', 'range'), every comms op
    (kineto_nccl.COMM_OPS, 'comms') and every process/thread name ('name': kind, pid, tid, name) to `sinks`;
    return the top-level values written after traceEvents, the events read and the events dropped as unreadable
    (EVENT_ERRORS). A trace none of whose events is readable is refused. With `parse_batches` (kineto.workers), the
    bulk's batches are handed to it unparsed, to be parsed elsewhere and their rows handed on in order before the
    rest of the events are fed; it returns their events read and dropped."""
    read = dropped = 0
    collecting = gc.isenabled()
    gc.disable()  # the events are millions of acyclic objects: the collector's passes over them free nothing
    try:
        with _open(path) as fh:
            if parse_batches is not None:
                read, dropped = parse_batches(batches.split_raw(fh))
            for batch in batches.split(fh) if parse_batches is None else ():
                fed = feed_all(batch, sinks)
                read, dropped = read + fed, dropped + len(batch) - fed
            for ev in ijson.items(fh, f"{TRACE_EVENTS}.item"):  # what split left: the last events, or all
                fh.mark()
                fed = feed_all((ev,), sinks)
                read, dropped = read + fed, dropped + 1 - fed
            after = trailing(fh.after_events())
    except (*READ_ERRORS, json.JSONDecodeError, RecursionError) as exc:
        raise broken(path, exc) from exc
    finally:
        if collecting:
            gc.enable()
    if dropped and not read:
        raise NotAProfile(f"{path} is refused: none of its {dropped:,} trace events can be read (each is not an "
                          "object, or its args or times are not what torch.profiler writes); pass a trace written "
                          "by torch.profiler")
    return after, read, dropped
