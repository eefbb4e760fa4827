"""What the release files share, each read from the one place it is written: the package's name, version,
description and Python from pyproject.toml; the registry name from the README's `mcp-name:` line, which the MCP
registry looks for in the package's description on PyPI to accept the entry."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
NAME: str = PROJECT["name"]
VERSION: str = PROJECT["version"]
DESCRIPTION: str = PROJECT["description"]
PYTHON: str = PROJECT["requires-python"]
MCP_NAME_LINE = re.compile(r"^<!-- mcp-name: (\S+) -->$", re.MULTILINE)


def mcp_name(readme: Path = README) -> str:
    found = MCP_NAME_LINE.findall(readme.read_text(encoding="utf-8"))
    if len(found) != 1:
        raise SystemExit(f"{readme} has {len(found)} `<!-- mcp-name: NAME -->` lines; the registry needs one")
    return found[0]
