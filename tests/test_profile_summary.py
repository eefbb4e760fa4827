"""profile_summary: hardware, windows, processes, table counts, missing data, library hints."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FIXTURE_IDS, FIXTURES, dump
from modeldb import make_model

from stallhound.tools import profile_summary as ps

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
              "command_line": "python train.py", "machine_gpus": "NVIDIA H100 80GB HBM3"})
    result = run(con)
    gpu_info = ("1 of 2 devices have no hardware record in the export, so their GPU model is unknown; nsys 2025.1.1 "
                "writes TARGET_INFO_GPU when it can query the GPUs, and no option adds it")
    dumped = result.model_dump()
    assert dumped.pop("program")["kind"] == "python"  # the command line runs Python; no framework's kernels
    assert dumped == {
        "profile": "t", "has_gpu_activity": True, "note": None, "nsys_version": "2025.1.1",
        "schema_version": "3.17.1", "host": "node1", "platform": "linux", "command_line": "python train.py",
        "machine_gpus": "NVIDIA H100 80GB HBM3", "derived_from": None, "rank": None, "distributed": None,
        "capture": {"start_ns": 0, "end_ns": 300, "duration_ns": 300},
        "gpu_active": {"start_ns": 0, "end_ns": 210, "duration_ns": 210}, "gpu_active_pct": 70.0,
        "devices": [
            {"device": 0, "name": "NVIDIA H100 80GB HBM3", "chip": "GH100", "sm_count": 132,
             "memory_bytes": 85_000_000_000, "compute_capability": "9.0", "kernel_count": 6, "kernel_time_ns": 30,
             "stream_count": 2, "memcpy_count": 0, "memset_count": 0, "graph_count": 0, "peak_memory_bytes": None},
            {"device": 1, "name": None, "chip": None, "sm_count": None, "memory_bytes": None,
             "compute_capability": None, "kernel_count": 1, "kernel_time_ns": 5, "stream_count": 1,
             "memcpy_count": 1, "memset_count": 0, "graph_count": 0, "peak_memory_bytes": None}],
        "process_count": 4, "launching_process_count": 3,  # process 1 launched nothing
        "top_processes": [{"pid": 100, "name": "proc100", "kernel_launches": 3, "threads_launching": 3},
                          {"pid": 101, "name": "proc101", "kernel_launches": 3, "threads_launching": 3},
                          {"pid": 102, "name": "proc102", "kernel_launches": 1, "threads_launching": 1}],
        "table_rows": {"gpus": 2, "processes": 4, "threads": 0, "kernels": 7, "memcpy": 1, "memset": 0,
                       "graph_exec": 0, "cuda_api": 1, "sync": 0, "nvtx": 0, "os_runtime": 0, "cpu_samples": 0,
                       "stacks": 0, "python_frames": 0, "sched": 0, "memory_usage": 0, "uvm_faults": 0,
                       "host_modules": 0, "library_api": 0, "profiler_overhead": 0, "diagnostics": 0},
        "missing": [{"data": d, "capture_flag": f} for d, f in [
            ("cpu_samples", "--sample=process-tree"), ("gpu_info", gpu_info),
            ("graph_exec", "--trace=cuda --cuda-graph-trace=graph (the default), when the program launches CUDA "
                           "graphs"),
            ("memory_usage", "--cuda-memory-usage=true"),  # memset and sync: --trace=cuda was on (kernels)
            ("nvtx", "--trace=nvtx (and mark each step of the program with an NVTX range)"),
            ("os_runtime", "--trace=osrt"), ("sched", "--cpuctxsw=process-tree"),
            ("stacks", "--cudabacktrace=all --python-backtrace=cuda --sample=process-tree"),
            ("uvm_faults", "--cuda-um-cpu-page-faults=true --cuda-um-gpu-page-faults=true")]],
        "libraries": [], "diagnostics": {"counts": {}, "messages": [], "truncated": False},
        "trace_quality": [gpu_info],
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
    # the export does list the machine's GPU (TARGET_INFO_GPU), it just traced nothing
    assert result.trace_quality == ["the export lists NVIDIA RTX A2000 12GB for the machine but recorded no event "
                                    "at all"]
    assert result.diagnostics.counts == {} and result.machine_gpus == "NVIDIA RTX A2000 12GB"


# --- trace quality on tiny models ----------------------------------------------------------------------
def api(name: str, kind: str, start: int, corr: int, tid: int = 1, end: int | None = None) -> dict:
    return {"pid": 1, "tid": tid, "correlation_id": corr, "name": name, "kind": kind, "start_ns": start,
            "end_ns": start + 5 if end is None else end}


def launched(i: int, start: int, api_name: str = "cudaLaunchKernel") -> dict:
    """A kernel of process 1 launched by the call with correlation id i."""
    return {"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "correlation_id": i, "start_ns": start,
            "end_ns": start + 10, "name": "k", "short_name": "k", "launch_api": api_name}


LAUNCHES = [api("cudaLaunchKernel", "launch", 100 * i, i) for i in range(10)]
H100 = [{"device_id": 0, "name": "NVIDIA H100 80GB HBM3"}]  # a named device: no hardware note
NO_KERNEL = ("10 kernel launch calls were traced but the export holds no kernel records and no CUDA call waited on "
             "the GPU: the program most likely stopped or crashed before its kernels ran or before the profiler "
             "flushed its CUDA trace buffers{last}, unless kernels were filtered out of "
             "the trace; check the program's exit status and re-capture with --trace=cuda, letting it exit normally "
             "(or calling cudaProfilerStop() first)")
# a thread's OS call ending 2 ms after the last launch (ends at 905 ns): the capture ran on after the last CUDA call
LATER_CALL = [{"pid": 1, "tid": 2, "name": "poll", "start_ns": 0, "end_ns": 2_000_905, "duration_ns": 2_000_905}]
GRAPHS = ("3 CUDA graph launches were recorded as whole graphs (--cuda-graph-trace=graph, nsys' default), so the "
          "kernels inside them have no records: GPU time counts each graph as one piece of work; re-capture with "
          "--cuda-graph-trace=node for per-kernel figures")


def partial(missing: int, launches: int, kernels: int) -> str:
    return (f"{missing} of {launches} kernel launch calls ({round(100 * missing / launches, 2)}%) have no kernel "
            f"record: their kernels ran after the capture stopped (the GPU was behind the CPU) or were lost, so "
            f"per-kernel figures cover only the {kernels} recorded kernels; capture until the GPU drains (e.g. "
            "synchronize before cudaProfilerStop)")


@pytest.mark.parametrize("tables, notes", [
    # the last CUDA call is the capture's last event: the capture ends with it, no time to tell (no "0.000 ms")
    ({"cuda_api": LAUNCHES}, [NO_KERNEL.format(last="")]),
    ({"cuda_api": LAUNCHES, "os_runtime": LATER_CALL}, [NO_KERNEL.format(
        last=" (the last CUDA call, cudaLaunchKernel, ended 2.000 ms before the capture did)")]),
    ({"cuda_api": LAUNCHES, "kernels": [launched(i, 100 * i + 10) for i in range(10)]}, []),
    # 1 of 10 missing is the edge of MISSING_KERNEL_PCT; 1 of 11 is below it, 2 of 10 past it
    ({"cuda_api": LAUNCHES, "kernels": [launched(i, 100 * i + 10) for i in range(9)]}, [partial(1, 10, 9)]),
    ({"cuda_api": LAUNCHES + [api("cudaLaunchKernel", "launch", 1000, 10)],
      "kernels": [launched(i, 100 * i + 10) for i in range(10)]}, []),
    ({"cuda_api": LAUNCHES, "kernels": [launched(i, 100 * i + 10) for i in range(8)]}, [partial(2, 10, 8)]),
    # older exports record the runtime and the driver call of one launch under one correlation id
    ({"cuda_api": LAUNCHES + [api("cuLaunchKernel", "launch", 100 * i + 1, i) for i in range(10)],
      "kernels": [launched(i, 100 * i + 10) for i in range(10)]}, []),
    # launches inside stream capture record graph nodes; the graph runs as whole-graph executions
    ({"cuda_api": [api("cudaStreamBeginCapture", "other", 0, 100, end=1)]
      + [api("cudaLaunchKernel", "launch", 10 + i, 101 + i) for i in range(5)]
      + [api("cudaStreamEndCapture", "other", 50, 106), api("cudaGraphInstantiate", "other", 60, 107)]
      + [api("cudaGraphLaunch", "graph", 100 + 100 * i, 200 + i) for i in range(3)],
      "graph_exec": [{"device_id": 0, "stream_id": 13, "pid": 1, "tid": 1, "correlation_id": 200 + i,
                      "start_ns": 110 + 100 * i, "end_ns": 190 + 100 * i, "graph_id": 1, "graph_exec_id": 2,
                      "launch_api": "cudaGraphLaunch"} for i in range(3)]}, [GRAPHS]),
    # the same launches on another thread than the capture are not captured
    ({"cuda_api": [api("cudaStreamBeginCapture", "other", 0, 100, tid=2, end=1),
                   api("cudaStreamEndCapture", "other", 500, 106, tid=2)] + LAUNCHES}, [NO_KERNEL.format(last="")]),
])
def test_profile_summary_launches_without_kernels(tables, notes):
    gpus = H100 if {"kernels", "graph_exec"} & set(tables) else []
    assert run(make_model(gpus=gpus, **tables)).trace_quality == notes


def test_profile_summary_copies_but_no_kernel():
    """What numba_prog (a program that died after two copies) looks like: 7 CUDA calls, 2 copies, no kernel."""
    calls = [api(n, k, 100 * i, i) for i, (n, k) in enumerate(
        [("cuInit", "other"), ("cuCtxSetCurrent", "other"), ("cuMemGetInfo", "other"), ("cuMemAlloc", "alloc"),
         ("cuMemAlloc", "alloc"), ("cuMemcpyHtoD", "memcpy"), ("cuMemcpyHtoD", "memcpy")])]
    copies = [{"device_id": 0, "stream_id": 7, "pid": 1, "correlation_id": c, "start_ns": 100 * c + 1,
               "end_ns": 100 * c + 4, "bytes": 4096, "direction": "H2D"} for c in (5, 6)]
    result = run(make_model(cuda_api=calls, memcpy=copies, gpus=H100))
    assert result.trace_quality == [
        "the GPU ran 2 copies and 0 memsets but no kernel was launched in the capture: if the program should "
        "compute on the GPU it stopped before its first launch or launched outside the capture; check its output and "
        "exit status",
        "GPU work spans only 17.02% of the capture: it starts 0.001 ms in and runs to the capture's end, "
        "so capture-wide figures are diluted by host-only time; gpu_utilization and gpu_idle_gaps measure over the "
        "GPU-active window by default, and `nsys profile --capture-range=cudaProfilerApi` (or --delay/--duration) "
        "keeps the capture to the GPU phase"]
    assert (result.gpu_active_pct, result.has_gpu_activity) == (17.02, True)


@pytest.mark.parametrize("words, lost", [("Not all CUDA events might have been collected.", True),
                                         ("CUDA injection initialized successfully.", False)])
def test_profile_summary_no_kernel_in_a_trace_nsys_says_lost_cuda_events(words, lost):
    """What jax_train_untraced looks like (a JAX run whose kernels nsys did not trace): CUDA calls and a memset, no
    kernel, and nsys's own diagnostic that CUDA events went missing: the absence is the trace's, not the program's."""
    calls = [api("cuInit", "other", 0, 1), api("cuGetProcAddress_v2", "other", 100, 2)]
    memset = [{"device_id": 0, "stream_id": 7, "pid": 1, "correlation_id": 3, "start_ns": 200, "end_ns": 201,
               "bytes": 4}]
    diagnostics = [{"time_ns": 300, "severity": "warning", "source": "injection", "pid": 1, "text": words}]
    notes = run(make_model(cuda_api=calls, memset=memset, diagnostics=diagnostics, gpus=H100)).trace_quality
    assert notes[0].startswith(
        "nsys reports that its CUDA trace of this capture is incomplete (its diagnostics: 'Not all CUDA events might "
        "have been collected.'): the export holds 2 CUDA calls, 0 copies and 1 memsets but no kernel") == lost
    assert notes[0].startswith("the GPU ran 0 copies and 1 memsets but no kernel was launched") != lost


def test_profile_summary_copies_without_api_trace():
    copies = [{"device_id": 0, "stream_id": 7, "start_ns": 0, "end_ns": 10, "bytes": 8, "direction": "H2D"}]
    assert run(make_model(memcpy=copies, gpus=H100)).trace_quality == [
        "the GPU ran 1 copies and 0 memsets but no kernel was launched in the capture: if the program should compute "
        "on the GPU it stopped before its first launch or launched outside the capture; check its output and exit "
        "status"]


@pytest.mark.parametrize("later, last", [
    ([], ""),  # the capture ends with the last call: nothing to tell (cudaq_vqe printed "0.000 ms before")
    (LATER_CALL, " (the last CUDA call, cudaFree, ended 2.000 ms before the capture did)")])
def test_profile_summary_api_calls_without_gpu_work(later, last):
    result = run(make_model(cuda_api=[api("cudaMalloc", "alloc", 0, 1), api("cudaFree", "alloc", 900, 2)],
                            os_runtime=later))
    assert result.trace_quality == [
        f"2 CUDA API calls were traced but the GPU recorded no work{last}: the program stopped before its GPU phase "
        "or ran it outside the capture; check its exit status and the capture range (--capture-range, --delay, "
        "--duration)"]


@pytest.mark.parametrize("gpu_end, fires", [(1_000_000, True), (4_990_000, True), (5_000_000, False)])
def test_profile_summary_gpu_active_share(gpu_end, fires):
    kernels = [dict(launched(0, 0), launch_api=None, end_ns=gpu_end)]
    result = run(make_model(kernels=kernels, cuda_api=[api("cudaFree", "alloc", 10_000_000, 1, end=10_000_000)],
                            gpus=H100))
    assert result.gpu_active_pct == round(100 * gpu_end / 10_000_000, 2)
    span = [n for n in result.trace_quality if n.startswith("GPU work spans")]
    assert span == ([f"GPU work spans only {result.gpu_active_pct}% of the capture: it starts 0.000 ms in and ends "
                     f"{(10_000_000 - gpu_end) / 1e6:,.3f} ms before the capture does, so capture-wide figures are "
                     "diluted by host-only time; gpu_utilization and gpu_idle_gaps measure over the GPU-active window "
                     "by default, and `nsys profile --capture-range=cudaProfilerApi` (or --delay/--duration) keeps "
                     "the capture to the GPU phase"] if fires else [])


@pytest.mark.parametrize("meta, note", [
    ({"nsys_version": "2026.2.1.210"}, "1 of 1 devices have no hardware record in the export, so their GPU model is "
     "unknown; nsys 2026.2.1.210 writes TARGET_INFO_GPU when it can query the GPUs, and no option adds it"),
    ({"nsys_version": "2020.3.1"}, "1 of 1 devices have no hardware record in the export, so their GPU model is "
     "unknown; nsys 2020.3.1 predates TARGET_INFO_GPU: a newer nsys (2021.2+) records it"),
])
def test_profile_summary_gpu_model_unknown_by_nsys_version(meta, note):
    result = run(make_model(kernels=[kernel("k", 0)], meta=meta))
    assert result.trace_quality == [note]


def test_profile_summary_derived_export_and_nsys_errors():
    diagnostics = [{"time_ns": 5, "severity": "error", "source": "analysis", "pid": None,
                    "text": "Error when processing events"}]
    result = run(make_model(kernels=[kernel("k", 0)], gpus=[{"device_id": 0, "name": "NVIDIA H100"}],
                            diagnostics=diagnostics, meta={"derived_from": "big.sqlite by cut.py"}))
    assert result.trace_quality == [
        "nsys recorded 1 error message(s) about this capture (see diagnostics): data may be missing from it; read "
        "them before trusting absences",
        "this export was cut or rewritten by another tool (big.sqlite by cut.py), so work crossing its edges is "
        "partial (e.g. launches whose kernels fall outside it); analyse the original export when you can"]


def test_profile_summary_diagnostics_are_bounded_errors_first():
    rows = ([{"time_ns": t, "severity": "warning", "source": "analysis", "pid": p, "text": f"warning {t % 7}"}
             for t in range(40) for p in (1, 2)]
            + [{"time_ns": 50, "severity": "error", "source": "injection", "pid": None, "text": "E" * 400},
               {"time_ns": 0, "severity": "info", "source": "daemon", "pid": None, "text": "Profiling has started."}])
    diag = run(make_model(diagnostics=rows)).diagnostics
    assert diag.model_dump() == {
        "counts": {"warning": 80, "error": 1, "info": 1},
        "messages": [{"severity": "error", "source": "injection", "text": "E" * ps.DIAGNOSTIC_TEXT_CHARS, "count": 1,
                      "processes": 0, "first_ns": 50}]
        + [{"severity": "warning", "source": "analysis", "text": f"warning {t}", "count": 12 if t < 5 else 10,
            "processes": 2, "first_ns": t} for t in range(ps.TOP_DIAGNOSTICS - 1)],
        "truncated": True}


def test_profile_summary_peak_device_memory():
    def event(t: int, op: str, nbytes: int, kind: str = "device", device: int = 0) -> dict:
        return {"device_id": device, "pid": 1, "time_ns": t, "operation": op, "mem_kind": kind, "bytes": nbytes}
    memory = [event(1, "allocation", 100), event(2, "allocation", 50), event(3, "allocation", 1_000, "pinned"),
              event(4, "deallocation", 100), event(4, "allocation", 70), event(5, "allocation", 5, "device_static"),
              event(6, "deallocation", 30, device=1)]
    devices = run(make_model(kernels=[kernel("k", 0), kernel("k", 1, device=1)], memory_usage=memory)).devices
    # device 0: 100, 150, then at t=4 the free counts before the allocation (150 -> 50 -> 120), then 125;
    # device 1 frees memory allocated before the capture: its running sum never rises above 0
    assert [(d.device, d.peak_memory_bytes) for d in devices] == [(0, 150), (1, 0)]


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


@pytest.mark.parametrize("stem", ["fuser_h200_crossentropy", "nsysai_mock", "nsysai_h100_2gpu_1s"])
def test_profile_summary_golden_diagnostics(open_fixture, stem):
    con = sqlite3.connect(f"file:{FIXTURES / f'{stem}.sqlite'}?mode=ro", uri=True)
    names = {1: "info", 2: "warning", 3: "error"}
    counts = {names[sev]: n for sev, n in con.execute("SELECT severity, count(*) FROM DIAGNOSTIC_EVENT GROUP BY 1")}
    messages = con.execute("""SELECT text, count(*), count(DISTINCT globalPid), min(timestamp) FROM DIAGNOSTIC_EVENT
                              WHERE severity = 2 GROUP BY text ORDER BY min(timestamp)""").fetchall()
    diag = run(open_fixture(stem).con).diagnostics
    assert diag.counts == counts
    assert [(m.severity, m.text, m.count, m.processes, m.first_ns) for m in diag.messages] == [
        ("warning", *m) for m in messages[:ps.TOP_DIAGNOSTICS]]
    assert diag.truncated is (len(messages) > ps.TOP_DIAGNOSTICS)


def test_profile_summary_golden_launches_without_kernels(open_fixture):
    """A derived 1 s window: about half the launches in it have their kernel outside it."""
    con = sqlite3.connect(f"file:{FIXTURES / 'nsysai_h100_2gpu_1s.sqlite'}?mode=ro", uri=True)
    launch = "(SELECT id FROM StringIds WHERE value LIKE 'cudaLaunch%' OR value LIKE 'cuLaunch%')"
    launches, missing = con.execute(f"""SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (
        SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId = r.correlationId
        AND (k.globalPid >> 24) = (r.globalTid >> 24))) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
        WHERE nameId IN {launch}""").fetchone()
    kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    notes = run(open_fixture("nsysai_h100_2gpu_1s").con).trace_quality
    assert (launches, missing, kernels) == (3346, 1714, 3442)
    assert notes[0].startswith(f"{missing:,} of {launches:,} kernel launch calls (51.23%) have no kernel record: "
                               "their kernels fall outside this derived export's window,")
    assert notes[1].startswith("this export was cut or rewritten by another tool (perf_h100_sp2_fa3.sqlite by "
                               "scripts/derive_test_fixture.py, window 155330248986-156330248986 ns)")
    assert "newer nsys" not in notes[2] and notes[2].startswith("2 of 2 devices have no hardware record")


@pytest.mark.parametrize("stem", ["fuser_h200_crossentropy", "dynamicvit_empty_export", "nsysai_h100_2gpu_1s"])
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
