"""Ranks compared by their steps of the same index (issue 31): rank_imbalance's step_ns and triage_job's slowest
rank checked against the ProfilerStep durations read from each rank's JSON, on real traces: the two sampled HTA
ranks, a real trace renumbered as a second rank (steps #5..#7 beside #4..#6), and a job of eight one-step ranks
made from our H100 capture (one ProfilerStep#2, with autograd ranges around) with planted stretches; and the
matching rule on its edges."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest
from test_kineto import KINETO, read_json, span, xs
from test_kineto_nccl import write_json

from stallhound.analysis.contracts import run_skill
from stallhound.analysis.rank_figures import RankSteps, matched_steps
from stallhound.formats import open_profile
from stallhound.jobs.job import load_job
from stallhound.tools import iterations
from stallhound.tools import rank_imbalance as ri
from stallhound.tools import triage_job as tj

ONESTEP = Path(__file__).resolve().parents[1] / "corpus" / "captures" / "data" / "onestep_resnet.json.gz"
SAMPLED = [KINETO / f"hta_sampled_rank{r}.json.gz" for r in (0, 1)]  # ProfilerStep#551 and #552 on each
NCCL = KINETO / "hta_a100_nccl_rank0.json.gz"  # ProfilerStep#4, #5, #6
STEP = re.compile(r"^ProfilerStep#([0-9]+)$")
# every time of rank r, x this: eight ranks, as the job the issue reports (its autograd ranges picked the wrong rank)
STRETCH = {r: Decimal(x) for r, x in enumerate(("1", "1", "1.3", "1.05", "0.95", "1.2", "1", "1.1"))}
TAIL_US = {1: Decimal(8000)}  # rank 1's step range ends 8 ms after its last op (host time at the step's end)
BY_FINDER_AND_NAME = pytest.mark.parametrize("range_name", [pytest.param(None, id="auto"),
                                                            pytest.param("ProfilerStep", id="range_name")])


def profiler_steps(path: Path) -> dict[int, int]:
    """Step number -> duration (ns) of each CPU-side ProfilerStep#N range in the trace, read from the JSON."""
    found = {}
    for e in xs(read_json(path), "user_annotation", "cpu_op"):
        if m := STEP.match(e["name"]):
            start, end = span(e)
            found[int(m.group(1))] = end - start
    return found


def truth(paths: list[Path]) -> dict[int, float]:
    """Rank -> the step_ns expected from the raw steps: the median of the steps after the first (all ranks here
    carry the same numbers), the only one's duration when one."""
    out = {}
    for rank, path in enumerate(paths):
        durs = [d for _, d in sorted(profiler_steps(path).items())]
        out[rank] = sorted(durs[1:])[(len(durs) - 2) // 2] if len(durs) > 2 else durs[-1]
    return out


def stretched(doc: dict, rank: int) -> dict:
    """Rank `rank` of the planted job: every time x STRETCH[rank] from the step's start, the step range
    TAIL_US[rank] longer, distributedInfo naming the rank."""
    step = next(e for e in xs(doc, "user_annotation") if STEP.match(e["name"]))
    t0 = Decimal(step["ts"])
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = (t0 + (Decimal(e["ts"]) - t0) * STRETCH[rank]).quantize(Decimal("0.001"))
        if "dur" in e:
            e["dur"] = (Decimal(e["dur"]) * STRETCH[rank]).quantize(Decimal("0.001"))
    step["dur"] += TAIL_US.get(rank, 0)
    doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": len(STRETCH)}
    return doc


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, cache_root):
    """jobs(name) -> (job, the ranks' files); each written and loaded once, its models in the session's cache."""
    made: dict[str, tuple] = {}

    def _job(name: str):
        if name not in made:
            folder = tmp_path_factory.mktemp(name)
            if name == "onestep":
                paths = [write_json(folder / f"rank{r}.json.gz", stretched(read_json(ONESTEP), r)) for r in STRETCH]
            elif name == "renumbered":  # rank 1: the same trace, its steps numbered one higher
                doc = read_json(NCCL)
                for e in xs(doc, "user_annotation"):
                    if m := STEP.match(e["name"]):
                        e["name"] = f"ProfilerStep#{int(m.group(1)) + 1}"
                doc["distributedInfo"]["rank"] = 1
                paths = [NCCL, write_json(folder / "rank1.json.gz", doc)]
            else:
                paths = SAMPLED
            made[name] = (load_job(paths, cache_dir=cache_root, workers=1), paths)
        return made[name]
    yield _job
    for job, _ in made.values():
        job.close()


def imbalance(job, **kw) -> ri.Result:
    return run_skill(job.con.cursor(), ri, ri.Params(job="j", **kw))


def steps_by_rank(result: ri.Result) -> dict[int, float | None]:
    return {r.rank: r.step_ns for r in result.rows}


# --- the matching rule ---------------------------------------------------------------------------------------
def test_matched_steps_by_marker_number_on_the_numbers_every_rank_has():
    got = matched_steps({0: RankSteps("nvtx:ProfilerStep#N", [10, 11, 12], [(4,), (5,), (6,)]),
                         1: RankSteps("nvtx:ProfilerStep#N", [20, 21, 22], [(5,), (6,), (7,)]), 2: None})
    assert (got.by, got.keys, got.durations) == ("marker number", [(5,), (6,)], {0: [11, 12], 1: [20, 21]})


def test_matched_steps_by_order_without_numbers_or_a_common_one():
    plain = {0: RankSteps("kernel_pattern:k", [10, 11, 12], None),
             1: RankSteps("nvtx:ProfilerStep#N", [20, 21], [(5,), (6,)])}
    assert matched_steps(plain).by == "order"
    assert matched_steps(plain).durations == {0: [10, 11], 1: [20, 21]}
    apart = {0: RankSteps("nvtx:ProfilerStep#N", [10], [(2,)]), 1: RankSteps("nvtx:ProfilerStep#N", [20], [(3,)])}
    assert (matched_steps(apart).by, matched_steps(apart).keys) == ("order", [(0,)])
    assert matched_steps({0: None, 1: RankSteps(None, [], None)}).by is None


# --- real traces ---------------------------------------------------------------------------------------------
def test_rank_imbalance_matches_steps_by_their_number(jobs, cache_root):
    """Rank 1 numbers its steps one higher: steps #5 and #6 are compared, each rank's step_ns is its #6 as the
    iterations tool times it on the rank's own profile (rank 1's #6 is the trace's original #5)."""
    job, paths = jobs("renumbered")
    result = imbalance(job)
    assert (result.step_match, result.steps_compared) == ("marker number", ["5", "6"])
    own = {}
    for rank, path in enumerate(paths):
        profile = open_profile(path, cache_dir=cache_root)
        found = iterations.run(profile.con, iterations.Params(profile="own"))
        profile.close()
        own[rank] = [r.duration_ns for r in found.rows]
        assert found.method == "nvtx:ProfilerStep#N"
    assert steps_by_rank(result) == {0: own[0][2], 1: own[1][1]}
    assert {r.step_method for r in result.rows} == {"nvtx:ProfilerStep#N"} and {r.steps for r in result.rows} == {3}
    assert "matched by marker number" in result.step_note and "matched by marker number" in ri.render(result)


def test_rank_imbalance_renumbered_steps_are_the_profiler_steps(jobs):
    job, paths = jobs("renumbered")
    raw = [profiler_steps(p) for p in paths]
    assert steps_by_rank(imbalance(job)) == {0: raw[0][6], 1: raw[1][6]}


@BY_FINDER_AND_NAME
def test_rank_imbalance_sampled_ranks_by_profiler_step(jobs, range_name):
    """The two sampled HTA ranks carry ProfilerStep#551 and #552: step_ns is each rank's #552."""
    job, paths = jobs("sampled")
    result = imbalance(job, range_name=range_name)
    assert steps_by_rank(result) == truth(paths) == {r: profiler_steps(p)[552] for r, p in enumerate(paths)}
    assert (result.step_match, result.steps_compared) == ("marker number", ["551", "552"])
    assert {r.step_method for r in result.rows} == {"nvtx:ProfilerStep#N"}


def test_rank_imbalance_missing_range_leaves_the_rank_without_steps(jobs):
    job, _ = jobs("sampled")
    result = imbalance(job, range_name="no such step")
    assert result.step_match is None and result.steps_compared == [] and steps_by_rank(result) == {0: None, 1: None}
    assert result.step_note == "no steps found on any rank with range 'no such step'"


@BY_FINDER_AND_NAME
def test_rank_imbalance_one_step_ranks_by_profiler_step(jobs, range_name):
    """Eight one-step ranks: the autograd ranges are longest on rank 2 (every time x1.3), the step on rank 1 (its
    range 8 ms past its ops): step_ns is each rank's ProfilerStep#2, read from its JSON."""
    job, paths = jobs("onestep")
    result = imbalance(job, range_name=range_name)
    raw = truth(paths)
    assert steps_by_rank(result) == raw and max(raw, key=raw.__getitem__) == 1
    assert (result.step_match, result.steps_compared) == ("marker number", ["2"])


def test_triage_job_names_the_rank_with_the_slowest_profiler_step(jobs):
    job, paths = jobs("onestep")
    result = tj.run(job.con.cursor(), tj.Params(job="j", range_name="ProfilerStep", limit=3))
    raw = truth(paths)
    assert (result.straggler, result.triaged_rank, result.chosen_by) == (None, 1, "slowest_step")
    assert result.chosen_why == (f"no straggler named; rank 1 has the longest step ({raw[1] / 1e6:.3f} ms; step(s) "
                                 "2 compared on every rank, matched by marker number; found by nvtx:ProfilerStep#2)")
    assert "matched by marker number" in result.step_note and "steps: 1 step(s)" in tj.render(result)
