"""Communication beyond NCCL, and the fix that follows the collective and the framework.

formats/comm_kernels.py: the kernel families that move data between GPUs (NCCL, MSCCL, DeepEP-style expert
parallel, NVSHMEM, custom all-reduce), on planted names (and the compute kernels no rule may catch), in a built
Kineto trace, and on real traces: DeepEP's dispatch/combine of an expert-parallel run and PyTorch's multimem
all-reduce of a TP8 vLLM run count as communication, checked against an independent reading of the JSON.
analysis/comm_context.py: the collective pattern (kernel name, or the c10d `nccl:<op>` range around the launch), the
frameworks seen and the variant that picks the book's fix, on planted models and real profiles (the 2-GPU FSDP run
whose SendRecv kernels are all-to-alls, DDP, a hand-written all-reduce loop, TorchRec), with the fix triage shows.
Question 2 says how many GPUs the profile traced of how large a job (torch.profiler's distributedInfo).
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
from contextlib import closing
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
from conftest import FIXTURES
from modeldb import make_model, union_ns
from test_kineto import KINETO, read_json, span, xs

from stallhound.analysis import comm_context, common, shares
from stallhound.analysis.contracts import run_skill
from stallhound.analysis.kernel_kinds import kind_of
from stallhound.formats import comm_kernels, open_profile
from stallhound.formats.derive import KERNEL_CATEGORY_SQL
from stallhound.tools import answer_questions, nccl_breakdown, profile_summary, triage
from stallhound.tools.answers import parallelism

CORPUS = Path(os.environ.get("STALLHOUND_CORPUS", "/work/corpus-cache"))  # restored by corpus/restore.py
DEEPEP = CORPUS / "deepseek_ep64_train_rank0.json"  # rank 0 of a 64-rank expert-parallel (DeepEP) training run
VLLM_TP8 = CORPUS / "tl_b200_vllm_moe_tp8.json.gz"  # rank 0 of a TP8 vLLM MoE decode: multimem all-reduce
DDP_MI300 = CORPUS / "tl_mi300_ddp_act_ckpt.json.gz"  # DDP on 8 MI300 (RCCL's ncclDevKernel_Generic)
MANUAL_AR = CORPUS / "hta_ddp_v100_rank1.json.gz"  # 2,020 all_reduce calls and no DDP range: a hand-written loop
TORCHREC = CORPUS / "hta_torchrec_a100_ws8_rank3.json.gz"  # TorchRec: KJT all-to-all as SendRecv kernels
MFU = FIXTURES / "nsysai_mfu_2gpu_before.sqlite"


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


def test_comm_deepep_run_is_one_gpu_of_a_64_rank_expert_parallel_job(cache_root):
    if not DEEPEP.exists():
        pytest.skip(f"{DEEPEP.name} is not restored (corpus/restore.py)")
    info = _json(DEEPEP)["distributedInfo"]
    with closing(open_profile(DEEPEP, cache_dir=cache_root)) as profile:
        answer = answer_questions.run(profile.con, answer_questions.Params(profile="p")).answers
    q02 = next(a for a in answer if a.id == "q02-gpu-count-parallelism")
    assert info["world_size"] == 64 and "single" not in q02.value
    assert q02.value.startswith("1 GPU(s) traced of a job of 64 rank(s) (rank 0, from distributedInfo")
    assert "expert parallel" in q02.value and q02.evidence["world_size"] == 64


# --- the pattern, the frameworks and the variant: planted ------------------------------------------------------------
def _nccl(s: int, e: int, coll: str | None, family: str = "NCCL", device: int = 0) -> dict:
    return {"device_id": device, "stream_id": 21, "pid": 1, "tid": 1, "start_ns": s, "end_ns": e,
            "launch_start_ns": s - 5, "launch_end_ns": s - 2, "name": f"k_{coll}", "short_name": f"k_{coll}",
            "category": "nccl", "nccl_collective": coll, "comm_family": family}


def _range(s: int, e: int, text: str) -> dict:
    return {"pid": 1, "tid": 1, "start_ns": s, "end_ns": e, "text": text}


@pytest.mark.parametrize("family, collective, op, pattern", [
    ("NCCL", "SendRecv", "all_to_all", comm_context.ALL_TO_ALL),  # NCCL's all-to-all runs as SendRecv
    ("NCCL", "SendRecv", "send", comm_context.POINT_TO_POINT),
    ("NCCL", "SendRecv", "batch_isend_irecv", comm_context.POINT_TO_POINT),
    ("NCCL", "SendRecv", None, comm_context.SEND_RECV),  # no op recorded: either
    ("NCCL", "SendRecv", "all_reduce", comm_context.SEND_RECV),  # an op that contradicts the kernel: the kernel
    ("NCCL", "AllReduce", "all_reduce", comm_context.ALL_REDUCE),
    ("NCCL", "AllGather", None, comm_context.SHARDED),
    ("NCCL", None, "_reduce_scatter_base", comm_context.SHARDED),  # RCCL's Generic kernel: the op names it
    ("NCCL", "Broadcast", "broadcast", comm_context.BROADCAST),
    ("NCCL", None, None, comm_context.OTHER),
    ("expert-parallel", "Dispatch", None, comm_context.ALL_TO_ALL),
    ("expert-parallel", None, None, comm_context.ALL_TO_ALL),  # DeepEP's notify step
    ("custom all-reduce", "AllReduce", None, comm_context.ALL_REDUCE),
])
def test_comm_pattern_of_a_kernel(family, collective, op, pattern):
    assert comm_context.pattern_of(family, collective, op) == pattern


@pytest.mark.parametrize("kernels, ranges, variant", [
    ([_nccl(100, 200, "AllReduce")], [_range(90, 99, "nccl:all_reduce"), _range(0, 1000, "DistributedDataParallel"
                                                                                  ".forward")], "ddp-allreduce"),
    ([_nccl(100, 200, "AllReduce")], [_range(90, 99, "nccl:all_reduce")], "manual-allreduce"),
    ([_nccl(100, 200, "AllReduce")], [], None),  # no range at all: nothing says who issues it
    ([_nccl(100, 200, "AllGather")], [_range(0, 1000, "FSDP::pre_forward")], "fsdp"),
    ([_nccl(100, 200, "ReduceScatter")], [_range(0, 1000, "DeepSpeedEngine.backward")], "zero"),
    ([_nccl(100, 200, "SendRecv")], [_range(90, 99, "nccl:all_to_all, op_id = 7"),
                                     _range(0, 1000, "FSDP::pre_forward")], "alltoall"),  # FSDP does not decide
    ([_nccl(100, 200, "SendRecv")],
     [_range(90, 99, "nccl:all_to_all"), _range(0, 1000, "## KJTAllToAllSplitsAwaitable wait() ##")],
     "alltoall-embeddings"),
    ([_nccl(100, 200, "Dispatch", "expert-parallel")], [], "alltoall-experts"),
    ([_nccl(100, 200, "SendRecv")], [_range(90, 99, "nccl:send")], "pipeline-p2p"),
    ([_nccl(100, 200, "AllReduce", "custom all-reduce")], [_range(0, 1000, "DistributedDataParallel.forward")],
     "tp-allreduce"),
    # most time decides: 300 ns of all-to-all over 100 ns of DDP all-reduce; unnamed kernels do not
    ([_nccl(100, 200, "AllReduce"), _nccl(300, 600, "SendRecv"), _nccl(700, 1500, None)],
     [_range(290, 299, "nccl:all_to_all"), _range(0, 2000, "DistributedDataParallel.forward")], "alltoall"),
])
def test_comm_variant_follows_collective_and_framework(kernels, ranges, variant):
    con = make_model(kernels=kernels, nvtx=ranges)
    ctx = comm_context.measure(con, {"start": 0, "end": 10_000, "devices": [0]})
    assert comm_context.variant(ctx, 0) == variant
    expected_tags = [] if variant is None else [variant] + (["alltoall"] if variant.startswith("alltoall-") else [])
    assert comm_context.tags(ctx, 0) == expected_tags


# --- the fix triage shows, on real profiles --------------------------------------------------------------------------
def _comm_findings(path: Path, cache_root: Path) -> list:
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        result = run_skill(profile.con, triage, triage.Params(profile="p"))
    return [f for f in result.findings if f.root_cause.startswith("nccl-")
            or f.root_cause == "compute-communication-imbalance"]


def test_comm_fsdp_run_sendrecv_kernels_are_all_to_all_and_get_the_all_to_all_fix(cache_root):
    with closing(sqlite3.connect(f"file:{MFU}?mode=ro", uri=True)) as raw:
        # SendRecv kernels whose launch call runs inside a `nccl:all_to_all` range of its own thread, per device
        inside = dict(raw.execute("""SELECT k.deviceId, count(DISTINCT k.correlationId)
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
              AND (r.globalTid >> 24) = (k.globalPid >> 24)
            JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.start <= r.start AND n."end" >= r."end"
              AND n.text LIKE 'nccl:all_to_all%'
            WHERE s.value LIKE 'ncclDevKernel_SendRecv%' GROUP BY 1""").fetchall())
        fsdp = raw.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'FSDP::%'").fetchone()[0]
    assert inside == {0: 32, 1: 32} and fsdp > 0  # of 33 per device: one launched before the cut
    with closing(open_profile(MFU, cache_dir=cache_root)) as profile:
        result = run_skill(profile.con, nccl_breakdown, nccl_breakdown.Params(profile="p"))
    assert result.context is not None and result.context.frameworks == ["FSDP"]
    assert [(d.device, d.pattern, d.ops) for d in result.context.devices] == [
        (0, "all-to-all", ["all_to_all"]), (1, "all-to-all", ["all_to_all"])]
    found = _comm_findings(MFU, cache_root)
    assert [f.root_cause for f in found] == ["nccl-on-compute-stream"] * 2
    for f in found:
        assert f.tags == ["alltoall"] and "async_op=True" in f.fix
        assert "DistributedDataParallel" not in f.fix and "FSDP" not in f.fix  # it runs FSDP; the collective is a2a


@pytest.mark.parametrize("path, root, tags, words, absent", [
    # DDP ranges (DistributedDataParallel.forward, the reducer's ops) and RCCL all-reduce kernels
    (corpus(DDP_MI300).values[0], "nccl-serialization", ["ddp-allreduce"], "bucket_cap_mb", "all_to_all"),
    # 2,020 all_reduce calls in 5 steps and no DDP range: a hand-written per-parameter all-reduce
    (corpus(MANUAL_AR).values[0], "nccl-serialization", ["manual-allreduce"], "DistributedDataParallel(model)",
     "bucket_cap_mb"),
    # TorchRec: SendRecv kernels launched by all_to_all, FBGEMM embedding ops
    (corpus(TORCHREC).values[0], "nccl-serialization", ["alltoall-embeddings", "alltoall"],
     "TrainPipelineSparseDist", "bucket_cap_mb"),
])
def test_comm_fix_follows_collective_and_framework_on_real_traces(cache_root, path, root, tags, words, absent):
    if not path.exists():
        pytest.skip(f"{path.name} is not restored (corpus/restore.py)")
    found = [f for f in _comm_findings(path, cache_root) if f.root_cause == root]
    assert found and all(f.tags == tags and words in f.fix and absent not in f.fix for f in found)


def test_comm_evidence_of_the_real_traces_is_what_the_variants_say():
    """An independent reading of each trace's JSON: the evidence the variants above rest on."""
    def names(path: Path) -> list[str]:
        return [e.get("name", "") for e in _json(path)["traceEvents"]]
    for path in (DDP_MI300, MANUAL_AR, TORCHREC):
        if not path.exists():
            pytest.skip(f"{path.name} is not restored (corpus/restore.py)")
    ddp, manual, rec = names(DDP_MI300), names(MANUAL_AR), names(TORCHREC)
    assert "DistributedDataParallel.forward" in ddp and ddp.count("nccl:all_reduce") > 0
    assert manual.count("nccl:all_reduce") == 2_020 and not any("DistributedDataParallel" in n or "reducer" in n
                                                                for n in manual)
    assert rec.count("nccl:all_to_all") == 42 and any(n.startswith("fbgemm::split_embedding") for n in rec)


# --- question 2: the GPUs traced and the job --------------------------------------------------------------------
@pytest.mark.parametrize("path", [pytest.param(KINETO / f"{n}.json.gz", id=n)
                                  for n in ("hta_sampled_rank0", "hta_a100_nccl_rank0")])
def test_comm_question_2_says_one_gpu_of_the_job(cache_root, path):
    info = read_json(path)["distributedInfo"]
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        answers = {a.id: a for a in answer_questions.run(profile.con, answer_questions.Params(profile="p")).answers}
    q02 = answers["q02-gpu-count-parallelism"]
    assert q02.value.startswith(f"1 GPU(s) traced of a job of {info['world_size']} rank(s) (rank {info['rank']}, "
                                "from distributedInfo, backend nccl")
    assert "single-GPU" not in q02.value and q02.evidence["world_size"] == info["world_size"]
    groups = [g["pg_size"] for g in info.get("pg_config", [])]
    assert (f"process groups of {', '.join(map(str, sorted(set(groups), reverse=True)))} ranks" in q02.value) == bool(
        groups)


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in sorted(KINETO.glob("*.json.gz"))])
def test_comm_distributed_info_lands_in_meta_and_the_summary(cache_root, path):
    info = read_json(path).get("distributedInfo", {})
    groups = [g["pg_size"] for g in info.get("pg_config", [])] or None
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        meta = profile.con.execute("SELECT rank, world_size, comm_backend, process_group_sizes FROM meta").fetchone()
        summary = run_skill(profile.con, profile_summary, profile_summary.Params(profile="p")).distributed
    assert meta == (info.get("rank"), info.get("world_size"), info.get("backend"), groups)
    assert summary is not None and (summary.rank, summary.world_size, summary.backend, summary.process_group_sizes,
                                    summary.source) == (*meta[:3], groups or [], "distributedInfo")


def test_comm_nsys_export_records_no_job():
    con = make_model(kernels=[_nccl(100, 200, "AllReduce")])
    assert profile_summary.run(con, profile_summary.Params(profile="t")).distributed is None


def test_comm_question_2_has_a_hint_for_every_pattern():
    assert set(parallelism.BY_PATTERN) == set(comm_context.PATTERNS)
    assert set(parallelism.BY_FAMILY) <= {f.name for f in comm_kernels.FAMILIES}


@pytest.mark.parametrize("devices, measured", [((0,), False), ((0, 1), True)])
def test_comm_serialization_says_when_one_device_cannot_measure_waiting(devices, measured):
    # each device: 1 ms of exposed all-reduce in every 2 ms, both ending together (no wait between them)
    kernels = [{**_nccl(i * 2_000_000, i * 2_000_000 + 1_000_000, "AllReduce", device=d), "stream_id": 21}
               for i in range(12) for d in devices]
    result = run_skill(make_model(kernels=kernels), nccl_breakdown, nccl_breakdown.Params(profile="t"))
    found = [f for f in result.findings if f.root_cause == "nccl-serialization"]
    assert len(found) == len(devices) and all(f.evidence["wait_measured"] == measured for f in found)
    assert all((nccl_breakdown.ALONE in f.title) != measured for f in found)


def _compute(s: int, e: int) -> dict:
    return {"device_id": 0, "stream_id": 21, "pid": 1, "tid": 1, "start_ns": s, "end_ns": e, "launch_start_ns": s - 5,
            "launch_end_ns": s - 2, "name": "gemm", "short_name": "gemm", "category": "compute"}


@pytest.mark.parametrize("family, fires", [("NCCL", True), ("custom all-reduce", False)])
def test_comm_tensor_parallel_all_reduce_on_the_compute_stream_is_no_finding(family, fires):
    """Layers and their all-reduce take turns on one stream by design in tensor-parallel inference (the next layer
    needs the sum); a DDP-style NCCL all-reduce there (manual: nccl:all_reduce ranges) is a finding."""
    kernels = [_compute(0, 400), _nccl(400, 600, "AllReduce", family), _compute(600, 1000),
               _nccl(1000, 1200, "AllReduce", family), _compute(1200, 1600)]
    con = make_model(kernels=kernels, nvtx=[_range(395, 398, "nccl:all_reduce"), _range(995, 998, "nccl:all_reduce")])
    result = run_skill(con, nccl_breakdown, nccl_breakdown.Params(profile="t"))
    assert [s.stream for s in result.nccl_on_compute_stream] == [21]
    found = [f for f in result.findings if f.root_cause == "nccl-on-compute-stream"]
    assert bool(found) == fires, [f.title for f in result.findings]

@pytest.mark.parametrize("path", [corpus(VLLM_TP8)])
def test_comm_vllm_tensor_parallel_all_reduce_is_not_told_to_move_streams(cache_root, path):
    assert not [f for f in _comm_findings(path, cache_root) if f.root_cause == "nccl-on-compute-stream"]
