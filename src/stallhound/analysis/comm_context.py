"""What a program's communication is for: the collective pattern each communication kernel carries out, the parallel
frameworks the trace shows, and from both the variant that picks the book's fix for a communication finding.

Op: PyTorch's c10d wraps each collective in a range named `nccl:<op>` (all_reduce, all_to_all, _all_gather_base,
send, ...), recorded by torch.profiler and, as NVTX, by nsys when PyTorch emits it. A kernel's op is the innermost
such range on its launching thread around its launch call. NCCL runs all-to-all and point-to-point alike as
SendRecv kernels; the op tells them apart.

Pattern of a kernel (PATTERNS), first rule that holds: its family's (expert-parallel: all-to-all; custom
all-reduce: all-reduce), else its collective's (AllToAll, Dispatch, Combine: all-to-all; AllReduce: all-reduce;
AllGather, ReduceScatter: all-gather/reduce-scatter; Broadcast, Reduce: broadcast), else its op's; SendRecv, Send
and Recv kernels take their op's pattern when it is all-to-all or point-to-point, else 'send/recv' (either).

Frameworks (FRAMEWORKS): a pattern over the distinct NVTX (torch.profiler: CPU op and annotation) texts, each
counted once per model.

Variant (VARIANTS) of a device: from the pattern with the most communication time on it (clipped to the window;
'other' only when no kernel has a known pattern) and the frameworks, first rule that holds:
- all-to-all: 'alltoall-experts' with expert-parallel kernels or MoE ranges, 'alltoall-embeddings' with TorchRec
  ranges, else 'alltoall';
- all-reduce by custom all-reduce kernels: 'tp-allreduce' (tensor-parallel inference stacks own them);
- all-reduce or all-gather/reduce-scatter: 'ddp-allreduce' (all-reduce with DDP ranges), 'fsdp', 'zero'
  (DeepSpeed), 'megatron', by the framework seen; an all-reduce with none of them but launched from c10d ops
  (so the trace records ranges, and no framework's): 'manual-allreduce';
- point-to-point: 'pipeline-p2p';
- else none (the book's plain fix).
tags(variant) adds the coarse tag 'alltoall' to the all-to-all variants: the fixes that hold for any all-to-all.
"""

from __future__ import annotations

import re

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.common import per_model
from stallhound.formats.comm_kernels import CUSTOM_ALL_REDUCE, EXPERT_PARALLEL
from stallhound.model.duck import one_row

ALL_TO_ALL, ALL_REDUCE, SHARDED = "all-to-all", "all-reduce", "all-gather/reduce-scatter"
POINT_TO_POINT, SEND_RECV, BROADCAST, OTHER = "point-to-point", "send/recv", "broadcast", "other"
PATTERNS = (ALL_TO_ALL, ALL_REDUCE, SHARDED, POINT_TO_POINT, SEND_RECV, BROADCAST, OTHER)
BY_COLLECTIVE = {"AllToAll": ALL_TO_ALL, "Dispatch": ALL_TO_ALL, "Combine": ALL_TO_ALL, "AllReduce": ALL_REDUCE,
                 "AllGather": SHARDED, "ReduceScatter": SHARDED, "Broadcast": BROADCAST, "Reduce": BROADCAST}
BY_FAMILY = {EXPERT_PARALLEL.name: ALL_TO_ALL, CUSTOM_ALL_REDUCE.name: ALL_REDUCE}
P2P_KERNELS = ("SendRecv", "Send", "Recv")  # NCCL's kernels for all-to-all and point-to-point alike
# c10d op names (the `nccl:<op>` ranges, lower case) -> pattern, first match (Python re).
OP_PATTERNS: tuple[tuple[str, str], ...] = (
    (ALL_TO_ALL, r"all_?to_?all"), (POINT_TO_POINT, r"^(batch_)?i?(send|recv)"),
    (SHARDED, r"all_?gather|reduce_?scatter"), (ALL_REDUCE, r"all_?reduce"), (BROADCAST, r"broadcast|^_?reduce"))
OP_RANGE = r"^nccl:([A-Za-z_]+)"  # c10d's record_function around each collective (nsys appends ', op_id = N')

# Parallel frameworks by the ranges they record, RE2 on the distinct NVTX / torch.profiler op texts.
FRAMEWORKS: dict[str, str] = {
    "DDP": r"^DistributedDataParallel\.|torch\.distributed\.ddp\.|torch::distributed::reducer::",  # forward, reducer
    "FSDP": r"^FSDP::|^FullyShardedDataParallel",  # FSDP1 and FSDP2 (fully_shard) record_function names
    "DeepSpeed": r"(?i)deepspeed",
    "Megatron": r"(?i)megatron",
    # TorchRec's awaitables and pipelines, and the FBGEMM table-batched embedding ops it runs on
    "TorchRec": r"KJT[A-Za-z]*Awaitable|PooledEmbeddings|[Tt]orch[Rr]ec|TrainPipeline|^fbgemm::split_embedding",
    "MoE": r"(?i)(^|[^a-z])(moe|experts?)([^a-z]|$)",  # mixture-of-experts layers' ranges
}

ALLTOALL = "alltoall"  # coarse tag on every all-to-all variant
VARIANTS = ("alltoall-experts", "alltoall-embeddings", ALLTOALL, "tp-allreduce", "ddp-allreduce", "fsdp", "zero",
            "megatron", "manual-allreduce", "pipeline-p2p")
DATA_PARALLEL = (("FSDP", "fsdp"), ("DeepSpeed", "zero"), ("Megatron", "megatron"))  # framework -> variant


class DevicePattern(BaseModel):
    device: int
    pattern: str = Field(description="the collective pattern with the most communication time on the device")
    family: str = Field(description="its kernels' library (kernels.comm_family)")
    ns: int = Field(description="its communication kernel time, clipped to the window")
    ops: list[str] = Field(description="the c10d ops (nccl:<op> ranges) its kernels were launched from")


class PatternTime(BaseModel):
    pattern: str
    family: str
    ns: int = Field(description="communication kernel time of this pattern and family, over the devices in scope")


class Context(BaseModel):
    frameworks: list[str] = Field(description="parallel frameworks whose ranges the trace holds (FRAMEWORKS)")
    devices: list[DevicePattern]
    patterns: list[PatternTime] = Field(description="every (pattern, family) seen, most time first")


# Per communication kernel in the window: its op (innermost `nccl:` range around its launch on its thread).
KERNELS_SQL = """
WITH k AS (SELECT row_number() OVER () AS kid, device_id, pid, tid, launch_start_ns, launch_end_ns,
                  coalesce(comm_family, 'NCCL') AS family, nccl_collective AS coll,
                  least(end_ns, $end) - greatest(start_ns, $start) AS ns
           FROM kernels WHERE category = 'nccl' AND device_id IN (SELECT unnest($devices))
             AND end_ns > $start AND start_ns < $end),
ops AS (SELECT pid, tid, start_ns, end_ns, lower(regexp_extract(text, $op_range, 1)) AS op
        FROM nvtx WHERE text LIKE 'nccl:%' AND end_ns IS NOT NULL),
tagged AS (SELECT k.kid, any_value(k.device_id) AS device_id, any_value(k.family) AS family,
                  any_value(k.coll) AS coll, any_value(k.ns) AS ns, arg_max(o.op, o.start_ns) AS op
           FROM k LEFT JOIN ops o ON o.pid = k.pid AND o.tid = k.tid AND o.start_ns <= k.launch_start_ns
                                     AND o.end_ns >= k.launch_end_ns
           GROUP BY k.kid)
SELECT device_id, family, coll, op, sum(ns)::BIGINT FROM tagged GROUP BY ALL ORDER BY ALL
"""
FRAMEWORKS_SQL = ("WITH t AS MATERIALIZED (SELECT DISTINCT text FROM nvtx WHERE text IS NOT NULL) SELECT ["
                  + ", ".join(f"count(*) FILTER (WHERE regexp_matches(text, $f{i}))" for i in range(len(FRAMEWORKS)))
                  + "] FROM t")


def op_pattern(op: str | None) -> str | None:
    return next((p for p, rule in OP_PATTERNS if op and re.search(rule, op)), None)


def pattern_of(family: str, collective: str | None, op: str | None) -> str:
    """The collective pattern of a communication kernel (see the module docstring)."""
    if family in BY_FAMILY:
        return BY_FAMILY[family]
    by_op = op_pattern(op)
    if collective in P2P_KERNELS:
        return by_op if by_op in (ALL_TO_ALL, POINT_TO_POINT) else SEND_RECV
    return BY_COLLECTIVE.get(collective or "") or by_op or OTHER


def frameworks(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The parallel frameworks whose ranges the model holds (once per model)."""
    def compute() -> list[str]:
        counts = one_row(con.execute(FRAMEWORKS_SQL, {f"f{i}": p for i, p in enumerate(FRAMEWORKS.values())}))[0]
        return [name for name, n in zip(FRAMEWORKS, counts, strict=True) if n]
    return per_model(con, ("comm_frameworks",), compute)


def measure(con: duckdb.DuckDBPyConnection, args: dict[str, object]) -> Context:
    """The context of the communication kernels in scope (`args`: scope_args)."""
    per: dict[int, dict[tuple[str, str], tuple[int, set[str]]]] = {}
    for device, family, coll, op, ns in con.execute(KERNELS_SQL, {**args, "op_range": OP_RANGE}).fetchall():
        key = (pattern_of(family, coll, op), family)
        total, ops = per.setdefault(device, {}).get(key, (0, set()))
        per[device][key] = (total + ns, ops | ({op} if op else set()))
    overall: dict[tuple[str, str], int] = {}
    for found in per.values():
        for key, (ns, _) in found.items():
            overall[key] = overall.get(key, 0) + ns
    patterns = [PatternTime(pattern=p, family=f, ns=ns)
                for (p, f), ns in sorted(overall.items(), key=lambda kv: (-kv[1], kv[0]))]
    devices = []
    for device, found in sorted(per.items()):
        # kernels that name no collective and carry no op say nothing: the known patterns decide
        (pattern, family), (ns, ops) = max(found.items(), key=lambda kv: (kv[0][0] != OTHER, kv[1][0], kv[0]))
        devices.append(DevicePattern(device=device, pattern=pattern, family=family, ns=ns, ops=sorted(ops)))
    return Context(frameworks=frameworks(con), devices=devices, patterns=patterns)


def variant(ctx: Context, device: int) -> str | None:
    """The variant of the device's communication (see the module docstring), None when no rule holds."""
    found = next((d for d in ctx.devices if d.device == device), None)
    if found is None:
        return None
    seen = set(ctx.frameworks)
    if found.pattern == ALL_TO_ALL:
        experts = found.family == EXPERT_PARALLEL.name or "MoE" in seen
        return "alltoall-experts" if experts else "alltoall-embeddings" if "TorchRec" in seen else ALLTOALL
    if found.pattern == ALL_REDUCE and found.family == CUSTOM_ALL_REDUCE.name:
        return "tp-allreduce"
    if found.pattern in (ALL_REDUCE, SHARDED):
        if found.pattern == ALL_REDUCE and "DDP" in seen:
            return "ddp-allreduce"
        framework = next((v for name, v in DATA_PARALLEL if name in seen), None)
        # no framework's ranges beside recorded c10d ops: the program calls all_reduce itself (without the ops,
        # a capture may simply not record ranges, and says nothing)
        manual = found.pattern == ALL_REDUCE and bool(found.ops)
        return framework or ("manual-allreduce" if manual else None)
    return "pipeline-p2p" if found.pattern == POINT_TO_POINT else None


def tags(ctx: Context, device: int) -> list[str]:
    """The fix-choosing tags of a communication finding on `device`: its variant, and 'alltoall' for any all-to-all."""
    chosen = variant(ctx, device)
    if chosen is None:
        return []
    return [chosen, ALLTOALL] if chosen.startswith(ALLTOALL) and chosen != ALLTOALL else [chosen]
