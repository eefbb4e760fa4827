"""The MCP server: every skill in stallhound.tools as a typed tool, plus profile lifecycle tools."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal, get_origin

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from stallhound import __version__
from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import StallhoundError
from stallhound.server import budget, ui
from stallhound.server.cancel import run_on_cursor, run_stoppable
from stallhound.server.http import bearer_auth
from stallhound.server.sessions import session_of
from stallhound.server.store import DEFAULT_MEMORY_BUDGET_MB, Lease, ProfileStore, Session
from stallhound.server.validation import StallhoundMCP
from stallhound.tools import pair_tools, skills

log = logging.getLogger("stallhound")

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False,
                            destructive_hint=False)
CLOSES = ToolAnnotations(read_only_hint=False, idempotent_hint=True, open_world_hint=False,
                         destructive_hint=False)  # close_profile, close_job: they end a session's use, nothing else
INSTRUCTIONS = """stallhound reads NVIDIA Nsight Systems profiles (nsys export --type sqlite, or .nsys-rep).
Start with load_profile(path) or triage(profile); every tool takes `profile` as the id load_profile returned
or a path. Figures are in ns/bytes; each result echoes its scope (devices, window) and says when rows were cut.
Findings cite root causes in the book: read stallhound://book/{id} for the fix and how to verify it.
For every rank of a distributed job, load_job(paths) and pass its id as `job` to the job tools."""


class LoadResult(BaseModel):
    profile: str = Field(description="id to pass as `profile` to every other tool")
    path: str
    summary: dict[str, Any] = Field(description="profile_summary of the loaded profile")


class ProfileEntry(BaseModel):
    profile: str
    path: str
    fingerprint: str


class ProfileList(BaseModel):
    profiles: list[ProfileEntry]


class Closed(BaseModel):
    closed: str


def _text_result(text: str, model: BaseModel) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=model.model_dump(mode="json"))


async def _load(store: ProfileStore, session: Session, ref: str, ctx: Context | None) -> Lease:
    """Lease (opening or building if needed) a profile off the event loop, with MCP progress; a cancelled load
    stops its build."""
    lease = store.lease_open(session, ref)
    if lease:
        return lease
    cancelled = threading.Event()
    token = anyio.lowlevel.current_token()  # the builder reports from threads anyio did not start

    def progress(done: int, total: int, label: str) -> None:
        if ctx is not None:
            anyio.from_thread.run(ctx.report_progress, done, total, label, token=token)

    return await run_stoppable(lambda: store.acquire(session, ref, progress, cancelled), cancelled.set, ctx)


@asynccontextmanager
async def _leased(store: ProfileStore, ctx: Context, ref: str) -> AsyncIterator[Lease]:
    """The profile `ref` of this request's session, kept open until the block ends."""
    lease = await _load(store, session_of(store, ctx), ref, ctx)
    try:
        yield lease
    finally:
        store.release(lease)


def _as_tool_error(exc: StallhoundError) -> ToolError:
    return ToolError(str(exc))


def _flat_signature(params_model: type[BaseModel]) -> list[inspect.Parameter]:
    out = []
    for name, info in params_model.model_fields.items():
        annotation = Annotated[info.annotation, Field(description=info.description, **_strict(info.annotation),
                                                      **_bounds(info))]
        default = inspect.Parameter.empty if info.is_required() else info.default
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return out


def _strict(annotation: Any) -> dict[str, bool]:
    """Types as the schema says: a client sends JSON, where true is no device 1 and "10" no limit.
    (A Literal matches its exact values already, and pydantic refuses strict on it.)"""
    return {} if get_origin(annotation) is Literal else {"strict": True}


def _bounds(info) -> dict[str, Any]:
    keys = ("ge", "le", "gt", "lt", "min_length", "max_length", "pattern")
    found: dict[str, Any] = {}
    for meta in info.metadata:
        for key in keys:
            value = getattr(meta, key, None)
            if value is not None:
                found[key] = value
    return found


def skill_tool(store: ProfileStore, module: ModuleType) -> Callable[..., Any]:
    """An async function with the skill's Params as flat keyword parameters, returning its Result."""

    async def call(ctx: Context, **kwargs: Any) -> CallToolResult:
        try:
            async with _leased(store, ctx, kwargs["profile"]) as lease:
                params = module.Params(**{**kwargs, "profile": lease.id})
                text, result = await run_on_cursor(
                    lease.profile.con,
                    lambda cur: budget.fit(run_skill(cur, module, params), module, params, budget.server_budget()), ctx)
        except StallhoundError as exc:
            raise _as_tool_error(exc) from exc
        return ui.with_view(_text_result(text, result), ctx, call.__name__)

    return _signed(call, module)


def pair_tool(store: ProfileStore, module: ModuleType) -> Callable[..., Any]:
    """Like skill_tool, for a tool comparing two profiles (`before`, `after`): both are leased for the call, each
    is measured on its own interruptible cursor (analysis/diff_side.py), then module.compare(before, after, params)."""
    from stallhound.tools.diff.side import measure

    async def call(ctx: Context, **kwargs: Any) -> CallToolResult:
        try:
            async with _leased(store, ctx, kwargs["before"]) as before, _leased(store, ctx, kwargs["after"]) as after:
                params = module.Params(**{**kwargs, "before": before.id, "after": after.id})
                sides = [await run_on_cursor(lease.profile.con, lambda cur, pid=lease.id: measure(cur, pid), ctx)
                         for lease in (before, after)]
                text, result = budget.fit(module.compare(*sides, params), module, params, budget.server_budget())
        except StallhoundError as exc:
            raise _as_tool_error(exc) from exc
        return _text_result(text, result)

    return _signed(call, module)


def _signed(call: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    """`call` with the module's Params as its flat keyword signature and its Result as return type."""
    parameters = [*_flat_signature(module.Params),
                  inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    call.__signature__ = inspect.Signature(parameters, return_annotation=module.Result)
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": module.Result}
    call.__name__ = module.__name__.rsplit(".", 1)[-1]
    return call


def build_server(roots: list[Path], cache_dir: Path | None = None, use_cache: bool = True,
                 memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB, token: str | None = None) -> MCPServer:
    """The server; with `token`, every HTTP request must carry it as a bearer token."""
    store = ProfileStore(roots=[r.resolve() for r in roots], cache_dir=cache_dir, use_cache=use_cache,
                         memory_budget_mb=memory_budget_mb)
    modules = skills()
    viewed = {name: (skill_tool(store, modules[name]), inspect.cleandoc(modules[name].__doc__)) for name in ui.VIEWS}
    mcp = StallhoundMCP(name="stallhound", version=__version__, instructions=INSTRUCTIONS, **bearer_auth(token),
                       extensions=[ui.extension(viewed, annotations=READ_ONLY, structured_output=True)])
    mcp.store = store  # for resources, prompts and tests

    for name, module in modules.items():
        if name in ui.VIEWS:  # registered with its view by the extension
            continue
        mcp.add_tool(skill_tool(store, module), name=name, description=inspect.cleandoc(module.__doc__),
                     annotations=READ_ONLY, structured_output=True)

    for name, module in pair_tools().items():
        mcp.add_tool(pair_tool(store, module), name=name, description=inspect.cleandoc(module.__doc__),
                     annotations=READ_ONLY, structured_output=True)

    summary = modules["profile_summary"]

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def load_profile(
        path: Annotated[str, Field(description="Path of an nsys .sqlite export (or .nsys-rep/.qdrep when nsys "
                                               "is installed) or a torch.profiler .json/.json.gz trace, inside the "
                                               "server's allowed roots")],
        ctx: Context,
    ) -> LoadResult:
        """Load a profile (built once into a cache, then reused); returns its id and summary."""
        try:
            async with _leased(store, ctx, path) as lease:
                pid, profile = lease.id, lease.profile
                result = await run_on_cursor(
                    profile.con, lambda cur: run_skill(cur, summary, summary.Params(profile=pid)), ctx)
        except StallhoundError as exc:
            raise _as_tool_error(exc) from exc
        loaded = LoadResult(profile=pid, path=str(profile.path), summary=result.model_dump(mode="json"))
        return _text_result(f"loaded {profile.path} as '{pid}'\n{summary.render(result)}", loaded)

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def list_profiles(ctx: Context) -> ProfileList:
        """List the profiles loaded in this session with their ids (clients of the 2026-07-28 protocol,
        which has no sessions, share one list)."""
        entries = [ProfileEntry(profile=pid, path=str(path), fingerprint=fingerprint)
                   for pid, path, fingerprint in store.listing(session_of(store, ctx))]
        listing = ProfileList(profiles=entries)
        text = "\n".join(f"{e.profile}: {e.path}" for e in entries) or "no profiles loaded"
        return _text_result(text, listing)

    @mcp.tool(annotations=CLOSES, structured_output=True)
    async def close_profile(
        profile: Annotated[str, Field(description="Id (or path) of a profile loaded in this session")],
        ctx: Context,
    ) -> Closed:
        """Close a profile loaded in this session; its memory is freed once no other session uses it (the
        cached model stays on disk)."""
        try:
            pid = store.close(session_of(store, ctx), profile)
        except StallhoundError as exc:
            raise _as_tool_error(exc) from exc
        return _text_result(f"closed {pid}", Closed(closed=pid))

    from stallhound.server.resources import register_resources
    register_resources(mcp, store)
    from stallhound.server.job_tools import register_job_tools
    from stallhound.server.jobs import JobStore
    mcp.jobs = JobStore(store)  # for tests
    register_job_tools(mcp, mcp.jobs)
    return mcp
