"""Streamable HTTP security: loopback unless a bearer token guards the server; Host/Origin checks always on.

Both are the SDK's own machinery: its bearer middleware (with a static-token verifier) answers 401 to
any request without the token, and its transport security refuses unexpected Host/Origin headers.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings

from stallhound.model.errors import InsecureBind, WeakToken

TOKEN_ENV = "STALLHOUND_TOKEN"
# A token is all that guards a server reachable from other machines: 16 characters of `secrets.token_urlsafe()` carry
# 96 bits, beyond guessing over a network; fewer, or a few characters repeated, can be guessed.
MIN_TOKEN_CHARS = 16
MIN_TOKEN_DISTINCT = 8
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe())'"
LOOPBACK_NAMES = ("localhost",)
CLIENT_ID = "stallhound-token"  # the one principal a static token stands for


class StaticToken:
    """The SDK's TokenVerifier for one shared secret, compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token=token, client_id=CLIENT_ID, scopes=[])
        return None


def check_token(token: str) -> None:
    """Refuse a token that cannot guard the server (its length and characters, never its text, are said)."""
    if len(token) < MIN_TOKEN_CHARS or len(set(token)) < MIN_TOKEN_DISTINCT or not token.isprintable() or any(
            c.isspace() for c in token):
        raise WeakToken(f"the bearer token ({len(token)} characters, {len(set(token))} different) is too weak to guard "
                        f"the server: use at least {MIN_TOKEN_CHARS} characters, {MIN_TOKEN_DISTINCT} of them "
                        f"different, no spaces, as `{MAKE_TOKEN}` makes, in --token or ${TOKEN_ENV}")


def bearer_auth(token: str | None) -> dict[str, Any]:
    """MCPServer arguments that make every HTTP request carry `token` (none: no auth); a weak token is refused."""
    if not token:
        return {}
    check_token(token)
    # The SDK's auth settings name an OAuth issuer; a static token has none to advertise, and without
    # resource_server_url the SDK publishes no metadata, so this URL is never served or followed.
    settings = AuthSettings(issuer_url="http://localhost", resource_server_url=None)
    return {"auth": settings, "token_verifier": StaticToken(token)}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    if token:
        check_token(token)
    if not token and not is_loopback(host):
        raise InsecureBind(f"binding {host} exposes the server beyond this machine: set a bearer token with "
                           f"--token or ${TOKEN_ENV}, or bind 127.0.0.1")


def _bound_name(host: str) -> list[str]:
    """The Host name a client uses for the bound address (none for loopback or all-interfaces binds)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return [host]
    if address.is_loopback or address.is_unspecified:
        return []
    return [f"[{address}]" if address.version == 6 else str(address)]


def transport_security(host: str, allowed_hosts: list[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection: Host must be a loopback name, the bound address or an allowed name."""
    names = ["127.0.0.1", "localhost", "[::1]", *allowed_hosts, *_bound_name(host)]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{n}:*" for n in names],
        allowed_origins=[f"{scheme}://{n}:*" for n in names for scheme in ("http", "https")],
    )
