"""How the server's and the CLI's help texts name the files stallhound reads, built from formats.registry (each
format's writer and suffixes), so a new format is named here without an edit."""

from __future__ import annotations

from collections.abc import Iterable

from stallhound.formats.registry import FORMATS


def either(items: Iterable[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    *head, last = items
    return f"{', '.join(head)} or {last}" if head else last


def writers() -> str:
    """What writes the files stallhound reads: 'nsys or torch.profiler'."""
    return either(f.writer for f in FORMATS)


def profile_files() -> str:
    """Each format's writer and file suffixes: 'nsys .sqlite/.nsys-rep/.qdrep or torch.profiler .json/.json.gz'."""
    return either(f"{f.writer} {'/'.join(f.suffixes)}" for f in FORMATS)
