"""Every input format stallhound reads, in the order files are tried: a new format is its folder (whose
__init__.py exposes FORMAT) plus one line here."""

from __future__ import annotations

from pathlib import Path

import duckdb

from stallhound.formats import kineto, nsys
from stallhound.formats.base import Format
from stallhound.model.errors import NotAProfile

FORMATS: tuple[Format, ...] = (
    nsys.FORMAT,
    kineto.FORMAT,
)


def detect(path: Path) -> Format:
    """The first format that knows the file (a readable, non-empty regular file); NotAProfile naming what each
    format expects when none does."""
    for fmt in FORMATS:
        if fmt.detect(path):
            return fmt
    raise NotAProfile(f"{path} is not " + " nor ".join(f.expects[0] for f in FORMATS) + "; "
                      + ", or ".join(f.expects[1] for f in FORMATS))


def profile_suffixes() -> tuple[str, ...]:
    """Suffixes of every format's files, in the registry's order."""
    return tuple(s for f in FORMATS for s in f.suffixes)


def picks(path: Path) -> bool:
    """Whether a file found in a folder or by a glob is a profile: named as some format's files are, and that format
    takes it (a content check where other programs write files of the same name)."""
    name = path.name.lower()
    return any(name.endswith(f.suffixes) and f.picks(path) for f in FORMATS)


def converted_suffixes() -> tuple[str, ...]:
    """Suffixes of the files some format converts before building, so their models are keyed by the conversion."""
    return tuple(s for f in FORMATS for s in f.converts)


def by_platform(platform: str | None) -> Format:
    """The format whose models carry this meta.platform; the one whose models carry their file's own platform
    (platform None) otherwise."""
    return next((f for f in FORMATS if f.platform is not None and f.platform == platform),
                next(f for f in FORMATS if f.platform is None))


def format_of(con: duckdb.DuckDBPyConnection) -> Format:
    """The format that built the model in `con`, read from its meta row."""
    row = con.execute("SELECT platform FROM meta").fetchone()
    return by_platform(row[0] if row else None)
