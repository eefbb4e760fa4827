"""`stallhound serve --transport http` in a subprocess on a free loopback port, for tests and bench/load.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 30  # import, then uvicorn start, on a loaded 2-core machine
STOP_TIMEOUT_S = 10


@dataclass
class Served:
    url: str  # the MCP endpoint
    port: int
    proc: subprocess.Popen
    log: Path  # the server's stderr

    def peak_rss_mb(self) -> float:
        """The server process's peak resident memory so far (Linux VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("VmHWM is missing from /proc: peak memory is only measured on Linux")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(root: Path, cache_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """A running HTTP server reading profiles under `root`; extra `args` go to `stallhound serve`."""
    port = free_port()
    with tempfile.NamedTemporaryFile(prefix="stallhound-serve-", suffix=".log", delete=False) as log:
        cmd = [sys.executable, "-m", "stallhound", "serve", "--transport", "http", "--port", str(port),
               "--root", str(root), "--cache-dir", str(cache_dir), *args]
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {Path(log.name).read_text()[-2000:]}")
            time.sleep(0.1)
        yield Served(f"http://127.0.0.1:{port}/mcp", port, proc, Path(log.name))
    finally:
        proc.terminate()
        proc.wait(timeout=STOP_TIMEOUT_S)
        Path(log.name).unlink(missing_ok=True)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
