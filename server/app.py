"""The MCP server: every skill in nsightful.tools as a typed tool, plus profile lifecycle tools."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from nsightful.profiles.errors import NsightfulError
from nsightful.profiles.ingest import Builder
from nsightful.server import __version__, budget
from nsightful.server.store import ProfileStore
from nsightful.tools import skills

log = logging.getLogger("nsightful")

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False,
                            destructive_hint=False)
INSTRUCTIONS = """nsightful reads NVIDIA Nsight Systems profiles (nsys export --type sqlite, or .nsys-rep).
Start with load_profile(path) or triage(profile); every tool takes `profile` as the id load_profile returned
or a path. Figures are in ns/bytes; each result echoes its scope (devices, window) and says when rows were cut.
Findings cite root causes in the book: read nsightful://book/{id} for the fix and how to verify it."""


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


async def _load(store: ProfileStore, ref: str, ctx: Context | None):
    """Load (or find) a profile off the event loop, with MCP progress and cancellation."""
    found = store.find(ref)
    if found:
        return found
    builders: list[Builder] = []
    token = anyio.lowlevel.current_token()  # the builder reports from threads anyio did not start

    def progress(done: int, total: int, label: str) -> None:
        if ctx is not None:
            anyio.from_thread.run(ctx.report_progress, done, total, label, token=token)

    try:
        return await anyio.to_thread.run_sync(lambda: store.load(ref, progress, builders.append),
                                              abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        for b in builders:
            b.interrupt()
        raise


def _as_tool_error(exc: NsightfulError) -> ToolError:
    return ToolError(str(exc))


def _flat_signature(params_model: type[BaseModel]) -> list[inspect.Parameter]:
    out = []
    for name, info in params_model.model_fields.items():
        annotation = Annotated[info.annotation, Field(description=info.description, **_bounds(info))]
        default = inspect.Parameter.empty if info.is_required() else info.default
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return out


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
            pid, profile = await _load(store, kwargs["profile"], ctx)
            params = module.Params(**{**kwargs, "profile": pid})

            def work():
                with profile.con.cursor() as cur:
                    return budget.fit(module.run(cur, params), module, params, budget.server_budget())

            text, result = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except NsightfulError as exc:
            raise _as_tool_error(exc) from exc
        return _text_result(text, result)

    parameters = [*_flat_signature(module.Params),
                  inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    call.__signature__ = inspect.Signature(parameters, return_annotation=module.Result)
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": module.Result}
    call.__name__ = module.__name__.rsplit(".", 1)[-1]
    return call


def build_server(roots: list[Path], cache_dir: Path | None = None, use_cache: bool = True) -> MCPServer:
    store = ProfileStore(roots=[r.resolve() for r in roots], cache_dir=cache_dir, use_cache=use_cache)
    mcp = MCPServer(name="nsightful", version=__version__, instructions=INSTRUCTIONS)
    mcp.store = store  # for resources, prompts and tests
    modules = skills()

    for name, module in modules.items():
        mcp.add_tool(skill_tool(store, module), name=name, description=inspect.cleandoc(module.__doc__),
                     annotations=READ_ONLY, structured_output=True)

    summary = modules["profile_summary"]

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def load_profile(
        path: Annotated[str, Field(description="Path of an nsys .sqlite export (or .nsys-rep/.qdrep when nsys "
                                               "is installed), inside the server's allowed roots")],
        ctx: Context,
    ) -> LoadResult:
        """Load a profile (built once into a cache, then reused); returns its id and summary."""
        try:
            pid, profile = await _load(store, path, ctx)
            with profile.con.cursor() as cur:
                result = summary.run(cur, summary.Params(profile=pid))
        except NsightfulError as exc:
            raise _as_tool_error(exc) from exc
        loaded = LoadResult(profile=pid, path=str(profile.path), summary=result.model_dump(mode="json"))
        return _text_result(f"loaded {profile.path} as '{pid}'\n{summary.render(result)}", loaded)

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def list_profiles() -> ProfileList:
        """List the profiles loaded in this session with their ids."""
        entries = [ProfileEntry(profile=pid, path=str(p.path), fingerprint=p.fingerprint)
                   for pid, p in store.profiles.items()]
        listing = ProfileList(profiles=entries)
        text = "\n".join(f"{e.profile}: {e.path}" for e in entries) or "no profiles loaded"
        return _text_result(text, listing)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True, open_world_hint=False,
                                          destructive_hint=False), structured_output=True)
    async def close_profile(
        profile: Annotated[str, Field(description="Id (or path) of a loaded profile")],
    ) -> Closed:
        """Close a loaded profile and free its memory (the cached model stays on disk)."""
        try:
            pid = store.close(profile)
        except NsightfulError as exc:
            raise _as_tool_error(exc) from exc
        return _text_result(f"closed {pid}", Closed(closed=pid))

    from nsightful.server.resources import register_resources
    register_resources(mcp, store)
    return mcp
