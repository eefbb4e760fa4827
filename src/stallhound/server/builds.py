"""Builds of models (a profile's, a job's) on threads of their own, shared by the calls that wait on them.

A build outlives the call that started it: a client that gives up (its request timed out, it cancelled, it
disconnected) leaves it running into the cache, and a later call for the same file attaches to it and follows its
progress instead of starting again. A build stops only when asked by name (cancel_load, or tasks/cancel on the task
of its load) and no call of another session is waiting for it: a client's cancel of a request cannot tell a user's
"stop" from its own timeout, so it only ends that call's wait. (Without a cache, --no-cache, a build that ends with
nobody waiting is lost; with stdio, the client stops the server process, and its builds, when it disconnects.)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context

from stallhound.model.cache import Progress
from stallhound.model.errors import ClientGone
from stallhound.server.cancel import ended_when_gone
from stallhound.server.sessions import Session

PROGRESS_POLL_S = 0.25  # a waiting call passes the build's steps on this often; its end is seen at once
Make = Callable[[Progress, threading.Event], Any]  # make(progress, cancelled): the build itself


@dataclass(eq=False)
class Build:
    """One build under way (or just ended): its progress, the calls waiting for it and, once ended, its error."""

    key: Hashable
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    steps: list[tuple[int, int, str]] = field(default_factory=list)  # each (done, total, label) it reported
    waiting: list[Ticket] = field(default_factory=list)
    error: Exception | None = None

    def report(self, done: int, total: int, label: str) -> None:
        self.steps.append((done, total, label))  # list.append is atomic: readers on other threads see whole steps


@dataclass(eq=False)
class Ticket:
    """One call's wait on a build; `share` is what the build's end gave this call (set under the builds' lock)."""

    build: Build
    session: Session
    stop: Callable[[], tuple[bool, int] | None]  # Builds.stop for this call's build and session, taking the lock
    share: Any = None


class Follower(Protocol):
    """Who else follows a call's build besides its MCP progress: the task the call runs in (server/tasks.py)."""

    def step(self, done: int, total: int, label: str) -> None: ...

    def follow(self, ticket: Ticket) -> None: ...


FOLLOWER: ContextVar[Follower | None] = ContextVar("stallhound_build_follower", default=None)


@contextmanager
def following(follower: Follower) -> Iterator[None]:
    """Inside the block, the builds this task's calls wait on are followed by `follower` too."""
    token = FOLLOWER.set(follower)
    try:
        yield
    finally:
        FOLLOWER.reset(token)


Ended = Callable[[Build, Any], None]  # ended(build, value), under the lock: hand the value to build.waiting
Orphaned = Callable[[Any], None]  # close a value no call is waiting for


@dataclass
class Builds:
    """The builds running in a server, one per key; `lock` is the store's, so a build's end and a call's lease of
    its model are one step."""

    lock: threading.Lock
    running: dict[Hashable, Build] = field(default_factory=dict)

    def join(self, key: Hashable, session: Session, make: Make, ended: Ended, orphaned: Orphaned) -> Ticket:
        """Under the lock: a ticket on the build of `key`, started on a thread of its own when none runs."""
        build = self.running.get(key)
        if build is None:
            build = self.running[key] = Build(key)
            threading.Thread(target=self._run, args=(build, make, ended, orphaned), daemon=True,
                             name=f"stallhound build {key}").start()
        ticket = Ticket(build, session, functools.partial(self._stop_locked, key, session))
        build.waiting.append(ticket)
        return ticket

    def _run(self, build: Build, make: Make, ended: Ended, orphaned: Orphaned) -> None:
        value, error = None, None
        try:
            value = make(build.report, build.cancelled)
        except Exception as exc:  # carried to every call waiting for the build, and raised there
            error = exc
        with self.lock:  # `ended` only hands the value out (no I/O), so nothing here keeps `ended` from being set
            del self.running[build.key]
            build.error = error
            if value is not None and build.waiting:
                ended(build, value)
            build.ended.set()
            orphan = value is not None and not build.waiting
        if orphan:  # built into the cache for a later call; nobody holds it open
            orphaned(value)

    def leave(self, ticket: Ticket) -> bool:
        """Under the lock: this call stops waiting; true when the build had ended (its share is the caller's to
        hand back)."""
        if not ticket.build.ended.is_set():
            ticket.build.waiting.remove(ticket)
            return False
        return True

    def stop(self, key: Hashable, session: Session) -> tuple[bool, int] | None:
        """Under the lock: (stopped, calls of other sessions waiting) for the build of `key`, None when none runs.
        It stops only when no call of another session waits for it."""
        build = self.running.get(key)
        if build is None:
            return None
        others = sum(1 for t in build.waiting if t.session is not session)
        if not others:
            build.cancelled.set()
        return not others, others


    def _stop_locked(self, key: Hashable, session: Session) -> tuple[bool, int] | None:
        with self.lock:
            return self.stop(key, session)


async def follow(ticket: Ticket, ctx: Context) -> None:
    """Until `build` ends, passing each step it reports on as this call's MCP progress (from the last one before the
    call came); the call may end first (a cancel, a timeout, its HTTP client leaving) and the build goes on."""
    build, follower = ticket.build, FOLLOWER.get()
    if follower is not None:
        follower.follow(ticket)
    sent = max(len(build.steps) - 1, 0)
    async with ended_when_gone(ctx):
        ended = False
        while not ended:
            ended = await anyio.to_thread.run_sync(build.ended.wait, PROGRESS_POLL_S, abandon_on_cancel=True)
            steps = build.steps[sent:]  # read after the wait: an ended build's last steps are all in
            sent += len(steps)
            for step in steps:
                await ctx.report_progress(*step)
                if follower is not None:
                    follower.step(*step)
    if not build.ended.is_set():
        raise ClientGone("the client left before the load ended")

