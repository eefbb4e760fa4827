"""Transport security over real connections: loopback by default, a bearer token on every request
otherwise, Host/Origin (DNS-rebinding) checks on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx2
import pytest
from conftest import FIXTURES, kernels_in_export
from httpserver import serving
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from stallhound.server.http import TOKEN_ENV, transport_security

TOKEN = "s3cret-token-for-tests"
MOCK = FIXTURES / "nsysai_mock.sqlite"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "0"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}



def _post(url: str, **headers: str) -> httpx2.Response:
    return httpx2.post(url, json=INITIALIZE, headers={**HEADERS, **headers}, timeout=30)


def _with_token(url: str, token: str, mode: str = "legacy") -> Client:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(url, http_client=http), mode=mode)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_http_security_refuses_a_non_loopback_bind_without_a_token(host, cache_root):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    done = subprocess.run([sys.executable, "-m", "stallhound", "serve", "--transport", "http", "--host",
                           host, "--root", str(FIXTURES), "--cache-dir", str(cache_root)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert f"binding {host} exposes the server" in done.stderr and "--token or $STALLHOUND_TOKEN" in done.stderr


@pytest.mark.anyio
@pytest.mark.parametrize("given", ["flag", "env"])
async def test_http_security_token_checked_on_every_request(given, cache_root):
    args, env = (("--token", TOKEN), None) if given == "flag" else ((), {TOKEN_ENV: TOKEN})
    with serving(FIXTURES, cache_root, *args, env=env) as served:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}x"},
                        {"Authorization": TOKEN}):
            refused = _post(served.url, **headers)
            assert refused.status_code == 401, headers
            assert "\n" not in refused.text and json.loads(refused.text)["error"] == "invalid_token"
        assert httpx2.get(served.url, timeout=30).status_code == 401
        assert httpx2.delete(served.url, timeout=30).status_code == 401

        for mode in ("legacy", "auto"):
            with pytest.raises(ExceptionGroup) as anonymous:
                async with Client(served.url, mode=mode) as client:
                    await client.call_tool("list_profiles", {})
            assert anonymous.value.subgroup(lambda e: isinstance(e, MCPError)) is not None
        for mode in ("legacy", "auto"):
            async with _with_token(served.url, TOKEN, mode) as client:
                result = await client.call_tool("top_kernels", {"profile": str(MOCK)})
            assert not result.is_error and result.structured_content["kernel_count"] == kernels_in_export(MOCK)
        assert _post(served.url, Authorization=f"Bearer {TOKEN}").status_code == 200


@pytest.mark.anyio
async def test_http_security_host_and_origin_checks_stay_on(cache_root):
    with serving(FIXTURES, cache_root, "--token", TOKEN) as served:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert _post(served.url, Host=f"evil.example:{served.port}", **auth).status_code == 421
        assert _post(served.url, Origin="http://evil.example", **auth).status_code == 403
        assert _post(served.url, Origin=f"http://localhost:{served.port}", **auth).status_code == 200
    with serving(FIXTURES, cache_root) as served:  # loopback without a token: the SDK's defaults
        assert _post(served.url, Host=f"evil.example:{served.port}").status_code == 421
        assert _post(served.url).status_code == 200


def test_http_security_a_non_loopback_bind_allows_its_own_address_and_named_hosts():
    bound = transport_security("10.1.2.3", ["gpu-box.lan"])
    assert bound.enable_dns_rebinding_protection
    assert {"10.1.2.3:*", "gpu-box.lan:*", "127.0.0.1:*"} <= set(bound.allowed_hosts)
    assert "http://gpu-box.lan:*" in bound.allowed_origins
    everywhere = transport_security("0.0.0.0", [])
    assert everywhere.enable_dns_rebinding_protection and "0.0.0.0:*" not in everywhere.allowed_hosts
