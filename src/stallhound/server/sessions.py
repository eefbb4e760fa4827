"""Which MCP session a request belongs to, so that each session lists and closes only its own profiles.

A handshake connection (stdio, or streamable HTTP with an Mcp-Session-Id) is one session from
`initialize` until it ends. The 2026-07-28 protocol has no sessions: each HTTP request stands alone,
so those requests share one sessionless set of ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mcp.server.connection import Connection
from mcp.server.mcpserver import Context
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from stallhound.formats.registry import profile_suffixes

if TYPE_CHECKING:
    from stallhound.server.store import ProfileStore

STATE_KEY = "stallhound.session"
ID_CHARS = re.compile(r"[^a-z0-9_-]+")
MAX_ID_CHARS = 32
# torch.profiler names its traces NAME.pt.trace.json(.gz); an id leaves that whole ending out, and the registry's
# suffixes do not say so (they are what picks a file, and any .json may be a trace).
TRACE_ENDINGS = (".pt.trace.json.gz", ".pt.trace.json")
# File endings an id leaves out, longest first: every format's suffixes and the endings above.
ID_SUFFIXES = tuple(sorted({*TRACE_ENDINGS, *profile_suffixes()}, key=len, reverse=True))


@dataclass
class Session:
    """The profiles one MCP session loaded: its own ids, each naming a file."""

    name: str
    ids: dict[str, Path] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)

    def id_of(self, path: Path) -> str | None:
        return next((pid for pid, p in self.ids.items() if p == path), None)

    def add(self, path: Path, fingerprint: str) -> str:
        pid = self.id_of(path)
        if pid is None:
            base = ID_CHARS.sub("-", _stem(path.name.lower())).strip("-")[:MAX_ID_CHARS] or "profile"
            pid, n = base, 1
            while pid in self.ids:
                n += 1
                pid = f"{base}-{n}"
            self.ids[pid] = path
        self.fingerprints[pid] = fingerprint
        return pid

    def listed(self) -> str:
        return ", ".join(self.ids) or "none yet"


def _stem(name: str) -> str:
    """The file name without its profile ending (rank0.pt.trace.json.gz -> rank0), or without its last suffix."""
    ending = next((e for e in ID_SUFFIXES if name.endswith(e) and len(name) > len(e)), None)
    return name[:-len(ending)] if ending else Path(name).stem


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
