"""The diagnosis on every real export: the findings an expert expects and none they would reject, each decided
by reading the raw export with SQL here; and the invariants every triage must keep on any profile."""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict

import pytest
from conftest import FIXTURE_IDS, FIXTURES
from modeldb import union_ns

from stallhound import book
from stallhound.tools import triage

PYTORCH_WORDS = re.compile(r"torch|DataLoader|\.item\(\)|pin_memory=|TrainingArguments|\bnn\.|FSDP|DDP|autocast|"
                           r"Hugging Face|\bgc\.|import ", re.I)
ONLY_ON_PYTHON = {"gc-pauses", "torch-compile-recompilation", "unneeded-activation-checkpointing"}


@pytest.fixture(scope="module")
def triaged(open_fixture):
    found: dict[str, triage.Result] = {}

    def _get(stem: str) -> triage.Result:
        if stem not in found:
            found[stem] = triage.run(open_fixture(stem).con, triage.Params(profile=stem, limit=100))
        return found[stem]
    return _get


def raw(stem: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{FIXTURES / stem}.sqlite?mode=ro", uri=True)


def kernel_share(stem: str, pattern: str, device: int | None = None) -> float:
    """Share of kernel time (all devices, or one) in kernels whose short name matches `pattern`."""
    con = raw(stem)
    rows = con.execute('SELECT s.value, k.deviceId, k."end" - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k '
                       "JOIN StringIds s ON s.id = k.shortName").fetchall()
    rows = [r for r in rows if device is None or r[1] == device]
    return sum(d for n, _, d in rows if re.search(pattern, n)) / sum(d for _, _, d in rows)


def busy_share(stem: str, device: int, start: int, end: int) -> float:
    """Union of the device's kernels, copies and memsets over [start, end), as a share."""
    con = raw(stem)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    work = []
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if t in tables:
            work += con.execute(f'SELECT start, "end" FROM {t} WHERE deviceId = ?', (device,)).fetchall()
    return union_ns([(max(s, start), min(e, end)) for s, e in work if e > start and s < end and e > s]) / (end - start)


def causes(result: triage.Result) -> dict[str, list]:
    out = defaultdict(list)
    for f in result.findings:
        out[f.root_cause].append(f)
    return out


# --- the review table: per real export ---------------------------------------------------------------------
def test_diagnosis_clue_a_cuda_program_starved_by_host_cpu_work(triaged):
    result = triaged("clue_t4_report4")
    w = result.window
    assert result.program.kind == "cuda"
    assert busy_share("clue_t4_report4", 0, w.start_ns, w.end_ns) < 0.3  # the T4 idles most of the loop
    [cpu] = causes(result)["cpu-bottleneck"]
    assert cpu.tags == ["host-cpu"] and cpu.time_at_stake_ns > 0.5 * w.duration_ns
    assert result.findings[0] is cpu and result.classification.bound == "host-bound"


def test_diagnosis_extrap_a_compute_bound_windows_program(triaged):
    result = triaged("extrap_windows_con_kernel")
    w = result.window
    assert busy_share("extrap_windows_con_kernel", 0, w.start_ns, w.end_ns) > 0.99
    # five cudaEventSynchronize calls wait 259 ms, but on a busy GPU: they cost nothing
    assert result.classification.bound == "compute-bound" and result.classification.compute_pct <= 100
    assert set(causes(result)) == {"kernel-hotspot"}
    [hot] = causes(result)["kernel-hotspot"]
    assert kernel_share("extrap_windows_con_kernel", "^test2$") > 0.9 and hot.time_at_stake_ns == 0


def loading_in_gaps(stem: str, tid: int) -> int:
    """Independent reading of the time device 0 idles while thread `tid` loads or compiles GPU code: the union of its
    module-loading calls, its launch calls of 0.5 ms or more that launched a kernel name's first kernel (lazy loading)
    and its NVTX ranges that say they compile, intersected with the long gaps (over 50 us, the next work launched only
    after the device ran dry) of the GPU-active window."""
    con = raw(stem)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    ops = sorted(op for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
                 if t in tables for op in con.execute(f'SELECT a.start, a."end", r."end" FROM {t} a '
                                                      "LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId)"))
    gaps, reach = [], ops[0][1]
    for start, end, launched in ops[1:]:
        if start - reach > 50_000 and launched > reach:
            gaps.append((reach, start))
        reach = max(reach, end)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    spans = [(s, e) for s, e, n, t in con.execute('SELECT start, "end", nameId, globalTid & 16777215 FROM '
                                                   "CUPTI_ACTIVITY_KIND_RUNTIME")
             if t == tid and re.match(r"cuModuleLoad|cuLibraryLoad|cuModuleGetFunction", names[n])]
    first: dict[str, tuple[int, int, int]] = {}
    for s, e, name, t in con.execute('SELECT r.start, r."end", k.demangledName, r.globalTid & 16777215 FROM '
                                     "CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                                     "USING (correlationId) ORDER BY k.start"):
        first.setdefault(name, (s, e, t))
    spans += [(s, e) for s, e, t in first.values() if t == tid and e - s >= 500_000]
    ranges = con.execute('SELECT n.start, n."end", coalesce(n.text, s.value), n.globalTid & 16777215 FROM '
                         'NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n."end" IS NOT NULL'
                         ).fetchall() if "NVTX_EVENTS" in tables else []
    spans += [(s, e) for s, e, text, t in ranges
              if t == tid and text and re.search(r"(?i)(^|[^a-z])(jit|nvrtc|ptxas)|compile([^d]|$)", text)]
    return union_ns([(max(s, gs), min(e, ge)) for gs, ge in gaps for s, e in spans if s < ge and e > gs])


def test_diagnosis_fuser_is_a_capture_of_compilation(triaged):
    """nvFuser compiles its fusions (compileNewKRT, compileFusionParallel, NVRTC) and loads them inside the window:
    the device idles 870 ms while that runs, not the whole of the gaps holding it (3,159 ms: the rest is CPU work).
    No loop: the one gap holding over half of it (564.8 ms) is the cost paid once (setup), the rest recurs."""
    result = triaged("fuser_h200_crossentropy")
    [jit] = causes(result)["module-loading-hot-path"]
    [setup] = causes(result)["profiler-window-on-warmup"]
    loading = jit.time_at_stake_ns + setup.evidence["loading_ns"]
    assert jit.tags == ["jit"] and loading == loading_in_gaps("fuser_h200_crossentropy", 50556)
    assert 869e6 < loading < 871e6 and setup.evidence["loading_ns"] > loading / 2 > jit.time_at_stake_ns
    assert result.classification.bound == "host-bound"


def test_diagnosis_h100_streams_pinned_weights_and_runs_fp32_gemms(triaged):
    result = triaged("nsysai_h100_2gpu_1s")
    con = raw("nsysai_h100_2gpu_1s")
    pinned, total = con.execute("SELECT sum(bytes) FILTER (WHERE srcKind = 1), sum(bytes) FROM "
                                "CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1").fetchone()
    assert pinned / total > 0.99  # the H2D copies are already pinned: pinning is not the fix
    h2d = causes(result)["excessive-h2d-transfers"]
    assert sorted(f.device for f in h2d) == [0, 1]
    assert all(f.tags == ["pinned"] and 0 < f.time_at_stake_ns <= result.window.duration_ns for f in h2d)
    assert kernel_share("nsysai_h100_2gpu_1s", "_ffma_|sgemm") > 0.5  # FP32 FMA GEMMs on tensor-core hardware
    assert sorted(f.device for f in causes(result)["fp32-gemm-no-tensor-cores"]) == [0, 1]
    w = result.window
    assert min(busy_share("nsysai_h100_2gpu_1s", d, w.start_ns, w.end_ns) for d in (0, 1)) > 0.99
    # both GPUs are busy 99%: nothing the host does can be costing time
    for cause in ("blocking-d2h-sync", "small-kernel-overhead", "excessive-synchronization", "cpu-bottleneck",
                  "gpu-bubbles"):
        assert cause not in causes(result), cause


@pytest.mark.parametrize("stem", ["nsysai_mfu_2gpu_before", "nsysai_mfu_2gpu_after"])
def test_diagnosis_mfu_steps_and_no_straggler(triaged, stem):
    result = triaged(stem)
    assert result.window.window_basis == "steady_state" and "FSDP::pre_forward" in result.window_note
    assert "nccl-straggler" not in causes(result)
    assert result.classification.bound == "compute-bound"
    starts = raw(stem).execute(
        'SELECT k.deviceId, k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName '
        "WHERE s.value LIKE 'ncclDevKernel%' ORDER BY k.start").fetchall()
    last = defaultdict(int)
    for (d0, _), (d1, _) in zip(starts[::2], starts[1::2], strict=False):
        if d0 != d1:
            last[d1] += 1
    assert min(last.values()) >= 0.25 * sum(last.values())  # each device arrives last a fair share of the time


def profiler_in_gaps(stem: str, device: int, start: int, end: int) -> int:
    """Independent reading of the time `device` idles in [start, end) while the profiler works (PROFILER_OVERHEAD)
    in the processes that launch its work: its long gaps (over 50 us, the next work launched only after the device
    ran dry) intersected with those records."""
    con = raw(stem)
    ops = con.execute(" UNION ALL ".join(
        f'SELECT a.start, a."end", r."end", r.globalTid >> 24 FROM {t} a LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r '
        "ON r.correlationId = a.correlationId AND r.globalTid >> 24 = a.globalPid >> 24 WHERE a.deviceId = ?"
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
        + " ORDER BY 1", (device,) * 3).fetchall()
    ops = [(max(s, start), min(e, end), launched, pid) for s, e, launched, pid in ops if e > start and s < end]
    gaps, reach = [], ops[0][1]
    for s, e, launched, _ in ops[1:]:
        if s - reach > 50_000 and (launched is None or launched > reach):
            gaps.append((reach, s))
        reach = max(reach, e)
    pids = {pid for *_, pid in ops}
    flushes = [(s, e) for s, e, pid in con.execute('SELECT start, "end", globalTid >> 24 FROM PROFILER_OVERHEAD')
               if pid in pids]
    return union_ns([(max(s, gs), min(e, ge)) for gs, ge in gaps for s, e in flushes if s < ge and e > gs])


def test_diagnosis_mfu_after_profiler_flush_is_not_module_loading(triaged):
    """No module is loaded or compiled in the window; a 6.0 ms CUPTI buffer flush of rank 0's process stalls its
    launches while device 0 idles: profiler overhead for the time it overlaps the gaps (device 1's 1.6 ms is under
    1% of the window)."""
    result = triaged("nsysai_mfu_2gpu_after")
    w = result.window
    assert not {"module-loading-hot-path", "torch-compile-recompilation"} & set(causes(result))
    [flush] = causes(result)["profiler-overhead"]
    assert flush.device == 0 and flush.time_at_stake_ns == profiler_in_gaps("nsysai_mfu_2gpu_after", 0, w.start_ns,
                                                                             w.end_ns) == 6_163_296
    assert profiler_in_gaps("nsysai_mfu_2gpu_after", 1, w.start_ns, w.end_ns) < 0.01 * w.duration_ns


def test_diagnosis_mfu_after_is_slower_for_small_kernels(triaged):
    before, after = triaged("nsysai_mfu_2gpu_before"), triaged("nsysai_mfu_2gpu_after")
    stake = {r: sum(f.time_at_stake_ns for f in causes(res)["small-kernel-overhead"])
             for r, res in (("before", before), ("after", after))}
    assert stake["after"] > 2 * stake["before"] > 0


def test_diagnosis_pipit_an_mpi_cuda_program(triaged):
    result = triaged("pipit_saxpy_mpi_a100")
    pageable = raw("pipit_saxpy_mpi_a100").execute(
        "SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE srcKind = 0 OR dstKind = 0").fetchone()
    assert pageable[0] == 15 and pageable[1] > 3e9
    assert result.program.kind == "cuda" and "MPI" in result.program.frameworks
    assert {"pageable-host-memory", "excessive-h2d-transfers", "cpu-bottleneck"} <= set(causes(result))
    assert result.classification.bound == "host-bound"


def test_diagnosis_degenerate_profiles_are_described_not_diagnosed(triaged):
    result = triaged("dynamicvit_empty_export")
    assert (result.classification.bound, result.findings) == ("no GPU activity", [])


def test_diagnosis_loading_gpu_code_is_a_finding_however_little_the_gpu_does(triaged):
    """torch.zeros(16).sum().item(): 3 GPU operations in 22 ms, too little to classify, but the first launch of
    reduce_kernel loads its module (lazy loading) for 17.8 ms of the 18.3 ms gap before it: that is the finding,
    one-time setup (paid once, no loop) beside a 4.2 ms allocation."""
    result = triaged("nsysai_mock")
    [jit] = result.findings
    assert result.classification.bound == "too little GPU activity" and jit.root_cause == "profiler-window-on-warmup"
    assert jit.evidence["loading_ns"] == loading_in_gaps("nsysai_mock", 91186) == 17_764_006


# --- invariants on every profile ----------------------------------------------------------------------------
def _check_invariants(result: triage.Result) -> None:
    c = result.classification
    for share in (c.compute_pct, c.copy_kernel_pct, c.transfer_pct, c.communication_pct, c.busy_pct, c.idle_pct):
        assert 0 <= share <= 100
    assert c.copy_kernel_pct <= c.compute_pct and c.overlap_pct >= 0
    per_device: dict[int | None, int] = defaultdict(int)
    seen = set()
    for f in result.findings:
        # one finding per cause and device; undersized-grid per kernel, each over the time it runs alone
        key = (f.root_cause, f.device, f.evidence["kernel"] if f.root_cause == "undersized-grid" else None)
        assert key not in seen, f"{f.root_cause} twice on device {f.device}"
        seen.add(key)
        if f.root_cause != "profiler-window-on-warmup":  # the warmup lies outside the analysed window
            per_device[f.device] += f.time_at_stake_ns
        assert f.time_at_stake_ns == 0 or f.device is not None
        entry = book.get_entry(f.root_cause)
        assert entry.applies(tuple(result.program.fix_chain)) and f.fix_for in result.program.fix_chain
        if result.program.kind not in ("pytorch", "python", "jax"):
            assert f.root_cause not in ONLY_ON_PYTHON and not PYTORCH_WORDS.search(f.fix), (f.root_cause, f.fix)
    if result.window:
        assert all(ns <= result.window.duration_ns for ns in per_device.values()), per_device
    assert result.total_findings == len(result.findings)


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_diagnosis_invariants_on_every_real_export(triaged, stem):
    _check_invariants(triaged(stem))


@pytest.mark.parametrize("sample", ["demo", "clean"])
def test_diagnosis_invariants_on_the_samples(request, sample):
    profile, _ = request.getfixturevalue(sample)
    _check_invariants(triage.run(profile.con, triage.Params(profile=sample, limit=100)))
