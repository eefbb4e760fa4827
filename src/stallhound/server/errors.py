"""Errors as MCP errors, in one place: the server registers every tool, resource and prompt handler through
`converting`, so our named errors (model/errors.py) reach a client as their one sentence with no traceback, as the
error the SDK passes on for that kind of handler; and a tool's invalid arguments are worded as one sentence too.
Any other exception is a defect of ours: the client gets one sentence naming its input and what to do, and the
server's log (stderr) gets the traceback."""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    CompleteRequestParams,
    CompleteResult,
    Completion,
    Icon,
    InputRequiredResult,
    ToolAnnotations,
)
from pydantic import ValidationError

from stallhound.model.errors import StallhoundError, echo, said
from stallhound.server.validation import explain, out_of_range, unknown_arguments

if TYPE_CHECKING:
    from stallhound.server.jobs import JobStore
    from stallhound.server.store import ProfileStore

F = TypeVar("F", bound=Callable[..., Any])
MakeError = Callable[[str], Exception]  # an MCP error from our error's sentence

AS_TOOL_ERROR: MakeError = ToolError
AS_RESOURCE_ERROR: MakeError = ResourceError
AS_PROMPT_ERROR: MakeError = functools.partial(MCPError, INVALID_PARAMS)  # passes the SDK's prompt wrapping untouched
TOOL_ERROR = "Error executing tool {tool}: {message}"  # how the SDK words every other failed call
# The arguments that name what a call is about, in the order an unforeseen error names the first one given.
SUBJECTS = ("profile", "path", "before", "after", "paths", "job", "id", "phase", "finding")

log = logging.getLogger("stallhound")


def unforeseen(what: str, given: dict[str, Any], exc: BaseException) -> str:
    """The one sentence a client gets for an exception we did not foresee; the traceback goes to the server's log."""
    subject = next((f"{key} {echo(given[key])}" for key in SUBJECTS if given.get(key) is not None), "its arguments")
    log.error("%s failed on %s", what, subject, exc_info=exc)
    return (f"{what} failed on {subject} with an error stallhound did not foresee ({type(exc).__name__}; the server "
            "logged the details): check that the input is a profile this server reads and try again, and if it "
            "persists report it with the server's log")


Hide = Callable[[str], str]  # a message without the server's own folders (StallhoundMCP.hidden)


def private_folders(folders: dict[Path, str], roots: list[Path]) -> dict[str, str]:
    """The server's own folders (its cache, its temporary folder) a message may name, each -> the words a client is
    told instead; a folder holding a root is left as it is, as the client was told the roots."""
    return {str(f): words for f, words in folders.items() if not any(r.is_relative_to(f) for r in roots)}


@contextmanager
def converted(to_mcp: MakeError, what: str = "the call", given: dict[str, Any] | None = None,
              hide: Hide = str) -> Iterator[None]:
    """Inside the block, a StallhoundError is raised as to_mcp(its sentence, `hide`'s), and any other exception (but
    the SDK's own MCP errors) as to_mcp(`unforeseen`'s sentence about `what` on the arguments `given`)."""
    try:
        yield
    except StallhoundError as exc:
        raise to_mcp(said(hide(str(exc)))) from exc
    except (MCPError, ToolError, ResourceError):
        raise
    except Exception as exc:  # noqa: BLE001 - every defect of ours ends as one sentence, its traceback logged
        raise to_mcp(unforeseen(what, given or {}, exc)) from exc


def converting(fn: F, to_mcp: MakeError, what: str = "the call", hide: Hide = str) -> F:
    """`fn` (sync or async, its signature kept for the SDK) with its errors `converted` (`what` names it in an
    unforeseen error's sentence); it names `to_mcp` as `converts_to`, which tests read."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            with converted(to_mcp, what, kwargs, hide):
                return await fn(*args, **kwargs)
    else:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with converted(to_mcp, what, kwargs, hide):
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
        self.private: dict[str, str] = {}  # private_folders, set by build_server
        super().__init__(*args, **kwargs)  # registers the extensions' tools, through add_tool

    def hidden(self, message: str) -> str:
        """`message` with each of the server's own folders, and what follows it in the same path, in words: a
        client has no business with paths outside the roots."""
        for folder, words in self.private.items():
            message = re.sub(re.escape(folder) + r"[^\s:;,()]*", words, message)
        return message

    def add_tool(self, fn: Callable[..., Any], name: str | None = None, title: str | None = None,
                 description: str | None = None, annotations: ToolAnnotations | None = None,
                 icons: list[Icon] | None = None, meta: dict[str, Any] | None = None,
                 structured_output: bool | None = None) -> None:
        handler = converting(fn, AS_TOOL_ERROR, name or fn.__name__, self.hidden)
        self.handlers["tool", name or fn.__name__] = handler
        super().add_tool(handler, name=name, title=title, description=description, annotations=annotations,
                         icons=icons, meta=meta, structured_output=structured_output)

    def resource(self, uri: str, **kwargs: Any) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self.handlers["resource", uri] = handler = converting(fn, AS_RESOURCE_ERROR, f"reading {uri}", self.hidden)
            super(StallhoundMCP, self).resource(uri, **kwargs)(handler)
            return fn
        return register

    def prompt(self, name: str | None = None, title: str | None = None, description: str | None = None,
               icons: list[Icon] | None = None) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self.handlers["prompt", name or fn.__name__] = handler = converting(
                fn, AS_PROMPT_ERROR, f"the prompt {name or fn.__name__}", self.hidden)
            super(StallhoundMCP, self).prompt(name, title=title, description=description, icons=icons)(handler)
            return fn
        return register

    def completion(self) -> Callable[[F], F]:
        """As the SDK's decorator, with the request's Context passed to the handler as its fourth argument (the SDK's
        passes none), so that completions answer from the caller's session."""
        def register(fn: F) -> F:
            async def handler(request: ServerRequestContext, params: CompleteRequestParams) -> CompleteResult:
                ctx = Context(request_context=request, mcp_server=self)
                with converted(AS_PROMPT_ERROR, f"completing {params.argument.name}"):
                    found = await fn(params.ref, params.argument, params.context, ctx)
                return CompleteResult(completion=found or Completion(values=[]))
            self._lowlevel_server.add_request_handler("completion/complete", CompleteRequestParams, handler)
            return fn
        return register

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None
                        ) -> CallToolResult | InputRequiredResult:
        schema = self._tool_input_schema(name) or {}
        valid = list(schema.get("properties", {}))
        extra = [key for key in arguments if key not in valid]
        if schema and extra:
            raise ToolError(TOOL_ERROR.format(tool=name, message=said(unknown_arguments(extra, valid))))
        if (beyond := out_of_range(arguments, schema)) is not None:
            raise ToolError(TOOL_ERROR.format(tool=name, message=beyond))
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:  # the SDK's own steps around our handler (its result's conversion)
            raise ToolError(TOOL_ERROR.format(tool=name, message=unforeseen(name, arguments, exc.__cause__ or exc))
                            ) from exc
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            raise ToolError(TOOL_ERROR.format(tool=name, message=said(explain(exc.__cause__, schema)))
                            ) from exc.__cause__
