"""Profiles loaded in this server: short ids, allowed roots, load on first use."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nsightful.profiles import Profile, open_profile
from nsightful.profiles.errors import InvalidRequest, ProfileNotFound
from nsightful.profiles.ingest import Builder, Progress

ID_CHARS = re.compile(r"[^a-z0-9_-]+")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # file://, http://, s3:// (a Path keeps one slash)
MAX_ID_CHARS = 32


class OutsideRoots(InvalidRequest):
    pass


class UnknownProfile(InvalidRequest):
    pass


@dataclass
class ProfileStore:
    roots: list[Path]
    cache_dir: Path | None = None
    use_cache: bool = True
    profiles: dict[str, Profile] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check_allowed(self, path: Path) -> Path:
        """The absolute, symlink-free path of `path` (relative ones are taken from the first root) when it lies
        inside one of the roots; a one-sentence error for URLs, NUL bytes, unresolvable paths and the rest."""
        given, listed = str(path), ", ".join(str(r) for r in self.roots)
        if URL_SCHEME.match(given):
            raise OutsideRoots(f"{given} is a URL; nsightful reads local files only: pass the path of the file "
                               f"inside the allowed roots ({listed})")
        if "\0" in given:
            raise InvalidRequest(f"the path {given!r} contains a NUL byte; pass a plain file path")
        full = path.expanduser()
        try:
            full = (full if full.is_absolute() else self.roots[0] / full).resolve()
            full.exists()  # raises for a name too long, which resolve() lets through
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
            raise ProfileNotFound(f"{given} cannot be resolved ({getattr(exc, 'strerror', None) or exc}); "
                                  "pass the path of an existing file") from exc
        if not any(full.is_relative_to(root) for root in self.roots):
            resolved = "" if str(full) == given else f" (it resolves to {full})"
            raise OutsideRoots(f"{given}{resolved} is outside the allowed roots ({listed}); move the "
                               "profile there or start the server with --root pointing at its folder")
        return full

    def _new_id(self, path: Path) -> str:
        base = ID_CHARS.sub("-", path.stem.lower()).strip("-")[:MAX_ID_CHARS] or "profile"
        candidate, n = base, 1
        while candidate in self.profiles:
            n += 1
            candidate = f"{base}-{n}"
        return candidate

    def find(self, ref: str) -> tuple[str, Profile] | None:
        """The loaded profile named by id or by path, if any."""
        with self.lock:
            if ref in self.profiles:
                return ref, self.profiles[ref]
            try:
                full = self.check_allowed(Path(ref))
            except (OSError, ValueError):
                return None
            for pid, profile in self.profiles.items():
                if profile.path == full:
                    return pid, profile
        return None

    def load(self, ref: str, progress: Progress | None = None,
             on_builder: Callable[[Builder], None] | None = None) -> tuple[str, Profile]:
        """Id and profile for `ref` (an id or a path), loading it if needed."""
        found = self.find(ref)
        if found:
            return found
        if "/" not in ref and "\\" not in ref and not Path(ref).suffix:
            loaded = ", ".join(self.profiles) or "none yet"
            raise UnknownProfile(f"no profile is loaded with id '{ref}' (loaded: {loaded}); "
                                 "call load_profile with the file's path")
        full = self.check_allowed(Path(ref))
        if not full.exists():
            raise ProfileNotFound(f"{full} does not exist; pass the path of an nsys .sqlite or .nsys-rep file")
        profile = open_profile(full, cache_dir=self.cache_dir, use_cache=self.use_cache, progress=progress,
                               on_builder=on_builder)
        with self.lock:
            for pid, existing in self.profiles.items():
                if existing.path == profile.path:
                    profile.close()
                    return pid, existing
            pid = self._new_id(full)
            self.profiles[pid] = profile
        return pid, profile

    def close(self, ref: str) -> str:
        found = self.find(ref)
        if not found:
            loaded = ", ".join(self.profiles) or "none"
            raise UnknownProfile(f"no profile '{ref}' is loaded (loaded: {loaded})")
        pid, profile = found
        with self.lock:
            del self.profiles[pid]
        profile.close()
        return pid

    def close_all(self) -> None:
        with self.lock:
            for profile in self.profiles.values():
                profile.close()
            self.profiles.clear()
