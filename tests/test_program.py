"""program: what kind of program made the profile, from which evidence; it picks the fix family."""

from __future__ import annotations

import pytest
from modeldb import make_model

from stallhound.analysis import program


def model(process: str | None = "app", kernels: tuple[str, ...] = ("my_kernel",), nvtx: tuple[str, ...] = (),
          command: str | None = None, threads: tuple[str, ...] = (), domain: str | None = None,
          launch: str = "cudaLaunchKernel"):
    rows = [{"device_id": 0, "stream_id": 7, "pid": 10, "tid": 10, "correlation_id": i, "start_ns": i * 100,
             "end_ns": i * 100 + 50, "short_name": name, "name": name} for i, name in enumerate(kernels)]
    return make_model(
        kernels=rows, processes=[{"pid": 10, "name": process}] if process else [],
        threads=[{"pid": 10, "tid": 10 + i, "name": t} for i, t in enumerate(threads)],
        nvtx=[{"pid": 10, "tid": 10, "text": t, "domain": domain, "start_ns": 0, "end_ns": 10, "kind": "push_pop",
               "depth": 0} for t in nvtx],
        cuda_api=[{"pid": 10, "tid": 10, "correlation_id": i, "name": launch, "kind": "launch",
                   "start_ns": i * 100 - 20, "end_ns": i * 100 - 10} for i in range(len(kernels))],
        meta={"command_line": command})


@pytest.mark.parametrize("kw, kind, framework", [
    ({"process": "python3", "kernels": ("void at::native::vectorized_elementwise_kernel<4>(int)",)}, "pytorch",
     "PyTorch (ATen)"),
    ({"process": "pt_main_thread", "threads": ("pt_autograd_0",), "command": "torchrun train.py"}, "pytorch", None),
    ({"process": "python3", "nvtx": ("XlaModule:#hlo_module=jit_step#",), "domain": "TSL"}, "jax",
     "XLA (JAX/TensorFlow)"),
    ({"process": "trtexec", "kernels": ("sm90_xmma_fprop_implicit_gemm",)}, "tensorrt", None),
    ({"process": "python3", "kernels": ("cupy_sqrt__float32_float32",), "launch": "cuLaunchKernel"}, "python", "CuPy"),
    ({"process": "julia", "kernels": ("julia_broadcast_kernel_1234",)}, "julia", "CUDA.jl (Julia)"),
    ({"process": "./stencil", "kernels": ("nvkernel_main_F1L42_2",)}, "offload", "OpenMP offload"),
    ({"process": "./jacobi", "kernels": ("main_88_gpu",)}, "offload", "OpenACC (nvc/nvfortran)"),
    ({"process": "./infer", "kernels": ("void at::native::reduce_kernel<512>(int)",)}, "cuda", "PyTorch (ATen)"),
    ({"process": "./saxpy", "kernels": ("saxpy(int, float *)",), "nvtx": ("MPI_Send",), "domain": "MPI"}, "cuda",
     "MPI"),
    ({"process": None, "kernels": ()}, "unknown", None),
])
def test_program_kind_from_its_evidence(kw, kind, framework):
    found = program.detect(model(**kw))
    assert found.kind == kind and found.fix_chain == list(program.FIX_CHAINS[kind])
    assert found.fix_chain[-1] == "generic" and found.decided_by
    if framework:
        assert framework in found.frameworks


def test_program_driver_only_launches_are_evidence_of_run_time_compiled_kernels():
    found = program.detect(model(process="./jit", launch="cuLaunchKernel"))
    assert any("driver API" in e for e in found.evidence)


@pytest.mark.parametrize("stem, kind, frameworks", [
    ("clue_t4_report4", "cuda", set()),
    ("extrap_windows_con_kernel", "cuda", set()),
    ("pipit_saxpy_mpi_a100", "cuda", {"MPI"}),
    ("fuser_h200_crossentropy", "pytorch", {"PyTorch (ATen)", "nvFuser"}),
    ("nsysai_h100_2gpu_1s", "pytorch", {"PyTorch (ATen)"}),
    ("nsysai_mfu_2gpu_before", "pytorch", {"PyTorch (ATen)", "FlashAttention / fused attention", "NCCL",
                                           "PyTorch FSDP"}),
    ("nsysai_mock", "pytorch", {"PyTorch (ATen)"}),
    ("dynamicvit_empty_export", "unknown", set()),
])
def test_program_on_real_exports(open_fixture, stem, kind, frameworks):
    found = program.detect(open_fixture(stem).con)
    assert found.kind == kind and frameworks <= set(found.frameworks)


def test_program_frameworks_seen_only_as_nvtx_domains_are_listed_by_name():
    """Domains have no count to rank them: a set's order (which hash randomization changes per process) would
    make `frameworks` differ from run to run."""
    con = make_model(nvtx=[{"pid": 10, "tid": 10, "text": "range", "domain": d, "start_ns": 0, "end_ns": 10,
                            "kind": "push_pop", "depth": 0} for d in program.NVTX_DOMAINS])
    assert program.detect(con).frameworks == sorted(set(program.NVTX_DOMAINS.values()))
