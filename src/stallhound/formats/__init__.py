"""Profiles: open an Nsight Systems export, or a PyTorch profiler (Kineto) trace, as a cached DuckDB profile model."""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from stallhound.formats import source
from stallhound.formats.kineto import build as kineto
from stallhound.formats.kineto import read as kineto_read
from stallhound.formats.nsys.build import Progress
from stallhound.model import cache
from stallhound.model.duck import close_model, open_model
from stallhound.model.errors import CacheUnwritable
from stallhound.model.limits import model_memory_mb

log = logging.getLogger("stallhound")


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
    """Open an export (.sqlite, or .nsys-rep/.qdrep when nsys is installed) or a torch.profiler trace (.json or
    .json.gz, known by its content) as a read-only model; setting `cancelled` stops a build under way."""
    target = source.check_file(Path(path))
    model_memory_mb()  # a wrong setting is said now, not after minutes of building
    directory = cache_dir or cache.cache_dir()
    sqlite_path, build_fn = target, cache.build_export
    if target.suffix.lower() in source.REPORT_SUFFIXES:
        sqlite_path = source.convert_report(target, directory)
    elif kineto_read.is_trace(target):
        build_fn = kineto.build
    key = source.fingerprint(sqlite_path)
    if use_cache:
        try:
            model, con = cache.open_cached(sqlite_path, key, directory, progress, cancelled, build_fn)
            return Profile(path=target, fingerprint=key, model_path=model, con=con)
        except CacheUnwritable as exc:
            log.warning("stallhound: %s; building in a temporary folder instead, for this load only", exc)
    scratch, model = cache.build_scratch(sqlite_path, key, progress, cancelled, build_fn)
    return Profile(path=target, fingerprint=key, model_path=model, con=open_model(model), _scratch=scratch)
