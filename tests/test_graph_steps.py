"""Steps from CUDA graph replays, and steps of stencil codes found by their kernel rhythm (issue 31).

A graph replay starts a step when no NVTX range does (explicit markers and repeating ranges with GPU work come
first) and its replays hold half its device's GPU time: tiny models here, then real traces checked against their raw
JSON: vLLM's one decode replay (tl_vllm_graph_replay_mi300) and our H100 capture launch_bound_graph, whose
ProfilerStep ranges win and which, with them taken out of its JSON (built here from the real trace), is 30 replays.
Stencils: the OpenMP-offload heat codes of the corpus (sc23omp_heat_*) against independent SQL on their exports, and
one of them with ~28 ms of host idle planted after each timestep (timesteps ~32 ms apart)."""

from __future__ import annotations

import shutil
import sqlite3
import statistics
from decimal import Decimal
from pathlib import Path

import pytest
from modeldb import make_model
from test_kineto import read_json, span, xs
from test_kineto_nccl import write_json

from corpus import sources
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.model.errors import InvalidRequest
from stallhound.tools import iterations as it
from stallhound.tools import triage as tr

BY_NAME = {p.name: p for p in sources.load()}
API = "cudaGraphLaunch"


def run(con, **kw) -> it.Result:
    return run_skill(con, it, it.Params(profile="t", **kw))


def replay(corr: int, launch: int, starts: list[int], length: int = 40, tid: int = 1, device: int = 0) -> list[dict]:
    """The kernels one graph launch (at `launch`, correlation `corr`) ran, each `length` ns from its start."""
    return [{"device_id": device, "stream_id": 7, "pid": 1, "tid": tid, "correlation_id": corr, "start_ns": s,
             "end_ns": s + length, "short_name": f"g{i}", "name": f"g{i}", "launch_api": API,
             "launch_start_ns": launch, "launch_end_ns": launch + 5} for i, s in enumerate(starts)]


def eager(s: int, e: int, name: str = "sample", tid: int = 1, corr: int | None = None) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": 1, "tid": tid, "correlation_id": corr, "start_ns": s, "end_ns": e,
            "short_name": name, "name": name, "launch_api": "cudaLaunchKernel", "launch_start_ns": s - 10}


def decode_loop() -> list[dict]:
    """Three replays of a graph (two kernels each, 100-190, 300-390, 500-590) with a sampler kernel after each."""
    kernels = []
    for k, start in enumerate((100, 300, 500)):
        kernels += replay(k + 1, start - 50, [start, start + 50])
        kernels.append(eager(start + 100, start + 120, corr=100 + k))
    return kernels


# --- unit ------------------------------------------------------------------------------------------
def test_graph_replays_are_the_steps_start_to_start_the_last_to_its_own_end():
    result = run(make_model(kernels=decode_loop()))
    assert (result.method, result.duration_basis, result.candidates) == ("graph:cudaGraphLaunch", "start_to_start", [])
    # the sampler after each replay is its step's; the last step's end is not in the trace (no next replay), and
    # its replay alone (90 ns) is under half a step: left out, as a last range cut off by the window is
    assert [(r.start_ns, r.end_ns) for r in result.rows] == [(100, 300), (300, 500)]
    assert result.reason == ("no NVTX range occurs 3+ times on a thread with GPU work; CUDA graph replays "
                             "(cudaGraphLaunch): 3 on 1 thread(s), holding 80% or more of their device's GPU time; "
                             "each replay starts a step")  # 3 x 80 ns of the 3 x 100 ns of kernels
    assert it.marked_steps(result) and it.step_named(result)


def test_graph_one_replay_is_one_step_and_bounds_the_window():
    result = run(make_model(kernels=replay(1, 50, [100, 200, 300])))
    assert (result.iteration_count, result.first_ns, result.span_start_ns) == (1, 240, 100)
    assert it.steady_window(result) == (100, 340)
    assert result.note.startswith("only 1 step(s) by graph:cudaGraphLaunch (the program's own graph replays")


def test_graph_a_repeating_range_around_replays_is_the_step():
    """Two replays a step inside a repeating range: the range is the coarser evidence."""
    kernels = decode_loop() + replay(9, 640, [700, 750])
    nvtx = [{"pid": 1, "tid": 1, "text": "decode", "start_ns": s, "end_ns": s + 190, "kind": "push_pop", "depth": 0}
            for s in (40, 440, 640)]
    result = run(make_model(kernels=kernels, nvtx=nvtx))
    assert result.method == "nvtx:decode"


def test_graph_replays_holding_little_of_the_gpu_time_are_no_step():
    """A graph of a few kernels beside long eager work (one layer captured): the kernel rhythm decides."""
    kernels = decode_loop() + [eager(s, s + 400, "big", corr=200 + i) for i, s in enumerate((1000, 1500, 2000, 2500))]
    result = run(make_model(kernels=kernels))
    assert result.method == "kernel_pattern:big"
    assert "CUDA graph replays hold at most 13% of a device's GPU time (a step's replays hold 50% or more)" in (
        result.reason)  # 240 of 240 + 60 + 1600 ns
    with pytest.raises(InvalidRequest, match="hold at most 13%"):
        run(make_model(kernels=kernels), method="graph")


def test_graph_nsys_whole_graph_executions_are_steps():
    """nsys' default graph trace: one graph_exec row a launch, no kernel rows inside."""
    execs = [{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "correlation_id": k, "start_ns": s,
              "end_ns": s + 150, "graph_id": 3, "graph_exec_id": 4, "launch_api": API, "launch_start_ns": s - 20,
              "launch_end_ns": s - 15} for k, s in enumerate((100, 300, 500, 700))]
    result = run(make_model(graph_exec=execs))
    assert result.method == "graph:cudaGraphLaunch"
    assert [r.duration_ns for r in result.rows] == [200, 200, 200, 150]


def test_graph_method_without_replays_is_an_error():
    with pytest.raises(InvalidRequest, match="no CUDA graph replays in this window"):
        run(make_model(kernels=[eager(10, 20)]), method="graph")


# --- real traces -----------------------------------------------------------------------------------
def graph_replays_in_json(doc: dict) -> list[tuple[int, int]]:
    """(first start, last end) in ns of the kernels of each graph launch, by the launch's correlation, in order."""
    launches = {e["args"]["correlation"] for e in xs(doc, "cuda_runtime") if e["name"].endswith("GraphLaunch")}
    spans: dict[int, list[tuple[int, int]]] = {}
    for e in xs(doc, "kernel"):
        if e["args"].get("correlation") in launches:
            spans.setdefault(e["args"]["correlation"], []).append(span(e))
    return sorted((min(s for s, _ in v), max(e for _, e in v)) for v in spans.values())


def restored(name: str) -> Path:
    path = sources.resolve(BY_NAME[name])
    if path is None:
        pytest.skip(f"corpus profile {name} is not restored in {sources.cache_dir()} (make corpus-restore)")
    return path


def test_graph_vllm_decode_replay_is_one_step(cache_root):
    """Before: 11 'iterations' of a per-layer attention kernel (kernel_unified_attention_2d, 0.876 ms)."""
    path = restored("tl_vllm_graph_replay_mi300")
    (start, end), = graph_replays_in_json(read_json(path))  # one hipGraphLaunch: 421 kernels
    con = open_profile(path, cache_dir=cache_root).con
    result = run(con)
    assert (result.method, result.iteration_count) == ("graph:hipGraphLaunch", 1)
    assert (result.rows[0].start_ns, result.rows[0].end_ns) == (start, end)  # 10.389 ms
    window = run_skill(con, tr, tr.Params(profile="t")).window
    assert (window.start_ns, window.end_ns, window.window_basis) == (start, end, "steady_state")


def test_graph_launch_bound_capture_profiler_steps_win_and_without_them_replays_are_steps(cache_root, tmp_path):
    path = sources.resolve(BY_NAME["launch_bound_graph"], cache_root)
    doc = read_json(path)
    assert run(open_profile(path, cache_dir=cache_root).con).method == "nvtx:ProfilerStep#N"  # 10 replays a step
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    stripped = write_json(tmp_path / "launch_bound_graph_nostep.json.gz", doc)
    replays = graph_replays_in_json(doc)
    result = run(open_profile(stripped, cache_dir=cache_root).con, limit=100)
    assert (result.method, result.iteration_count) == ("graph:cudaGraphLaunch", len(replays) == 30 and 30)
    expected = [b[0] - a[0] for a, b in zip(replays, replays[1:], strict=False)] + [replays[-1][1] - replays[-1][0]]
    assert [r.duration_ns for r in result.rows] == expected
    assert result.steady_median_ns == statistics.median(expected[1:])  # 0.105 ms


# --- stencils --------------------------------------------------------------------------------------
def kernel_starts(path: Path, name: str) -> list[int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return [s for (s,) in con.execute("SELECT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON "
                                          "n.id = k.shortName WHERE n.value = ? ORDER BY 1", (name,))]


def steady_periods(starts: list[int]) -> tuple[int, float]:
    """(steps, steady median) of a kernel rhythm read as the step finder reads it: start to next start, the first
    step out of the median."""
    periods = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    return len(periods), statistics.median(periods[1:])


@pytest.mark.parametrize(("name", "kernel", "median_ms"), [
    ("sc23omp_heat_datareg", "nvkernel_solve_F1L210_2", 4.210),
    ("sc23omp_heat_mapeveryiter", "nvkernel_solve_F1L204_2", 554.844)])
def test_stencil_heat_timesteps_by_their_kernel(cache_root, name, kernel, median_ms):
    path = restored(name)
    result = run(open_profile(path, cache_dir=cache_root).con)
    assert (result.method, result.duration_basis) == (f"kernel_pattern:{kernel}", "start_to_start")
    assert (result.iteration_count, result.steady_median_ns) == steady_periods(kernel_starts(path, kernel))
    assert result.iteration_count == 49 and result.steady_median_ns == pytest.approx(median_ms * 1e6, abs=1e3)


def host_idle_after(path: Path, dst: Path, kernel: str, gaps_ns: list[int]) -> Path:
    """A copy of the export where, after the k-th run of `kernel` ends, everything later moves gaps_ns[k] on: the
    host idles that long before the next timestep (a call spanning that moment lasts the gap longer)."""
    shutil.copyfile(path, dst)
    ends = [e for (e,) in sqlite3.connect(path).execute(
        'SELECT k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.shortName WHERE n.value = ? '
        "ORDER BY 1", (kernel,))]
    with sqlite3.connect(dst) as con:
        con.execute("CREATE TEMP TABLE gaps (after INTEGER, gap INTEGER)")
        con.executemany("INSERT INTO gaps VALUES (?, ?)", list(zip(ends, gaps_ns, strict=False)))
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in set(tables) - {"TARGET_INFO_SESSION_START_TIME"}:
            columns = [r[1] for r in con.execute(f"PRAGMA table_info('{table}')")]
            for c in set(columns) & {"start", "end", "timestamp", "startTime", "stopTime"}:
                con.execute(f'UPDATE {table} SET "{c}" = "{c}" + (SELECT coalesce(sum(gap), 0) FROM gaps '
                            f'WHERE after < {table}."{c}") WHERE "{c}" IS NOT NULL')
    con.close()
    return dst


def test_stencil_timesteps_32_ms_apart_across_host_idle_are_steady(cache_root, tmp_path):
    """The heat stencil's 4.2 ms timesteps with 23-33 ms of host idle after each (jittered +-18%): timesteps
    ~32 ms apart, the GPU idle 87% of the time, found as steady iterations that bound triage's window."""
    kernel = "nvkernel_solve_F1L210_2"
    gaps = [int(Decimal(28_000_000) * (1 + Decimal((k * 7) % 11 - 5) / 28)) for k in range(50)]
    path = host_idle_after(restored("sc23omp_heat_datareg"), tmp_path / "heat_idle.sqlite", kernel, gaps)
    starts = kernel_starts(path, kernel)
    count, median = steady_periods(starts)
    assert 31e6 < median < 33e6
    con = open_profile(path, cache_dir=cache_root).con
    result = run(con)
    assert (result.method, result.iteration_count, result.steady_median_ns) == (
        f"kernel_pattern:{kernel}", count, median)
    assert result.note is None and result.rows[1].gpu_busy_pct < 20
    window = run_skill(con, tr, tr.Params(profile="t")).window
    assert (window.window_basis, window.start_ns, window.end_ns) == ("steady_state", starts[0], starts[-1])
