"""Jobs open in this server: each MCP session names its own (like its profiles), and a tool call leases its job,
so a job closed by its session or its session's end closes its connection once the calls on it have finished."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from stallhound.jobs.files import job_files
from stallhound.jobs.job import Job, load_job
from stallhound.model.cache import Progress
from stallhound.model.errors import UnknownJob
from stallhound.server.builds import Build, Ticket
from stallhound.server.sessions import MAX_ID_CHARS, Session
from stallhound.server.store import ProfileStore

ID_CHARS = re.compile(r"[^a-z0-9_-]+")


@dataclass
class OpenJob:
    id: str
    job: Job
    leases: int = 0  # tool calls running on it now
    closed: bool = False  # dropped by its session: its connection closes with the last lease


@dataclass
class JobStore:
    profiles: ProfileStore  # for the allowed roots and the cache folder
    sessions: dict[int, dict[str, OpenJob]] = field(default_factory=dict)  # id(Session) -> job id -> job
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.profiles.ended.append(self.end_session)

    def attach(self, session: Session, paths: Sequence[str], workers: int | None) -> Ticket:
        """A ticket on the load of the job `paths` name: the one under way for these files, or a new one."""
        files = tuple(job_files(paths, self.profiles.check_allowed))

        def make(progress: Progress, cancelled: threading.Event) -> Job:
            return load_job(files, cache_dir=self.profiles.cache_dir, workers=workers, progress=progress,
                            check=self.profiles.check_allowed, cancelled=cancelled)

        with self.profiles.lock:
            return self.profiles.builds.join(job_key_of(files), session, make, _to_first, Job.close)

    def collect(self, ticket: Ticket) -> OpenJob | None:
        """The job the ended load of `ticket` gave this call, as a job of its session (the same job loaded again keeps
        its id); None when another call took it (this one then loads it again, from the cache)."""
        with self.profiles.lock:
            self.profiles.builds.leave(ticket)
            job, ticket.share = ticket.share, None
        if ticket.build.error is not None:
            raise ticket.build.error
        return None if job is None else self._open(ticket.session, job)

    def leave(self, ticket: Ticket) -> None:
        """This call no longer waits for its load (which goes on); a job it was given is closed."""
        with self.profiles.lock:
            ended = self.profiles.builds.leave(ticket)
            job, ticket.share = ticket.share, None
        if ended and job is not None:
            job.close()

    def stop_load(self, session: Session, paths: Sequence[str]) -> tuple[bool, int] | None:
        """What Builds.stop says for the load of the job `paths` name."""
        files = job_files(paths, self.profiles.check_allowed)
        with self.profiles.lock:
            return self.profiles.builds.stop(job_key_of(files), session)

    def load(self, session: Session, paths: Sequence[str], workers: int | None) -> OpenJob:
        """Load the job `paths` name, waiting on this thread."""
        while True:
            ticket = self.attach(session, paths, workers)
            ticket.build.ended.wait()
            opened = self.collect(ticket)
            if opened is not None:
                return opened

    def _open(self, session: Session, job: Job) -> OpenJob:
        with self.lock:
            jobs = self.sessions.setdefault(id(session), {})
            same = next((j for j in jobs.values() if j.job.key == job.key), None)
            opened = OpenJob(same.id if same else _new_id(jobs, job), job)
            jobs[opened.id] = opened
        if same:
            self._drop(same)
        return opened

    @contextmanager
    def leased(self, session: Session, ref: str) -> Iterator[OpenJob]:
        with self.lock:
            found = self._find(session, ref)
            found.leases += 1
        try:
            yield found
        finally:
            with self.lock:
                found.leases -= 1
                last = found.closed and found.leases == 0
            if last:
                found.job.close()

    def close(self, session: Session, ref: str) -> str:
        with self.lock:
            found = self._find(session, ref)
            del self.sessions[id(session)][found.id]
        self._drop(found)
        return found.id

    def listing(self, session: Session) -> list[OpenJob]:
        with self.lock:
            return list(self.sessions.get(id(session), {}).values())

    def end_session(self, session: Session) -> None:
        with self.lock:
            ended = list(self.sessions.pop(id(session), {}).values())
        for found in ended:
            self._drop(found)

    def _find(self, session: Session, ref: str) -> OpenJob:
        jobs = self.sessions.get(id(session), {})
        if ref not in jobs:
            loaded = ", ".join(jobs) or "none yet"
            raise UnknownJob(f"no job is loaded with id '{ref}' in this session (loaded: {loaded}); call load_job "
                             "with the ranks' profiles (paths, their folder or a glob)")
        return jobs[ref]

    def _drop(self, found: OpenJob) -> None:
        with self.lock:
            found.closed = True
            idle = found.leases == 0
        if idle:
            found.job.close()


def job_key_of(files: Sequence[Path]) -> tuple[str, tuple[Path, ...]]:
    """The key of a job's load among the server's builds: its files, in order."""
    return "job", tuple(files)


def _to_first(build: Build, job: Job) -> None:
    """As a job's load ends: the job is the first waiting call's; the others load it again from the cache (each
    session's job has a connection of its own)."""
    build.waiting[0].share = job


def _new_id(jobs: dict[str, OpenJob], job: Job) -> str:
    """'job-<folder of the first rank's profile>', numbered when this session has one of that name."""
    folder = ID_CHARS.sub("-", job.ranks[0].path.parent.name.lower()).strip("-")[:MAX_ID_CHARS]
    base = f"job-{folder}" if folder else "job"
    pid, n = base, 1
    while pid in jobs:
        n += 1
        pid = f"{base}-{n}"
    return pid
