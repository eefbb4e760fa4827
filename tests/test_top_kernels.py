"""top_kernels: grouping by demangled or short name, shares, kinds, hotspots and the FP32 GEMM detector."""

from __future__ import annotations

import sqlite3
from collections import defaultdict

import pytest
from conftest import FIXTURE_IDS, FIXTURES
from modeldb import make_model

from stallhound.analysis import rules
from stallhound.analysis.contracts import run_skill
from stallhound.model.errors import InvalidRequest
from stallhound.tools import top_kernels as tk

ACTIVE_FIXTURES = [f for f in FIXTURE_IDS if f != "dynamicvit_empty_export"]
VEC = "void at::native::vectorized_elementwise_kernel"
ADD = f"{VEC}<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)"
FILL = f"{VEC}<(int)4, at::native::FillFunctor<float>, std::array<char *, (unsigned long)1>>(int, T2, T3)"
FFMA = ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute"
        "_kernel__5x_cublas")
SGEMM = "volta_sgemm_128x64_nn"  # an FP32 GEMM whose name shows no TF32-capable architecture
NVJET = "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"


def k(name: str, s: int, e: int, device: int = 0, stream: int = 7, short: str | None = None) -> dict:
    short = short or name.removeprefix("void ").split("<")[0].split("(")[0].split("::")[-1]
    return {"device_id": device, "stream_id": stream, "start_ns": s, "end_ns": e, "short_name": short, "name": name}


def gpu(device: int = 0, cc: str | None = "9.0") -> dict:
    return {"device_id": device, "compute_capability": cc}


def run(con, **kw) -> tk.Result:
    return run_skill(con, tk, tk.Params(profile="t", **kw))


def row(**kw) -> tk.KernelRow:
    return tk.KernelRow(**{"variants": 1, "device": None, **kw})


TINY = [k(ADD, 0, 10), k(ADD, 100, 130), k(FILL, 200, 220), k(FFMA, 300, 350)]


@pytest.fixture
def ns_kernels(monkeypatch):
    """These unit kernels last nanoseconds: no kernel counts as tiny here, the tiny-kernel rule (hotspots.launch_bound)
    has its own tests in test_hotspots."""
    monkeypatch.setattr(rules, "TINY_KERNEL_NS", 0)


# --- unit ------------------------------------------------------------------------------------------
def test_top_kernels_whole_result_by_name(ns_kernels):
    result = run(make_model(kernels=TINY, gpus=[gpu()]))
    assert (result.group_by, result.kernel_count, result.kernel_time_ns, result.distinct_names) == ("name", 4, 110, 3)
    assert (result.truncated, result.total_rows, result.notes, result.scope.duration_ns) == (False, 3, [], 350)
    assert result.rows == [
        row(display_name=FFMA, name=FFMA, short_name=FFMA, kind="gemm-fp32", count=1, total_ns=50, mean_ns=50.0,
            median_ns=50.0, min_ns=50, max_ns=50, std_ns=0.0, kernel_time_pct=45.45, window_pct=14.29),
        row(display_name="vectorized_elementwise_kernel<CUDAFunctor_add<float>>", name=ADD,
            short_name="vectorized_elementwise_kernel", kind="elementwise", count=2, total_ns=40, mean_ns=20.0,
            median_ns=20.0, min_ns=10, max_ns=30, std_ns=10.0, kernel_time_pct=36.36, window_pct=11.43),
        row(display_name="vectorized_elementwise_kernel<FillFunctor<float>>", name=FILL,
            short_name="vectorized_elementwise_kernel", kind="elementwise", count=1, total_ns=20, mean_ns=20.0,
            median_ns=20.0, min_ns=20, max_ns=20, std_ns=0.0, kernel_time_pct=18.18, window_pct=5.71),
    ]
    assert result.hotspots == result.rows[:2]
    assert result.gemms == [tk.DeviceGemms(
        device=0, kernel_time_ns=110, gemm_fp32_ns=50, gemm_fp32_count=1, gemm_fp32_pct=45.45, gemm_tensor_ns=0,
        gemm_other_ns=0, conv_fp32_ns=0, top_fp32_gemm=FFMA, compute_capability="9.0", min_arch_from_names=80,
        tf32_tensor_cores=True, fp16_tensor_cores=True, basis="compute_capability")]
    fp32, hot = result.findings  # the device's two hot kernels: one finding, most time first
    assert fp32.model_dump() == {
        "root_cause": "fp32-gemm-no-tensor-cores", "severity": "medium", "device": 0, "time_at_stake_ns": 25,
        "tags": ["gemm-fp32"],
        "title": f"device 0: FP32 GEMMs without tensor cores take 45.5% of kernel time ({FFMA}) on a GPU with TF32 "
                 "tensor cores (compute capability 9.0)",
        "evidence": {"gemm_fp32_ns": 50, "gemm_fp32_pct": 45.45, "gemm_fp32_count": 1, "kernel_time_ns": 110,
                     "gemm_tensor_ns": 0, "tensor_core_basis": "compute_capability", "compute_capability": "9.0",
                     "tf32_min_speedup": 2.0}, "where": None}
    ncu = ("ncu --kernel-name vectorized_elementwise_kernel --launch-skip 0 --launch-count 1 --set full "
           "-o vectorized_elementwise_kernel <program>")  # no grid recorded: no configuration to skip to
    add = ("vectorized_elementwise_kernel<CUDAFunctor_add<float>> (elementwise) takes 36.4% of kernel time and 11.4% "
           "of the window on device 0; the timeline holds no FLOP or byte counts, so whether it runs near the GPU's "
           f"limits cannot be told without Nsight Compute: `{ncu}`")
    assert (hot.root_cause, hot.severity, hot.device, hot.time_at_stake_ns, hot.tags) == (
        "kernel-hotspot", "info", 0, 0, ["gemm-fp32", "elementwise"])
    assert hot.title.startswith("2 kernels take 81.8% of kernel time and 25.7% of the window on device 0: 1) "
                                f"{FFMA} (gemm-fp32) takes 45.5%") and hot.title.endswith(f" | 2) {add}")
    assert (hot.evidence["kernel"], hot.evidence["hot_kernels"], hot.evidence["hot_kernel_time_pct"],
            hot.evidence["hot_window_pct"]) == (FFMA, 2, 81.8, 25.7)
    assert "GEMMs on device 0: FP32" in tk.render(result) and "CUDAFunctor_add<float>" in tk.render(result)


def test_top_kernels_group_by_short_name_merges_instantiations():
    result = run(make_model(kernels=TINY, gpus=[gpu()]), group_by="short_name")
    assert (result.distinct_names, result.total_rows) == (2, 2)
    assert result.rows[0] == row(
        display_name="vectorized_elementwise_kernel", name=ADD, short_name="vectorized_elementwise_kernel",
        kind="elementwise", variants=2, count=3, total_ns=60, mean_ns=20.0, median_ns=20.0, min_ns=10, max_ns=30,
        std_ns=8.2, kernel_time_pct=54.55, window_pct=17.14)
    assert [r.display_name for r in result.hotspots] == ["vectorized_elementwise_kernel", FFMA]


def test_top_kernels_per_device_shares_are_of_each_device(ns_kernels):
    kernels = [k("x", 0, 30), k("y", 30, 40), k("x", 0, 10, device=1), k("y", 10, 60, device=1)]
    merged = run(make_model(kernels=kernels))
    assert [(r.display_name, r.device, r.kernel_time_pct, r.window_pct) for r in merged.rows] == [
        ("y", None, 60.0, 50.0), ("x", None, 40.0, 33.33)]
    [both] = merged.findings  # two hot kernels over the devices together: one finding, most time first
    assert (both.title.split(": 1) ")[0], both.device, both.severity) == (
        "2 kernels take 100.0% of kernel time and 83.3% of the window", None, "medium")
    assert both.title.index("1) y (custom) takes 60.0%") < both.title.index("2) x (custom) takes 40.0%")
    split = run(make_model(kernels=kernels), per_device=True)
    assert [(r.display_name, r.device, r.kernel_time_pct, r.window_pct) for r in split.rows] == [
        ("y", 1, 83.33, 83.33), ("x", 0, 75.0, 50.0), ("x", 1, 16.67, 16.67), ("y", 0, 25.0, 16.67)]
    assert [(f.device, f.evidence["kernel_time_pct"]) for f in split.findings] == [(1, 83.33), (0, 75.0)]
    only = run(make_model(kernels=kernels), device=1)
    assert [(f.device, f.evidence["kernel_time_pct"]) for f in only.findings] == [(1, 83.33)]


@pytest.mark.parametrize("kernels, kw, hot", [
    ([k("a", 0, 30), k("b", 30, 100)], {}, [("b", "medium")]),  # exactly 30% is not above it
    ([k("a", 0, 40), k("b", 40, 100)], {"limit": 1}, [("b", "medium")]),  # whatever the limit: one finding for both
    ([k(NCCL, 0, 90), k("b", 90, 100)], {}, []),  # NCCL time includes waiting for peers
    ([k("a", 0, 10), k("a", 90, 100), k("b", 40, 45)], {}, [("a", "info")]),  # not most of the window: by kernel time
    ([k("a", 0, 10), k("a", 90, 100)], {}, []),  # one name: its 100% of kernel time says nothing...
    ([k("a", 0, 50), k("a", 50, 100)], {}, [("a", "medium")]),  # ... unless it runs most of the window
    ([k("a", 0, 50), k("b", 50, 100, device=1)], {"per_device": True}, [("a", "medium"), ("b", "medium")]),
])
def test_top_kernels_hotspot_preconditions(kernels, kw, hot, ns_kernels):
    """A hot kernel takes over 30% of kernel time beside others, or over half the window alone; with no launch
    configuration recorded there is no evidence of under-use, so one running most of the window is medium."""
    result = run(make_model(kernels=kernels), **kw)
    assert [(f.evidence["kernel"], f.severity) for f in result.findings] == hot
    assert all(f.time_at_stake_ns == 0 for f in result.findings)


@pytest.mark.parametrize("gpus, kernels, basis, found", [
    ([gpu(cc="9.0")], [k(FFMA, 0, 50), k("b", 50, 100)], "compute_capability", True),
    ([gpu(cc="8.6")], [k(SGEMM, 0, 50), k("b", 50, 100)], "compute_capability", True),  # hardware beats names
    ([gpu(cc="7.5")], [k(FFMA, 0, 50), k("b", 50, 100)], "compute_capability", False),  # T4: no TF32 (FP16: below)
    ([gpu(cc=None)], [k(FFMA, 0, 50), k("b", 50, 100)], "kernel_names", True),  # sm80_ in the name
    ([gpu(cc=None)], [k(SGEMM, 0, 50), k("b", 50, 100)], "unknown", False),  # volta_ kernels run on Hopper too
    ([gpu(cc=None)], [k(SGEMM, 0, 50), k(NVJET, 50, 100)], "kernel_names", True),  # nvjet: Hopper or newer
    ([gpu(cc="9.0")], [k(FFMA, 0, 10), k("b", 10, 100)], "compute_capability", True),  # 10%: at the threshold
    ([gpu(cc="9.0")], [k(FFMA, 0, 999), k("b", 999, 10_000)], "compute_capability", False),  # 9.99%
])
def test_top_kernels_fp32_gemm_needs_tf32_tensor_cores_and_a_share(gpus, kernels, basis, found):
    result = run(make_model(kernels=kernels, gpus=gpus))
    (g,) = result.gemms
    assert g.basis == basis
    fp32 = [f for f in result.findings if f.root_cause == "fp32-gemm-no-tensor-cores" and "gemm-fp32" in f.tags]
    assert len(fp32) == int(found)
    if found:
        assert fp32[0].time_at_stake_ns == g.gemm_fp32_ns // 2 and fp32[0].device == 0


def test_top_kernels_fp32_notes_say_what_could_not_be_decided():
    unknown = run(make_model(kernels=[k(SGEMM, 0, 50), k("b", 50, 100)], gpus=[gpu(cc=None)]))
    assert unknown.notes == ["device 0: FP32 GEMMs take 50.0% of kernel time, but the export records no compute "
                             "capability and no kernel name shows sm80 or newer, so whether it has TF32 tensor cores "
                             "cannot be told"]
    old = run(make_model(kernels=[k(SGEMM, 0, 50), k("b", 50, 100)], gpus=[gpu(cc="6.0")]))
    assert old.notes == ["device 0: FP32 GEMMs take 50.0% of kernel time on compute capability 6.0, which has no "
                         "tensor cores"]
    assert run(make_model(kernels=[k(SGEMM, 0, 50), k("b", 50, 100)], gpus=[gpu(cc="7.0")])).notes == []


SCUDNN = "cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1"  # cuDNN's FP32 implicit-GEMM convolution
DGRAD = "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const *, int)"
H884 = "volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc2nchw_tn_v1"  # FP16 on tensor cores


@pytest.mark.parametrize("cc, kernels, fp32_ns, stake_ns", [
    ("7.0", [k(SGEMM, 0, 300), k(SCUDNN, 300, 500), k(DGRAD, 500, 600), k("b", 600, 1000)], (300, 300), 525),
    ("7.5", [k(SCUDNN, 0, 100), k("b", 100, 1000)], (0, 100), 88),  # convs alone: 10%, at the threshold
    ("7.5", [k(SCUDNN, 0, 99), k(H884, 99, 500), k("b", 500, 1000)], None, None),  # 9.9%: the FP16 conv is no FP32
    ("6.0", [k(SGEMM, 0, 500), k("b", 500, 1000)], None, None),  # Pascal: no tensor cores at all
    ("8.0", [k(SCUDNN, 0, 500), k("b", 500, 1000)], None, None),  # Ampere: FP32 convs are TF32's (cudnn.allow_tf32)
])
def test_top_kernels_fp16_tensor_cores_on_7x(cc, kernels, fp32_ns, stake_ns):
    """On compute capability 7.x (V100, T4) the FP32 GEMMs and cuDNN convolutions are what FP16 mixed precision
    moves to the tensor cores; at most 7/8 of their time is saved (FP16_PEAK_SPEEDUP, an upper bound)."""
    result = run(make_model(kernels=kernels, gpus=[gpu(cc=cc)]))
    found = [f for f in result.findings if f.root_cause == "fp32-gemm-no-tensor-cores"]
    if fp32_ns is None:
        assert found == []
        return
    (f,) = found
    assert (f.evidence["gemm_fp32_ns"], f.evidence["conv_fp32_ns"]) == fp32_ns
    assert f.time_at_stake_ns == stake_ns == round(sum(fp32_ns) * 7 / 8) and f.tags == ["fp16-tensor-cores"]
    assert f"compute capability {cc}, whose tensor cores run FP16" in f.title and "at most" in f.title


@pytest.mark.parametrize("name, cc, stake_ns", [
    ("NVIDIA GeForce RTX 2080 Ti", "7.5", 375),  # half-rate FP16 with FP32 accumulation: ~4x, at most 3/4 (the PARAM
    # traces' GPU: param_linear_mlp_2080ti's 278.6 ms of sgemm may save 209 ms, not 244)
    ("NVIDIA TITAN RTX", "7.5", 438),  # a full-rate Turing: 7/8
    ("Tesla T4", "7.5", 438),
    ("NVIDIA GeForce GTX 1080", "6.1", None),  # no tensor cores
])
def test_top_kernels_fp16_bound_follows_the_gpus_fp16_rate(name, cc, stake_ns):
    result = run(make_model(kernels=[k(SGEMM, 0, 500), k("b", 500, 1000)], gpus=[{**gpu(cc=cc), "name": name}]))
    found = [f for f in result.findings if f.root_cause == "fp32-gemm-no-tensor-cores"]
    assert [f.time_at_stake_ns for f in found] == ([stake_ns] if stake_ns else [])
    if found:
        rate = 4 if "GeForce" in name else 8
        assert f"peak {rate}x rate" in found[0].title and found[0].evidence["fp16_peak_speedup"] == rate


def test_top_kernels_reads_no_tensor_cores_from_an_amd_gfx_version():
    """An AMD GPU records its gfx version (9.0: an MI200) where NVIDIA's compute capability goes: no TF32 is read."""
    amd = {"device_id": 0, "compute_capability": "9.0", "name": "AMD Instinct MI210"}
    result = run(make_model(kernels=[k(SGEMM, 0, 500), k("b", 500, 1000)], gpus=[amd]))
    (g,) = result.gemms
    assert (g.basis, g.tf32_tensor_cores, g.fp16_tensor_cores, result.notes) == ("amd", None, None, [])
    assert [f for f in result.findings if f.root_cause == "fp32-gemm-no-tensor-cores"] == []


def test_top_kernels_fp32_gemm_per_device_and_capped_at_the_window():
    overlapping = [k(FFMA, 0, 100, stream=s) for s in (1, 2, 3)]  # 300 ns of GEMMs in a 100 ns window
    kernels = overlapping + [k(FFMA, 0, 10, device=1), k("b", 10, 100, device=1)]
    result = run(make_model(kernels=kernels, gpus=[gpu(0), gpu(1)]))
    fp32 = [(f.device, f.severity, f.time_at_stake_ns, f.evidence["gemm_fp32_ns"]) for f in result.findings
            if f.root_cause == "fp32-gemm-no-tensor-cores"]
    assert fp32 == [(0, "high", 100, 300), (1, "medium", 5, 10)]


@pytest.mark.parametrize("kw, message", [
    ({"device": 3}, "device 3 is not in this profile"),
    ({"start_ns": 600, "end_ns": 500}, "is empty"),
    ({"start_ns": 5000, "end_ns": 6000}, "outside the capture"),
])
def test_top_kernels_rejects_bad_scope(kw, message):
    with pytest.raises(InvalidRequest, match=message):
        run(make_model(kernels=TINY), **kw)


def test_top_kernels_params_validation():
    with pytest.raises(ValueError):
        tk.Params(profile="t", group_by="demangled")


def test_top_kernels_empty_export_has_no_window(open_fixture):
    with pytest.raises(InvalidRequest, match="no timed events"):
        run(open_fixture("dynamicvit_empty_export").con)


# --- golden: real exports against independent SQL on the raw SQLite --------------------------------
def raw(stem: str) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


RAW_GROUPS = """SELECT {key}, count(*), sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
    JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName GROUP BY {key}"""


@pytest.mark.parametrize("stem", ["nsysai_h100_2gpu_1s", "nsysai_mfu_2gpu_before", "fuser_h200_crossentropy",
                                  "clue_t4_report4", "extrap_windows_con_kernel"])
@pytest.mark.parametrize("group_by, key", [("name", "d.value"), ("short_name", "s.value")])
def test_top_kernels_groups_match_raw_sql(open_fixture, stem, group_by, key):
    expected = sorted((name[:tk.NAME_CHARS] if group_by == "name" else name, n, t)
                      for name, n, t in raw(stem).execute(RAW_GROUPS.format(key=key)))
    result = run(open_fixture(stem).con, group_by=group_by, limit=500)
    got = sorted((r.name if group_by == "name" else r.short_name, r.count, r.total_ns) for r in result.rows)
    assert got == expected
    assert (result.kernel_count, result.kernel_time_ns, result.distinct_names, result.truncated) == (
        sum(n for _, n, _ in expected), sum(t for _, _, t in expected), len(expected), False)
    assert sum(r.variants for r in result.rows) == len(raw(stem).execute(RAW_GROUPS.format(key="d.value")).fetchall())


def test_top_kernels_per_device_matches_raw_sql(open_fixture):
    stem = "nsysai_h100_2gpu_1s"
    totals = dict(raw(stem).execute('SELECT deviceId, sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1'))
    top = raw(stem).execute("""SELECT k.deviceId, d.value, sum(k."end" - k.start) AS t FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds d ON d.id = k.demangledName GROUP BY 1, 2 ORDER BY t DESC LIMIT 4""").fetchall()
    result = run(open_fixture(stem).con, per_device=True, limit=4)
    assert [(r.device, r.name, r.total_ns, r.kernel_time_pct) for r in result.rows] == [
        (d, n, t, round(100 * t / totals[d], 2)) for d, n, t in top]


def test_top_kernels_fp32_gemms_on_h100_fixture_without_hardware_info(open_fixture):
    """nsysai_h100_2gpu_1s has no TARGET_INFO_GPU: the sm80_ FFMA GEMM names decide."""
    stem = "nsysai_h100_2gpu_1s"
    con = raw(stem)
    assert not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'TARGET_INFO_GPU'").fetchone()
    figures = con.execute("""SELECT k.deviceId, sum(k."end" - k.start) FILTER (WHERE d.value LIKE '%\\_ffma\\_%'
        ESCAPE '\\'), count(*) FILTER (WHERE d.value LIKE '%\\_ffma\\_%' ESCAPE '\\'), sum(k."end" - k.start)
        FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName
        GROUP BY 1 ORDER BY 1""").fetchall()
    result = run(open_fixture(stem).con)
    fp32 = [f for f in result.findings if f.root_cause == "fp32-gemm-no-tensor-cores"]
    assert [(f.device, f.severity, f.time_at_stake_ns, f.evidence["gemm_fp32_ns"], f.evidence["gemm_fp32_count"],
             f.evidence["kernel_time_ns"], f.evidence["tensor_core_basis"], f.evidence["min_arch_from_names"],
             f.tags) for f in fp32] == [
        (d, "high", round(fp32_ns / 2), fp32_ns, n, total, "kernel_names", 80, ["gemm-fp32"])
        for d, fp32_ns, n, total in figures]
    assert all(fp32_ns / total > 0.8 for _, fp32_ns, _, total in figures)
    assert [(g.compute_capability, g.tf32_tensor_cores, g.gemm_tensor_ns) for g in result.gemms] == [
        (None, True, 0)] * 2


@pytest.mark.parametrize("stem", ["nsysai_mfu_2gpu_before", "nsysai_mfu_2gpu_after"])
def test_top_kernels_mfu_gemms_are_tensor_core_and_attention_is_the_hotspot(open_fixture, stem):
    con = raw(stem)
    nvjet = dict(con.execute("""SELECT k.deviceId, sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nvjet%' GROUP BY 1"""))
    flash, total = con.execute("""SELECT sum(k."end" - k.start) FILTER (WHERE s.value = 'flash_fwd_kernel'),
        sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName""").fetchone()
    result = run(open_fixture(stem).con)
    assert {g.device: (g.gemm_tensor_ns, g.gemm_fp32_ns, g.gemm_other_ns) for g in result.gemms} == {
        d: (t, 0, 0) for d, t in nvjet.items()}
    assert [(f.root_cause, f.tags, f.device, f.evidence["kernel_time_pct"]) for f in result.findings] == [
        ("kernel-hotspot", ["attention"], None, round(100 * flash / total, 2))]


def test_top_kernels_user_kernels_are_custom_hotspots(open_fixture):
    top, share = raw("clue_t4_report4").execute("""SELECT s.value, 100.0 * sum(k."end" - k.start) / (SELECT
        sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL) AS p FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
        ON s.id = k.shortName GROUP BY 1 ORDER BY p DESC LIMIT 1""").fetchone()
    result = run(open_fixture("clue_t4_report4").con)
    assert {r.kind for r in result.rows} == {"custom"}
    assert [(f.evidence["kernel"], f.tags, f.device, f.evidence["kernel_time_pct"]) for f in result.findings] == [
        (top, ["custom"], 0, round(share, 2))]


@pytest.mark.parametrize("stem", ACTIVE_FIXTURES)
def test_top_kernels_result_stays_small(open_fixture, stem):
    result = run(open_fixture(stem).con, per_device=True)
    assert len(result.model_dump_json()) < 20_000
    assert tk.render(result)
    by_device = defaultdict(int)
    for r in run(open_fixture(stem).con, per_device=True, limit=500).rows:
        by_device[r.device] += r.total_ns
    assert dict(by_device) == {g.device: g.kernel_time_ns for g in result.gemms}


# --- synthetic samples -----------------------------------------------------------------------------
def test_top_kernels_no_fp32_finding_on_bf16_demo(demo):
    profile, truth = demo
    result = run(profile.con)
    assert [f.root_cause for f in result.findings if f.root_cause == "fp32-gemm-no-tensor-cores"] == []
    assert {g.device for g in result.gemms} == set(truth["devices"])
    assert all(g.gemm_fp32_ns == 0 and g.gemm_tensor_ns > 0 and g.basis == "compute_capability" for g in result.gemms)


def test_top_kernels_quiet_on_clean(clean):
    profile, _ = clean
    result = run(profile.con)
    assert all(f.time_at_stake_ns == 0 and f.severity == "info" for f in result.findings)
