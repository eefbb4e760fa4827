"""Errors as MCP errors, in one place: the server registers every tool, resource and prompt handler through
`converting`, so our named errors (model/errors.py) reach a client as their one sentence with no traceback, as the
error the SDK passes on for that kind of handler; and a tool's invalid arguments are worded as one sentence too."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, Icon, InputRequiredResult, ToolAnnotations
from pydantic import ValidationError

from stallhound.model.errors import StallhoundError
from stallhound.server.validation import explain, unknown_arguments

if TYPE_CHECKING:
    from stallhound.server.jobs import JobStore
    from stallhound.server.store import ProfileStore

F = TypeVar("F", bound=Callable[..., Any])
MakeError = Callable[[str], Exception]  # an MCP error from our error's sentence

AS_TOOL_ERROR: MakeError = ToolError
AS_RESOURCE_ERROR: MakeError = ResourceError
AS_PROMPT_ERROR: MakeError = functools.partial(MCPError, INVALID_PARAMS)  # passes the SDK's prompt wrapping untouched
TOOL_ERROR = "Error executing tool {tool}: {message}"  # how the SDK words every other failed call


@contextmanager
def converted(to_mcp: MakeError) -> Iterator[None]:
    """Inside the block, a StallhoundError is raised as to_mcp(its sentence)."""
    try:
        yield
    except StallhoundError as exc:
        raise to_mcp(str(exc)) from exc


def converting(fn: F, to_mcp: MakeError) -> F:
    """`fn` (sync or async, its signature kept for the SDK) with its errors `converted`; it names `to_mcp` as
    `converts_to`, which tests read."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            with converted(to_mcp):
                return await fn(*args, **kwargs)
    else:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with converted(to_mcp):
                return fn(*args, **kwargs)
    wrapped.converts_to = to_mcp  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]


class StallhoundMCP(MCPServer):
    """The MCP server: every handler registered through `converting`, and a tool's invalid arguments worded in one
    sentence naming the argument and what it may be. `handlers` holds what was registered, by (kind, name)."""

    store: ProfileStore  # set by build_server, for resources, prompts and tests
    jobs: JobStore  # set by build_server, for tests

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.handlers: dict[tuple[str, str], Callable[..., Any]] = {}
        super().__init__(*args, **kwargs)  # registers the extensions' tools, through add_tool

    def add_tool(self, fn: Callable[..., Any], name: str | None = None, title: str | None = None,
                 description: str | None = None, annotations: ToolAnnotations | None = None,
                 icons: list[Icon] | None = None, meta: dict[str, Any] | None = None,
                 structured_output: bool | None = None) -> None:
        handler = converting(fn, AS_TOOL_ERROR)
        self.handlers["tool", name or fn.__name__] = handler
        super().add_tool(handler, name=name, title=title, description=description, annotations=annotations,
                         icons=icons, meta=meta, structured_output=structured_output)

    def resource(self, uri: str, **kwargs: Any) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self.handlers["resource", uri] = handler = converting(fn, AS_RESOURCE_ERROR)
            super(StallhoundMCP, self).resource(uri, **kwargs)(handler)
            return fn
        return register

    def prompt(self, name: str | None = None, title: str | None = None, description: str | None = None,
               icons: list[Icon] | None = None) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self.handlers["prompt", name or fn.__name__] = handler = converting(fn, AS_PROMPT_ERROR)
            super(StallhoundMCP, self).prompt(name, title=title, description=description, icons=icons)(handler)
            return fn
        return register

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None
                        ) -> CallToolResult | InputRequiredResult:
        schema = self._tool_input_schema(name) or {}
        valid = list(schema.get("properties", {}))
        extra = [key for key in arguments if key not in valid]
        if schema and extra:
            raise ToolError(TOOL_ERROR.format(tool=name, message=unknown_arguments(extra, valid)))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc, UnexpectedToolError) or not isinstance(exc.__cause__, ValidationError):
                raise
            raise ToolError(TOOL_ERROR.format(tool=name, message=explain(exc.__cause__, schema))) from exc.__cause__
