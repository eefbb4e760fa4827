"""profile_summary: hardware, windows, processes, table counts, missing data, library hints."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, dump
from modeldb import make_model

from nsightful.tools import profile_summary as ps

FA3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwd"
       "Sm90<(int)2, cute::tuple<cute::C<(int)1>>, cutlass::bfloat16_t>>>>(T1::Params)")
FA2 = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, (bool)0, "
       "cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, cutlass::bfloat16_t>>>(Flash_"
       "fwd_params)")
NAMES = {
    "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>>(int, T2, T3)": 3,
    "triton_poi_fused_add_0": 2,
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_cublas": 4,
    "cudnn_infer_volta_scudnn_128x64_relu_interior_nn_v1": 1,
    "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw": 1,
    FA2: 2,
    FA3: 1,
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>::Params)": 1,
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)": 5,
    "my_kernel(float *)": 1,
}


def kernel(name: str, i: int, pid: int = 100, tid: int = 100, device: int = 0) -> dict:
    return {"device_id": device, "stream_id": 7 + i % 2, "pid": pid, "tid": tid, "start_ns": 10 * i,
            "end_ns": 10 * i + 5, "name": name, "short_name": name.split("(")[0].split("<")[0].split()[-1]}


def run(con) -> ps.Result:
    return ps.run(con, ps.Params(profile="t"))


def test_profile_summary_library_hints():
    rows = [kernel(n, i) for i, n in enumerate(n for n, c in NAMES.items() for _ in range(c))]
    result = run(make_model(kernels=rows))
    assert [(lib.library, lib.kernel_count, lib.distinct_names, lib.version_hint) for lib in result.libraries] == [
        ("PyTorch (ATen)", 3, 1, None),
        ("Triton", 2, 1, None),
        ("cuBLAS/CUTLASS GEMM", 4, 1, None),  # neither the attention nor the cuDNN kernels count here
        ("cuDNN", 2, 2, None),
        ("FlashAttention / fused attention", 4, 3, "flash-attn 2 and flash-attn 3 (from kernel class names)"),
        ("NCCL", 5, 1, None),
    ]
    assert result.libraries[-1].example == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


@pytest.mark.parametrize("names, hint", [
    ([FA2], "flash-attn 2 (from kernel class names)"),
    ([FA3], "flash-attn 3 (from kernel class names)"),
    (["fmha_cutlassF_f32_aligned_64x64_rf_sm80(Params)"], "no flash-attn 2/3 kernel names: another fused attention "
                                                          "(e.g. fmha from cuDNN, xformers, TensorRT)"),
])
def test_profile_summary_flash_attention_version(names, hint):
    libraries = run(make_model(kernels=[kernel(n, i) for i, n in enumerate(names)])).libraries
    assert [(lib.library, lib.version_hint) for lib in libraries] == [("FlashAttention / fused attention", hint)]


def test_profile_summary_whole_result_on_tiny_model():
    con = make_model(
        kernels=[kernel("a(int)", i, pid=100 + i % 2, tid=200 + i % 3) for i in range(6)]
        + [kernel("b(int)", 9, pid=102, device=1)],
        memcpy=[{"device_id": 1, "stream_id": 3, "start_ns": 200, "end_ns": 210, "bytes": 8, "direction": "H2D"}],
        cuda_api=[{"pid": 100, "tid": 200, "name": "cudaLaunchKernel", "start_ns": 0, "end_ns": 300}],
        processes=[{"pid": p, "name": f"proc{p}"} for p in (1, 100, 101, 102)],
        gpus=[{"device_id": 0, "name": "NVIDIA H100 80GB HBM3", "chip": "GH100", "sm_count": 132,
               "memory_bytes": 85_000_000_000, "compute_capability": "9.0"}, {"device_id": 1}],
        meta={"nsys_version": "2025.1.1", "schema_version": "3.17.1", "host": "node1", "platform": "linux",
              "command_line": "python train.py"})
    result = run(con)
    assert result.model_dump() == {
        "profile": "t", "has_gpu_activity": True, "note": None, "nsys_version": "2025.1.1",
        "schema_version": "3.17.1", "host": "node1", "platform": "linux", "command_line": "python train.py",
        "capture": {"start_ns": 0, "end_ns": 300, "duration_ns": 300},
        "gpu_active": {"start_ns": 0, "end_ns": 210, "duration_ns": 210},
        "devices": [
            {"device": 0, "name": "NVIDIA H100 80GB HBM3", "chip": "GH100", "sm_count": 132,
             "memory_bytes": 85_000_000_000, "compute_capability": "9.0", "kernel_count": 6, "kernel_time_ns": 30,
             "stream_count": 2, "memcpy_count": 0, "memset_count": 0},
            {"device": 1, "name": None, "chip": None, "sm_count": None, "memory_bytes": None,
             "compute_capability": None, "kernel_count": 1, "kernel_time_ns": 5, "stream_count": 1,
             "memcpy_count": 1, "memset_count": 0}],
        "process_count": 4,
        "top_processes": [{"pid": 100, "name": "proc100", "kernel_launches": 3, "threads_launching": 3},
                          {"pid": 101, "name": "proc101", "kernel_launches": 3, "threads_launching": 3},
                          {"pid": 102, "name": "proc102", "kernel_launches": 1, "threads_launching": 1}],
        "table_rows": {"gpus": 2, "processes": 4, "threads": 0, "kernels": 7, "memcpy": 1, "memset": 0,
                       "cuda_api": 1, "sync": 0, "nvtx": 0, "os_runtime": 0, "cpu_samples": 0, "sched": 0},
        "missing": [{"data": d, "capture_flag": f} for d, f in [
            ("cpu_samples", "--sample=process-tree"), ("memset", "--trace=cuda"),
            ("nvtx", "--trace=nvtx (and annotate the code with NVTX ranges, e.g. torch.cuda.nvtx.range)"),
            ("os_runtime", "--trace=osrt"), ("sched", "--cpuctxsw=process-tree"), ("sync", "--trace=cuda")]],
        "libraries": [], "findings": [],
    }
    assert "device 0: NVIDIA H100 80GB HBM3" in ps.render(result)


def test_profile_summary_top_processes_capped():
    con = make_model(kernels=[kernel("k", i, pid=i) for i in range(ps.TOP_PROCESSES + 3)])
    assert len(run(con).top_processes) == ps.TOP_PROCESSES


def test_profile_summary_no_gpu_activity_is_not_an_error():
    con = make_model(cuda_api=[{"pid": 1, "tid": 1, "name": "cudaMalloc", "start_ns": 0, "end_ns": 100}])
    result = run(con)
    assert (result.has_gpu_activity, result.gpu_active, result.devices, result.libraries) == (False, None, [], [])
    assert result.note.startswith("no GPU activity")


def test_profile_summary_empty_export_says_so(open_fixture):
    result = run(open_fixture("dynamicvit_empty_export").con)
    assert (result.has_gpu_activity, result.capture, result.gpu_active, result.devices) == (False, None, None, [])
    assert "no timed events" in result.note and "NOTE: " in ps.render(result)
    assert {m.data for m in result.missing} >= {"kernels", "cuda_api", "nvtx"}


# --- golden: real exports against independent SQL on the raw SQLite --------------------------------
def raw_table_count(con: sqlite3.Connection, table: str) -> int:
    exists = con.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if exists else 0


@pytest.mark.parametrize("stem", FIXTURE_IDS)
def test_profile_summary_golden_counts(open_fixture, stem):
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    result = run(open_fixture(stem).con)
    per_device: dict[int, list[int]] = {}
    for table, col in (("CUPTI_ACTIVITY_KIND_KERNEL", 0), ("CUPTI_ACTIVITY_KIND_MEMCPY", 1),
                       ("CUPTI_ACTIVITY_KIND_MEMSET", 2)):
        if raw_table_count(con, table):
            for device, n in con.execute(f"SELECT deviceId, count(*) FROM {table} GROUP BY 1"):
                per_device.setdefault(device, [0, 0, 0])[col] = n
    assert {d.device: [d.kernel_count, d.memcpy_count, d.memset_count] for d in result.devices} == per_device
    assert result.table_rows["kernels"] == raw_table_count(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    if raw_table_count(con, "NVTX_EVENTS"):  # ranges and marks: 34 mark, 59 push/pop, 60 start/end
        nvtx = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (34, 59, 60)").fetchone()[0]
        assert result.table_rows["nvtx"] == nvtx
    launches = con.execute("""SELECT (globalPid >> 24) & 16777215 AS pid, count(*) AS n FROM CUPTI_ACTIVITY_KIND_KERNEL
                              GROUP BY 1 ORDER BY n DESC, pid LIMIT 5""").fetchall() if per_device else []
    assert [(p.pid, p.kernel_launches) for p in result.top_processes] == launches
    assert result.has_gpu_activity is bool(per_device)
    assert len(result.model_dump_json()) < 20_000


def test_profile_summary_golden_windows_and_libraries(open_fixture):
    con = sqlite3.connect(f"file:{FIXTURES / 'nsysai_mfu_2gpu_before.sqlite'}?mode=ro", uri=True)
    lo, hi = con.execute("""SELECT min(s), max(e) FROM (SELECT start s, "end" e FROM CUPTI_ACTIVITY_KIND_KERNEL
        UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, "end"
        FROM CUPTI_ACTIVITY_KIND_MEMSET)""").fetchone()
    flash, nccl = con.execute("""SELECT count(*) FILTER (WHERE s.value LIKE '%flash%'),
        count(*) FILTER (WHERE s.value LIKE '%nccl%') FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds s ON s.id = k.demangledName""").fetchone()
    result = run(open_fixture("nsysai_mfu_2gpu_before").con)
    assert (result.gpu_active.start_ns, result.gpu_active.end_ns) == (lo, hi)
    libraries = {lib.library: lib for lib in result.libraries}
    assert libraries["FlashAttention / fused attention"].kernel_count == flash
    assert libraries["FlashAttention / fused attention"].version_hint.startswith("flash-attn 2 ")
    assert libraries["NCCL"].kernel_count == nccl
    assert set(libraries) == {"PyTorch (ATen)", "cuBLAS/CUTLASS GEMM", "FlashAttention / fused attention", "NCCL"}


@pytest.mark.parametrize("stem", ["fuser_h200_crossentropy", "dynamicvit_empty_export"])
def test_profile_summary_snapshot(open_fixture, stem, snapshot):
    assert dump(run(open_fixture(stem).con)) == snapshot


# --- synthetic sample: what was generated is what is summarised ------------------------------------
@pytest.mark.parametrize("sample", ["demo", "clean"])
def test_profile_summary_matches_synthetic_truth(request, sample):
    profile, truth = request.getfixturevalue(sample)
    result = run(profile.con)
    # truth's capture start also counts NVTX domain-creation events, which the model does not keep
    assert result.capture.start_ns >= truth["capture_start_ns"]
    assert result.capture.end_ns == truth["capture_end_ns"]
    assert [d.device for d in result.devices] == truth["devices"]
    assert {p.pid for p in result.top_processes} == set(truth["pids"])
    totals = {t["device"]: t for t in truth["totals"]["per_device"]}
    assert {d.device: (d.kernel_count, d.kernel_time_ns) for d in result.devices} == {
        d: (t["kernels"], t["kernel_time_ns"]) for d, t in totals.items()}
    assert {lib.library for lib in result.libraries} >= {
        "PyTorch (ATen)", "Triton", "cuBLAS/CUTLASS GEMM", "FlashAttention / fused attention", "NCCL"}
    nccl = next(lib for lib in result.libraries if lib.library == "NCCL")
    assert nccl.kernel_count == sum(t["nccl_kernels"] for t in totals.values())
    assert result.findings == []
