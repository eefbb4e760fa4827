"""The MCP tasks extension (io.modelcontextprotocol/tasks, 2026-07-28 protocol): load_profile, load_job and triage_job
answer a client that declares the extension on its request with a task handle at once, run on in the server, and the
client polls tasks/get for the status (the build's current step as its message) and the final result, or stops the
work with tasks/cancel (which, for a load, also stops its build unless another session waits for it). Clients that do
not declare it get today's blocking call. The SDK (mcp 2.3) has the extension seams (request methods, a tools/call
interceptor, claimed result types) but no tasks of its own; this is the server side of the extension's spec.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolRequestParams, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from stallhound.server.builds import Ticket, following

EXTENSION_ID = "io.modelcontextprotocol/tasks"
TASK_TOOLS = frozenset({"load_profile", "load_job", "triage_job"})
TTL_MS = 3_600_000  # a finished task's result is kept this long for the client to fetch
POLL_INTERVAL_MS = 500  # loads report a step every second or so
GROUP_KEY = "stallhound.tasks"  # the lifespan's task group, in the request context's lifespan_context


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = {}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(eq=False)
class Task:
    """One task: its status, the build its work follows (for tasks/cancel), and how it ended."""

    task_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    status: str = "working"
    message: str = "started"
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    ticket: Ticket | None = None
    ending: dict[str, Any] = field(default_factory=dict)  # {"result": ...} or {"error": ...} once ended
    ended_s: float | None = None  # time.monotonic() at its end

    def step(self, done: int, total: int, label: str) -> None:
        self.message, self.updated = f"step {done} of {total}: {label}", _now()

    def follow(self, ticket: Ticket) -> None:
        self.ticket = ticket

    def end(self, status: str, message: str, **ending: Any) -> None:
        if self.status == "working":
            self.status, self.message, self.ending, self.updated = status, message, ending, _now()
            self.ended_s = time.monotonic()

    def wire(self, result_type: str) -> dict[str, Any]:
        return {"resultType": result_type, "taskId": self.task_id, "status": self.status,
                "statusMessage": self.message, "createdAt": self.created, "lastUpdatedAt": self.updated,
                "ttlMs": TTL_MS, "pollIntervalMs": POLL_INTERVAL_MS, **self.ending}


@asynccontextmanager
async def lifespan(_: object) -> AsyncIterator[dict[str, anyio.abc.TaskGroup]]:
    """The server's lifespan: a task group the tasks run in, ended with the server."""
    async with anyio.create_task_group() as group:
        yield {GROUP_KEY: group}
        group.cancel_scope.cancel()


class Tasks(Extension):
    identifier = EXTENSION_ID

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def methods(self) -> list[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [MethodBinding("tasks/get", TaskParams, self._get, versions),
                MethodBinding("tasks/cancel", TaskParams, self._cancel, versions),
                MethodBinding("tasks/update", UpdateParams, self._update, versions)]

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        if params.name not in TASK_TOOLS or not _declared(ctx):
            return await call_next(ctx)
        now = time.monotonic()
        self.tasks = {i: t for i, t in self.tasks.items() if t.ended_s is None or now - t.ended_s < TTL_MS / 1000}
        task = Task()
        self.tasks[task.task_id] = task
        # the work outlives this request: no HTTP request to watch for a disconnect
        ctx.lifespan_context[GROUP_KEY].start_soon(self._run, task, call_next, replace(ctx, request=None))
        return task.wire("task")

    async def _run(self, task: Task, call_next: CallNext, ctx: ServerRequestContext[Any, Any]) -> None:
        with task.scope, following(task):
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                task.end("failed", exc.error.message, error=exc.error.model_dump(mode="json", exclude_none=True))
            except Exception as exc:  # anything else would end the server's task group: it is this task's failure
                task.end("failed", str(exc), error={"code": INTERNAL_ERROR, "message": str(exc)})
            else:
                task.end("completed", "done", result=_wire(result))
        task.end("cancelled", "cancelled by tasks/cancel")

    def _task(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> Task:
        if not _declared(ctx):
            raise MCPError(-32021, f"Missing required client capability: declare the {EXTENSION_ID} extension",
                           {"requiredCapabilities": {"extensions": {EXTENSION_ID: {}}}})
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(INVALID_PARAMS, f"Failed to retrieve task: no task {params.task_id} (it never began, or "
                                           "its result expired)")
        return task

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        return self._task(ctx, params).wire("complete")

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        self._task(ctx, params)  # these tasks never ask for input: responses are ignored, as the spec allows
        return {}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        task = self._task(ctx, params)
        if task.ticket is not None:
            task.ticket.stop()  # an explicit stop: the build ends unless another session waits for it
        task.scope.cancel()
        return {}


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the tasks extension (2026-07-28: in the request's capabilities)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and EXTENSION_ID in capabilities.extensions)


def _wire(result: HandlerResult) -> dict[str, Any]:
    """A tools/call handler's result as the wire's JSON object."""
    if isinstance(result, dict) or result is None:
        return dict(result or {})
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)
