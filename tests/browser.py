"""Headless Chromium for the report tests: the page's DOM after its scripts ran, its console errors, a screenshot.

One process per page (`--dump-dom` with `--enable-logging=stderr`, or `--screenshot`), no driver: robust on a
small CI box. `make test` installs Debian's chromium package when it is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

WINDOW = (1400, 2400)  # px: wide enough for the timeline's 1,110 viewBox units, tall enough for two devices
TIMEOUT_S = 120  # a cold chromium start on a busy 2-core box takes seconds, not minutes
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\] (.*)")  # chromium's log line for a console message


def _chromium() -> str:
    found = shutil.which("chromium")
    if not found:
        pytest.fail("chromium is not installed: run `make test` (it installs Debian's chromium package)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={WINDOW[0]},{WINDOW[1]}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)


def dom(page: Path, *flags: str) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, the console messages it logged)."""
    done = _run("--enable-logging=stderr", "--v=0", *flags, "--dump-dom", page.resolve().as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [m.group(1) for m in CONSOLE.finditer(done.stderr)]


def screenshot(page: Path, out: Path) -> tuple[int, int]:
    """Write a PNG of the page to `out`; its (width, height) from the PNG header."""
    done = _run(f"--screenshot={out}", page.resolve().as_uri())
    assert done.returncode == 0 and out.exists(), done.stderr[-2000:]
    header = out.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
