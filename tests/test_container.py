"""The container (issue 34 item 5): the Dockerfile builds, and its image serves over streamable HTTP with a bearer
token: an MCP client with the token loads a fixture mounted at /profiles and gets the same kernel count as the
export; a client without it is refused; without a token the image refuses to bind all interfaces. Docker must be
able to build and run images here; where it is not (no client, or no daemon), the module skips with one line."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from conftest import FIXTURES, kernels_in_export
from httpserver import free_port
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parents[1]
PROFILE = FIXTURES / "nsysai_mock.sqlite"
TOKEN = "container-token-for-tests"
BUILD_TIMEOUT_S = 900  # a first build pulls python:3.11-slim and the dependencies' wheels
START_TIMEOUT_S = 60


def _docker_ready() -> str | None:
    """Why Docker can't run the test here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    return None if info.returncode == 0 else "the Docker daemon is not reachable here"


_WHY_NOT = _docker_ready()
if _WHY_NOT is not None:
    pytest.skip(f"container test: {_WHY_NOT}", allow_module_level=True)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    tag = f"stallhound-test:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ROOT)], check=True, timeout=BUILD_TIMEOUT_S,
                   capture_output=True)
    yield tag
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def _run(image: str, port: int, *env: str) -> str:
    done = subprocess.run(["docker", "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:8000",
                           "-v", f"{PROFILE.parent}:/profiles:ro", *env, image,
                           "--transport", "http", "--host", "0.0.0.0", "--port", "8000"],
                          check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _wait_up(url: str, container: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            httpx2.get(url, timeout=2)
            return
        except httpx2.TransportError:
            time.sleep(0.5)
    logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
    raise AssertionError(f"the container did not serve within {START_TIMEOUT_S} s: {logs.stderr[-2000:]}")


@pytest.mark.anyio
async def test_container_serves_http_with_a_token(image):
    port = free_port()
    container = _run(image, port, "-e", f"STALLHOUND_TOKEN={TOKEN}")
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        _wait_up(url, container)
        assert httpx2.get(url, timeout=10).status_code == 401
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        async with Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool("top_kernels", {"profile": f"/profiles/{PROFILE.name}"})
        assert not result.is_error and result.structured_content["kernel_count"] == kernels_in_export(PROFILE)
    finally:
        subprocess.run(["docker", "stop", container], capture_output=True)


def test_container_refuses_all_interfaces_without_a_token(image):
    done = subprocess.run(["docker", "run", "--rm", image, "--transport", "http", "--host", "0.0.0.0"],
                          capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert done.returncode != 0 and "--token or $STALLHOUND_TOKEN" in done.stderr
