"""Which MCP session a request belongs to, so that each session lists and closes only its own profiles.

A handshake connection (stdio, or streamable HTTP with an Mcp-Session-Id) is one session from
`initialize` until it ends. The 2026-07-28 protocol has no sessions: each HTTP request stands alone,
so those requests share one sessionless set of ids.
"""

from __future__ import annotations

from mcp.server.connection import Connection
from mcp.server.mcpserver import Context
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from nsightful.server.store import ProfileStore, Session

STATE_KEY = "nsightful.session"


def _connection(ctx: Context) -> Connection:
    # The SDK keeps per-connection state and teardown on Connection (`state`, `exit_stack`), but the
    # MCPServer Context does not expose it yet; its ServerSession holds it.
    return ctx.request_context.session._connection  # noqa: SLF001


def session_of(store: ProfileStore, ctx: Context) -> Session:
    """This request's session in `store`, opened on its connection's first use and ended with it."""
    connection = _connection(ctx)
    if connection.client_params is None or connection.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return store.sessionless
    session = connection.state.get(STATE_KEY)
    if session is None:
        session = connection.state[STATE_KEY] = store.open_session(connection.session_id or "stdio")
        connection.exit_stack.callback(store.end_session, session)
    return session
