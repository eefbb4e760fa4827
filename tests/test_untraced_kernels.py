"""Kernel launches without kernel records (analysis.untraced_kernels): a crash is called one only when nothing in the
trace shows the kernels ran; the range profiler, WSL2 and a host that waited on the GPU each say why the records are
missing instead. Tiny models for the edges, and the corpus profiles whose readings (issue 35) are checked on the
raw export (SQL) or trace (JSON)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import Counter

import pytest
from modeldb import make_model
from test_idle_evidence import corpus_profile
from test_kineto_nccl import write_json

from stallhound.analysis import shares
from stallhound.analysis.common import ms
from stallhound.analysis.untraced_kernels import WAIT_MIN_NS
from stallhound.formats import open_profile
from stallhound.formats.kineto import workers
from stallhound.tools import profile_summary as ps
from stallhound.tools import triage

WSL = "5.15.90.1-microsoft-standard-WSL2"
QCU_SHA256 = "6f0255c8c69e2c177929793ca3b7eb48a082d3c42831c535e4a9d4526cb8f9d3"
SGEMM_SHA256 = "9cf6df772c83758b03289ab532935edf6be131429026d0a20a759f441e71c291"
RANGE_SHA256 = "07e7e02da9cfda66f5b6fc5fd17e1f93185321504496f4c00e8d375fb162bf84"
ZOOLOGY_SHA256 = "a40f0a72900ca9a018ae9772d821f571af345198094294d212dd55a88696d2cd"


def api(name: str, kind: str, start: int, corr: int, end: int | None = None) -> dict:
    return {"pid": 1, "tid": 1, "correlation_id": corr, "name": name, "kind": kind, "start_ns": start,
            "end_ns": start + 5 if end is None else end}


LAUNCHES = [api("cudaLaunchKernel", "launch", 100 * i, i) for i in range(10)]
CRASH = ("10 kernel launch calls were traced but the export holds no kernel records and no CUDA call waited on the "
         "GPU: the program most likely stopped or crashed before its kernels ran or before the profiler flushed its "
         "CUDA trace buffers, unless kernels were filtered out of the trace; check the program's exit status and "
         "re-capture with --trace=cuda, letting it exit normally (or calling cudaProfilerStop() first)")


def first_note(meta: dict | None = None, **tables: list[dict]) -> str:
    return ps.run(make_model(meta=meta, **tables), ps.Params(profile="t")).trace_quality[0]


def sync(wait_ns: int, corr: int = 10, name: str = "cudaDeviceSynchronize") -> dict:
    return api(name, "sync", 1000, corr, end=1000 + wait_ns)


def test_a_crash_launches_without_waits_or_teardown_is_still_called_one():
    """Launches and nothing after them: no sync waited on the GPU, so nothing says the kernels ran."""
    assert first_note(cuda_api=LAUNCHES) == CRASH
    # syncs that return at once (the GPU had nothing to do) are no evidence either, on Linux or on WSL2
    short = [sync(WAIT_MIN_NS - 1, 10 + i) for i in range(3)]
    assert first_note(cuda_api=LAUNCHES + short) == CRASH


def test_a_host_that_waited_on_the_gpu_shows_the_kernels_ran():
    """One sync blocked WAIT_MIN_NS: the GPU was working, so the records are the trace's loss, not a crash."""
    note = first_note(cuda_api=LAUNCHES + [sync(WAIT_MIN_NS), sync(1_000, 11, "cudaStreamSynchronize")],
                      meta={"os_release": "5.15.0-73-generic"})
    assert note.startswith("10 kernel launch calls were traced but the export holds no kernel records, yet the host "
                           "waited 1.001 ms on the GPU in 2 sync calls (cudaDeviceSynchronize x1 1.000 ms, "
                           "cudaStreamSynchronize x1 0.001 ms): the kernels ran and the trace lacks their records")
    assert "crash" not in note and "--trace=cuda" in note


@pytest.mark.parametrize("wait_ns, ran", [
    (WAIT_MIN_NS, "; the host waited 1.000 ms on the GPU in 1 sync calls (cudaDeviceSynchronize x1 1.000 ms), so the "
                  "kernels ran"),
    (WAIT_MIN_NS - 1, "; no sync call waited on the GPU, so whether the kernels ran cannot be told from this trace"),
])
def test_wsl2_says_the_platform_records_no_gpu_work(wait_ns, ran):
    note = first_note(cuda_api=LAUNCHES + [sync(wait_ns)], meta={"os_release": WSL, "nsys_version": "2023.2.3"})
    assert note == (
        "10 kernel launch calls were traced but the export holds no kernel records or copy records, and the capture "
        f"ran on WSL2 (kernel release {WSL}): nsys 2023.2.3 recorded the CUDA calls there but none of the GPU's own "
        f"work, which on WSL2 depends on the nsys release, the driver and Windows{ran}. Only the host side can be "
        "read (where and how long the host waited on the GPU: sync_analysis; the launches and copies it issued), not "
        "GPU idle, kernel or copy times; for a device timeline re-capture on native Linux, or on WSL2 with a current "
        "nsys and driver, and check that the export holds kernels")


def test_wsl2_with_copy_records_is_not_blamed_on_the_platform():
    """The GPU's own records exist (a copy): WSL2 did trace the device, so the missing kernels are no platform's."""
    copy = {"device_id": 0, "stream_id": 7, "pid": 1, "correlation_id": 20, "start_ns": 50, "end_ns": 60, "bytes": 8,
            "direction": "H2D"}
    note = first_note(cuda_api=LAUNCHES, memcpy=[copy], meta={"os_release": WSL},
                      gpus=[{"device_id": 0, "name": "NVIDIA GeForce RTX 3060"}])
    assert note == CRASH


def test_range_profiler_events_say_the_kernels_ran_under_it():
    """A torch.profiler trace with cuda_profiler_range events: the range profiler, not a crash, even on WSL2."""
    note = first_note(cuda_api=LAUNCHES, meta={"profiler_ranges": 10, "os_release": WSL})
    assert note.startswith("10 kernel launch calls were traced but the export holds no kernel records, and it holds "
                           "10 cuda_profiler_range events (the kernels by name, with the hardware counters measured "
                           "for each in their args): the kernels ran under CUPTI's range profiler")
    assert "crash" not in note and "WSL2" not in note


MEASURED_HEAD = ["no GPU activity: no kernel, copy or memset in the window",
                 "  compute 0.0%  transfer 0.0%  communication 0.0%  idle 100.0%  (overlap 0.0%)"]
UNRECORDED_HEAD = [f"no GPU activity: {shares.UNRECORDED_REASON}",
                   "  shares unknown: the device's time is not recorded (compute, transfer, communication, idle)"]


def headline(result: triage.Result) -> list[str]:
    """Triage's bound and shares lines, under its trace notes."""
    return triage.render(result).splitlines()[len(result.quality):len(result.quality) + 2]


@pytest.mark.parametrize("extra, meta, recorded", [
    ([sync(WAIT_MIN_NS)], {"os_release": "5.15.0-73-generic"}, False),  # a blocked sync: the GPU worked
    ([sync(WAIT_MIN_NS - 1)], {"os_release": "5.15.0-73-generic"}, True),  # the crash branch: nothing ran
    ([], {"os_release": WSL}, False),  # WSL2 records none of the GPU's work
    ([], {"profiler_ranges": 10}, False),  # the range profiler measured the kernels
    ([], None, True),  # launches alone
])
def test_the_headline_claims_idle_only_when_the_device_time_was_recorded(extra, meta, recorded):
    """Launches without device records: where the trace shows the GPU worked (untraced_kernels' evidence) its time is
    not recorded, so the shares are unknown ('not recorded', left at 0), not 100% idle; a crash keeps the idle
    reading."""
    result = triage.run(make_model(cuda_api=LAUNCHES + extra, meta=meta), triage.Params(profile="t"))
    c = result.classification
    assert headline(result) == (MEASURED_HEAD if recorded else UNRECORDED_HEAD)
    assert (c.shares_basis, c.idle_pct) == (("measured", 100.0) if recorded else ("not recorded", 0.0))
    shown = triage.render_markdown(result)
    assert ("| idle | 100.0 |" in shown) == recorded and ("shares unknown" in shown) != recorded


@pytest.mark.parametrize("ranges", [0, 2])
def test_kineto_load_counts_the_range_profiler_events(tmp_path, cache_root, ranges):
    """meta.profiler_ranges counts a trace's cuda_profiler_range events, which are no kernels (none in `kernels`)."""
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 2,
              "args": {"correlation": 5}}
    measured = [{"ph": "X", "cat": "cuda_profiler_range", "name": f"kernel_{i}", "pid": 0, "tid": 0, "ts": 20 + i,
                 "dur": 1, "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 64}} for i in range(ranges)]
    path = write_json(tmp_path / "t.json.gz", {"schemaVersion": 1, "traceEvents": [launch, *measured]})
    profile = open_profile(path, cache_dir=cache_root)
    try:
        got = profile.con.execute("SELECT profiler_ranges, os_release, (SELECT count(*) FROM kernels), "
                                  "(SELECT count(*) FROM cuda_api) FROM meta").fetchone()
    finally:
        profile.close()
    assert got == (ranges, None, 0, 1)


# --- the corpus profiles, read on their raw data ------------------------------------------------------------------
SYNC_SQL = """SELECT count(*), sum(r.end - r.start), max(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE '%ynchronize%'"""
LAUNCH_SQL = """SELECT count(*) FROM (SELECT DISTINCT r.globalTid / 16777216 % 16777216, r.correlationId
FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId WHERE s.value GLOB 'cu*Launch*')"""


def quality_of(path, cache_root) -> tuple[list[str], triage.Result, tuple]:
    """Triage's trace notes and result, and the model's (os_release, profiler_ranges)."""
    profile = open_profile(path, cache_dir=cache_root)
    try:
        result = triage.run(profile.con, triage.Params(profile=path.stem))
        meta = profile.con.execute("SELECT os_release, profiler_ranges FROM meta").fetchone()
    finally:
        profile.close()
    return result.quality, result, meta


@pytest.mark.parametrize("name, sha256, release, calls, top", [
    ("qcu_quda_wsl_apionly", QCU_SHA256, "6.6.36.3-microsoft-standard-WSL2", 11_137, "cuEventSynchronize x2,457"),
    ("sgemm_practice_wsl_apionly", SGEMM_SHA256, WSL, 80, "cudaEventSynchronize x32"),
])
def test_wsl2_api_only_captures_say_the_kernels_ran_and_the_platform_lacks_their_records(name, sha256, release,
                                                                                          calls, top, cache_root):
    """qcu (QUDA via Python) and sgemm (a C++ benchmark), both API-only on WSL2: SoftwareReleaseVersion, the launch
    count and the host's sync waits (SQL) are what the note says; no crash is claimed."""
    path = corpus_profile(name, sha256)
    raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert raw.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'SoftwareReleaseVersion'").fetchone() \
        == (release,)
    assert not raw.execute("SELECT name FROM sqlite_master WHERE name GLOB 'CUPTI_ACTIVITY_KIND_[KM]E*'").fetchall()
    n, waited, longest = raw.execute(SYNC_SQL).fetchone()
    assert n == calls and longest >= WAIT_MIN_NS
    launches = raw.execute(LAUNCH_SQL).fetchone()[0]
    quality, result, meta = quality_of(path, cache_root)
    assert meta == (release, None)
    note = quality[0]
    assert note.startswith(f"{launches:,} kernel launch calls were traced but the export holds no kernel records or "
                           f"copy records, and the capture ran on WSL2 (kernel release {release})")
    assert f"the host waited {ms(waited)} on the GPU in {n:,} sync calls ({top} " in note
    assert "so the kernels ran" in note and "native Linux" in note
    assert not any("crash" in q or "flushed" in q for q in quality) and result.findings == []
    assert headline(result) == UNRECORDED_HEAD and result.classification.shares_basis == "not recorded"


def test_range_profiler_trace_says_its_kernels_ran_under_the_range_profiler(cache_root):
    """hta_cupti_range_no_kernels (JSON): 77 cudaLaunchKernel, no kernel or copy event, 77 cuda_profiler_range events
    carrying hardware counters; the note says so and asks for a torch.profiler timeline, not an nsys option."""
    path = corpus_profile("hta_cupti_range_no_kernels", RANGE_SHA256)
    events = json.load(gzip.open(path))["traceEvents"]
    cats = Counter(e.get("cat") for e in events)
    launches = sum(1 for e in events if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaLaunchKernel")
    ranges = [e for e in events if e.get("cat") == "cuda_profiler_range"]
    assert (cats["kernel"], cats["gpu_memcpy"], launches, len(ranges)) == (0, 0, 77, 77)
    assert all(any(k.startswith("smsp__") for k in e["args"]) for e in ranges)
    quality, result, meta = quality_of(path, cache_root)
    assert meta == (None, len(ranges))
    assert quality[0].startswith(f"{launches} kernel launch calls were traced but the export holds no kernel "
                                 f"records, and it holds {len(ranges)} cuda_profiler_range events")
    assert quality[0].endswith("re-capture with torch.profiler with activities=[ProfilerActivity.CPU, "
                               "ProfilerActivity.CUDA] and no profiler_metrics")
    assert not any("crash" in q or "nsys" in q for q in quality) and result.findings == []
    assert headline(result) == UNRECORDED_HEAD and result.classification.shares_basis == "not recorded"


def test_a_torch_trace_cut_after_its_launches_is_still_called_a_crash(cache_root):
    """zoology_a100_no_kernels (JSON): 260 launch calls, no kernel, no sync call at all: nothing shows the kernels
    ran, so the crash-or-unflushed reading stands (without calling the profiler nsys)."""
    path = corpus_profile("zoology_a100_no_kernels", ZOOLOGY_SHA256)
    events = json.load(path.open())["traceEvents"]
    runtime = Counter(e.get("name") for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    assert not [n for n in runtime if "ynchronize" in str(n)] and runtime["cudaLaunchKernel"] == 236
    quality, result, meta = quality_of(path, cache_root)
    assert meta == (None, 0) and headline(result) == MEASURED_HEAD
    assert quality[0].startswith("260 kernel launch calls were traced but the export holds no kernel records and no "
                                 "CUDA call waited on the GPU: the program most likely stopped or crashed")
    assert "nsys" not in quality[0]


def test_kineto_workers_hand_back_the_range_profiler_events():
    """A batch parsed in a worker (large traces) sends the range rows back as the in-process path stages them."""
    measured = {"ph": "X", "cat": "cuda_profiler_range", "name": "k", "pid": 0, "tid": 0, "ts": 1, "dur": 1}
    parsed = workers.parse(json.dumps([measured, dict(measured, name="k2")]).encode())
    assert (parsed.columns["range"], parsed.read) == (['["k","k2"]'], 2)
