"""rank_imbalance: per-rank GPU time, steps, waits in matched collectives, the straggler and its lateness, kernel
spread, histograms and cross-rank findings, on synthetic rank sets with a planted straggler, on the two real
Kineto ranks, and on tiny in-memory jobs."""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path

import duckdb
import jsonschema
import pytest
from modeldb import make_model, union_ns

from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.jobs import parquet as job_parquet
from stallhound.jobs.job import load_job
from stallhound.jobs.ranks import RankSpec, Unit
from stallhound.synth.ranks import TRUTH_NAME, write_rank_set
from stallhound.tools import iterations
from stallhound.tools import rank_imbalance as ri

KINETO = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kineto"
DELAY_NS = 3_000_000
LATENESS_TOLERANCE = 0.05  # the straggler's NCCL kernel starts delay_ns after its GPU could run it; jitter of
#                            the peers' launches moves the next-latest arrival by tens of us, well under 5%
EXCESS_TOLERANCE = 0.10  # per-step excess compares totals over 4% kernel jitter: 10% of the delay covers it
US = 1_000
MS = 1_000_000


def models_of(paths: list[Path], cache: Path) -> list[Path]:
    """Build (or find) each rank's model; the job reads the files, so no connection stays open."""
    models = []
    for path in paths:
        profile = open_profile(path, cache_dir=cache)
        models.append(profile.model_path)
        profile.close()
    return models


def job_of(models: list[Path], folder: Path) -> duckdb.DuckDBPyConnection:
    """The job connection (jobs.parquet, as load_job makes it) of built models, rank r = models[r]: for
    ranks whose models a test made or changed itself (a load_job takes profiles, not models)."""
    specs = [RankSpec(rank=r, rank_source="order", path=m, fingerprint=f"p{r}", model_path=m, unit=Unit())
             for r, m in enumerate(models)]
    for spec in specs:
        job_parquet.write_rank(spec, folder, threads=1)
    return job_parquet.connect(folder, specs)


def with_hosts(models: list[Path], hosts: list[str], folder: Path) -> list[Path]:
    """Copies of `models` whose meta.host is hosts[r]: ranks captured on different machines (synth writes one)."""
    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for r, (model, host) in enumerate(zip(models, hosts, strict=True)):
        copy = folder / f"r{r}.duckdb"
        copy.write_bytes(model.read_bytes())
        with duckdb.connect(str(copy)) as con:
            con.execute("UPDATE meta SET host = ?", [host])
        copies.append(copy)
    return copies


@pytest.fixture(scope="module")
def rank_set(tmp_path_factory):
    """rank_set(name) -> (job connection, truth, model paths by rank); each set written and loaded once by
    load_job, as the server and CLI load a job; with `hosts`, a job of the same models on different hosts."""
    made: dict[str, tuple] = {}
    specs = {"compute": dict(straggler_rank=1, kind="compute"), "host": dict(straggler_rank=2, kind="host"),
             "balanced": dict(straggler_rank=None)}

    def _set(name: str, hosts: list[str] | None = None):
        if name not in made:
            folder = tmp_path_factory.mktemp(f"ranks-{name}")
            truth = write_rank_set(folder, ranks=4, iterations=8, delay_ns=DELAY_NS, **specs[name])
            job = load_job(folder, cache_dir=tmp_path_factory.mktemp(f"cache-{name}"), workers=1)
            made[name] = (job, truth, [s.model_path for s in sorted(job.ranks, key=lambda s: s.rank)])
        job, truth, models = made[name]
        if hosts is None:
            return job.con, truth, models
        return job_of(with_hosts(models, hosts, tmp_path_factory.mktemp("hosts")),
                      tmp_path_factory.mktemp("hosts-job")), truth, models
    yield _set
    for job, _, _ in made.values():
        job.close()


def run(con, **kw) -> ri.Result:
    return run_skill(con, ri, ri.Params(job="j", **kw))


def by_rank(result: ri.Result) -> dict[int, ri.RankRow]:
    return {r.rank: r for r in result.rows}


def test_rank_imbalance_finds_planted_compute_straggler(rank_set):
    con, truth, _ = rank_set("compute")
    result = run(con)
    planted = truth["straggler"]
    s = result.straggler
    assert s is not None and s.rank == planted["rank"] == 1
    assert s.lateness_ns == planted["lateness_ns"]  # the same definition, computed by synth from its own rows
    assert abs(s.lateness_ns - DELAY_NS) <= LATENESS_TOLERANCE * DELAY_NS
    assert s.last_count == s.collectives == planted["delayed"] == 16
    assert s.cause == "compute"
    assert abs(s.compute_excess_per_step_ns - planted["extra_compute_ns"]) <= EXCESS_TOLERANCE * DELAY_NS
    assert [f.root_cause for f in result.findings] == ["nccl-straggler"]
    assert result.findings[0].evidence["straggler_rank"] == 1
    assert result.basis == "arrival" and result.clock == "same_host"


def test_rank_imbalance_finds_planted_host_straggler(rank_set):
    con, truth, _ = rank_set("host")
    s = run(con).straggler
    assert s is not None and s.rank == truth["straggler"]["rank"] == 2
    assert s.lateness_ns == truth["straggler"]["lateness_ns"]
    assert s.cause == "idle"
    assert abs(s.idle_excess_per_step_ns - DELAY_NS) <= EXCESS_TOLERANCE * DELAY_NS


def test_rank_imbalance_balanced_set_names_no_straggler(rank_set):
    con, _, _ = rank_set("balanced")
    result = run(con)
    assert result.straggler is None
    assert result.verdict.startswith("balanced")
    assert result.findings == []
    assert result.matched == 16 and result.median_skew_ns < ri.MIN_SKEW_NS * 5


def test_rank_imbalance_durations_when_hosts_differ(rank_set):
    con, truth, _ = rank_set("compute", hosts=["a", "b", "c", "d"])
    result = run(con)
    assert (result.clock, result.basis) == ("different_hosts", "durations")
    assert "different hosts" in result.basis_note
    assert result.straggler.rank == truth["straggler"]["rank"]
    assert abs(result.straggler.lateness_ns - DELAY_NS) <= LATENESS_TOLERANCE * DELAY_NS


def _reference_waits(con: duckdb.DuckDBPyConnection) -> dict[int, tuple[int, int]]:
    """(wait_ns, NCCL ns) per rank by the k-th NCCL kernel of every rank (synth ranks start together)."""
    kernels = con.execute("SELECT rank, start_ns, end_ns FROM kernels WHERE category = 'nccl' "
                          "ORDER BY rank, start_ns").fetchall()
    per: dict[int, list[tuple[int, int]]] = {}
    for rank, s, e in kernels:
        per.setdefault(rank, []).append((s, e))
    out = {rank: [0, 0] for rank in per}
    for group in zip(*per.values(), strict=True):
        last = max(s for s, _ in group)
        for rank, (s, e) in zip(per, group, strict=True):
            out[rank][0] += min(last, e) - s
            out[rank][1] += e - s
    return {rank: tuple(v) for rank, v in out.items()}


def clipped(con: duckdb.DuckDBPyConnection, sql: str, lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(s, lo), min(e, hi)) for s, e in con.execute(sql).fetchall() if e > lo and s < hi]


def test_rank_imbalance_figures_match_independent_sql(rank_set):
    con, truth, models = rank_set("host")
    result = run(con, limit=4)
    waits = _reference_waits(con)
    for rank, model in enumerate(models):
        own = duckdb.connect(str(model), read_only=True)
        lo, hi = own.execute("SELECT gpu_start_ns, gpu_end_ns FROM meta").fetchone()
        compute = clipped(own, "SELECT start_ns, end_ns FROM kernels WHERE category <> 'nccl' "
                               "UNION ALL SELECT start_ns, end_ns FROM graph_exec", lo, hi)
        nccl = clipped(own, "SELECT start_ns, end_ns FROM kernels WHERE category = 'nccl'", lo, hi)
        copy = clipped(own, "SELECT start_ns, end_ns FROM memcpy UNION ALL SELECT start_ns, end_ns FROM memset",
                       lo, hi)
        row = by_rank(result)[rank]
        assert row.window_ns == hi - lo
        assert row.compute_ns == union_ns(compute)
        assert row.communication_ns == union_ns(nccl)
        assert row.copy_ns == union_ns(copy)
        assert row.idle_ns == hi - lo - union_ns(compute + nccl + copy)
        assert (row.wait_ns, round(100 * row.wait_ns / waits[rank][1], 2)) == (waits[rank][0], row.wait_share_pct)
        steps = iterations.run(own, iterations.Params(profile="own"))
        assert (row.steps, row.step_ns) == (steps.iteration_count, steps.steady_median_ns)
        assert row.steps == len(truth["iterations"])
        own.close()


def test_rank_imbalance_kineto_ranks_are_sane_and_schema_valid(cache_root, tmp_path):
    paths = [KINETO / f"hta_sampled_rank{r}.json.gz" for r in (0, 1)]
    con = job_of(models_of(paths, cache_root), tmp_path / "job")
    result = run(con)
    jsonschema.validate(json.loads(result.model_dump_json()), ri.Result.model_json_schema())
    assert result.ranks == 2 and len(result.rows) == 2 and result.clock == "unknown"
    nccl = dict(con.execute("SELECT rank, count(*) FROM kernels WHERE category = 'nccl' GROUP BY rank").fetchall())
    assert result.unmatched_kernels == sum(nccl.values()) - 2 * result.matched
    for row in result.rows:
        for share in (row.compute_pct, row.copy_pct, row.communication_pct, row.idle_pct, row.wait_share_pct):
            assert 0 <= share <= 100
        assert row.compute_ns + row.idle_ns <= row.window_ns
        assert row.steps >= 2 and 0 < row.step_ns < row.window_ns
        assert row.wait_ns <= row.communication_ns
    assert result.matched < ri.MIN_MATCHED and result.straggler is None and result.findings == []
    assert all(sum(h.counts) == 2 for h in result.histograms)
    assert ri.render(result).startswith("job j: 2 ranks")


# --- tiny in-memory jobs --------------------------------------------------------------------------------------
def nccl(rank: int, s: int, e: int, coll: str = "AllReduce") -> dict:
    return {"device_id": rank, "stream_id": 21, "start_ns": s, "end_ns": e, "short_name": "nccl_k",
            "name": "nccl_k", "category": "nccl", "nccl_collective": coll}


def comp(rank: int, s: int, e: int, name: str = "gemm") -> dict:
    return {"device_id": rank, "stream_id": 7, "start_ns": s, "end_ns": e, "short_name": name, "name": name,
            "category": "compute"}


def tiny_job(tmp_path: Path, per_rank: list[list[dict]], hosts: list[str] | None = None
             ) -> duckdb.DuckDBPyConnection:
    """A job of make_model ranks (kernels only; rank r on hosts[r], else all on 'h'), each saved to a file."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = []
    for rank, kernels in enumerate(per_rank):
        model = make_model(meta={"fingerprint": "test", "host": hosts[rank] if hosts else "h"}, kernels=kernels)
        path = tmp_path / f"r{rank}.duckdb"
        model.execute(f"ATTACH '{path}' AS out")
        model.execute("COPY FROM DATABASE memory TO out")
        model.close()
        files.append(path)
    return job_of(files, tmp_path / "job")


def arrivals(count: int, late: dict[int, int], transfer: int = 400 * US, period: int = 2 * MS) -> list[list[dict]]:
    """`count` collectives; rank r's kernel starts late[r] after i x period, all end `transfer` after the last."""
    ranks = [[] for _ in late]
    for i in range(count):
        last = i * period + max(late.values())
        for r, off in late.items():
            ranks[r].append(nccl(r, i * period + off, last + transfer))
    return ranks


def test_rank_imbalance_lateness_is_the_lead_over_the_next_latest_rank(tmp_path):
    con = tiny_job(tmp_path, arrivals(12, {0: 0, 1: 500 * US, 2: 1500 * US}))
    result = run(con)
    assert result.straggler.rank == 2
    assert result.straggler.lateness_ns == 1000 * US
    assert result.straggler.peer_wait_ns == 12 * 1250 * US  # median of rank 0 (1.5 ms) and rank 1 (1 ms) per coll
    rows = by_rank(result)
    assert [rows[r].wait_ns for r in range(3)] == [12 * 1500 * US, 12 * 1000 * US, 0]
    assert rows[0].wait_share_pct == round(100 * 1500 / 1900, 2)  # wait / its kernel time (1.5 + 0.4 ms)
    assert result.median_skew_ns == 1500 * US and result.median_transfer_ns == 400 * US
    assert result.rows[0].rank == 2  # worst first


def test_rank_imbalance_too_few_collectives_name_nobody(tmp_path):
    con = tiny_job(tmp_path, arrivals(ri.MIN_MATCHED - 1, {0: 0, 1: 2 * MS}))
    result = run(con)
    assert result.straggler is None and "too few" in result.verdict and result.findings == []


def test_rank_imbalance_rank_in_few_collectives_is_not_named(tmp_path):
    ranks = arrivals(12, {0: 0, 1: 0})  # ranks 0 and 1 arrive together, rank 0 last on the tie
    ranks.append([comp(2, 0, 30 * MS)])
    for i in range(2):  # rank 2 joins rank 0 in two broadcasts only, 1 ms late
        at = 30 * MS + i * 2 * MS
        ranks[0].append(nccl(0, at, at + 1400 * US, "Broadcast"))
        ranks[2].append(nccl(2, at + MS, at + 1400 * US, "Broadcast"))
    result = run(tiny_job(tmp_path, ranks))
    assert result.basis == "arrival" and result.matched == 14 and by_rank(result)[2].last_share_pct == 100.0
    assert result.straggler is None and result.verdict.startswith("rank 0 arrives last to 12 of 14")


def test_rank_imbalance_small_lateness_is_not_worth_chasing(tmp_path):
    con = tiny_job(tmp_path, arrivals(12, {0: 0, 1: 50 * US}))
    result = run(con)
    assert result.straggler is None and "worth chasing" in result.verdict


def test_rank_imbalance_varying_late_rank_is_imbalance(tmp_path):
    ranks = [[], [], []]
    for i in range(12):
        late = {r: (MS if r == i % 3 else 0) for r in range(3)}
        for r, kernels in enumerate(arrivals(1, late, transfer=MS)):
            ranks[r] += [{**k, "start_ns": k["start_ns"] + i * 3 * MS, "end_ns": k["end_ns"] + i * 3 * MS}
                         for k in kernels]
    result = run(tiny_job(tmp_path, ranks))
    assert result.straggler is None and result.verdict.startswith("balanced")
    assert [f.root_cause for f in result.findings] == ["compute-communication-imbalance"]
    assert result.findings[0].time_at_stake_ns == result.median_wait_ns == 8 * MS  # 8 collectives waiting 1 ms


def test_rank_imbalance_clocks_apart_read_durations(tmp_path):
    ranks = arrivals(12, {0: 0, 1: 0, 2: 2 * MS})
    ranks[1] = [{**k, "start_ns": k["start_ns"] + 10_000 * MS, "end_ns": k["end_ns"] + 10_000 * MS} for k in ranks[1]]
    result = run(tiny_job(tmp_path, ranks))
    assert result.basis == "durations" and "does not overlap" in result.basis_note
    assert result.straggler.rank == 2 and result.straggler.lateness_ns == 2 * MS


def test_rank_imbalance_shares_kernel_spread_and_histograms(tmp_path):
    ranks = [[comp(r, 0, 10 * MS), comp(r, 5 * MS, (12 + r) * MS, "attn"), nccl(r, 30 * MS, 35 * MS)]
             for r in range(10)]
    result = run(tiny_job(tmp_path, ranks), limit=3)
    assert len(result.rows) == 3 and result.truncated
    rows = by_rank(result)
    assert rows[9].compute_ns == 21 * MS and rows[9].idle_ns == 35 * MS - 21 * MS - 5 * MS
    assert all(sum(h.counts) == 10 for h in result.histograms)
    compute = next(h for h in result.histograms if h.metric == "compute_pct")
    assert (compute.low, compute.high) == (round(100 * 12 / 35, 2), round(100 * 21 / 35, 2))
    attn = next(k for k in result.kernel_spread if k.kernel == "attn")
    means = [(7 + r) * MS for r in range(10)]
    assert (attn.min_mean_ns, attn.max_mean_ns, attn.slowest_rank) == (7 * MS, 16 * MS, 9)
    assert attn.spread_pct == round(100 * 9 * MS / statistics.median(means), 2)


def test_rank_imbalance_ranks_without_nccl_or_events_compare_nothing(tmp_path):
    result = run(tiny_job(tmp_path, [[comp(0, 0, 5 * MS)], []]))
    assert result.matched == 0 and result.straggler is None and "no NCCL collective" in result.verdict
    empty = by_rank(result)[1]
    assert (empty.window_ns, empty.steps, empty.step_ns, empty.idle_pct) == (0, 0, None, 0.0)
    assert by_rank(result)[0].compute_pct == 100.0 and result.findings == []
    alone = run(tiny_job(tmp_path / "one", [[comp(0, 0, 5 * MS)]]))
    assert alone.verdict.startswith("one rank")


def test_rank_imbalance_fits_the_result_budget(rank_set):
    from stallhound.server import budget
    con, _, _ = rank_set("compute")
    params = ri.Params(job="j", limit=3)
    text, result = budget.fit(run_skill(con, ri, params), ri, params, budget.MIN_RESULT_CHARS)
    assert len(text) <= budget.MIN_RESULT_CHARS and len(result.model_dump_json()) <= budget.MIN_RESULT_CHARS
    assert result.cut_by in ("limit", "characters") and result.truncated
    assert result.straggler.rank == 1 and [f.root_cause for f in result.findings] == ["nccl-straggler"]


def test_rank_imbalance_run_measures_and_run_skill_attaches_the_findings(rank_set):
    con, _, _ = rank_set("compute")
    figures = ri.run(con, ri.Params(job="j"))
    assert figures.findings == [] and figures.straggler.rank == 1
    found = run_skill(con, ri, ri.Params(job="j")).findings
    assert found == ri.findings(figures)
    assert [(f.root_cause, f.evidence["straggler_rank"]) for f in found] == [("nccl-straggler", 1)]


def test_synth_ranks_write_one_rank_per_file_and_the_truth(tmp_path):
    truth = write_rank_set(tmp_path, ranks=2, iterations=3, straggler_rank=None)
    assert json.loads((tmp_path / TRUTH_NAME).read_text()) == json.loads(json.dumps(truth))
    assert sorted(p.name for p in tmp_path.glob("rank_*.sqlite")) == ["rank_0.sqlite", "rank_1.sqlite"]
    whole = truth["job"]["totals"]["per_device"]
    for rank in truth["ranks"]:
        export = sqlite3.connect(rank["path"])
        devices = export.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        pids = export.execute("SELECT DISTINCT (globalTid >> 24) & 16777215 FROM CUPTI_ACTIVITY_KIND_RUNTIME"
                              ).fetchall()
        kernels = export.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        export.close()
        assert (devices, pids) == ([(rank["device"],)], [(rank["pid"],)])
        assert kernels == whole[rank["rank"]]["kernels"]
    with pytest.raises(FileExistsError):
        write_rank_set(tmp_path, ranks=2, iterations=3)


def test_synth_ranks_cli_writes_a_rank_set_and_refuses_a_bad_rank(tmp_path, capsys):
    from stallhound.cli import main as cli
    assert cli.main(["synth", str(tmp_path), "--ranks", "2", "--iterations", "3", "--straggler-rank", "1"]) == 0
    truth = json.loads((tmp_path / TRUTH_NAME).read_text())
    assert (truth["straggler"]["rank"], truth["straggler"]["kind"], len(truth["ranks"])) == (1, "compute", 2)
    assert cli.main(["synth", str(tmp_path), "--ranks", "2", "--straggler-rank", "2", "--force"]) == 2
    assert "straggler rank 2 is not one of the 2 ranks (0-1)" in capsys.readouterr().err
