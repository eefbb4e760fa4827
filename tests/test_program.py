"""program: what kind of program made the profile, from the weight of its evidence; it picks the fix family."""

from __future__ import annotations

import pytest
from fixture_guard import FIXTURES_ROOT
from modeldb import make_model

from stallhound.analysis import program, program_clues
from stallhound.formats import open_profile
from stallhound.formats.kineto.meta import PLATFORM as KINETO

ATEN = "void at::native::vectorized_elementwise_kernel<4>(int)"
TRT_LLM = "void tensorrt_llm::kernels::fusedQKNormRopeKernel<16>(float *)"
THRUST = "void cub::DeviceForEachKernel<thrust::cuda_cub::__transform::unary_transform_f>(int)"


def model(process: str | None = "app", kernels: tuple[str, ...] = ("my_kernel",), nvtx: tuple[str, ...] = (),
          command: str | None = None, threads: tuple[str, ...] = (), domain: str | None = None,
          launch: str = "cudaLaunchKernel", durations: tuple[int, ...] = (), platform: str | None = None,
          modules: tuple[str, ...] = (), **tables: list[dict]):
    """Kernels `kernels` (each 50 ns unless `durations` says) launched by `launch` from pid 10 named `process`."""
    lengths = durations or (50,) * len(kernels)
    rows = [{"device_id": 0, "stream_id": 7, "pid": 10, "tid": 10, "correlation_id": i, "start_ns": i * 10_000,
             "end_ns": i * 10_000 + d, "short_name": name, "name": name}
            for i, (name, d) in enumerate(zip(kernels, lengths, strict=True))]
    api = [{"pid": 10, "tid": 10, "correlation_id": i, "name": launch, "kind": "launch",
            "start_ns": i * 10_000 - 20, "end_ns": i * 10_000 - 10} for i in range(len(kernels))]
    return make_model(
        kernels=rows, processes=[{"pid": 10, "name": process}] if process else [],
        threads=[{"pid": 10, "tid": 10 + i, "name": t} for i, t in enumerate(threads)],
        nvtx=[{"pid": 10, "tid": 10, "text": t, "domain": domain, "start_ns": 0, "end_ns": 10, "kind": "push_pop",
               "depth": 0} for t in nvtx],
        cuda_api=api + tables.pop("cuda_api", []),
        host_modules=[{"pid": 10, "module": m, "stacks": 3} for m in modules],
        meta={"command_line": command, "platform": platform}, **tables)


@pytest.mark.parametrize("kw, kind, framework", [
    ({"process": "python3", "kernels": (ATEN,)}, "pytorch", "PyTorch (ATen)"),
    ({"process": "pt_main_thread", "threads": ("pt_autograd_0",), "command": "torchrun train.py"}, "pytorch", None),
    ({"process": "python3", "nvtx": ("XlaModule:#hlo_module=jit_step#",), "domain": "TSL"}, "jax",
     "XLA (JAX/TensorFlow)"),
    ({"process": "trtexec", "kernels": ("sm90_xmma_fprop_implicit_gemm",)}, "tensorrt", None),
    ({"process": "python3", "kernels": ("cupy_sqrt__float32_float32",), "launch": "cuLaunchKernel"}, "cupy", "CuPy"),
    ({"process": "python3", "kernels": ("cudapy::__main__::add$241(Array<float, 1>)",), "launch": "cuLaunchKernel"},
     "numba", "Numba"),
    ({"process": None, "threads": ("python",), "kernels": ("void cudf::detail::gather_kernel(int)",),
      "nvtx": ("join",), "domain": "libcudf"}, "cudf", "cuDF (RAPIDS)"),
    ({"process": "julia", "kernels": ("julia_broadcast_kernel_1234",)}, "julia", "CUDA.jl (Julia)"),
    ({"process": None, "kernels": ("broadcast_kernel(CuKernelContext, CuDeviceArray<Float32, (int)3, (int)1>)",),
      "launch": "cuLaunchKernel"}, "julia", "CUDA.jl (Julia)"),  # trixicuda_jl_broadcast's kernel, no process
    ({"process": "./stencil", "kernels": ("nvkernel_main_F1L42_2",)}, "offload", "OpenMP offload"),
    ({"process": "./jacobi", "kernels": ("main_88_gpu",)}, "offload", "OpenACC (nvc/nvfortran)"),
    ({"process": "./a.out", "kernels": ("function_11_gpu(std::array<double, 100000ul>&)", "BooArray::add_56_gpu()")},
     "offload", "OpenACC (nvc/nvfortran)"),  # demangled names carry their parameters
    ({"process": "./infer", "kernels": ("void at::native::reduce_kernel<512>(int)",)}, "cuda", "PyTorch (ATen)"),
    ({"process": "./saxpy", "kernels": ("saxpy(int, float *)",), "nvtx": ("MPI_Send",), "domain": "MPI"}, "cuda",
     "MPI"),
    ({"process": None, "kernels": ("void stencil<float>(float *, int)",)}, "cuda", None),  # no process table
    ({"process": None, "kernels": ()}, "unknown", None),
])
def test_program_kind_from_its_evidence(kw, kind, framework):
    found = program.detect(model(**kw))
    assert found.kind == kind and found.fix_chain == list(program.FIX_CHAINS[kind])
    assert found.fix_chain[-1] == "generic" and found.decided_by
    if framework:
        assert framework in found.frameworks


def test_program_one_kernel_of_another_framework_does_not_name_the_program():
    """A PyTorch decode step calling one TensorRT-LLM kernel (2% of kernel time) is PyTorch; the evidence shows both
    sides with their weights, and the decision says which outweighed which."""
    found = program.detect(model(process="python3", kernels=(ATEN, TRT_LLM, "my_kernel"), durations=(80, 2, 18)))
    assert found.kind == "pytorch" and found.language == "python"
    assert "kernels of PyTorch (ATen): 1, 80.0% of kernel time [pytorch +0.80]" in found.evidence
    assert "kernels of TensorRT: 1, 2.0% of kernel time [tensorrt +0.02]" in found.evidence
    assert found.decided_by.startswith("PyTorch weighs 0.80 against tensorrt 0.02")


def test_program_a_stray_framework_kernel_under_the_minimum_weight_names_nothing():
    found = program.detect(model(process="python3", kernels=(TRT_LLM, "my_kernel"), durations=(4, 96)))
    assert 0.04 < program.MIN_FRAMEWORK_WEIGHT and found.kind == "python"
    heavier = program.detect(model(process="python3", kernels=(TRT_LLM, "my_kernel"), durations=(6, 94)))
    assert 0.06 >= program.MIN_FRAMEWORK_WEIGHT and heavier.kind == "tensorrt"


def test_program_a_torch_profiler_trace_is_pytorch_whatever_its_process_is_named():
    """hta_sampled's process is 'pyper:trainer:0:0': a Kineto trace is PyTorch's, and its threads run Python."""
    found = program.detect(model(process="pyper:trainer:0:0", threads=("python3.8",), kernels=(ATEN, "my_kernel"),
                                 durations=(10, 90), platform=KINETO))
    assert (found.kind, found.language) == ("pytorch", "python")
    assert found.decided_by == "PyTorch weighs 1.10; language python weighs 1.50"
    assert "the process named itself (pyper:trainer:0:0): no evidence of its language" in found.evidence
    native = program.detect(model(process="./trainer", kernels=(ATEN, "my_kernel"), durations=(10, 90)))
    assert (native.kind, native.language) == ("cuda", "native")  # libtorch in a C++ program: CUDA C++ fixes
    windows = program.detect(model(process="C:\\bench\\ParallelKernelsTest.exe"))
    assert (windows.kind, windows.language) == ("cuda", "native")


def test_program_the_process_without_gpu_work_still_tells_its_language():
    """A Julia run whose CUDA trace failed, and a native program with no GPU activity at all."""
    julia = program.detect(model(process=None, kernels=(), command="julia nsys_trace.jl"))
    assert (julia.kind, julia.language) == ("julia", "julia")
    native = program.detect(model(process=None, kernels=(), command="./heat_map 8000 100"))
    assert (native.kind, native.language) == ("unknown", "native")
    assert "cannot be told" in native.decided_by


def test_program_host_modules_in_the_call_stacks_are_evidence():
    torch = program.detect(model(process="python3.12", kernels=(), modules=(
        "/usr/lib/python3.12/lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so", "/env/torch/lib/libtorch_python.so"),
        cuda_api=[{"pid": 10, "tid": 10, "name": "cudaGetDeviceCount", "kind": "other", "start_ns": 0,
                   "end_ns": 5}]))
    assert torch.kind == "pytorch" and "host module of PyTorch in the call stacks [pytorch +0.50]" in torch.evidence
    # an install path is no evidence: a CUDA Fortran program's cuDNN from a conda environment
    fortran = program.detect(model(process="./train", modules=(
        "/home/u/miniconda3/envs/py/lib/python3.14/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9",
        "/opt/nvidia/hpc_sdk/Linux_x86_64/25.9/compilers/lib/libnvf.so")))
    assert (fortran.kind, fortran.language) == ("cuda", "native")


def test_program_openacc_runtime_events_show_an_offload_program():
    found = program.detect(model(process=None, kernels=("my_kernel",), library_api=[
        {"pid": 10, "tid": 10, "library": "openacc", "name": "acc_enqueue_launch", "start_ns": 0, "end_ns": 5}]))
    assert found.kind == "offload" and "openacc calls traced: 1 [offload and native +1.00]" in found.evidence


def _managed(name="cudaMallocManaged"):
    return [{"pid": 10, "tid": 10, "name": name, "kind": "alloc", "start_ns": -900, "end_ns": -800}]


def test_program_stdpar_is_thrust_kernels_on_data_the_program_never_copies():
    """nvc++ -stdpar: the parallel algorithms run as CUB/Thrust kernels on managed memory, with no copy calls."""
    found = program.detect(model(process="./lulesh", kernels=(THRUST, "my_kernel"), durations=(70, 30),
                                 cuda_api=_managed()))
    assert found.kind == "stdpar" and found.fix_chain == ["stdpar", "cuda", "generic"]
    assert any(e.startswith("CUB/Thrust kernels (70.0% of kernel time) with managed memory") for e in found.evidence)
    copies = [{"device_id": 0, "stream_id": 7, "pid": 10, "tid": 10, "correlation_id": 99, "start_ns": 100,
               "end_ns": 200, "bytes": 4096, "direction": "H2D", "src_kind": "pageable", "dst_kind": "device"}]
    thrust_in_cuda = program.detect(model(process="./lulesh", kernels=(THRUST, "my_kernel"), durations=(70, 30),
                                          cuda_api=_managed(), memcpy=copies))
    assert thrust_in_cuda.kind == "cuda"  # a CUDA program that copies its data itself and calls Thrust
    assert program.detect(model(process="./lulesh", kernels=(THRUST,))).kind == "cuda"
    # HMM systems (-gpu=mem:unified) allocate nothing managed: the NVHPC compiler's runtime in the stacks tells
    built = program.detect(model(process="./lulesh", kernels=(THRUST,), modules=("/opt/nvhpc/lib/libnvc.so",)))
    assert built.kind == "stdpar" and any("NVHPC compiler runtime" in e for e in built.evidence)


@pytest.mark.parametrize("stem, kind, language, frameworks", [
    ("clue_t4_report4", "cuda", "native", set()),
    ("extrap_windows_con_kernel", "cuda", "native", set()),
    ("pipit_saxpy_mpi_a100", "cuda", "native", {"MPI"}),
    ("fuser_h200_crossentropy", "pytorch", "python", {"PyTorch (ATen)", "nvFuser"}),
    ("nsysai_h100_2gpu_1s", "pytorch", "python", {"PyTorch (ATen)"}),
    ("nsysai_mfu_2gpu_before", "pytorch", "python", {"PyTorch (ATen)", "FlashAttention / fused attention", "NCCL",
                                                     "PyTorch FSDP"}),
    ("nsysai_mock", "pytorch", "python", {"PyTorch (ATen)"}),
    ("dynamicvit_empty_export", "unknown", "unknown", set()),
])
def test_program_on_real_exports(open_fixture, stem, kind, language, frameworks):
    found = program.detect(open_fixture(stem).con)
    assert (found.kind, found.language) == (kind, language) and frameworks <= set(found.frameworks)


@pytest.mark.parametrize("name", ["hta_sampled_rank0", "hta_sampled_rank1", "hta_a100_nccl_rank0"])
def test_program_on_real_torch_profiler_traces(cache_root, name):
    """Each is a torch.profiler trace: hta_sampled's process is 'pyper:trainer:0:N' and its threads 'python3.8'
    (it came out 'cuda (libtorch native)' with C++ fixes before)."""
    profile = open_profile(FIXTURES_ROOT / "kineto" / f"{name}.json.gz", cache_dir=cache_root)
    try:
        found = program.detect(profile.con)
    finally:
        profile.close()
    assert (found.kind, found.language) == ("pytorch", "python") and "PyTorch (ATen)" in found.frameworks


def test_program_frameworks_seen_only_as_nvtx_domains_are_listed_by_name():
    """Domains have no count to rank them: a set's order (which hash randomization changes per process) would
    make `frameworks` differ from run to run."""
    names = ["MPI", "TSL", "TensorRT", "CCCL", "NCCL", "cuDNN", "cuBLAS", "libcudf", "cudf_python"]
    con = make_model(nvtx=[{"pid": 10, "tid": 10, "text": "range", "domain": d, "start_ns": 0, "end_ns": 10,
                            "kind": "push_pop", "depth": 0} for d in names])
    assert program.detect(con).frameworks == sorted({label for label, *_ in program_clues.NVTX_DOMAINS})


def test_program_clues_of_modules_come_in_the_rules_order_whatever_the_process():
    """The clues a triage prints are the same from one run to the next: matched rules in MODULES' order, each once
    (a set's order changed with each process's string hashes)."""
    con = model(modules=("/usr/lib/libcudf.so", "/opt/lib/libtorch_cuda.so", "/usr/lib/libpython3.11.so",
                         "/usr/lib/libtorch.so"))
    labels = [c.line for c in program_clues.gather(con).clues if c.line.startswith("host module")]
    assert labels == [f"host module of {label} in the call stacks" for label in ("Python", "PyTorch", "cuDF (RAPIDS)")]
