"""What registries and assistants read beside the package: server.json, stallhound's entry in the MCP registry,
checked against the registry's published schema and against what the server really takes and reads; and the agent
skill, whose tool calls must be the server's own tools with their own parameters.

The registry's schema is schemas/2025-12-11/server.schema.json of github.com/modelcontextprotocol/static (MIT
licence; published at release.server_json.SCHEMA_URL). Tests run offline and the project commits no copy of
others' files, so the schema test reads the copy in ../shared/schemas/ and skips with one line when it is not
there; its sha256 pins the published version."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import jsonschema
import pytest
from fixture_guard import FIXTURES_ROOT
from mcp.client import Client

from release import server_json
from release.meta import NAME, VERSION, mcp_name
from stallhound.cli.main import DEBUG_ENV, parser
from stallhound.server.app import build_server
from stallhound.server.http import TOKEN_ENV

ROOT = Path(__file__).resolve().parents[1]
SERVER_SCHEMA = FIXTURES_ROOT.parent / "schemas" / "server.schema.json"
SERVER_SCHEMA_SHA256 = "3fba09590c99f61735d234822279f4223fab9e300c0a81e81c91ab62a4114de0"  # as of static@a9ba437
SKILL = ROOT / "skills" / "stallhound" / "SKILL.md"
WORKFLOW = {"load_profile", "triage", "call_sites", "diff_profiles", "verify_fix"}  # what the skill must teach
TOOL_CALL = re.compile(r"`([a-z_]+)\(([^)`]*)\)`")  # `tool(param, param=...)` as the skill writes a call


def test_release_server_json_is_valid_against_the_registry_schema(tmp_path):
    if not SERVER_SCHEMA.is_file():
        pytest.skip(f"the MCP registry's server.json schema is not in {SERVER_SCHEMA.parent} (see this module)")
    raw = SERVER_SCHEMA.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == SERVER_SCHEMA_SHA256
    schema = json.loads(raw)
    assert schema["$id"] == server_json.SCHEMA_URL
    assert server_json.main([str(tmp_path / "server.json")]) == 0
    entry = json.loads((tmp_path / "server.json").read_text())
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    validator.validate(entry)
    assert not validator.is_valid({**entry, "description": "x" * 101})  # the registry's limit, held


def test_release_server_json_names_the_package_its_version_and_how_it_runs():
    entry = server_json.server_json()
    assert (entry["name"], entry["version"]) == (mcp_name(), VERSION)
    assert entry["name"] == "io.github.stallhound/stallhound"  # the README's mcp-name line, read once
    (package,) = entry["packages"]
    assert (package["registryType"], package["identifier"], package["version"]) == ("pypi", NAME, VERSION)
    assert package["transport"] == {"type": "stdio"}
    args: list[str] = []
    for arg in package["packageArguments"]:  # the command line a client builds from them, two folders given
        args += [arg["value"]] if arg["type"] == "positional" else [arg["name"], "/a", arg["name"], "/b"]
    parsed = parser().parse_args(args)
    assert parsed.command == "serve" and [str(p) for p in parsed.root] == ["/a", "/b"]


def test_release_server_json_lists_every_setting_the_server_reads():
    read = {name for path in (ROOT / "src" / "stallhound").rglob("*.py")
            for name in re.findall(r'"(STALLHOUND_[A-Z_]+)"', path.read_text(encoding="utf-8"))}
    listed = [v["name"] for v in server_json.server_json()["packages"][0]["environmentVariables"]]
    # the token is HTTP's, and the package runs on stdio; DEBUG_ENV prints a CLI command's traceback, which the server
    # logs on its own
    assert sorted(listed) == sorted(read - {TOKEN_ENV, DEBUG_ENV})


def _front_matter(text: str) -> dict[str, str]:
    head, sep, _ = text.removeprefix("---\n").partition("\n---\n")
    assert text.startswith("---\n") and sep, "SKILL.md starts with YAML front matter between --- lines"
    return dict(line.split(": ", 1) for line in head.splitlines())


@pytest.mark.anyio
async def test_release_skill_calls_only_the_servers_tools_with_their_parameters(tmp_path):
    text = SKILL.read_text(encoding="utf-8")
    meta = _front_matter(text)
    assert meta["name"] == NAME and 0 < len(meta["description"]) <= 1024  # the skills format's limits
    async with Client(build_server([tmp_path])) as client:
        params = {t.name: set(t.input_schema["properties"]) for t in (await client.list_tools()).tools}
    calls = [(name, [a.split("=")[0].strip() for a in args.split(",") if a.strip()])
             for name, args in TOOL_CALL.findall(text)]
    unknown = [(name, args) for name, args in calls if name not in params or not set(args) <= params[name]]
    assert not unknown, f"SKILL.md calls tools or parameters the server does not have: {unknown}"
    assert WORKFLOW <= {name for name, _ in calls}
