"""Issue 33: the bulk of a Kineto trace is parsed in batches (formats.kineto.batches). Every row it hands on equals the
row ijson's event-by-event stream gives (the reader's own fallback, checked on real traces cut into many batches); cuts
that fall inside a string or a nested list of objects are moved; epoch-scale times keep every nanosecond; damage past
the first batches is still reported as a broken trace, and bad events are still dropped and counted."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from stallhound.formats.kineto import batches
from stallhound.formats.kineto import read as kineto_read
from stallhound.model.errors import NotAProfile

KINETO = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kineto"
SINKS = ("gpu", "host", "comms", "python", "name")
SMALL_BATCH_BYTES = 4096  # a few dozen events a batch: the fixtures are cut hundreds of times
EPOCH_US = Decimal("1700000000123456.789")  # a 2023 time in microseconds, with nanoseconds a double cannot hold


def _rows(path: Path, monkeypatch, batch_bytes: int | None) -> tuple[dict, tuple]:
    """The rows every sink got and what events() returned, in batches of `batch_bytes` or (None) by ijson alone."""
    if batch_bytes is None:
        monkeypatch.setattr(batches, "split", lambda fh: iter(()))
    else:
        monkeypatch.setattr(batches, "BATCH_BYTES", batch_bytes)
    got: dict[str, list] = {sink: [] for sink in SINKS}
    result = kineto_read.events(path, {sink: rows.append for sink, rows in got.items()})
    monkeypatch.undo()
    return got, result


def _batched(path: Path, monkeypatch) -> tuple[dict, tuple]:
    """As _rows in small batches, checking that the batch path parsed most events (it is not the fallback at work)."""
    parsed = []
    split = batches.split

    def counted(fh):
        for batch in split(fh):
            parsed.append(len(batch))
            yield batch
    monkeypatch.setattr(batches, "split", counted)
    got = _rows(path, monkeypatch, SMALL_BATCH_BYTES)
    read, dropped = got[1][1:]
    assert sum(parsed) > (read + dropped) // 2, (sum(parsed), read + dropped)
    return got


def _kernel(i: int, name: str = "gemm", **args) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": EPOCH_US + i, "dur": Decimal("1.5"),
            "args": {"device": 0, "stream": 7, "correlation": i, **args}}


def _write(path: Path, events: list, tail: str = "", between: str = ",\n") -> Path:
    # Decimal times written as JSON numbers, with every digit
    body = between.join(json.dumps(e, default=str).replace('"1700', "1700").replace('.789"', ".789")
                      .replace('"dur": "1.5"', '"dur": 1.5') for e in events)
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + body + "\n]" + tail + "}")
    return path


@pytest.mark.parametrize("path", sorted(KINETO.glob("*.json.gz")), ids=lambda p: p.name)
def test_batches_give_the_rows_the_event_stream_gives(path, monkeypatch):
    streamed = _rows(path, monkeypatch, None)
    assert streamed[1][1] > 1000  # events read: the fixture is cut many times
    assert _batched(path, monkeypatch) == streamed


@pytest.mark.parametrize("between", [",\n", ", "], ids=["a line each", "one line"])
def test_cuts_inside_strings_and_nested_objects_are_moved(tmp_path, monkeypatch, between):
    """A name holding the boundary bytes, and args with a list of objects (on lines of their own when events are):
    the cut pattern matches inside both; the rows are those ijson reads."""
    events = [_kernel(i, name="k<{a}, {b}>", shapes=[{"x": i}, {"y": i}]) for i in range(400)]
    path = _write(tmp_path / "tricky.json", events, between=between)
    if between == ",\n":
        path.write_text(path.read_text().replace('}, {"y"', '},\n{"y"'))
    batched = _batched(path, monkeypatch)
    assert batched == _rows(path, monkeypatch, None)
    assert len(batched[0]["gpu"]) == 400


def test_epoch_times_keep_their_nanoseconds(tmp_path, monkeypatch):
    path = _write(tmp_path / "epoch.json", [_kernel(i) for i in range(300)], ', "displayTimeUnit": "ms"')
    assert b'"ts": 1700000000123456.789' in path.read_bytes()
    got, (after, read, dropped) = _batched(path, monkeypatch)
    starts_ends = [(row[5], row[6]) for row in got["gpu"]]
    assert starts_ends == [(1_700_000_000_123_456_789 + i * 1000, 1_700_000_000_123_458_289 + i * 1000)
                           for i in range(300)]
    assert (after, read, dropped) == ({"displayTimeUnit": "ms"}, 300, 0)


def test_bad_events_in_batches_are_dropped_and_counted(tmp_path, monkeypatch):
    bad = [5, "x", None, {"ph": "X", "cat": "kernel", "ts": "soon"}, {"ph": "X", "cat": "cpu_op", "args": [1]}]
    events = [e for i in range(200) for e in (_kernel(i), bad[i % len(bad)])]
    path = _write(tmp_path / "bad.json", events)
    got, (_, read, dropped) = _batched(path, monkeypatch)
    # the ts-less cpu_op is read (it makes no row), the other four of each five are dropped
    assert (len(got["gpu"]), read, dropped) == (200, 240, 160)


def test_damage_after_the_first_batches_is_a_broken_trace(tmp_path, monkeypatch):
    path = _write(tmp_path / "damaged.json", [_kernel(i) for i in range(300)])
    content = path.read_bytes()
    at = content.index(b'"correlation": 250')
    path.write_bytes(content[:at] + b"\xff" + content[at + 1:])
    monkeypatch.setattr(batches, "BATCH_BYTES", SMALL_BATCH_BYTES)
    with pytest.raises(NotAProfile, match="not a complete torch.profiler"):
        kineto_read.events(path, {sink: lambda row: None for sink in SINKS})
    path.write_bytes(content[:len(content) // 2])  # truncated
    with pytest.raises(NotAProfile, match="not a complete torch.profiler"):
        kineto_read.events(path, {sink: lambda row: None for sink in SINKS})


@pytest.mark.parametrize("buf", [b'{"a": 1},\n{"l": [{"b": 1},\n{"c": 2}', b'{"a": 1}, {"n": "x}, {y'],
                         ids=["nested objects", "in a string"])
def test_a_cut_that_does_not_parse_moves_to_the_one_before(buf):
    events, rest = batches._cut(buf)
    assert events == [{"a": 1}] and buf[rest:].startswith(b'{"')
    assert rest == buf.index(b"{", 1)
