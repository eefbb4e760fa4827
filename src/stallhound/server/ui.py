"""The MCP Apps extension (io.modelcontextprotocol/ui) through the SDK's `Apps`: the tools that have a picture, each
bound to its ui:// view, and the views' HTML.

A host that shows MCP Apps reads the tool's `_meta.ui.resourceUri`, loads the view and hands it the tool result
(its structured content) by postMessage; the tool returns the same text and structured result to every client,
and names its view in the result's `_meta` too when the client negotiated the extension.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.apps import Apps, client_supports_apps
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult

from stallhound.report import page

TIMELINE_URI = "ui://stallhound/timeline.html"
VIEWS = {"show_timeline": TIMELINE_URI}  # tool -> the ui:// view that draws its result


def with_view(result: CallToolResult, ctx: Context, tool: str) -> CallToolResult:
    """`result` naming the tool's view in its `_meta` when the tool has one and the client negotiated MCP Apps."""
    if tool not in VIEWS or not client_supports_apps(ctx):
        return result
    return result.model_copy(update={"meta": {**(result.meta or {}), "ui": {"resourceUri": VIEWS[tool]}}})


def extension(tools: dict[str, tuple[Callable[..., Any], str]], **tool_kwargs: Any) -> Apps:
    """The Apps extension serving `tools` (name -> (MCP tool function, description), one per VIEWS entry) with their
    views; `tool_kwargs` (annotations, structured_output) go to every tool."""
    apps = Apps()
    apps.add_html_resource(TIMELINE_URI, page.timeline_view(), name="timeline", title="stallhound timeline",
                           description="Per-device lanes of compute, copies, NCCL and idle gaps, with the steps "
                                       "above; zoom by wheel or drag. Drawn from a show_timeline result.",
                           prefers_border=True)
    for name, (fn, description) in tools.items():
        apps.tool(resource_uri=VIEWS[name], name=name, description=description, **tool_kwargs)(fn)
    return apps
