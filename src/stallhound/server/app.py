"""The MCP server: every skill in stallhound.tools as a typed tool, plus profile lifecycle tools."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import BaseModel, Field

from stallhound import __version__
from stallhound.analysis.contracts import run_skill
from stallhound.model import cache
from stallhound.model.errors import NoLoadUnderWay
from stallhound.server import ui
from stallhound.server.builds import follow
from stallhound.server.cancel import run_on_cursor
from stallhound.server.errors import StallhoundMCP, private_folders
from stallhound.server.http import bearer_auth
from stallhound.server.job_tools import register_job_tools
from stallhound.server.jobs import JobStore
from stallhound.server.resources import register_resources
from stallhound.server.sessions import session_of
from stallhound.server.store import DEFAULT_MEMORY_BUDGET_MB, Lease, ProfileStore, Session
from stallhound.server.tasks import Tasks
from stallhound.server.tasks import lifespan as tasks_lifespan
from stallhound.server.wording import profile_files
from stallhound.server.wrapper import (
    CLOSES,
    READ_ONLY,
    Kind,
    Leased,
    add_tools,
    description,
    measured_then_compared,
    on_one_cursor,
    text_result,
    tool_function,
)
from stallhound.tools import pair_tools, skills

log = logging.getLogger("stallhound")

INSTRUCTIONS = f"""stallhound reads GPU profiles ({profile_files()} files).
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


class LoadStopped(BaseModel):
    paths: list[str]
    stopped: bool = Field(description="true when the build was told to stop; false when it goes on for calls of "
                                      "other sessions")
    waiting_calls: int = Field(description="calls of other sessions waiting for the build")


async def _load(store: ProfileStore, session: Session, ref: str, ctx: Context) -> Lease:
    """Lease a profile, opening or building it if needed, with MCP progress; a call that ends first leaves the build
    running (server/builds.py)."""
    held = store.attach(session, ref)
    if isinstance(held, Lease):
        return held
    try:
        await follow(held, ctx)
        return store.collect(held)
    finally:
        store.leave(held)  # after collect, nothing is left to let go


@asynccontextmanager
async def _leased(store: ProfileStore, ctx: Context, ref: str) -> AsyncIterator[Lease]:
    """The profile `ref` of this request's session, kept open until the block ends."""
    lease = await _load(store, session_of(store, ctx), ref, ctx)
    try:
        yield lease
    finally:
        store.release(lease)


def profile_kinds(store: ProfileStore) -> tuple[Kind, Kind]:
    """The tools on one profile (`profile`) and those comparing two (`before`, `after`): each profile leased from
    `store` for the call."""
    @asynccontextmanager
    async def lease(ctx: Context, ref: str) -> AsyncIterator[Leased]:
        async with _leased(store, ctx, ref) as held:
            yield Leased(held.id, held.profile.con)

    return (Kind("single", ("profile",), lease, on_one_cursor),
            Kind("pair", ("before", "after"), lease, measured_then_compared))


def build_server(roots: list[Path], cache_dir: Path | None = None, use_cache: bool = True,
                 memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB, token: str | None = None) -> MCPServer:
    """The server; with `token`, every HTTP request must carry it as a bearer token."""
    store = ProfileStore(roots=[r.resolve() for r in roots], cache_dir=cache_dir, use_cache=use_cache,
                         memory_budget_mb=memory_budget_mb)
    single, pair = profile_kinds(store)
    modules = skills()
    viewed = {name: (tool_function(modules[name], single), description(modules[name])) for name in ui.VIEWS}
    mcp = StallhoundMCP(name="stallhound", version=__version__, instructions=INSTRUCTIONS, **bearer_auth(token),
                       extensions=[ui.extension(viewed, annotations=READ_ONLY, structured_output=True), Tasks()],
                       lifespan=tasks_lifespan)
    mcp.store = store  # for resources, prompts and tests
    mcp.private = private_folders({store.cache_dir or cache.cache_dir(): "the server's cache folder",
                                   Path(tempfile.gettempdir()): "the server's temporary folder"}, store.roots)
    add_tools(mcp, {name: m for name, m in modules.items() if name not in ui.VIEWS}, single)  # the viewed ones:
    add_tools(mcp, pair_tools(), pair)  # registered with their view by the extension
    _register_profile_tools(mcp, store, modules["profile_summary"])
    register_resources(mcp, store)
    mcp.jobs = JobStore(store)  # for tests
    register_job_tools(mcp, mcp.jobs)
    _register_cancel_load(mcp, mcp.jobs)
    return mcp


def _register_profile_tools(mcp: StallhoundMCP, store: ProfileStore, summary: ModuleType) -> None:
    """load_profile, list_profiles and close_profile."""

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def load_profile(
        path: Annotated[str, Field(description=f"Path of a profile ({profile_files()} file), inside the server's "
                                               "allowed roots")],
        ctx: Context,
    ) -> Annotated[CallToolResult, LoadResult]:  # the SDK reads the output schema off LoadResult
        """Load a profile (built once into a cache, then reused); returns its id and summary.

        A build outlives a call that ends first (a timeout, a cancel, a disconnect): loading the same file again
        attaches to it and reports its progress, or opens what it built; cancel_load stops it."""
        async with _leased(store, ctx, path) as lease:
            pid, profile = lease.id, lease.profile
            result = await run_on_cursor(
                profile.con, lambda cur: run_skill(cur, summary, summary.Params(profile=pid)), ctx)
        loaded = LoadResult(profile=pid, path=str(profile.path), summary=result.model_dump(mode="json"))
        return text_result(f"loaded {profile.path} as '{pid}'\n{summary.render(result)}", loaded)

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def list_profiles(ctx: Context) -> Annotated[CallToolResult, ProfileList]:
        """List the profiles loaded in this session with their ids (clients of the 2026-07-28 protocol,
        which has no sessions, share one list)."""
        entries = [ProfileEntry(profile=pid, path=str(path), fingerprint=fingerprint)
                   for pid, path, fingerprint in store.listing(session_of(store, ctx))]
        listing = ProfileList(profiles=entries)
        text = "\n".join(f"{e.profile}: {e.path}" for e in entries) or "no profiles loaded"
        return text_result(text, listing)

    @mcp.tool(annotations=CLOSES, structured_output=True)
    async def close_profile(
        profile: Annotated[str, Field(description="Id (or path) of a profile loaded in this session")],
        ctx: Context,
    ) -> Annotated[CallToolResult, Closed]:
        """Close a profile loaded in this session; its memory is freed once no other session uses it (the
        cached model stays on disk)."""
        pid = store.close(session_of(store, ctx), profile)
        return text_result(f"closed {pid}", Closed(closed=pid))


def _register_cancel_load(mcp: StallhoundMCP, jobs: JobStore) -> None:
    @mcp.tool(annotations=CLOSES, structured_output=True)
    async def cancel_load(
        paths: Annotated[list[str], Field(min_length=1, description=(
            "What the load was given: the profile's path (load_profile), or the job's paths, folder or glob "
            "(load_job)"))],
        ctx: Context,
    ) -> Annotated[CallToolResult, LoadStopped]:
        """Stop a load_profile or load_job build under way, unless calls of other sessions are waiting for it.

        A load whose call ended (the client's timeout, a cancel, a disconnect) keeps building into the cache, and
        loading the same files again attaches to it and reports its progress; a client's cancel of a call cannot
        tell a user's "stop" from its own timeout, so only this tool (or tasks/cancel on the load's task) stops the
        build. This session's calls waiting for it then end with an error; clients of the 2026-07-28 protocol, which
        has no sessions, count as one session."""
        session = session_of(jobs.profiles, ctx)
        found = jobs.profiles.stop_build(session, paths[0]) if len(paths) == 1 else None
        found = found or jobs.stop_load(session, paths)
        if found is None:
            raise NoLoadUnderWay(f"no load of {', '.join(paths)} is under way (it ended or never began: a finished "
                                 "load is in the cache, and loading it again opens it)")
        stopped, others = found
        text = (f"stopped the load of {', '.join(paths)}" if stopped else
                f"the load of {', '.join(paths)} goes on: {others} calls of other sessions are waiting for it")
        return text_result(text, LoadStopped(paths=paths, stopped=stopped, waiting_calls=others))
