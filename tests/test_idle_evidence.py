"""Idle causes decided by evidence, on real profiles: what the raw trace holds in the gaps (read here from the JSON
or with SQL on the export, never from the model), checked against what the tools say. A data loader only where the
trace shows one; start-up and one-time setup are no bubbles; idle on a trace that lost its kernels is not ranked;
the steady window's note never has a negative duration; a capture whose CUDA tracing never started says so."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sqlite3
from functools import cache
from pathlib import Path

import pytest
from conftest import FIXTURES
from fixture_guard import FIXTURES_ROOT
from modeldb import make_model, union_ns

from stallhound.analysis import input_pipeline, trace_quality
from stallhound.analysis.common import run_skill
from stallhound.formats import open_profile
from stallhound.tools import gpu_idle_gaps, triage

KINETO = FIXTURES_ROOT / "kineto"
US = 1000  # Kineto times are in microseconds


@cache
def events(name: str) -> tuple[dict, ...]:
    """The complete ('X') events of a torch.profiler trace, as the JSON has them."""
    with gzip.open(KINETO / name) as f:
        return tuple(e for e in json.load(f)["traceEvents"] if e.get("ph") == "X")


def gpu_gaps(evs: tuple[dict, ...]) -> list[tuple[float, float]]:
    """The stretches (us) between the device's kernels, copies and memsets: a plain sweep over the JSON."""
    work = sorted((e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    out, reach = [], work[0][1]
    for s, e in work[1:]:
        if s > reach:
            out.append((reach, s))
        reach = max(reach, e)
    return out


def covered_us(evs: tuple[dict, ...], tid: int, cat: str, lo: float, hi: float) -> float:
    """How much of [lo, hi) the thread spends inside events of category `cat` (nested ones counted once)."""
    pieces = [(max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in evs
              if e.get("cat") == cat and e.get("tid") == tid and e["ts"] < hi and e["ts"] + e["dur"] > lo]
    return union_ns([(round(s * US), round(e * US)) for s, e in pieces]) / US


@pytest.fixture(scope="module")
def kineto(cache_root):
    opened = {}

    def _open(name: str):
        if name not in opened:
            opened[name] = open_profile(KINETO / name, cache_dir=cache_root)
        return opened[name]
    yield _open
    for profile in opened.values():
        profile.close()


def triaged(profile, name: str) -> triage.Result:
    return triage.run(profile.con, triage.Params(profile=name, limit=100))


# --- class 2: a data loader only from evidence of one ------------------------------------------------------------
def test_ddp_forward_is_host_work_in_operators_not_a_data_loader(kineto):
    """hta_a100: the 253 ms once called data-loader starvation sat in gaps inside DistributedDataParallel.forward, a
    range that merely contains 'Data'. The JSON shows the main thread inside CPU operators that launch nothing
    (aten::unflatten_dense_tensors after the buffer broadcast) and no DataLoader anywhere."""
    name = "hta_a100_nccl_rank0.json.gz"
    evs = events(name)
    assert not any("dataloader" in e["name"].lower() or "_next_data" in e["name"] for e in evs)
    [main] = {e["tid"] for e in evs if e["name"].startswith("ProfilerStep#")}
    forward = min((e for e in evs if e["name"] == "DistributedDataParallel.forward" and e.get("cat") ==
                   "user_annotation"), key=lambda e: e["ts"])
    inside = [g for g in gpu_gaps(evs) if forward["ts"] <= g[0] < forward["ts"] + forward["dur"]]
    lo, hi = max(inside, key=lambda g: g[1] - g[0])
    ops, calls = covered_us(evs, main, "cpu_op", lo, hi), covered_us(evs, main, "cuda_runtime", lo, hi)
    assert (hi - lo) > 15_000 and ops - calls > 0.9 * (hi - lo)  # 15.7 ms, 97% inside operators, no CUDA call

    profile = kineto(name)
    assert input_pipeline.evidence(profile.con) == ()
    gaps = run_skill(profile.con, gpu_idle_gaps, gpu_idle_gaps.Params(profile=name, limit=100)).gaps
    [gap] = [g for g in gaps if abs(g.start_ns - lo * US) < 1]  # the JSON's float microseconds, to the ns
    assert abs(gap.duration_ns - (hi - lo) * US) < 2 and gap.cause == "host_op"
    result = triaged(profile, name)
    found = {f.root_cause: f for f in result.findings}
    assert "dataloader-starvation" not in found
    host = found["cpu-bottleneck"]
    assert "inside framework operators that launched no GPU work" in host.title
    lo, hi = result.window.start_ns / US, result.window.end_ns / US
    work = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    busy = union_ns([(round(max(e["ts"], lo) * US), round(min(e["ts"] + e["dur"], hi) * US)) for e in work
                     if e["ts"] < hi and e["ts"] + e["dur"] > lo])
    assert host.time_at_stake_ns <= result.window.duration_ns - busy  # never more than the device idled


@pytest.mark.parametrize("name", ["hta_sampled_rank0.json.gz", "hta_sampled_rank1.json.gz"])
def test_only_the_programs_own_loader_ranges_are_input_waits(kineto, name):
    """hta_sampled: DistributedDataParallel.forward and TorchRec's all2all_data ranges are no input pipeline; the
    only loader evidence is the '## data_load ##' annotation, and only gaps it covers can be starvation."""
    evs = events(name)
    loads = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e["name"] == "## data_load ##"]
    assert len(loads) == 2
    profile = kineto(name)
    assert input_pipeline.evidence(profile.con) == ("NVTX range '## data_load ##'",)
    overlapping = sum(hi - lo for lo, hi in gpu_gaps(evs) if any(lo < e and hi > s for s, e in loads))
    starved = sum(f.time_at_stake_ns for f in triaged(profile, name).findings
                  if f.root_cause == "dataloader-starvation")
    assert starved <= round(overlapping * US)


def test_torchscript_operators_are_no_compilation(kineto):
    """hta_sampled_rank1: torch::jit:: operators run TorchScript graphs; the JSON holds no module load or compile."""
    name = "hta_sampled_rank1.json.gz"
    evs = events(name)
    assert any("torch::jit::" in e["name"] for e in evs)
    assert not any(e.get("cat") == "cuda_runtime" and ("Module" in e["name"] or "Library" in e["name"]) for e in evs)
    assert {"module-loading-hot-path", "torch-compile-recompilation"}.isdisjoint(
        f.root_cause for f in triaged(kineto(name), name).findings)


# --- class 10: the steady window never leaves out a negative time -------------------------------------------------
def test_a_step_that_begins_before_the_gpu_leaves_nothing_out(kineto):
    """hta_a100: ProfilerStep#4 opens 6.092 ms before the first kernel (JSON): nothing GPU-active lies before it."""
    name = "hta_a100_nccl_rank0.json.gz"
    evs = events(name)
    step = min(e["ts"] for e in evs if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    first = min(e["ts"] for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    note = triaged(kineto(name), name).window_note
    assert f"nothing left out before the first steady iteration (it begins {(first - step) / 1000:.3f} ms" in note
    assert "-" not in note.split(";")[1]


# --- class 3: start-up and one-time setup are no bubbles ------------------------------------------------------------
def test_start_up_and_teardown_are_outside_the_idle_findings(open_fixture):
    """clue_t4: the capture holds 562.8 ms of start-up before the first GPU work and 219.4 ms after the last (SQL);
    over the capture the idle findings are those of the GPU-active window, which holds neither (the host's CPU work
    between them: 275.1 ms, where counting the edges made it 476.6 ms: 257.0 ms before the syncs' turnarounds, in
    which the thread prints, were its own (18.1 ms); the idle between pages the host faults in belongs to unified
    memory)."""
    con = sqlite3.connect(f"file:{FIXTURES / 'clue_t4_report4'}.sqlite?mode=ro", uri=True)
    first, last = con.execute("SELECT min(s), max(e) FROM (SELECT start s, \"end\" e FROM CUPTI_ACTIVITY_KIND_KERNEL "
                              "UNION ALL SELECT start, \"end\" FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
                              "SELECT start, \"end\" FROM CUPTI_ACTIVITY_KIND_MEMSET)").fetchone()
    profile = open_fixture("clue_t4_report4")
    start, end = profile.con.execute("SELECT capture_start_ns, capture_end_ns FROM meta").fetchone()
    assert first - start > 560_000_000 and end - last > 219_000_000
    by_window = {}
    for window in ((start, end), (first, last)):
        result = run_skill(profile.con, gpu_idle_gaps, gpu_idle_gaps.Params(profile="p", start_ns=window[0],
                                                                             end_ns=window[1]))
        by_window[window] = sorted((f.root_cause, f.time_at_stake_ns) for f in result._idle.findings())
    capture, gpu = by_window[start, end], by_window[first, last]
    assert ("cpu-bottleneck", 275_069_021) in capture and set(capture) <= set(gpu)
    assert all(ns < 0.01 * (end - start) for f, ns in set(gpu) - set(capture))  # worth reporting in a shorter window


# --- class 8: idle on a trace that lost its kernels is not ranked -------------------------------------------------
def test_launches_without_kernels_after_the_last_recorded_one_are_not_lost(open_fixture):
    """nsysai_h100_2gpu_1s, a cut export: 1,714 launch calls have no kernel, every one launched after its thread's
    last launch whose kernel was recorded (SQL): their kernels ran past the cut, none is missing inside it."""
    con = sqlite3.connect(f"file:{FIXTURES / 'nsysai_h100_2gpu_1s'}.sqlite?mode=ro", uri=True)
    rows = con.execute("""
        SELECT r.globalTid, r.start, k.correlationId IS NOT NULL FROM CUPTI_ACTIVITY_KIND_RUNTIME r
        JOIN StringIds s ON s.id = r.nameId
        LEFT JOIN (SELECT DISTINCT globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL) k
          ON k.correlationId = r.correlationId AND k.globalPid = (r.globalTid >> 24) << 24
        WHERE s.value LIKE 'cudaLaunchKernel%'""").fetchall()
    last = {}
    for tid, start, recorded in rows:
        if recorded:
            last[tid] = max(last.get(tid, start), start)
    unrecorded = [(tid, start) for tid, start, recorded in rows if not recorded]
    assert len(unrecorded) == 1714 and all(start > last[tid] for tid, start in unrecorded)
    lost = trace_quality.lost_kernels(open_fixture("nsysai_h100_2gpu_1s").con, 0, 2**62)
    assert lost == trace_quality.LostKernels(0, len(rows))


def test_idle_findings_on_a_trace_that_lost_most_kernels_are_not_ranked(tmp_path, cache_root):
    """nsysai_mfu_2gpu_before with 5 of every 6 kernel records of its middle 80% deleted, as a CUPTI buffer loss
    leaves them (their launch calls stay): every idle finding is info, ranked after every other finding, and says
    how many of the window's launches lost their kernels (SQL on the damaged copy)."""
    path = tmp_path / "lost.sqlite"
    shutil.copy(FIXTURES / "nsysai_mfu_2gpu_before.sqlite", path)
    path.chmod(0o644)
    with sqlite3.connect(path) as con:
        lo, hi = con.execute("SELECT min(start), max(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        deleted = con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start BETWEEN ? AND ? AND "
                              "correlationId % 6 <> 0", (lo + (hi - lo) // 10, hi - (hi - lo) // 10)).rowcount
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile="lost", limit=100))
    finally:
        profile.close()
    idle = {"gpu-bubbles", "cpu-bottleneck", "small-kernel-overhead", "excessive-synchronization",
            "module-loading-hot-path"}
    ranks = [(f.root_cause in idle, f.severity) for f in result.findings]
    assert any(is_idle for is_idle, _ in ranks) and all(sev == "info" for is_idle, sev in ranks if is_idle)
    first_idle = next(i for i, (is_idle, _) in enumerate(ranks) if is_idle)
    assert all(sev == "info" for _, sev in ranks[first_idle:])  # nothing ranked after them but other info
    assert all(f"{deleted:,} of the" in f.title for f in result.findings if f.root_cause in idle)


# --- class 10: a capture whose CUDA tracing never started -----------------------------------------------------------
FAILED = "CUDA profiling might have not been started correctly."


@pytest.mark.parametrize("cuda_rows, failed", [(0, True), (1, False)])
def test_cuda_data_of_a_capture_whose_cuda_tracing_did_not_start(cuda_rows, failed):
    """The start failure speaks only where the capture holds no CUDA data: a helper process of a capture that has
    them carries the same message."""
    con = make_model(diagnostics=[{"severity": "warning", "source": "analysis", "pid": 7, "text": FAILED}],
                     cuda_api=[{"pid": 7, "tid": 7, "name": "cudaFree", "kind": "alloc", "start_ns": 1,
                                "end_ns": 2}] * cuda_rows)
    flags = dict(con.execute("SELECT data, capture_flag FROM capabilities WHERE NOT present").fetchall())
    assert ("did not start" in flags["kernels"]) == failed and ("--trace=cuda" in flags["kernels"]) != failed


CORPUS = Path(os.environ.get("STALLHOUND_CORPUS") or "~/.cache/stallhound-corpus").expanduser()


def corpus_profile(name: str, sha256: str) -> Path:
    """A restored corpus profile (corpus/sources), skipped when it is not in this machine's corpus cache."""
    path = next((p for p in sorted(CORPUS.glob(f"{name}.*")) if p.is_file()), None)
    if path is None:
        pytest.skip(f"corpus profile {name} is not restored in {CORPUS}")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    return path


def test_julia_capture_whose_cuda_trace_failed_says_so(cache_root):
    """jaccjl_cg_nocuda: nsys's DIAGNOSTIC_EVENT says CUDA profiling did not start and the export has no CUDA table
    (SQL); triage says tracing failed to start instead of asking for --trace=cuda."""
    path = corpus_profile("jaccjl_cg_nocuda", "7f994d1947bef95166a9c5e296cbc333fb306c60c9c2918ab1aa50e2ce7330e2")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert raw.execute("SELECT count(*) FROM DIAGNOSTIC_EVENT WHERE text = ?", (FAILED,)).fetchone() == (1,)
    assert not raw.execute("SELECT name FROM sqlite_master WHERE name LIKE 'CUPTI_ACTIVITY_KIND_%'").fetchall()
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile="jacc"))
    finally:
        profile.close()
    assert any("CUDA tracing did not start" in q for q in result.quality)
    cuda = [m for m in result.missing if m.data in ("kernels", "cuda_api", "memcpy")]
    assert len(cuda) == 3 and all("did not start" in m.capture_flag and "--trace" not in m.capture_flag for m in cuda)


def test_pinned_allocation_before_the_first_kernel_is_setup_under_its_name(cache_root):
    """dtuhpc_omp_matmult_mnk (OpenMP offload on an H100): between the first copy and the first kernel the host
    spends 1.14 s, 651 ms of it in cuMemHostAlloc and cudaMallocHost (pinned host memory, SQL), with one 0.5 ms
    cuModuleLoadDataEx: one-time setup by allocation, not a bubble the trace cannot explain, nor module loading."""
    path = corpus_profile("dtuhpc_omp_matmult_mnk", "ade9459cfeaa84478c49e8a124245e2e0b0c2b5eb8f694cac4a1e8ba130969a0")
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    (copied,) = raw.execute("SELECT min(\"end\") FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
    (kernel,) = raw.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    pinned, module = raw.execute("""
        SELECT sum(min(r."end", ?2) - max(r.start, ?1)) FILTER (WHERE s.value LIKE '%HostAlloc%'
                                                                 OR s.value LIKE 'cudaMallocHost%'),
               sum(min(r."end", ?2) - max(r.start, ?1)) FILTER (WHERE s.value LIKE 'cuModuleLoad%')
        FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        WHERE r."end" > ?1 AND r.start < ?2""", (copied, kernel)).fetchone()
    assert pinned > 0.5 * (kernel - copied) and module < 1_000_000
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile="dtu"))
    finally:
        profile.close()
    [setup] = [f for f in result.findings if f.root_cause == "profiler-window-on-warmup"]
    assert "allocating or freeing device or pinned memory" in setup.title and "compiling" not in setup.title
    assert kernel - copied <= setup.time_at_stake_ns <= result.window.duration_ns
    assert {"gpu-bubbles", "module-loading-hot-path"}.isdisjoint(f.root_cause for f in result.findings)


def test_hip_launches_link_their_kernels_so_allocator_waits_are_seen(cache_root):
    """tl_mi300_resnet18_nopool (ROCm, caching allocator off): kernels are launched by hipLaunchKernel and
    hipExtModuleLaunchKernel (JSON), and hipFree calls on the launching thread take most of the idle time; the
    kernels link to their launches, so the idle is the allocator's, within the allocator calls' time (JSON)."""
    path = corpus_profile("tl_mi300_resnet18_nopool",
                          "0e9ad539e9d802f76f88c88c4780ad76489626382707d91b7dfcf19c364764b7")
    with gzip.open(path) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    launches = {e["name"] for e in evs if e.get("cat") == "cuda_runtime" and "Launch" in e["name"]}
    alloc_us = sum(e["dur"] for e in evs if e.get("cat") == "cuda_runtime" and e["name"] in ("hipMalloc", "hipFree"))
    assert launches == {"hipLaunchKernel", "hipExtModuleLaunchKernel"}
    profile = open_profile(path, cache_dir=cache_root)
    try:
        linked = profile.con.execute("SELECT count(*), count(launch_api) FROM kernels").fetchone()
        result = triage.run(profile.con, triage.Params(profile="mi300"))
    finally:
        profile.close()
    assert linked[0] == linked[1] > 0
    [alloc] = [f for f in result.findings if f.root_cause == "alloc-in-loop"]
    assert 0.8 * result.window.duration_ns * (100 - alloc.evidence["device_busy_pct"]) / 100 <= alloc.time_at_stake_ns
    assert alloc.time_at_stake_ns <= alloc_us * US
