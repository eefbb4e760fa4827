"""Through real MCP clients: invalid arguments come back as one sentence, cancelled or abandoned calls stop
their work (threads and CPU), and explain_finding checks and completes its finding."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx2
import pytest
from conftest import FIXTURES, text_of
from httpserver import serving
from mcp.client import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, PromptReference

from stallhound.analysis import common
from stallhound.cli import main as cli
from stallhound.cli.calls import parse_params
from stallhound.model.errors import StallhoundError
from stallhound.server.app import build_server
from stallhound.server.validation import shown
from stallhound.tools import query_sql, top_kernels

MOCK = str(FIXTURES / "nsysai_mock.sqlite")
BIG = str(FIXTURES / "nsysai_h100_2gpu_1s.sqlite")  # 3,442 kernels: a triple self-join runs for minutes
HEAVY_SQL = "SELECT sum((a.start_ns + b.end_ns + c.start_ns) % 7) AS s FROM kernels a, kernels b, kernels c"
PROFILE_HELP = "Profile id returned by load_profile, or a path to an nsys .sqlite/.nsys-rep export"
SCOPED = "profile, device, start_ns, end_ns"
CANCEL_AFTER_S = 0.5
SETTLE_S = 0.5  # after a cancel, before CPU is measured: a stop takes a few interrupt polls
QUIET_WINDOW_S = 1.5
QUIET_CPU_S = 0.3  # CPU seconds allowed in the window: the unfixed query burns ~1.5 core-seconds of it
PROMPT_S = 2.0  # a next call after a cancel answers within this (the fixture's calls take ~0.05 s)
MODES = ["legacy", "auto"]



@pytest.fixture(scope="module")
def server(cache_root):
    return build_server([FIXTURES], cache_dir=cache_root)



EXACT = [
    ("top_kernels", {}, f"profile is required: {PROFILE_HELP}"),
    ("top_kernels", {"profile": MOCK, "limit": 0}, "limit must be an integer from 1 to 500 (got 0)"),
    ("top_kernels", {"profile": MOCK, "limit": "ten"}, "limit must be an integer from 1 to 500 (got 'ten')"),
    ("top_kernels", {"profile": MOCK, "offset": -1}, "offset must be an integer from 0 to 1000000 (got -1)"),
    ("top_kernels", {"profile": MOCK, "device": -1}, "device must be an integer of at least 0, or null (got -1)"),
    ("top_kernels", {"profile": MOCK, "device": True}, "device must be an integer of at least 0, or null (got true)"),
    ("top_kernels", {"profile": MOCK, "device": 1.5}, "device must be an integer of at least 0, or null (got 1.5)"),
    ("top_kernels", {"profile": MOCK, "device": "0"}, "device must be an integer of at least 0, or null (got '0')"),
    ("top_kernels", {"profile": MOCK, "per_device": 1}, "per_device must be true or false (got 1)"),
    ("top_kernels", {"profile": MOCK, "group_by": "size"},
     "group_by must be one of 'name', 'short_name' (got 'size')"),
    ("top_kernels", {"profile": MOCK, "bogus": 1, "limt": 2},
     f"'bogus', 'limt' are not parameters of this tool (parameters: {SCOPED}, group_by, per_device, limit, offset)"),
    ("query_sql", {"profile": MOCK}, "sql is required: One DuckDB SELECT/WITH query (or DESCRIBE of one) over the "
                                     "model tables (see describe_schema); bind no parameters"),
    ("query_sql", {"profile": MOCK, "sql": ""}, "sql must be a non-empty string (got '')"),
    ("query_sql", {"profile": MOCK, "sql": "SELECT 1", "timeout_s": 0},
     "timeout_s must be a number above 0 and up to 60 (got 0)"),
    ("query_sql", {"profile": MOCK, "sql": "SELECT 1", "timeout_s": True},
     "timeout_s must be a number above 0 and up to 60 (got true)"),
    ("find_kernels", {"profile": MOCK, "pattern": "x" * 501},
     f"pattern must be a string of 1 to 500 characters (got '{'x' * 56}...)"),
    ("find_kernels", {"profile": MOCK, "pattern": "gemm", "regex": "yes"}, "regex must be true or false (got 'yes')"),
    ("gpu_idle_gaps", {"profile": MOCK, "min_gap_ns": 5}, "min_gap_ns must be an integer of at least 1000 (got 5)"),
    ("gpu_utilization", {"profile": MOCK, "buckets": [1]}, "buckets must be an integer from 1 to 200 (got [1])"),
    ("answer_questions", {"profile": MOCK, "phase": 3}, "phase must be a string, or null (got 3)"),
    ("load_profile", {}, "path is required: Path of a profile (nsys .sqlite/.nsys-rep/.qdrep or torch.profiler "
                         ".json/.json.gz file), inside the server's allowed roots"),
    ("load_profile", {"path": 3}, "path must be a string (got 3)"),
    ("list_profiles", {"all": True}, "'all' is not a parameter of this tool (parameters: none)"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_server_errors_invalid_arguments_are_one_exact_sentence(server, mode):
    async with Client(server, mode=mode) as client:
        for tool, args, message in EXACT:
            result = await client.call_tool(tool, args)
            assert result.is_error and text_of(result) == f"Error executing tool {tool}: {message}", (tool, args)
        still = await client.call_tool("top_kernels", {"profile": MOCK, "device": 0, "limit": 1})
        whole = await client.call_tool("query_sql", {"profile": MOCK, "sql": "SELECT 1 AS x", "timeout_s": 5})
        unset = await client.call_tool("top_kernels", {"profile": MOCK, "device": None})
    assert not still.is_error and still.structured_content["kernel_count"] == 2
    assert whole.structured_content["rows"] == [[1]]  # an integer is a number, as JSON has it
    assert not unset.is_error and unset.structured_content["scope"]["devices"] == [0]


def _wrong_values(spec: dict) -> list:
    """Values of the wrong JSON type for a parameter's schema (bool for numbers: it must not pass as 1)."""
    kinds = {arm.get("type") for arm in spec.get("anyOf", [spec])}
    if kinds & {"integer", "number"}:
        return [True, "ten", [1]]
    if "boolean" in kinds:
        return ["yes", 1]
    return [5, {"a": 1}]


@pytest.mark.anyio
async def test_server_errors_every_tool_every_parameter_refuses_wrong_types(server):
    """Every parameter of every tool, given a wrong type: one line naming it and the value, nothing run."""
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
        checked = 0
        for tool in tools:
            base = {"profile": MOCK, "sql": "SELECT 1", "pattern": "gemm", "path": MOCK, "before": MOCK, "after": MOCK,
                    "root_cause": "gpu-bubbles", "paths": [MOCK], "job": "job", "events": "syncs"}
            base = {k: v for k, v in base.items() if k in tool.input_schema["properties"]}
            for name, spec in tool.input_schema["properties"].items():
                for value in _wrong_values(spec):
                    result = await client.call_tool(tool.name, {**base, name: value})
                    message = text_of(result)
                    assert result.is_error and "\n" not in message, (tool.name, name, value, message)
                    assert message.startswith(f"Error executing tool {tool.name}: {name} must be "), message
                    assert message.endswith(f"(got {shown(value)})") and "pydantic" not in message
                    checked += 1
            if tool.input_schema.get("required"):
                missing = await client.call_tool(tool.name, {})
                assert missing.is_error and f": {tool.input_schema['required'][0]} is required: " in text_of(missing)
        still = await client.call_tool("top_kernels", {"profile": MOCK})
    assert checked > 100 and not still.is_error


def test_server_errors_cli_reads_shell_strings_and_words_errors_as_the_server(capsys):
    params = parse_params(top_kernels, MOCK, ["device=0", "per_device=true", "limit=3"])
    assert (params.device, params.per_device, params.limit) == (0, True, 3)
    for pair, message in [("limit=ten", "limit must be an integer from 1 to 500 (got 'ten')"),
                          ("device=true", "device must be an integer of at least 0, or null (got 'true')"),
                          ("device=1.5", "device must be an integer of at least 0, or null (got '1.5')"),
                          ("group_by=size", "group_by must be one of 'name', 'short_name' (got 'size')")]:
        with pytest.raises(StallhoundError) as err:
            parse_params(top_kernels, MOCK, [pair])
        assert str(err.value) == message
    code = cli.main(["tool", "query_sql", MOCK, "-p", "sql=SELECT 1", "-p", "rows=3"])
    assert code == cli.EXIT_USAGE
    assert capsys.readouterr().err == ("stallhound: error: 'rows' is not a parameter of this tool "
                                       "(parameters: sql, limit, offset, timeout_s)\n")


def test_server_errors_formatter_words_lists_per_item():
    from pydantic import BaseModel, Field, ValidationError

    from stallhound.server.validation import explain

    class Params(BaseModel):
        devices: list[int] = Field(default_factory=list)

    with pytest.raises(ValidationError) as err:
        Params.model_validate({"devices": [0, "x"]}, strict=True)
    assert explain(err.value, Params.model_json_schema()) == "devices[1] must be an integer (got 'x')"
    with pytest.raises(ValidationError) as err:
        Params.model_validate({"devices": 3}, strict=True)
    assert explain(err.value, Params.model_json_schema()) == "devices must be a list (each item an integer) (got 3)"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_server_errors_explain_finding_checks_and_completes_its_finding(server, mode):
    async with Client(server, mode=mode) as client:
        with pytest.raises(MCPError) as err:
            await client.get_prompt("explain_finding", {"profile": MOCK, "finding": "gpu"})
        assert err.value.code == INVALID_PARAMS and "\n" not in err.value.message
        assert err.value.message.startswith("no root-cause entry 'gpu'; valid ids: alloc-in-loop, ")
        assert "gpu-bubbles" in err.value.message
        good = await client.get_prompt("explain_finding", {"profile": MOCK, "finding": "gpu-bubbles"})
        assert "stallhound://book/gpu-bubbles" in good.messages[0].content.text
        done = await client.complete(PromptReference(name="explain_finding"), {"name": "finding", "value": "gpu"})
        assert done.completion.values == ["gpu-bubbles"]
        done = await client.complete(PromptReference(name="explain_finding"), {"name": "finding", "value": "nccl-"})
        assert done.completion.values == ["nccl-on-compute-stream", "nccl-serialization", "nccl-straggler"]
        await client.call_tool("load_profile", {"path": MOCK})
        profiles = await client.complete(PromptReference(name="verify_fix"), {"name": "before", "value": ""})
        assert "nsysai_mock" in profiles.completion.values
        paths = await client.complete(PromptReference(name="triage_profile"), {"name": "path", "value": ""})
        assert paths.completion.values == []  # a path is not completed from finding or profile ids


def _threads_in(source: Path) -> list[str]:
    """Threads whose stack is inside `source` right now."""
    return [t.name for t in threading.enumerate()
            if any(f.f_code.co_filename == str(source) for f in _stack(sys._current_frames().get(t.ident)))]


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


async def _cancel_a_heavy_query_then_ask_again(client: Client) -> None:
    """Cancel a query that would run for minutes; the next call on the same profile answers promptly."""
    await client.call_tool("load_profile", {"path": BIG})
    with anyio.move_on_after(CANCEL_AFTER_S) as waited:
        await client.call_tool("query_sql", {"profile": BIG, "sql": HEAVY_SQL, "timeout_s": 60})
    assert waited.cancelled_caught
    started = time.monotonic()
    after = await client.call_tool("top_kernels", {"profile": BIG, "limit": 1})
    assert not after.is_error and time.monotonic() - started < PROMPT_S


async def _quiet_cpu(cpu_s: Callable[[], float]) -> float:
    """CPU seconds (as `cpu_s` counts them) spent over QUIET_WINDOW_S, once a cancelled query had SETTLE_S to stop."""
    await anyio.sleep(SETTLE_S)
    before = cpu_s()
    await anyio.sleep(QUIET_WINDOW_S)
    return cpu_s() - before


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_server_errors_cancelled_query_stops_its_thread_and_cpu_in_memory(server, mode):
    async with Client(server, mode=mode) as client:
        await _cancel_a_heavy_query_then_ask_again(client)
        assert await _quiet_cpu(time.process_time) < QUIET_CPU_S
        assert _threads_in(Path(query_sql.__file__)) == []


@pytest.mark.anyio
async def test_server_errors_interrupted_triage_leaves_no_partial_results(server, monkeypatch):
    """A triage cancelled half way caches nothing partial: the next one equals one computed from scratch."""
    monkeypatch.setattr(common, "_model_cache", {})
    async with Client(server) as client:
        await client.call_tool("load_profile", {"path": BIG})
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "triage", {"profile": BIG})
            while not common._model_cache:  # cancel once its first detector result is in
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        await anyio.sleep(SETTLE_S)
        partial = len(common._model_cache)
        after_cancel = (await client.call_tool("triage", {"profile": BIG})).structured_content
        complete = len(common._model_cache)
        monkeypatch.setattr(common, "_model_cache", {})
        fresh = (await client.call_tool("triage", {"profile": BIG})).structured_content
    assert partial < complete and after_cancel == fresh and fresh["findings"]


TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime + stime


@pytest.fixture(scope="module")
def http_server(cache_root):
    with serving(FIXTURES, cache_root) as served:
        yield served.proc.pid, served.url


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_server_errors_cancelled_query_stops_over_http(http_server, mode):
    """legacy: notifications/cancelled; auto (2026-07-28): the client closes the response stream."""
    pid, url = http_server
    async with Client(url, mode=mode) as client:
        await _cancel_a_heavy_query_then_ask_again(client)
        assert await _quiet_cpu(lambda: _cpu_s(pid)) < QUIET_CPU_S


HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LEGACY_VERSION = "2025-06-18"


def _rpc(rid: int, method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


@pytest.mark.anyio
@pytest.mark.parametrize("leave", ["drop the connection", "close the session"])
async def test_server_errors_query_stops_when_a_stateful_http_client_leaves(http_server, leave):
    """2025-era stateful HTTP, by hand: the client drops the call's connection, or DELETEs its session."""
    pid, url = http_server
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(url, headers=HEADERS, json=_rpc(1, "initialize", {
            "protocolVersion": LEGACY_VERSION, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}))
        session = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"],
                   "mcp-protocol-version": LEGACY_VERSION}
        await http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        await http.post(url, headers=session, json=_rpc(2, "tools/call", {
            "name": "load_profile", "arguments": {"path": BIG}}))
        async with httpx2.AsyncClient(timeout=30) as caller:
            call = caller.build_request("POST", url, headers=session, json=_rpc(3, "tools/call", {
                "name": "query_sql", "arguments": {"profile": BIG, "sql": HEAVY_SQL, "timeout_s": 60}}))
            response = await caller.send(call, stream=True)
            await anyio.sleep(CANCEL_AFTER_S)
            busy_since = _cpu_s(pid)
            await anyio.sleep(CANCEL_AFTER_S)
            assert _cpu_s(pid) - busy_since > CANCEL_AFTER_S / 4  # the query was running
            if leave == "close the session":
                assert (await http.delete(url, headers=session)).status_code == 200
            await response.aclose()
    assert await _quiet_cpu(lambda: _cpu_s(pid)) < QUIET_CPU_S
