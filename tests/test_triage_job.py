"""triage_job: the cross-rank findings plus the triage of the rank that matters, on synthetic rank sets with a
planted straggler (and a balanced one), on the two real Kineto ranks, over an MCP client and the CLI; the rank's
findings checked against triage run directly on that rank's own profile."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from conftest import text_of
from mcp.client import Client

from stallhound.analysis import common
from stallhound.cli import main as cli
from stallhound.formats import open_profile
from stallhound.jobs.job import load_job
from stallhound.server.app import build_server
from stallhound.synth.ranks import write_rank_set
from stallhound.tools import iterations, triage
from stallhound.tools import triage_job as tj

KINETO = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kineto"
DELAY_NS = 3_000_000
SETS = {"host": dict(straggler_rank=2, kind="host"), "compute": dict(straggler_rank=1, kind="compute"),
        "balanced": dict(straggler_rank=None)}


@pytest.fixture(scope="module")
def rank_set(tmp_path_factory, cache_root):
    """rank_set(name) -> (folder, truth, job); each set written, built and loaded once."""
    made: dict[str, tuple] = {}

    def _set(name: str):
        if name not in made:
            folder = tmp_path_factory.mktemp(f"ranks-{name}") / "run"
            folder.mkdir()
            truth = write_rank_set(folder, ranks=4, iterations=8, delay_ns=DELAY_NS, **SETS[name])
            made[name] = (folder, truth, load_job(folder, cache_dir=cache_root, workers=1))
        return made[name]
    yield _set
    for _, _, job in made.values():
        job.close()


def run(job, **kw) -> tj.Result:
    return tj.run(job.con.cursor(), tj.Params(job="j", **kw))


def own_triage(path: Path, cache_root: Path, monkeypatch) -> triage.Result:
    """triage on the rank's own profile, computed afresh (no result remembered from the job's run)."""
    monkeypatch.setattr(common, "_model_cache", {})
    profile = open_profile(path, cache_dir=cache_root)
    try:
        return triage.run(profile.con, triage.Params(profile="own", limit=triage.MAX_FINDINGS))
    finally:
        profile.close()


def figures(findings) -> list[tuple]:
    return [(f.root_cause, f.time_at_stake_ns, f.device, f.severity, f.title, f.fix) for f in findings]


def test_triage_job_straggler_first_with_the_straggler_rank_triaged(rank_set, cache_root, monkeypatch):
    folder, truth, job = rank_set("host")
    result = run(job)
    planted = truth["straggler"]["rank"]
    top = result.findings[0]
    assert planted == 2 and (top.root_cause, top.rank, top.evidence["straggler_rank"]) == ("nccl-straggler", None,
                                                                                            planted)
    assert top.book_uri == "stallhound://book/nccl-straggler" and top.fix and top.source_tool == "rank_imbalance"
    assert (result.straggler, result.triaged_rank, result.chosen_by) == (planted, planted, "straggler")
    assert f"rank {planted} is the straggler" in result.chosen_why
    rank_found = [f for f in result.findings if f.rank is not None]
    assert rank_found and {f.rank for f in rank_found} == {planted}
    direct = own_triage(folder / f"rank_{planted}.sqlite", cache_root, monkeypatch)
    assert figures(rank_found) == figures(direct.findings)
    assert result.total_findings == 1 + direct.total_findings
    assert result.time_at_stake_ns == top.time_at_stake_ns + direct.time_at_stake_ns
    assert (result.program, result.classification, result.window_note) == (
        direct.program, direct.classification, direct.window_note)
    stakes = [f.time_at_stake_ns for f in result.findings]
    assert stakes == sorted(stakes, reverse=True) and [f.position for f in result.findings] == [
        *range(1, len(stakes) + 1)]


def test_triage_job_compute_straggler_names_its_rank(rank_set):
    _, truth, job = rank_set("compute")
    result = run(job)
    assert result.findings[0].root_cause == "nccl-straggler"
    assert result.findings[0].evidence["straggler_rank"] == result.triaged_rank == truth["straggler"]["rank"] == 1
    assert "it computes longer than the others" in result.findings[0].title
    assert tj.render(result).splitlines()[1].startswith("triaged rank 1 (straggler): rank 1 is the straggler")


def test_triage_job_balanced_set_triages_the_slowest_rank(rank_set, cache_root, monkeypatch):
    folder, _, job = rank_set("balanced")
    result = run(job)
    steps = {}
    for rank in range(4):  # each rank's own step time, from iterations on its own profile
        profile = open_profile(folder / f"rank_{rank}.sqlite", cache_dir=cache_root)
        steps[rank] = iterations.run(profile.con, iterations.Params(profile="own")).steady_median_ns
        profile.close()
    slowest = max(steps, key=lambda r: (steps[r], -r))
    assert result.straggler is None and result.verdict.startswith("balanced")
    assert (result.triaged_rank, result.chosen_by) == (slowest, "slowest_step")
    assert "no straggler named" in result.chosen_why
    assert all(f.rank == slowest for f in result.findings)
    direct = own_triage(folder / f"rank_{slowest}.sqlite", cache_root, monkeypatch)
    assert figures(result.findings) == figures(direct.findings)


def test_triage_job_kineto_ranks_are_schema_valid(cache_root, monkeypatch):
    paths = [KINETO / f"hta_sampled_rank{r}.json.gz" for r in (0, 1)]
    job = load_job(paths, cache_dir=cache_root, workers=1)
    try:
        result = run(job, limit=3)
    finally:
        job.close()
    jsonschema.validate(json.loads(result.model_dump_json()), tj.Result.model_json_schema())
    assert result.ranks == 2 and result.straggler is None and result.chosen_by == "slowest_step"
    direct = own_triage(paths[result.triaged_rank], cache_root, monkeypatch)
    assert len(result.findings) == 3 and result.truncated and result.total_findings == direct.total_findings
    assert figures(result.findings) == figures(direct.findings[:3])
    assert all(f.rank == result.triaged_rank and f.book_uri.startswith("stallhound://book/") for f in result.findings)


def test_triage_job_fits_the_result_budget(rank_set):
    from stallhound.server import budget
    _, _, job = rank_set("host")
    params = tj.Params(job="j")
    text, result = budget.fit(tj.run(job.con.cursor(), params), tj, params, budget.MIN_RESULT_CHARS)
    assert len(text) <= budget.MIN_RESULT_CHARS and len(result.model_dump_json()) <= budget.MIN_RESULT_CHARS
    assert result.findings[0].root_cause == "nccl-straggler"


@pytest.mark.anyio
async def test_triage_job_over_mcp_after_load_job(rank_set, tmp_path):
    folder, truth, _ = rank_set("host")
    server = build_server([folder], cache_dir=tmp_path)
    async with Client(server) as client:
        loaded = await client.call_tool("load_job", {"paths": [str(folder)], "workers": 2})
        job = loaded.structured_content["job"]
        result = await client.call_tool("triage_job", {"job": job, "limit": 2})
        bad = await client.call_tool("triage_job", {"job": job, "limit": 0})
    assert not result.is_error, text_of(result)
    found = result.structured_content["findings"]
    assert [(f["root_cause"], f["rank"]) for f in found] == [("nccl-straggler", None), ("gpu-bubbles", 2)]
    assert found[0]["evidence"]["straggler_rank"] == truth["straggler"]["rank"]
    assert result.structured_content["triaged_rank"] == 2
    assert text_of(result).startswith(f"job {job}: 4 ranks; straggler: rank 2")
    assert bad.is_error and "limit must be an integer from 1 to 100 (got 0)" in text_of(bad)


def test_triage_job_cli_matches_the_tool(rank_set, tmp_path, capsys):
    folder, _, job = rank_set("host")
    assert cli.main(["triage-job", str(folder), "--workers", "2", "--cache-dir", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    direct = json.loads(run(job).model_dump_json())
    assert {**printed, "job": "j"} == direct


def test_triage_job_ranks_of_one_export_keep_their_own_cached_results(tmp_path):
    from test_job import export_kernels_per_pid, write_ranks

    from stallhound.analysis.rank_figures import rank_view
    (path,) = write_ranks(tmp_path, ["train.sqlite"], devices=4)
    job = load_job([path], cache_dir=tmp_path / "cache", workers=1)
    try:
        file_print = job.con.execute("SELECT any_value(profile_id) FROM ranks").fetchone()[0]
        counted, prints = [], set()
        for rank in range(4):
            with rank_view(job.con, rank) as cur:
                prints.add(cur.execute("SELECT fingerprint FROM meta").fetchone()[0])
                counted.append(common.per_model(cur, ("kernels",), lambda c=cur: c.execute(
                    "SELECT min(pid), count(*) FROM kernels").fetchone()))
        result = tj.run(job.con, tj.Params(job="j"))
    finally:
        job.close()
    assert counted == sorted(export_kernels_per_pid(path).items())  # each rank's own, not rank 0's remembered
    assert len(prints) == 4 and all(p.startswith(f"{file_print}#pids ") for p in prints)
    assert result.ranks == 4 and result.triaged_rank in range(4)
