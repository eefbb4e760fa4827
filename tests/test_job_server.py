"""Jobs over MCP (in-memory client, stdio subprocess) and the `stallhound build` command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jobskill
import pytest
from conftest import text_of
from httpserver import serving
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from test_job import KINETO, KINETO_RANKS, trace_kernels, write_ranks

from stallhound import tools
from stallhound.analysis.contracts import run_skill
from stallhound.cli import job as cli_job
from stallhound.cli import main as cli
from stallhound.jobs.job import load_job
from stallhound.server.app import build_server
from stallhound.server.jobs import JobStore
from stallhound.server.sessions import Session
from stallhound.server.store import ProfileStore
from stallhound.synth.ranks import write_rank_set
from stallhound.tools import rank_imbalance

GLOB = str(KINETO / "hta_sampled_rank*.json.gz")
EXPECTED = {0: trace_kernels(KINETO_RANKS[0]), 1: trace_kernels(KINETO_RANKS[1])}


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setattr(tools, "job_tools", lambda: {"rank_kernels": jobskill})
    return build_server([KINETO], cache_dir=tmp_path)


@pytest.mark.anyio
async def test_load_job_over_mcp_reports_progress_per_rank(server):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async with Client(server, mode="legacy") as client:
        loaded = await client.call_tool("load_job", {"paths": [GLOB], "workers": 2}, progress_callback=on_progress)
    assert not loaded.is_error, text_of(loaded)
    assert loaded.structured_content["ranks"] == [
        {"rank": r, "rank_source": "distributedInfo", "path": str(p), "part": None} for r, p in enumerate(KINETO_RANKS)]
    assert loaded.structured_content["job"] == "job-kineto"
    assert [(p, t) for p, t, _ in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    written = [m for _, _, m in seen[2:]]  # in the order the pool finished them
    assert sorted(m.split(" written")[0] for m in written) == ["rank 0", "rank 1"]
    assert [m.split("Parquet ")[1] for m in written] == ["(1 of 2 ranks)", "(2 of 2 ranks)"]


@pytest.mark.anyio
async def test_job_tool_runs_on_every_rank_through_the_server(server):
    async with Client(server) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert {"rank_kernels", "load_job", "list_jobs", "close_job"} <= listed
        job = (await client.call_tool("load_job", {"paths": [str(KINETO_RANKS[1]), str(KINETO_RANKS[0])],
                                                   "workers": 1})).structured_content["job"]
        counted = await client.call_tool("rank_kernels", {"job": job})
        assert {int(k): v for k, v in counted.structured_content["kernels_per_rank"].items()} == EXPECTED
        unknown = await client.call_tool("rank_kernels", {"job": "job-nope"})
        assert unknown.is_error and text_of(unknown).endswith(
            "no job is loaded with id 'job-nope' in this session (loaded: job-kineto); call load_job with the ranks' "
            "profiles (paths, their folder or a glob)")
        bad = await client.call_tool("rank_kernels", {"job": job, "min_rank": -1})
        assert bad.is_error and "min_rank must be an integer of at least 0 (got -1)" in text_of(bad)
        still = await client.call_tool("rank_kernels", {"job": job, "min_rank": 1})
        assert still.structured_content["kernels_per_rank"] == {"1": EXPECTED[1]}


@pytest.mark.anyio
async def test_load_job_jobs_are_per_session(server):
    async with Client(server, mode="legacy") as first, Client(server, mode="legacy") as second:
        await first.call_tool("load_job", {"paths": [GLOB], "workers": 1})
        assert [j["job"] for j in (await first.call_tool("list_jobs", {})).structured_content["jobs"]] == [
            "job-kineto"]
        assert (await second.call_tool("list_jobs", {})).structured_content["jobs"] == []
        other = await second.call_tool("close_job", {"job": "job-kineto"})
        assert other.is_error and "no job is loaded with id 'job-kineto' in this session" in text_of(other)
        closed = await first.call_tool("close_job", {"job": "job-kineto"})
        assert closed.structured_content == {"closed": "job-kineto"}
        assert (await first.call_tool("list_jobs", {})).structured_content["jobs"] == []


@pytest.mark.anyio
async def test_load_job_errors_are_one_sentence(server, tmp_path):
    async with Client(server) as client:
        outside = await client.call_tool("load_job", {"paths": ["/etc"]})
        assert outside.is_error and "/etc is outside the allowed roots" in text_of(outside)
        nothing = await client.call_tool("load_job", {"paths": [str(KINETO / "none_*.json.gz")]})
        assert nothing.is_error and "names no profile" in text_of(nothing)
        both_zero = [str(KINETO_RANKS[0]), str(KINETO / "hta_a100_nccl_rank0.json.gz")]
        twice = await client.call_tool("load_job", {"paths": both_zero})
        message = text_of(twice)
        assert twice.is_error and "two parts of the job claim one rank (rank 0 by" in message and "\n" not in message
        workers = await client.call_tool("load_job", {"paths": [GLOB], "workers": 0})
        assert workers.is_error and "workers must be an integer from 1 to 64, or null (got 0)" in text_of(workers)
        still = await client.call_tool("load_job", {"paths": [GLOB]})
        assert not still.is_error


@pytest.mark.anyio
async def test_load_job_over_stdio_builds_in_a_process_pool(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-m", "stallhound", "serve", "--root",
                                                                 str(KINETO), "--cache-dir", str(tmp_path)])
    async with Client(params) as client:
        loaded = await client.call_tool("load_job", {"paths": [str(KINETO)], "workers": 2})
    assert loaded.is_error and "two parts of the job claim one rank" in text_of(loaded)  # the folder has 3 rank-0/1
    assert len(list(tmp_path.glob("*.duckdb"))) == 3  # every file was built in the pool before ranks were checked


def test_build_cli_prints_ranks_and_parquet(tmp_path, capsys):
    paths = write_ranks(tmp_path / "run", ["rank_0.sqlite", "rank_1.sqlite"])
    assert cli.main(["build", *map(str, paths), "--workers", "2", "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert f"rank 0: {paths[0]} [file name]" in out and f"rank 1: {paths[1]} [file name]" in out
    folder = Path(out.strip().splitlines()[-1].removeprefix("Parquet: "))
    assert sorted(p.name for p in (folder / "kernels").iterdir()) == ["rank=0", "rank=1"]


def test_build_cli_dask_scheduler_without_dask_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    code = cli.main(["build", str(KINETO_RANKS[0]), "--dask-scheduler", "tcp://127.0.0.1:8786", "--cache-dir",
                     str(tmp_path)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and err.count("\n") == 1 and "pip install 'stallhound[distributed]'" in err


def test_build_cli_honours_dask_scheduler_address(tmp_path, capsys, monkeypatch):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
        assert cli.main(["build", GLOB, "--cache-dir", str(tmp_path)]) == 0
        tasks = cluster.scheduler.task_prefixes
    assert {"build_file", "write_rank"} <= set(tasks)
    assert "rank 1: " in capsys.readouterr().out
    after = load_job(GLOB, cache_dir=tmp_path, workers=1)  # the server's load then finds the cluster's work
    assert after.timings.reused
    after.close()


def test_job_tool_cli_command_runs_on_the_job(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tools, "job_tools", lambda: {"rank_kernels": jobskill})
    monkeypatch.setattr(cli_job, "JOB_TOOLS", {"rank_kernels": "kernels per rank"})  # the parser's static list
    assert cli.main(["rank-kernels", GLOB, "--workers", "1", "--cache-dir", str(tmp_path), "-p", "min_rank=1"]) == 0
    assert capsys.readouterr().out.strip() == f"rank 1: {EXPECTED[1]} kernels"
    assert cli.main(["rank-kernels", GLOB, "--cache-dir", str(tmp_path), "-p", "min_rank=x"]) == cli.EXIT_USAGE
    assert "min_rank must be an integer of at least 0 (got 'x')" in capsys.readouterr().err


def test_close_job_waits_for_the_calls_running_on_it(tmp_path):
    jobs = JobStore(ProfileStore(roots=[KINETO], cache_dir=tmp_path))
    session = Session("s")
    opened = jobs.load(session, [GLOB], 1)
    with jobs.leased(session, opened.id) as running:
        assert jobs.close(session, opened.id) == opened.id
        assert running.job.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == sum(EXPECTED.values())
    with pytest.raises(Exception, match="(?i)closed"):
        opened.job.con.execute("SELECT 1")
    second = jobs.load(session, [GLOB], 1)
    jobs.profiles.end_session(session)
    assert jobs.listing(session) == []
    with pytest.raises(Exception, match="(?i)closed"):
        second.job.con.execute("SELECT 1")


@pytest.mark.anyio
async def test_load_job_over_streamable_http(tmp_path):
    with serving(KINETO, tmp_path) as served:
        async with Client(served.url, mode="legacy") as client:
            loaded = await client.call_tool("load_job", {"paths": [GLOB], "workers": 2})
            listed = await client.call_tool("list_jobs", {})
    assert [r["rank_source"] for r in loaded.structured_content["ranks"]] == ["distributedInfo"] * 2
    assert [j["job"] for j in listed.structured_content["jobs"]] == ["job-kineto"]


@pytest.fixture(scope="module")
def straggler_set(tmp_path_factory):
    """A synthetic rank set with rank 1 planted as a straggler (its truth), written once."""
    folder = tmp_path_factory.mktemp("straggler") / "run"
    folder.mkdir()
    truth = write_rank_set(folder, ranks=4, iterations=8, delay_ns=3_000_000, straggler_rank=1, kind="compute")
    return folder, truth


@pytest.mark.anyio
async def test_rank_imbalance_over_mcp_names_the_planted_straggler(straggler_set, tmp_path):
    folder, truth = straggler_set
    server = build_server([folder], cache_dir=tmp_path)
    async with Client(server) as client:
        loaded = await client.call_tool("load_job", {"paths": [str(folder)], "workers": 2})
        assert [(r["rank"], r["rank_source"]) for r in loaded.structured_content["ranks"]] == [
            (r, "file name") for r in range(4)]
        result = await client.call_tool("rank_imbalance", {"job": loaded.structured_content["job"]})
    assert not result.is_error, text_of(result)
    straggler = result.structured_content["straggler"]
    assert straggler["rank"] == truth["straggler"]["rank"] == 1
    assert straggler["lateness_ns"] == truth["straggler"]["lateness_ns"]
    assert [f["root_cause"] for f in result.structured_content["findings"]] == ["nccl-straggler"]


def test_rank_imbalance_cli_on_the_job_matches_the_tool_on_the_reopened_job(straggler_set, tmp_path, capsys):
    folder, truth = straggler_set
    assert cli.main(["rank-imbalance", str(folder), "--workers", "2", "--cache-dir", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    job = load_job(folder, cache_dir=tmp_path, workers=1)  # reopened: the Parquet the command wrote
    try:
        direct = json.loads(run_skill(job.con, rank_imbalance, rank_imbalance.Params(job="job")).model_dump_json())
    finally:
        job.close()
    assert printed["straggler"]["rank"] == truth["straggler"]["rank"]
    assert (printed["straggler"], printed["rows"]) == (direct["straggler"], direct["rows"])
