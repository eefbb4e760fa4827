"""End-to-end: the MCP server through real clients (in-process SDK client in both protocol modes,
a stdio subprocess, streamable HTTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import conftest
import jsonschema
import pytest
from conftest import FIXTURE_FILES, FIXTURES, text_of
from httpserver import serving
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from stallhound.analysis.contracts import run_skill
from stallhound.server import budget
from stallhound.server.app import build_server
from stallhound.tools import JOB_TOOL_NAMES, PAIR_TOOL_NAMES, TOOL_NAMES

LIFECYCLE_TOOLS = {"load_profile", "list_profiles", "close_profile", "load_job", "list_jobs", "close_job",
                   "cancel_load"}
ALL_TOOLS = set(TOOL_NAMES) | set(PAIR_TOOL_NAMES) | set(JOB_TOOL_NAMES) | LIFECYCLE_TOOLS
MODES = ["legacy", "auto"]
REQUIRED_ARGS = {**conftest.REQUIRED_ARGS, "call_sites": {"events": "api_calls", "full_stacks": 5}}  # its largest



@pytest.fixture(scope="module")
def server(cache_root):
    return build_server([FIXTURES], cache_dir=cache_root)



@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_server_lists_every_tool_with_schemas(server, mode):
    async with Client(server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == ALL_TOOLS
    for tool in tools.values():
        assert tool.description and tool.output_schema, tool.name
        assert tool.annotations.read_only_hint is (tool.name not in ("close_profile", "close_job", "cancel_load"))
        for name, prop in tool.input_schema["properties"].items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"


def test_server_every_tool_is_in_the_readme_and_every_analysis_is_cited_by_the_book():
    from stallhound import book
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert [t for t in sorted(ALL_TOOLS) if f"`{t}`" not in readme] == []
    cited = {s.tool for entry in book.load_book().values() for s in entry.signals}
    readers = {"describe_schema", "query_sql", "triage", "answer_questions", "triage_job",  # run or read the
               "call_sites"}  # others' detectors, or place their events in the program's code
    assert sorted(set(TOOL_NAMES + JOB_TOOL_NAMES) - readers - cited) == []


async def _every_tool(server, mode: str, fixture: Path) -> dict[str, tuple[bool, str, dict | None]]:
    """tool -> (is_error, text, structured content) for every single-profile tool on `fixture`, checked on the way:
    a result validates against the tool's output schema and its text and JSON each fit the budget uncut (every
    default result on every fixture: the tools' own tests need no size check of their own); an error
    (only where the profile has no data for the tool) is one sentence."""
    outcomes = {}
    async with Client(server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        loaded = await client.call_tool("load_profile", {"path": str(fixture)})
        assert not loaded.is_error, text_of(loaded)
        pid = loaded.structured_content["profile"]
        for name in TOOL_NAMES:
            result = await client.call_tool(name, {"profile": pid, **REQUIRED_ARGS.get(name, {})})
            text = text_of(result)
            if result.is_error:
                assert "\n" not in text and "Traceback" not in text, f"{name}: {text}"
            else:
                jsonschema.validate(result.structured_content, tools[name].output_schema)
                assert result.structured_content.get("cut_by") != "characters", f"{name}: its default result was cut"
                assert max(len(json.dumps(result.structured_content)), len(text)) <= budget.MAX_RESULT_CHARS, name
            outcomes[name] = (result.is_error, text, result.structured_content)
    return outcomes


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fixture", FIXTURE_FILES, ids=[p.stem for p in FIXTURE_FILES])
async def test_server_every_tool_on_every_fixture(server, mode, fixture, snapshot):
    """Schema, budget and one-sentence errors on every fixture in both protocol modes; the first line of each text
    (the headline a reader sees first: counts, window, verdict, or the error) is snapshotted, so a change to any
    figure in it shows up in a diff one line per tool."""
    outcomes = await _every_tool(server, mode, fixture)
    first_lines = {name: ("error: " if is_error else "") + text.split("\n", 1)[0]
                   for name, (is_error, text, _) in outcomes.items()}
    assert first_lines == snapshot


@pytest.mark.anyio
async def test_server_every_tool_whole_text_on_the_smallest_export(server, snapshot):
    """The whole text of every tool on nsysai_mock (2 kernels, 1 copy, 1 sync): short enough to review in full."""
    outcomes = await _every_tool(server, "legacy", FIXTURES / "nsysai_mock.sqlite")
    assert {name: text for name, (_, text, _) in outcomes.items()} == snapshot


@pytest.mark.anyio
async def test_server_errors_are_one_sentence_and_server_keeps_serving(server):
    async with Client(server) as client:
        outside = await client.call_tool("load_profile", {"path": "/etc/passwd"})
        assert outside.is_error and "outside the allowed roots" in text_of(outside)
        unknown = await client.call_tool("top_kernels", {"profile": "nope"})
        assert unknown.is_error and "no profile is loaded with id 'nope'" in text_of(unknown)
        path = str(FIXTURES / "nsysai_mock.sqlite")
        bad_device = await client.call_tool("top_kernels", {"profile": path, "device": 7})
        assert bad_device.is_error and "device 7 is not in this profile (devices: 0)" in text_of(bad_device)
        bad_window = await client.call_tool("gpu_utilization", {"profile": path, "start_ns": 10, "end_ns": 5})
        assert bad_window.is_error and "empty" in text_of(bad_window)
        refused = await client.call_tool("query_sql", {"profile": path, "sql": "COPY kernels TO '/tmp/x.csv'"})
        assert refused.is_error and "only SELECT" in text_of(refused)
        still = await client.call_tool("top_kernels", {"profile": path})
        assert not still.is_error and still.structured_content["kernel_count"] == 2
        listed = await client.call_tool("list_profiles", {})
        assert "nsysai_mock" in [p["profile"] for p in listed.structured_content["profiles"]]
        closed = await client.call_tool("close_profile", {"profile": "nsysai_mock"})
        assert closed.structured_content == {"closed": "nsysai_mock"}
        listed = await client.call_tool("list_profiles", {})
        assert "nsysai_mock" not in [p["profile"] for p in listed.structured_content["profiles"]]


@pytest.mark.anyio
async def test_server_load_reports_progress(tmp_path):
    server = build_server([FIXTURES], cache_dir=tmp_path)
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async with Client(server, mode="legacy") as client:
        result = await client.call_tool("load_profile", {"path": str(FIXTURES / "nsysai_mock.sqlite")},
                                        progress_callback=on_progress)
    assert not result.is_error
    assert seen and seen[-1][0] == seen[-1][1] and all(t == seen[0][1] for _, t, _ in seen)


@pytest.mark.anyio
async def test_server_resources_and_prompts(server):
    async with Client(server) as client:
        uris = {str(r.uri) for r in (await client.list_resources()).resources}
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert {"stallhound://book", "stallhound://questions", "stallhound://schema"} <= uris
        assert {"stallhound://book/{id}", "stallhound://questions/{phase}", "stallhound://profiles/{id}"} <= templates
        entry = await client.read_resource("stallhound://book/gpu-bubbles")
        assert "GPU bubbles" in entry.contents[0].text
        phase = await client.read_resource("stallhound://questions/communication")
        assert "q22" in phase.contents[0].text
        schema = await client.read_resource("stallhound://schema")
        assert "kernels:" in schema.contents[0].text
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert prompts == {"triage_profile", "explain_finding", "verify_fix"}
        prompt = await client.get_prompt("triage_profile", {"path": "/profiles/run.sqlite"})
        assert "/profiles/run.sqlite" in prompt.messages[0].content.text
        from mcp_types import ResourceTemplateReference
        done = await client.complete(ResourceTemplateReference(uri="stallhound://book/{id}"),
                                     {"name": "id", "value": "nccl-"})
        assert done.completion.values == ["nccl-on-compute-stream", "nccl-serialization", "nccl-straggler"]


@pytest.mark.anyio
async def test_server_stdio_round_trip(cache_root):
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "stallhound", "serve", "--root", str(FIXTURES),
                                         "--cache-dir", str(cache_root)])
    async with Client(params) as client:
        result = await client.call_tool("top_kernels", {"profile": str(FIXTURES / "nsysai_mock.sqlite"), "limit": 1})
    assert not result.is_error
    assert result.structured_content["kernel_count"] == 2 and len(result.structured_content["rows"]) == 1


@pytest.mark.anyio
async def test_server_streamable_http_round_trip(cache_root):
    with serving(FIXTURES, cache_root) as served:
        async with Client(served.url) as client:
            result = await client.call_tool("gpu_utilization", {"profile": str(FIXTURES / "nsysai_mock.sqlite")})
    assert not result.is_error and result.structured_content["scope"]["devices"] == [0]


INSPECTOR = Path(__file__).resolve().parents[1] / ".tools/inspector/node_modules/.bin/mcp-inspector"


def _inspector(cache_root, *args: str) -> dict:
    if not INSPECTOR.exists():
        pytest.fail("the MCP Inspector is not installed: run `make test` (it installs it with npm)")
    cmd = [str(INSPECTOR), "--cli", sys.executable, "-m", "stallhound", "serve", "--root", str(FIXTURES),
           "--cache-dir", str(cache_root), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "CI": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_server_inspector_lists_tools_and_calls(cache_root):
    listed = _inspector(cache_root, "--method", "tools/list")
    assert {t["name"] for t in listed["tools"]} == ALL_TOOLS
    path = str(FIXTURES / "nsysai_h100_2gpu_1s.sqlite")
    for tool in ("top_kernels", "gpu_idle_gaps", "triage"):
        called = _inspector(cache_root, "--method", "tools/call", "--tool-name", tool, "--tool-arg", f"profile={path}")
        assert not called.get("isError"), called
        assert called["structuredContent"]


def test_server_inspector_reads_resources_and_prompts(cache_root):
    resources = _inspector(cache_root, "--method", "resources/list")
    assert "stallhound://book" in {r["uri"] for r in resources["resources"]}
    entry = _inspector(cache_root, "--method", "resources/read", "--uri", "stallhound://book/nccl-straggler")
    assert "straggler" in entry["contents"][0]["text"].lower()
    prompts = _inspector(cache_root, "--method", "prompts/list")
    assert {p["name"] for p in prompts["prompts"]} == {"triage_profile", "explain_finding", "verify_fix"}


@pytest.fixture(scope="module")
def eight_gpus(tmp_path_factory, cache_root):
    from stallhound import synth
    from stallhound.formats import open_profile
    path = tmp_path_factory.mktemp("eight") / "demo8.sqlite"
    synth.write_sample(path, synth.demo(devices=8))
    profile = open_profile(path, cache_dir=cache_root)
    yield profile
    profile.close()


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_server_default_results_fit_the_budget_on_eight_gpus(eight_gpus, name):
    """Per-device rows and findings grow with the node: a full 8-GPU node must still fit a model's context."""
    from stallhound.tools import skills
    module = skills()[name]
    result = run_skill(eight_gpus.con, module, module.Params(profile="p", **REQUIRED_ARGS.get(name, {})))
    assert len(result.model_dump_json()) + len(module.render(result)) < budget.MAX_RESULT_CHARS
