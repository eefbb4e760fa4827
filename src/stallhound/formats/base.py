"""What an input format is to the rest of stallhound: how to know its files, build a model from one, and word
what its captures record (the registry lists every format; stallhound.formats.remedy words remedies with them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stallhound.model.cache import Progress


def as_is(path: Path, cache_dir: Path) -> Path:
    """A file the format builds from directly: nothing to prepare."""
    return path


def by_name(path: Path) -> bool:
    """A file named as the format's files are is one: no other program writes files of that name."""
    return True


@dataclass(frozen=True)
class Format:
    """One input format; its folder's __init__.py exposes it as FORMAT, and registry.FORMATS lists it.

    It is the model cache's Recipe (writer, read_errors, build, damaged), so the cache builds any format alike.
    """

    name: str
    writer: str  # what writes its files, in messages: "nsys", "torch.profiler"
    detect: Callable[[Path], bool]  # whether a readable, non-empty file is one of this format's
    build: Callable[[Path, Path, str, Progress | None, threading.Event | None], None]  # (source, out model, key, ...)
    damaged: Callable[[Path, Exception], Exception | None]  # the error a build failure means when part is unreadable
    read_errors: tuple[type[Exception], ...]  # what reading its files raises besides duckdb.Error
    # need (capabilities.data, or derive.KERNELS_IN_GRAPHS) -> the capture option that records it; a need the
    # format cannot record is absent, and a remedy for it names a format that can.
    options: Mapping[str, str]
    say: Callable[[list[str], bool], str]  # (options, bare) -> the capture to make: a command, or (bare) its options
    written_by: Callable[[str | None, str], str]  # (the writer's version, the schema version) -> who wrote a profile
    expects: tuple[str, str]  # (what its files are, how to get one): the error for a file no format detects
    platform: str | None = None  # the meta.platform its models carry; None: the file's own (one format only)
    converts: tuple[str, ...] = ()  # suffixes of the files `prepare` converts before a build
    # Picking a run's profiles out of a folder: the suffixes its files are named with, and whether a file so named
    # is one of them (by_name when no other program writes such names; a content check when others do, as .json).
    suffixes: tuple[str, ...] = ()
    picks: Callable[[Path], bool] = by_name
    prepare: Callable[[Path, Path], Path] = as_is  # (file, cache folder) -> the file to build from
