"""Which kernels move data between GPUs, and which library launched them: name rules on demangled kernel names.

Every format's build (formats/derive.py) files a kernel of any family below under kernels.category 'nccl' (the
communication category: shares, nccl_breakdown and rank_imbalance count it as communication, not compute) and
names its family in kernels.comm_family; analysis/kernel_kinds.py reads the same rules. A rule is an RE2 pattern
that Python's re reads the same way, matched case-insensitively anywhere in the demangled name; the first family
that matches wins, in FAMILIES order (MSCCL first: its kernels take NCCL types as arguments).

A rule must never catch a compute kernel. The generic words are compute: `reduce` (at::native::reduce_kernel,
cuBLAS splitKreduce), `dispatch` and `combine` (a MoE router's _combined_routing_compute, CUB's DispatchReduceByKey),
a block-level all-reduce inside a norm kernel. So each rule names what only a communication library emits: its
prefix (nccl, msccl, nvshmem), the namespace of its transfer kernels, or a kernel name no compute library uses.
"""

from __future__ import annotations

from dataclasses import dataclass

# NCCL's collectives as its kernel names spell them (kernels.nccl_collective), longest alternatives first where one
# contains another (AllReduce before Reduce).
NCCL_COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "SendRecv",
                    "AllToAll", "Send", "Recv")


@dataclass(frozen=True)
class Family:
    name: str  # kernels.comm_family
    pattern: str  # RE2 and Python re alike, lower case, matched case-insensitively
    why: str


NCCL = Family(
    "NCCL", r"nccl|rccl",
    "NCCL's kernels: ncclKernel_* (before 2.19), ncclDevKernel_* and the symmetric-memory ncclSymk* (2.27); RCCL, "
    "AMD's port, keeps NCCL's names (ncclDevKernel_Generic)")
MSCCL = Family(
    "MSCCL", r"msccl",
    "Microsoft's MSCCL (mscclKernel_*, also inside RCCL) and MSCCL++ (mscclpp::) collective kernels")
EXPERT_PARALLEL = Family(
    "expert-parallel",
    r"(?:^|[^a-z0-9_])(?:intranode|internode|internode_ll|low_latency)::[a-z_]*(?:dispatch|combine|notify|clean_)",
    "DeepEP's token dispatch and combine kernels and their notify/clean steps (deep_ep::intranode::dispatch, "
    "deep_ep::internode_ll::combine, deep_ep::internode::cached_notify, forks such as dpsk::ep::internode::"
    "notify_dispatch): an expert-parallel all-to-all over NVLink/RDMA; the namespace is what tells them from a "
    "router's compute kernels named dispatch or combine, and its layout kernel (get_dispatch_layout) is compute")
NVSHMEM = Family(
    "NVSHMEM", r"nvshmem",
    "NVSHMEM's own kernels (nvshmemi_*, nvshmemx_*): one-sided puts, gets, barriers and collectives")
CUSTOM_ALL_REDUCE = Family(
    "custom all-reduce",
    r"cross_device_reduce|(?:one|two)_?shot_?all_?(?:reduce|gather)|multimem_[a-z_]*(?:reduce|gather)|"
    r"allreduce_?fusion|userbuffers|quickreduce::",
    "all-reduce kernels of inference and training stacks that bypass NCCL over NVLink: vLLM/SGLang "
    "cross_device_reduce_1stage/2stage, PyTorch symmetric memory one_shot/two_shot and multimem (NVLS) all-reduce "
    "and all-gather, TensorRT-LLM oneShot/twoShotAllReduce and allreduce_fusion (also FlashInfer's), Transformer "
    "Engine userbuffers, vLLM's quickreduce")
FAMILIES: tuple[Family, ...] = (MSCCL, NCCL, EXPERT_PARALLEL, NVSHMEM, CUSTOM_ALL_REDUCE)
ANY = "|".join(f"(?:{f.pattern})" for f in FAMILIES)  # a communication kernel of any family

# kernels.nccl_collective of each family: the collective its kernel name says, where it says one. DeepEP's halves
# of the expert all-to-all are Dispatch and Combine (its notify and clean steps serve both: no label).
_NCCL_NAMED = f"nullif(regexp_extract(value, '({'|'.join(NCCL_COLLECTIVES)})', 1), '')"
_COLLECTIVE = {
    NCCL.name: _NCCL_NAMED,
    MSCCL.name: _NCCL_NAMED,
    EXPERT_PARALLEL.name: ("CASE WHEN regexp_matches(lower(value), '::[a-z_]*dispatch') THEN 'Dispatch' "
                           "WHEN regexp_matches(lower(value), '::[a-z_]*combine') THEN 'Combine' END"),
    CUSTOM_ALL_REDUCE.name: ("CASE WHEN regexp_matches(lower(value), 'all_?gather') THEN 'AllGather' "
                             "ELSE 'AllReduce' END"),
}


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# SQL on a column `value` (a demangled or short kernel name), for a build's per-name table.
IS_COMM_SQL = f"regexp_matches(value, {_quoted('(?i)' + ANY)})"
FAMILY_SQL = ("CASE " + " ".join(f"WHEN regexp_matches(value, {_quoted('(?i)' + f.pattern)}) THEN {_quoted(f.name)}"
                                  for f in FAMILIES) + " END")
COLLECTIVE_SQL = f"CASE {FAMILY_SQL} " + " ".join(f"WHEN {_quoted(name)} THEN {sql}"
                                                  for name, sql in _COLLECTIVE.items()) + " END"
