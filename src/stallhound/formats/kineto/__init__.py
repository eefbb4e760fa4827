"""PyTorch profiler (Kineto) Chrome traces, plain or gzipped, as the kineto Format."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb

from stallhound.formats.base import Format
from stallhound.formats.kineto.meta import OPTIONS, PLATFORM
from stallhound.model.cache import Progress
from stallhound.model.errors import NotAProfile

# What DuckDB raises when a trace's values cannot be mapped into the model (text where a number belongs); the
# reader itself turns a truncated or invalid file into NotAProfile.
DAMAGE_ERRORS = (duckdb.InvalidInputException, duckdb.TypeMismatchException, duckdb.ConversionException)


# The reader (with ijson) and the build are imported when a trace is read: opening a cached model needs neither.

def _damaged(path: Path, exc: Exception) -> Exception | None:
    from stallhound.formats.kineto.read import broken

    return broken(path, exc) if isinstance(exc, DAMAGE_ERRORS) else None


def _build(source: Path, out: Path, key: str, progress: Progress | None, cancelled: threading.Event | None) -> None:
    from stallhound.formats.kineto import build as trace_build

    trace_build.build(source, out, key, progress, cancelled)


def is_trace(path: Path) -> bool:
    from stallhound.formats.kineto.read import is_trace as read_is_trace

    return read_is_trace(path)


def has_trace_events(path: Path) -> bool:
    """A JSON file among others (a folder of runs often holds JSON that is no trace, such as `stallhound synth`'s
    truth files) is a trace when it holds traceEvents."""
    from stallhound.formats.kineto.read import header

    try:
        header(path)
    except NotAProfile:
        return False
    return True


def say(options: list[str], bare: bool) -> str:
    """What records the data: one profiler setting, or several joined; there are no options to list bare."""
    return " and ".join(dict.fromkeys(options))


def written_by(version: str | None, schema: str) -> str:
    return f"{PLATFORM} trace, schema {schema},"


# Typed here: meta.py reads the registry, which imports this module, so mypy meets FORMAT inside that cycle.
FORMAT: Format = Format(
    name="kineto", writer="torch.profiler", detect=is_trace, build=_build, damaged=_damaged, read_errors=(),
    options=OPTIONS, say=say, written_by=written_by,
    expects=("a JSON object", "pass a torch.profiler trace (.json or .json.gz)"), platform=PLATFORM,
    suffixes=(".json", ".json.gz"), picks=has_trace_events)
