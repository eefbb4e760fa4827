"""Where stallhound keeps what it builds: the cache folder, found without importing DuckDB (the answer memo looks
there before anything that reads a profile is imported)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "STALLHOUND_CACHE_DIR"


def cache_dir() -> Path:
    """$STALLHOUND_CACHE_DIR, else $XDG_CACHE_HOME/stallhound, else ~/.cache/stallhound."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stallhound"
