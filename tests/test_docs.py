"""The README's tool table and `stallhound tools` come from the tools the server registers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mcp.client import Client

from stallhound import tools
from stallhound.cli import docs
from stallhound.server.app import build_server

README = Path(__file__).resolve().parents[1] / "README.md"
LIFECYCLE = {"load_profile", "list_profiles", "close_profile"}


@pytest.fixture(scope="module")
def summaries() -> list[tuple[str, str]]:
    return docs.tool_summaries()


def test_docs_readme_tool_table_is_the_generated_one(summaries):
    readme = README.read_text(encoding="utf-8")
    assert docs.with_table(readme, summaries) == readme, "README's tool table is out of date: run `make docs`"


@pytest.mark.anyio
async def test_docs_list_every_tool_a_client_sees_from_every_registry(summaries, tmp_path):
    async with Client(build_server([tmp_path], cache_dir=tmp_path)) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
    registries = (set(tools.TOOL_NAMES) | set(tools.PAIR_TOOL_NAMES) | set(getattr(tools, "JOB_TOOL_NAMES", ()))
                  | LIFECYCLE)
    assert [name for name, _ in summaries] == sorted(listed, key=[n for n, _ in summaries].index)
    assert {name for name, _ in summaries} == listed and registries <= listed
    assert all(line and "\n" not in line and "|" not in line for _, line in summaries)
    table = dict(summaries)
    assert table["gpu_idle_gaps"] == "Where does each GPU sit idle, for how long, and why?"
    assert table["load_profile"].startswith("Load a profile")


def test_docs_cli_tools_prints_one_line_per_tool(summaries):
    done = subprocess.run([sys.executable, "-m", "stallhound", "tools"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [name for name, _ in summaries]
    assert lines[0].split(None, 1)[1] == summaries[0][1]


def test_docs_table_needs_its_markers():
    with pytest.raises(ValueError, match="no tool table markers"):
        docs.with_table("# a README without the markers\n", [("x", "y")])
    updated = docs.with_table(f"intro\n{docs.BEGIN}\nold table\n{docs.END}\nrest\n", [("a_tool", "Does a | b.")])
    assert updated == (f"intro\n{docs.BEGIN}\n| tool | answers |\n|---|---|\n| `a_tool` | Does a \\| b. |\n"
                       f"{docs.END}\nrest\n")
