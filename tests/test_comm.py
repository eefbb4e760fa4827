"""Communication beyond NCCL.

formats/comm_kernels.py: the kernel families that move data between GPUs (NCCL, MSCCL, DeepEP-style expert
parallel, NVSHMEM, custom all-reduce), on planted names (and the compute kernels no rule may catch), in a built
Kineto trace, and on real traces: DeepEP's dispatch/combine of an expert-parallel run and PyTorch's multimem
all-reduce of a TP8 vLLM run count as communication, checked against an independent reading of the JSON.
"""

from __future__ import annotations

import gzip
import json
import os
from contextlib import closing
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
from modeldb import union_ns
from test_kineto import read_json, span, xs

from stallhound.analysis import common, shares
from stallhound.analysis.contracts import run_skill
from stallhound.analysis.kernel_kinds import kind_of
from stallhound.formats import comm_kernels, open_profile
from stallhound.formats.derive import KERNEL_CATEGORY_SQL
from stallhound.tools import triage

CORPUS = Path(os.environ.get("STALLHOUND_CORPUS", "/work/corpus-cache"))  # restored by corpus/restore.py
DEEPEP = CORPUS / "deepseek_ep64_train_rank0.json"  # rank 0 of a 64-rank expert-parallel (DeepEP) training run
VLLM_TP8 = CORPUS / "tl_b200_vllm_moe_tp8.json.gz"  # rank 0 of a TP8 vLLM MoE decode: multimem all-reduce


def corpus(path: Path):
    return pytest.param(path, id=path.name, marks=pytest.mark.skipif(
        not path.exists(), reason=f"{path.name} is not restored (corpus/restore.py)"))


# --- the families, on names ----------------------------------------------------------------------------------
COMM = [  # (demangled name, family, collective)
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*)",
     "expert-parallel", "Combine"),
    ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int)", "expert-parallel", "Dispatch"),
    ("void dpsk::ep::internode::cached_notify<8, 4>(int, int, int*, void**, int, int)", "expert-parallel", None),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*)", "expert-parallel", "Dispatch"),
    ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*, float*)", "expert-parallel", "Combine"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long)",
     "custom all-reduce", "AllReduce"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16>(float**, unsigned long)",
     "custom all-reduce", "AllReduce"),
    ("void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, unsigned long)", "custom all-reduce",
     "AllGather"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)",
     "custom all-reduce", "AllReduce"),
    ("void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8>(int)",
     "custom all-reduce", "AllReduce"),
    ("userbuffers_fp16_sum_inplace_gpu_rw(int, int, int, int, int, int, void**, int, unsigned long)",
     "custom all-reduce", "AllReduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "NCCL", "AllGather"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "NCCL", None),  # RCCL: the op names it
    ("ncclSymkDevKernel_AllReduce_AGxLL_R(ncclSymkDevWorkArgs4K)", "NCCL", "AllReduce"),
    ("mscclKernel_Sum_float_LL128(int, ncclDevComm*, mscclAlgo*, mscclWork*)", "MSCCL", None),
    ("void nvshmemi_transfer_rma_p<int>(void*)", "NVSHMEM", None),
]
COMPUTE = [  # generic words a name rule must not read as communication
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>(int)",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float>(cublasLt::cublasSplitKParams<float>)",
    "void cub::DeviceReduceByKeyKernel<cub::DispatchReduceByKey<long*, long*>>(int)",
    "_combined_routing_compute",  # a MoE router's kernel (vLLM on ROCm)
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    "void vllm::moe::topkGatingSoftmax<8, 16>(float const*)",
    "void blockAllReduceSum_layernorm<float>(float*)",
    "void moe_align_block_size_kernel<int>(int const*, int*)",
]


def derived(names: list[str]) -> list[tuple]:
    """(category, family, collective) per name, as a build derives them."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER, value VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?)", list(enumerate(names)))
    return [tuple(r) for r in con.execute(f"""SELECT {KERNEL_CATEGORY_SQL}, {comm_kernels.FAMILY_SQL},
        {comm_kernels.COLLECTIVE_SQL} FROM t ORDER BY i""").fetchall()]


def test_comm_families_on_names():
    assert derived([n for n, _, _ in COMM]) == [("nccl", family, coll) for _, family, coll in COMM]
    assert all(kind_of(n) == "nccl" for n, _, _ in COMM)


def test_comm_rules_do_not_catch_compute_kernels():
    assert all(category != "nccl" and family is None for category, family, _ in derived(COMPUTE))
    assert all(kind_of(n) != "nccl" for n in COMPUTE)


def test_comm_each_family_is_one_named_rule_with_a_why():
    names = [f.name for f in comm_kernels.FAMILIES]
    assert len(set(names)) == len(names) and all(f.why and f.pattern == f.pattern.lower()
                                                 for f in comm_kernels.FAMILIES)
    assert {family for _, family, _ in COMM} == set(names)  # every family is tried on a real name above


# --- a built trace: the families count as communication ------------------------------------------------------------
def _events(name: str, start_us: int, dur_us: int, stream: int, corr: int) -> list[dict]:
    """A kernel and the cudaLaunchKernel call that launched it, 2 us before it."""
    return [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start_us, "dur": dur_us,
             "args": {"device": 0, "stream": stream, "correlation": corr, "External id": corr}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, "ts": start_us - 2,
             "dur": 1, "args": {"correlation": corr, "External id": corr}}]


def test_comm_planted_families_count_as_communication_in_a_built_trace(tmp_path):
    gemm = "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_128x128>(int)"
    planted = [(gemm, 0, 400, 7), (COMM[0][0], 100, 300, 20), (COMM[5][0], 500, 100, 20), (COMPUTE[3], 600, 50, 7)]
    planted += [(gemm, 700 + 20 * i, 10, 7) for i in range(10)]  # enough operations to classify
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 16},
           "traceEvents": [e for i, (n, s, d, st) in enumerate(planted) for e in _events(n, s + 10, d, st, i)]}
    path = tmp_path / "planted.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with closing(open_profile(path, cache_dir=tmp_path / "cache")) as profile:
        rows = profile.con.execute("SELECT name, category, comm_family FROM kernels WHERE category = 'nccl' "
                                   "ORDER BY start_ns").fetchall()
        assert rows == [(COMM[0][0], "nccl", "expert-parallel"), (COMM[5][0], "nccl", "custom all-reduce")]
        scope = common.resolve_scope(profile.con, common.ScopedParams(profile="p"), default="gpu_active")
        c = shares.classify(profile.con, scope, set())
        # window 10-900 us; communication 110-410 and 510-610 us
        assert (c.communication_pct, c.communication_families) == (round(100 * 400 / 890, 2),
                                                                   ["expert-parallel", "custom all-reduce"])
        assert "(expert-parallel, custom all-reduce)" in triage.render(run_skill(profile.con, triage,
                                                                                  triage.Params(profile="p")))


# --- real traces: DeepEP and multimem all-reduce are communication ---------------------------------------------------
def _json(path: Path) -> dict:
    return read_json(path) if path.suffix == ".gz" else json.loads(path.read_text(), parse_float=Decimal)


@pytest.mark.parametrize("path, family, matches", [
    (corpus(DEEPEP).values[0], "expert-parallel", lambda n: "::internode::" in n and "layout" not in n),
    (corpus(VLLM_TP8).values[0], "custom all-reduce", lambda n: "multimem_all_reduce" in n),
])
def test_comm_real_traces_count_other_families_as_communication(cache_root, path, family, matches):
    if not path.exists():
        pytest.skip(f"{path.name} is not restored (corpus/restore.py)")
    doc = _json(path)
    ours = [span(e) for e in xs(doc, "kernel") if matches(e["name"])]
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        con = profile.con
        assert con.execute("SELECT count(*) FROM kernels WHERE comm_family = $f AND category = 'nccl'",
                           {"f": family}).fetchone()[0] == len(ours) > 0
        scope = common.resolve_scope(con, common.ScopedParams(profile="p"), default="gpu_active")
        c = shares.classify(con, scope, set())
        s, e = scope.start_ns, scope.end_ns
        expected = union_ns([(max(a, s), min(b, e)) for a, b in ours if b > s and a < e])
        nccl = [span(k) for k in xs(doc, "kernel") if "nccl" in k["name"].lower()]
        expected_all = union_ns([(max(a, s), min(b, e)) for a, b in ours + nccl if b > s and a < e])
        assert c.communication_pct == round(100 * expected_all / scope.duration_ns, 2) > 0
        assert family in c.communication_families and expected > 0
