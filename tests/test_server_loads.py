"""Loads that outlive their calls, through real MCP clients whose request timeout is shorter than the build: a
larger export is made in the test (the scale tool, 50 copies of a real 2-GPU capture: ~2.5 s to build here), the
first call times out, the build goes on into the cache, and the retry attaches to it (or opens what it built)
without building again; cancel_load stops it only when no other session waits for it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from conftest import FIXTURES, text_of
from fixture_guard import FIXTURES_ROOT
from httpserver import serving
from mcp.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, CancelTaskRequest, GetTaskRequest, Result
from pydantic import TypeAdapter

from stallhound.jobs import job as job_module
from stallhound.model import cache
from stallhound.server import jobs as server_jobs
from stallhound.server.app import build_server

SCALE_TOOL = FIXTURES_ROOT.parent / "tools" / "scale_profile.py"
COPIES = 50  # ~100 MB, ~2.5 s to build on the test machine: well past the client's timeout
TIMEOUT_S = 0.6  # the client's request timeout, shorter than the build


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    if not SCALE_TOOL.exists():
        pytest.skip(f"needs the scale tool {SCALE_TOOL}, which is missing")
    out = tmp_path_factory.mktemp("big") / "big_2gpu.sqlite"
    subprocess.run([sys.executable, str(SCALE_TOOL), str(FIXTURES / "nsysai_h100_2gpu_1s.sqlite"), str(out),
                    "--copies", str(COPIES)], check=True, capture_output=True)
    return out.resolve()


@pytest.fixture
def builds(monkeypatch) -> list[Path]:
    """The sources of every model build the server starts (cache.build_to, which every build of a profile runs)."""
    started: list[Path] = []
    build_to = cache.build_to

    def counted(source, *args, **kwargs):
        started.append(source)
        return build_to(source, *args, **kwargs)

    monkeypatch.setattr(cache, "build_to", counted)
    return started


def _kernels_in(export: Path) -> int:
    with sqlite3.connect(f"file:{export}?mode=ro", uri=True) as con:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


def _kernels_loaded(result) -> int:
    return sum(d["kernel_count"] for d in result.structured_content["summary"]["devices"])


async def _times_out(client: Client, tool: str, arguments: dict) -> None:
    with pytest.raises(MCPError, match="[Tt]imed out"):
        await client.call_tool(tool, arguments, read_timeout_seconds=TIMEOUT_S)


async def _until(condition) -> None:
    with anyio.fail_after(60):
        while not condition():
            await anyio.sleep(0.02)


async def _until_ended(server) -> None:
    await _until(lambda: not server.store.builds.running)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_loads_a_timed_out_load_goes_on_and_the_retry_attaches(big, builds, tmp_path, mode):
    server = build_server([big.parent], cache_dir=tmp_path)
    steps = []

    async def on_progress(done, total, label):
        steps.append((done, total))

    async with Client(server, mode=mode) as client:
        await _times_out(client, "load_profile", {"path": str(big)})
        assert list(server.store.builds.running) == [big]  # the build went on without its caller
        reached = max((done for done, *_ in server.store.builds.running[big].steps), default=0)
        retry = await client.call_tool("load_profile", {"path": str(big)}, progress_callback=on_progress)
    assert not retry.is_error, text_of(retry)
    assert builds == [big]  # built once, for both calls
    assert _kernels_loaded(retry) == _kernels_in(big) == COPIES * _kernels_in(FIXTURES / "nsysai_h100_2gpu_1s.sqlite")
    assert steps and steps[-1][0] == steps[-1][1]  # the retry followed the build's steps to its end
    # from where the build was when the retry joined (on a slow machine that may still be step 1), never again
    assert steps[0][0] >= reached and all(a[0] < b[0] for a, b in zip(steps, steps[1:], strict=False))


@pytest.mark.anyio
async def test_loads_a_retry_after_the_build_ended_opens_what_it_built(big, builds, tmp_path):
    server = build_server([big.parent], cache_dir=tmp_path)
    async with Client(server) as client:
        await _times_out(client, "load_profile", {"path": str(big)})
        await _until_ended(server)
        assert not server.store.models  # nobody waited: the model went to the cache and was closed
        assert [p.name for p in tmp_path.glob("*.duckdb")] != []
        retry = await client.call_tool("load_profile", {"path": str(big)})
    assert not retry.is_error and builds == [big]
    assert _kernels_loaded(retry) == _kernels_in(big)


@pytest.mark.anyio
async def test_loads_cancel_load_stops_a_build_nobody_else_waits_for(big, builds, tmp_path):
    server = build_server([big.parent], cache_dir=tmp_path)
    async with Client(server, mode="legacy") as mine, Client(server, mode="legacy") as theirs:
        await _times_out(mine, "load_profile", {"path": str(big)})
        build = server.store.builds.running[big]
        await _until(lambda: not build.waiting)  # my timed-out call has left it
        async with anyio.create_task_group() as tg:
            waiting: list = []
            tg.start_soon(lambda: _append(waiting, theirs.call_tool("load_profile", {"path": str(big)})))
            await _until(lambda: len(build.waiting) == 1)
            refused = await mine.call_tool("cancel_load", {"paths": [str(big)]})
        assert refused.structured_content == {"paths": [str(big)], "stopped": False, "waiting_calls": 1}
        assert not waiting[0].is_error and builds == [big]  # their load got the model, built once

        await theirs.call_tool("close_profile", {"profile": str(big)})
        for model in tmp_path.glob("*.duckdb"):
            model.unlink()  # so that the next load builds again
        await _times_out(mine, "load_profile", {"path": str(big)})
        stopped = await mine.call_tool("cancel_load", {"paths": [str(big)]})
        assert stopped.structured_content["stopped"] is True
        await _until_ended(server)
        again = await mine.call_tool("cancel_load", {"paths": [str(big)]})
    assert again.is_error and text_of(again).endswith(
        "no load of " + str(big) + " is under way (it ended or never began: a finished load is in the cache, and "
        "loading it again opens it)")
    assert builds == [big, big] and list(tmp_path.glob("*.duckdb")) == []  # the stopped build left no model


async def _append(into: list, call) -> None:
    into.append(await call)


@pytest.mark.anyio
async def test_loads_load_job_timed_out_then_retried_loads_the_job_once(big, tmp_path, monkeypatch):
    loads = []

    def counted(*args, **kwargs):
        loads.append(args[0])
        return job_module.load_job(*args, **kwargs)

    monkeypatch.setattr(server_jobs, "load_job", counted)
    server = build_server([big.parent], cache_dir=tmp_path)
    async with Client(server, mode="legacy") as client:
        await _times_out(client, "load_job", {"paths": [str(big)], "workers": 1})
        retry = await client.call_tool("load_job", {"paths": [str(big)], "workers": 1})
    assert not retry.is_error, text_of(retry)
    assert loads == [(big,)]  # one load, which the retry attached to
    assert retry.structured_content["ranks_total"] == 2 and retry.structured_content["reused"] is False


class TaskHandle(Result):
    """The tasks extension's CreateTaskResult, as a client claims it."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class TasksClient(ClientExtension):
    """A client of the tasks extension: it declares it, and finishes a task handle by polling tasks/get (at the
    interval the server asks for) until the task ends; `polls` keeps every tasks/get answer."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self) -> None:
        self.polls: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
        while True:
            task = await _task_request(ctx.session, "tasks/get", handle.task_id)
            self.polls.append(task)
            if task["status"] == "completed":
                return CallToolResult.model_validate(task["result"])
            assert task["status"] == "working", task
            await anyio.sleep(task["pollIntervalMs"] / 1000)


async def _task_request(session, method: str, task_id: str) -> dict[str, Any]:
    request = {"tasks/get": GetTaskRequest, "tasks/cancel": CancelTaskRequest}[method]
    return await session.send_request(request(params={"task_id": task_id}), TypeAdapter(dict[str, Any]))


@pytest.mark.anyio
async def test_loads_a_tasks_client_polls_a_load_longer_than_its_timeout_to_the_end(big, builds, tmp_path):
    server = build_server([big.parent], cache_dir=tmp_path)
    tasks = TasksClient()
    async with Client(server, mode="auto", extensions=[tasks], read_timeout_seconds=TIMEOUT_S) as client:
        loaded = await client.call_tool("load_profile", {"path": str(big)})
    assert not loaded.is_error, text_of(loaded)
    assert _kernels_loaded(loaded) == _kernels_in(big) and builds == [big]
    working = [p for p in tasks.polls if p["status"] == "working"]
    assert len(working) >= 2 and any(p["statusMessage"].startswith("step ") for p in working)  # the build's steps
    assert tasks.polls[-1]["status"] == "completed" and tasks.polls[-1]["resultType"] == "complete"


@pytest.mark.anyio
async def test_loads_tasks_cancel_stops_the_load_and_its_build(big, builds, tmp_path):
    server = build_server([big.parent], cache_dir=tmp_path)
    async with Client(server, mode="auto", extensions=[TasksClient()]) as client:
        handle = await client.session.call_tool("load_profile", {"path": str(big)}, allow_claimed=True)
        assert isinstance(handle, TaskHandle) and handle.status == "working"
        await _until(lambda: big in server.store.builds.running)
        cancelled = await _task_request(client.session, "tasks/cancel", handle.task_id)
        assert cancelled["resultType"] == "complete" and "taskId" not in cancelled  # an empty acknowledgement
        await _until_ended(server)
        task = await _task_request(client.session, "tasks/get", handle.task_id)
        with pytest.raises(MCPError, match="no task nope"):
            await _task_request(client.session, "tasks/get", "nope")
    assert task["status"] == "cancelled" and "result" not in task
    assert builds == [big] and list(tmp_path.glob("*.duckdb")) == []  # the build stopped and left no model


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_loads_a_client_without_the_tasks_extension_gets_the_result_itself(mode, cache_root):
    server = build_server([FIXTURES.resolve()], cache_dir=cache_root)
    mock = FIXTURES.resolve() / "nsysai_mock.sqlite"
    async with Client(server, mode=mode) as client:
        loaded = await client.session.call_tool("load_profile", {"path": str(mock)}, allow_claimed=True)
    assert isinstance(loaded, CallToolResult) and not loaded.is_error


@pytest.mark.anyio
async def test_loads_a_tasks_client_over_http_polls_to_the_end(big, tmp_path):
    """Over streamable HTTP (2026-07-28, stateless), where the tasks run in the server's lifespan."""
    tasks = TasksClient()
    with serving(big.parent, tmp_path) as served:
        async with Client(served.url, mode="auto", extensions=[tasks], read_timeout_seconds=TIMEOUT_S) as client:
            loaded = await client.call_tool("load_profile", {"path": str(big)})
    assert not loaded.is_error, text_of(loaded)
    assert _kernels_loaded(loaded) == _kernels_in(big)
    assert [p["status"] for p in tasks.polls][-1] == "completed" and len(tasks.polls) >= 2
