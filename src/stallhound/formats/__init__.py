"""Formats: open a file of any registered format (an Nsight Systems export, a PyTorch profiler trace...) as a
cached DuckDB profile model; the format, found by registry.detect, builds it."""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from stallhound.formats import registry, source
from stallhound.model import cache
from stallhound.model.cache import Progress
from stallhound.model.duck import close_model, open_model
from stallhound.model.errors import CacheUnwritable
from stallhound.model.limits import model_memory_mb

log = logging.getLogger("stallhound")
__all__ = ["Profile", "Progress", "open_profile"]


@dataclass
class Profile:
    path: Path  # what the user pointed at
    fingerprint: str
    model_path: Path
    con: duckdb.DuckDBPyConnection = field(repr=False)
    _scratch: Path | None = field(default=None, repr=False)  # --no-cache build directory

    def close(self) -> None:
        close_model(self.model_path, self.con)
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)


def open_profile(path: str | Path, *, cache_dir: Path | None = None, use_cache: bool = True,
                 progress: Progress | None = None,
                 cancelled: threading.Event | None = None) -> Profile:
    """Open a profile of any registered format (an nsys .sqlite, or .nsys-rep/.qdrep when nsys is installed; a
    torch.profiler trace, .json or .json.gz, known by its content) as a read-only model; setting `cancelled` stops
    a build under way."""
    target = source.check_file(Path(path))
    fmt = registry.detect(target)
    model_memory_mb()  # a wrong setting is said now, not after minutes of building
    directory = cache_dir or cache.cache_dir()
    built_from = fmt.prepare(target, directory)
    key = cache.fingerprint(built_from)
    if use_cache:
        try:
            model, con = cache.open_cached(built_from, key, directory, fmt, progress, cancelled)
            return Profile(path=target, fingerprint=key, model_path=model, con=con)
        except CacheUnwritable as exc:
            log.warning("stallhound: %s; building in a temporary folder instead, for this load only", exc)
    scratch, model = cache.build_scratch(built_from, key, fmt, progress, cancelled)
    return Profile(path=target, fingerprint=key, model_path=model, con=open_model(model), _scratch=scratch)
