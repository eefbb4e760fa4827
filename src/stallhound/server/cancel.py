"""Blocking work of a tool call, on a worker thread that stops when the call does.

What ends a call in the SDK: `notifications/cancelled` cancels the handler's scope (stdio, 2025-era
HTTP, in-memory); on 2026-07-28 HTTP closing the response stream does; a closed HTTP session ends its
handlers. A 2025-era HTTP request whose connection drops keeps running, for a client that may resume
it from an event store; this server keeps none, so nobody ever could, and it is stopped as well.
Abandoning the thread is not enough: DuckDB would keep the cores busy until the query ends, so the
worker is interrupted until it has returned.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import duckdb
from mcp.server.mcpserver import Context
from starlette.requests import Request

from stallhound.model.errors import ClientGone
from stallhound.model.limits import model_memory

T = TypeVar("T")
STOP_POLL_S = 0.05  # between interrupts: one that lands between two queries of a tool is lost
STOP_WAIT_S = 5.0  # longest wait for an interrupted worker; steps between queries are short Python
GONE_POLL_S = 0.25  # between checks that an HTTP client is still connected


class _Worker(Generic[T]):
    """`job` for one worker thread; `stop()` from the event loop interrupts it, or keeps it from starting."""

    def __init__(self, job: Callable[[], T], interrupt: Callable[[], None]):
        self._job, self._interrupt = job, interrupt
        self._lock = threading.Lock()
        self._state = "waiting"  # -> running -> finished, or -> dropped when stopped before it started
        self._value: T | None = None
        self._error: Exception | None = None
        self.done = anyio.Event()

    def _call(self) -> None:
        with self._lock:
            if self._state == "dropped":
                return
            self._state = "running"
        try:
            self._value = self._job()
        except Exception as exc:  # carried to the awaiting task and raised there
            self._error = exc
        finally:
            with self._lock:
                self._state = "finished"

    async def run(self) -> None:
        try:
            await anyio.to_thread.run_sync(self._call, abandon_on_cancel=True)
        finally:
            self.done.set()

    def stop(self) -> bool:
        """Interrupt the job; true while it still runs."""
        with self._lock:
            if self._state == "waiting":
                self._state = "dropped"
            if self._state != "running":
                return False
            self._interrupt()
            return True

    def result(self) -> T:
        with self._lock:
            if self._state != "finished":
                raise ClientGone("the client left before the answer was ready")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


async def _cancel_when_gone(request: Request, scope: anyio.CancelScope) -> None:
    while not await request.is_disconnected():
        await anyio.sleep(GONE_POLL_S)
    scope.cancel()


async def _stop(worker: _Worker[Any]) -> None:
    with anyio.move_on_after(STOP_WAIT_S):
        while worker.stop():
            await anyio.sleep(STOP_POLL_S)


@asynccontextmanager
async def ended_when_gone(ctx: Context | None) -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group whose block is cancelled when this call's HTTP client leaves (and ends with the block)."""
    request = ctx.request_context.request if ctx is not None else None
    async with anyio.create_task_group() as tg:
        if isinstance(request, Request):
            tg.start_soon(_cancel_when_gone, request, tg.cancel_scope)
        yield tg
        tg.cancel_scope.cancel()


async def run_stoppable(job: Callable[[], T], interrupt: Callable[[], None], ctx: Context | None) -> T:
    """job() on a worker thread, interrupted until it returns if the call is cancelled or its client leaves."""
    worker = _Worker(job, interrupt)
    try:
        async with ended_when_gone(ctx) as tg:
            tg.start_soon(worker.run)
            await worker.done.wait()
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(worker)
    return worker.result()


async def run_on_cursor(con: duckdb.DuckDBPyConnection, job: Callable[[duckdb.DuckDBPyConnection], T],
                        ctx: Context | None) -> T:
    """job(cursor) on its own cursor of `con`, so that stopping it interrupts this call's queries only."""
    cur = con.cursor()

    def work() -> T:
        with cur, model_memory():
            return job(cur)

    def interrupt() -> None:
        with suppress(duckdb.ConnectionException):  # the job closed its cursor on the way out
            cur.interrupt()

    return await run_stoppable(work, interrupt, ctx)
