"""The one MCP tool function of a tool module, whatever it runs on: one profile, two profiles or a job. A `Kind`
says what differs (which Params fields name what the call leases, how each is leased, how the answer comes from the
leased connections); the rest is here once: the Params as flat keyword parameters, the leases held for the call, the
work on interruptible cursors (progress and cancellation: server/cancel.py), the result fitted to the budget."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any, Literal, get_origin

import duckdb
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from stallhound.analysis.contracts import run_skill
from stallhound.server import budget, ui
from stallhound.server.cancel import run_on_cursor
from stallhound.tools import diff_profiles, verify_fix
from stallhound.tools.diff.side import measure

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False,
                            destructive_hint=False)
CLOSES = ToolAnnotations(read_only_hint=False, idempotent_hint=True, open_world_hint=False,
                         destructive_hint=False)  # close_profile, close_job: they end a session's use, nothing else


@dataclass(frozen=True)
class Leased:
    """What a tool call holds open: the session's id for it and its connection."""

    id: str
    con: duckdb.DuckDBPyConnection


Answer = Callable[[ModuleType, BaseModel, list[Leased], Context], Awaitable[tuple[str, BaseModel]]]


@dataclass(frozen=True)
class Kind:
    """What differs between the tools on one profile, on two profiles and on a job."""

    name: str  # single, pair or job
    fields: tuple[str, ...]  # the Params fields naming what a call leases, in the order leased
    lease: Callable[[Context, str], AbstractAsyncContextManager[Leased]]  # one of them, held until the block ends
    answer: Answer  # (text, result) of the module on the leased connections, fitted to the budget


async def on_one_cursor(module: ModuleType, params: BaseModel, leased: list[Leased], ctx: Context
                        ) -> tuple[str, BaseModel]:
    """The module's run (and findings) on a cursor of the one leased connection."""
    return await run_on_cursor(
        leased[0].con,
        lambda cur: budget.fit(run_skill(cur, module, params), module, params, budget.server_budget()), ctx)


async def measured_then_compared(module: ModuleType, params: BaseModel, leased: list[Leased], ctx: Context
                                 ) -> tuple[str, BaseModel]:
    """Each side measured on its own cursor (tools/diff/side.py) on the steps of params.range_name (a pair tool's
    Params have one), then module.compare(*sides, params)."""
    assert isinstance(params, (diff_profiles.Params, verify_fix.Params)), "the pair tools"
    steps = params.range_name
    sides = [await run_on_cursor(side.con, functools.partial(measure, pid=side.id, range_name=steps), ctx)
             for side in leased]
    return budget.fit(module.compare(*sides, params), module, params, budget.server_budget())


def tool_function(module: ModuleType, kind: Kind) -> Callable[..., Any]:
    """An async function with the module's Params as flat keyword parameters, returning its Result (as text and
    structured content); its `kind` names the kind, for tests."""
    name = tool_name(module)

    async def call(ctx: Context, **kwargs: Any) -> CallToolResult:
        async with AsyncExitStack() as held:
            leased = [await held.enter_async_context(kind.lease(ctx, kwargs[field])) for field in kind.fields]
            ids = {field: lease.id for field, lease in zip(kind.fields, leased, strict=True)}
            params = module.Params(**{**kwargs, **ids})
            text, result = await kind.answer(module, params, leased, ctx)
        return ui.with_view(text_result(text, result), ctx, name)

    call.kind = kind.name  # type: ignore[attr-defined]
    return signed(call, module)


def add_tools(mcp: MCPServer, modules: dict[str, ModuleType], kind: Kind) -> None:
    """Each module as the read-only tool of its name, of this kind."""
    for name, module in modules.items():
        mcp.add_tool(tool_function(module, kind), name=name, description=description(module), annotations=READ_ONLY,
                     structured_output=True)


def description(module: ModuleType) -> str:
    assert module.__doc__ is not None, f"{module.__name__} has no docstring, a tool's description"
    return inspect.cleandoc(module.__doc__)


def tool_name(module: ModuleType) -> str:
    return module.__name__.rsplit(".", 1)[-1]


def text_result(text: str, model: BaseModel) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=model.model_dump(mode="json"))


def signed(call: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    """`call` with the module's Params as its flat keyword signature and its Result as return type."""
    parameters = [*_flat_signature(module.Params),
                  inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    call.__signature__ = inspect.Signature(parameters, return_annotation=module.Result)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": module.Result}
    call.__name__ = tool_name(module)
    return call


_ANNOTATED: Any = Annotated  # subscripted with a field's annotation at run time, which mypy takes for a type


def _flat_signature(params_model: type[BaseModel]) -> list[inspect.Parameter]:
    out = []
    for name, info in params_model.model_fields.items():
        annotation = _ANNOTATED[info.annotation, Field(description=info.description, **_strict(info.annotation),
                                                      **_bounds(info))]
        default = inspect.Parameter.empty if info.is_required() else info.default
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return out


def _strict(annotation: Any) -> dict[str, Any]:
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
