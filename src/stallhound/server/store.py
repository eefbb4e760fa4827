"""Profiles open in this server: ids per MCP session over one shared, memory-bounded LRU of open models."""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from stallhound.formats import Profile, open_profile
from stallhound.model.cache import Progress
from stallhound.model.errors import InvalidRequest, OutsideRoots, ProfileNotFound, UnknownProfile, echo
from stallhound.server.builds import Build, Builds, Ticket
from stallhound.server.sessions import Session

log = logging.getLogger("stallhound")

MB = 1 << 20
# Open models are charged their file size: DuckDB caches at most the model's pages, while a query's own
# intermediates come and go with the call. Past this budget the least recently used idle model is closed
# and reopens from the cache on its next use.
DEFAULT_MEMORY_BUDGET_MB = 4096
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # file://, http://, s3:// (a Path keeps one slash)


@dataclass
class _Model:
    profile: Profile
    cost_bytes: int
    leases: int = 0  # tool calls running on it now: never closed under them

    def close(self) -> None:
        self.profile.close()


@dataclass
class Lease:
    """A session's id for a profile, and the open profile, held until `ProfileStore.release`."""

    id: str
    profile: Profile
    key: Path


@dataclass
class ProfileStore:
    roots: list[Path]
    cache_dir: Path | None = None
    use_cache: bool = True
    memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB
    sessions: list[Session] = field(default_factory=list)
    models: OrderedDict[Path, _Model] = field(default_factory=OrderedDict)  # least recently used first
    lock: threading.Lock = field(default_factory=threading.Lock)
    # requests outside any session (the 2026-07-28 protocol over HTTP has none) share these ids
    sessionless: Session = field(default_factory=lambda: Session("sessionless"))
    ended: list[Callable[[Session], None]] = field(default_factory=list)  # told when a session ends (its jobs)
    builds: Builds = field(init=False)  # the loads under way, profiles' and jobs'

    def __post_init__(self) -> None:
        self.sessions.append(self.sessionless)
        self.builds = Builds(self.lock)

    def check_allowed(self, path: Path) -> Path:
        """The absolute, symlink-free path of `path` (relative ones are taken from the first root) when it lies
        inside one of the roots; a one-sentence error for URLs, NUL bytes, unresolvable paths and the rest."""
        given, listed = echo(path), ", ".join(str(r) for r in self.roots)
        if URL_SCHEME.match(given):
            raise OutsideRoots(f"{given} is a URL; stallhound reads local files only: pass the path of the file "
                               f"inside the allowed roots ({listed})")
        if "\0" in str(path):
            raise InvalidRequest(f"the path {given} contains a NUL byte; pass a plain file path")
        full = path.expanduser()
        try:
            full = (full if full.is_absolute() else self.roots[0] / full).resolve()
            full.exists()  # raises for a name too long, which resolve() lets through
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
            raise ProfileNotFound(f"{given} cannot be resolved ({getattr(exc, 'strerror', None) or exc}); "
                                  "pass the path of an existing file") from exc
        if not any(full.is_relative_to(root) for root in self.roots):
            # where a link leads outside the roots is not said: it would tell what lies there
            raise OutsideRoots(f"{given} is outside the allowed roots ({listed}); move the profile there or start "
                               "the server with --root pointing at its folder")
        return full

    def open_session(self, name: str) -> Session:
        session = Session(name)
        with self.lock:
            self.sessions.append(session)
        return session

    def end_session(self, session: Session) -> None:
        """Forget a finished session's ids; models no other session names are closed."""
        with self.lock:
            self.sessions = [s for s in self.sessions if s is not session]
            session.ids.clear()
            closing = self._take_unreferenced()
        self._close(closing)
        for hook in self.ended:
            hook(session)

    def _path_of(self, session: Session, ref: str) -> tuple[str | None, Path]:
        if ref in session.ids:
            return ref, session.ids[ref]
        if "/" not in ref and "\\" not in ref and not Path(ref).suffix:
            raise UnknownProfile(f"no profile is loaded with id '{ref}' in this session (loaded: "
                                 f"{session.listed()}); call load_profile with the file's path")
        full = self.check_allowed(Path(ref))
        return session.id_of(full), full

    def attach(self, session: Session, ref: str) -> Lease | Ticket:
        """A lease on `ref` (an id of this session or a path) when its model is open, else a ticket on the build that
        opens it: the one under way for this file, or a new one."""
        with self.lock:
            _, key = self._path_of(session, ref)
            model = self.models.get(key)
            if model is not None:
                return self._lease(session, key, model)
            # open_profile words a missing or unreadable file (formats.source.check_file)
            return self.builds.join(key, session, functools.partial(self._open, key), self._opened, _Model.close)

    def _open(self, key: Path, progress: Progress, cancelled: threading.Event) -> _Model:
        profile = open_profile(key, cache_dir=self.cache_dir, use_cache=self.use_cache, progress=progress,
                               cancelled=cancelled)
        return _Model(profile, profile.model_path.stat().st_size)

    def _opened(self, build: Build, model: _Model) -> None:
        """Under the lock, as a build ends: its model, open and held for each call still waiting for it."""
        self.models[_file_of(build)] = model
        for ticket in build.waiting:
            model.leases += 1
            ticket.share = model

    def collect(self, ticket: Ticket) -> Lease:
        """The lease the ended build of `ticket` holds for this call; the build's error when it failed."""
        with self.lock:
            self.builds.leave(ticket)
            if ticket.build.error is not None:
                raise ticket.build.error
            model, ticket.share = ticket.share, None
            lease = self._lease(ticket.session, _file_of(ticket.build), model, held=True)
            closing = self._take_over_budget()
        self._close(closing)
        return lease

    def leave(self, ticket: Ticket) -> None:
        """This call no longer waits for its build (which goes on); what the build held for it is let go."""
        with self.lock:
            ended = self.builds.leave(ticket)
            model, ticket.share = ticket.share, None
        if ended and model is not None:
            self.release(Lease("", model.profile, _file_of(ticket.build)))

    def acquire(self, session: Session, ref: str) -> Lease:
        """Lease the profile `ref`, opening or building it if needed (waiting on this thread for a build)."""
        held = self.attach(session, ref)
        if isinstance(held, Lease):
            return held
        held.build.ended.wait()
        return self.collect(held)

    def stop_build(self, session: Session, ref: str) -> tuple[bool, int] | None:
        """What Builds.stop says for the load of the profile `ref`."""
        with self.lock:
            _, key = self._path_of(session, ref)
            return self.builds.stop(key, session)

    def _lease(self, session: Session, key: Path, model: _Model, held: bool = False) -> Lease:
        """Lease `model` to this session; `held`: the lease was taken for the call already (as its build ended)."""
        model.leases += 0 if held else 1
        self.models.move_to_end(key)
        pid = session.add(key, model.profile.fingerprint)
        return Lease(pid, model.profile, key)

    def release(self, lease: Lease) -> None:
        with self.lock:
            model = self.models.get(lease.key)
            if model is not None and model.profile is lease.profile:
                model.leases -= 1
            closing = self._take_unreferenced() + self._take_over_budget()
        self._close(closing)

    @contextmanager
    def leased(self, session: Session, ref: str) -> Iterator[Lease]:
        lease = self.acquire(session, ref)
        try:
            yield lease
        finally:
            self.release(lease)

    def close(self, session: Session, ref: str) -> str:
        """Drop `ref` from this session; its model closes once no other session names it."""
        with self.lock:
            try:
                pid, _ = self._path_of(session, ref)
            except UnknownProfile:
                pid = None
            if pid is None:
                raise UnknownProfile(f"no profile '{ref}' is loaded in this session (loaded: {session.listed()})")
            del session.ids[pid]
            session.fingerprints.pop(pid, None)
            closing = self._take_unreferenced()
        self._close(closing)
        return pid

    def _take_unreferenced(self) -> list[Profile]:
        named = {path for s in self.sessions for path in s.ids.values()}
        idle = [key for key, m in self.models.items() if m.leases == 0 and key not in named]
        return [self.models.pop(key).profile for key in idle]

    def _take_over_budget(self) -> list[Profile]:
        budget = self.memory_budget_mb * MB
        total = sum(m.cost_bytes for m in self.models.values())
        taken = []
        for key in [k for k, m in self.models.items() if m.leases == 0]:
            if total <= budget:
                break
            model = self.models.pop(key)
            total -= model.cost_bytes
            taken.append(model.profile)
            log.info("closed %s to stay within the %d MB budget of open profiles", key, self.memory_budget_mb)
        return taken

    def _close(self, profiles: list[Profile]) -> None:
        for profile in profiles:
            profile.close()

    def listing(self, session: Session) -> list[tuple[str, Path, str]]:
        """(id, path, fingerprint) of each profile this session loaded."""
        with self.lock:
            return [(pid, path, session.fingerprints[pid]) for pid, path in session.ids.items()]

    def open_bytes(self) -> int:
        with self.lock:
            return sum(m.cost_bytes for m in self.models.values())


def _file_of(build: Build) -> Path:
    """The file a profile's build opens: its key among the builds."""
    return cast(Path, build.key)
