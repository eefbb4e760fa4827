"""NCCL collective metadata of a Kineto trace: what PyTorch records for each collective, as kernel columns.

PyTorch writes a collective's parameters on its `record_param_comms` CPU op and, in recent versions, on the NCCL
kernel too: 'Collective name', 'In msg nelems', 'Out msg nelems', 'dtype', 'Group size', 'Process Group Name',
'Process Group Ranks', 'In split size', 'Out split size' and, in some versions, 'Rank' (the process's rank in that
group). A kernel without them takes those of the record_param_comms op with its 'External id' (the op that
launched it). Older versions record none of them; with record_shapes they still write 'Input Dims' and 'Input
type' on the ops around the launch: the c10d:: op (c10d::allreduce_, c10d::_allgather_base_, ...), record_param_comms
and the `nccl:<collective>` range.

Message size in bytes: the collective's whole buffer (AllGather's gathered output, ReduceScatter's input,
AllReduce's either), the size nccl-tests reports, from the first field that gives it (SIZE_FIELDS, named in
kernels.nccl_size_field):
- 'msg nelems': max(In msg nelems, Out msg nelems) x the dtype's element size (ELEMENT_BYTES);
- 'Input Dims': the largest tensor among an op's Input Dims (a list of ints per tensor; Scalars and tensor lists
  carry none) x its Input type's element size. A c10d:: op lists its output and input tensors, so its largest is
  the whole buffer; record_param_comms and nccl:* list the input alone, the whole buffer except for a gather
  (AllGather's input is one rank's share): theirs counts only when their collective is known and no gather. A
  kernel takes the largest over the ops around its launch call;
- 'split size': all_to_all over tensor lists records each peer's element count; its sum, the larger side, x the
  dtype's element size (all_to_allv's splits count rows of dim 0, not elements, so they give no size alone).
NULL when no field gives it.
"""

from __future__ import annotations

import json
import math

COMMS_OP = "record_param_comms"  # the CPU op PyTorch's c10d wraps every collective in
COMM_OPS = (COMMS_OP, "nccl:", "c10d::")  # ops that may record a collective's tensors (names start so)
FULL_BUFFER_OP = "c10d::"  # lists the output tensor besides the input
SIZE_FIELDS = ("msg nelems", "Input Dims", "split size")
SPLIT_COLLECTIVE = "all_to_all"  # the list form, whose splits are element counts
# Element sizes by the names Kineto writes: torch dtype names in 'dtype' (c10::ScalarType) and C++ type names in
# 'Input type' (c10::BFloat16, long int, float, ...).
ELEMENT_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1, "QUInt4x2": 1, "QUInt2x4": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2,
    "Int": 4, "Float": 4, "QInt32": 4, "ComplexHalf": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8,
    "ComplexDouble": 16,
    "bool": 1, "signed char": 1, "unsigned char": 1, "c10::quint8": 1, "c10::qint8": 1, "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1,
    "short": 2, "short int": 2, "unsigned short": 2, "c10::Half": 2, "c10::BFloat16": 2,
    "int": 4, "unsigned int": 4, "float": 4, "c10::qint32": 4, "c10::complex<c10::Half>": 4,
    "long": 8, "long int": 8, "long long": 8, "long long int": 8, "unsigned long": 8, "double": 8,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}
# Staged per kernel and per comms op, in the order of fields().
COLUMNS = (("nccl_message_bytes", "BIGINT"), ("nccl_size_field", "VARCHAR"), ("nccl_group", "VARCHAR"),
           ("nccl_group_size", "INTEGER"), ("nccl_rank", "INTEGER"), ("nccl_group_ranks", "VARCHAR"))
NONE = (None,) * len(COLUMNS)


def as_int(value) -> int | None:
    if value.__class__ is int:  # most values: skips the call to int()
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _nelems(args: dict) -> int | None:
    counts = [n for n in (as_int(args.get("In msg nelems")), as_int(args.get("Out msg nelems"))) if n is not None]
    return max(counts) if counts else None


def _tensor_bytes(dims, kind) -> int | None:
    """Bytes of one Input Dims entry: a list of ints with a known element type; None for anything else."""
    size = ELEMENT_BYTES.get(kind) if isinstance(kind, str) else None
    if not size or not isinstance(dims, list) or not dims or not all(isinstance(d, int) for d in dims):
        return None
    return math.prod(dims) * size


def dims_bytes(name: str, args: dict, collective: str | None) -> int | None:
    """The largest tensor of an op's Input Dims in bytes, when it is the collective's whole buffer."""
    if not name.startswith(FULL_BUFFER_OP) and (collective is None or "Gather" in collective):
        return None
    dims, kinds = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(kinds, list):
        return None
    sizes = [b for d, k in zip(dims, kinds, strict=False) if (b := _tensor_bytes(d, k)) is not None]
    return max(sizes) if sizes else None


def _split_elements(args: dict) -> int | None:
    if args.get("Collective name") != SPLIT_COLLECTIVE:
        return None
    sides = []
    for key in ("In split size", "Out split size"):
        try:
            splits = json.loads(str(args.get(key)))
        except json.JSONDecodeError:
            continue
        if isinstance(splits, list) and splits and all(isinstance(s, int) for s in splits):
            sides.append(sum(splits))
    return max(sides) if sides else None


def message_bytes(name: str, args: dict, collective: str | None) -> tuple[int | None, str | None]:
    """(bytes of the collective's whole buffer, the field it came from: one of SIZE_FIELDS); (None, None)."""
    size = ELEMENT_BYTES.get(str(args.get("dtype")))
    nelems = _nelems(args)
    if nelems is not None and size:
        return nelems * size, SIZE_FIELDS[0]
    if (dims := dims_bytes(name, args, collective)) is not None:
        return dims, SIZE_FIELDS[1]
    splits = _split_elements(args)
    if splits is not None and size:
        return splits * size, SIZE_FIELDS[2]
    return None, None


def fields(name: str, args: dict, collective: str | None) -> tuple:
    """(message bytes, its field, group name, group size, rank in the group, the group's ranks as written) from an
    event's args and its collective (model label, None when unknown); all None when it records no collective."""
    recorded = "Collective name" in args
    if not recorded and not name.startswith(COMM_OPS):
        return NONE
    group = args.get("Process Group Name")
    ranks = args.get("Process Group Ranks")
    return (*message_bytes(name, args, collective), None if group is None else str(group),
            as_int(args.get("Group size")), as_int(args.get("Rank")), None if ranks is None else str(ranks))


# The kernel's own metadata, else its record_param_comms op's (`c`, joined on External id), else the size read from
# the Input Dims of the ops around its launch (`d`); its rank in the group, when not recorded, is the position of the
# trace's rank ($rank, meta.rank) in the group's ranks.
KERNEL_SQL = """coalesce(g.nccl_message_bytes, c.nccl_message_bytes, d.nccl_message_bytes),
       CASE WHEN g.nccl_message_bytes IS NOT NULL THEN g.nccl_size_field
            WHEN c.nccl_message_bytes IS NOT NULL THEN c.nccl_size_field ELSE d.nccl_size_field END,
       coalesce(g.nccl_group, c.nccl_group), coalesce(g.nccl_group_size, c.nccl_group_size),
       coalesce(g.nccl_rank, c.nccl_rank,
                nullif(list_position(TRY_CAST(coalesce(g.nccl_group_ranks, c.nccl_group_ranks) AS BIGINT[]),
                                     $rank), 0) - 1)"""
# `d`: per NCCL kernel (correlation id), the larger Input Dims size of the c10d:: op and of the other comms op that
# started last before its launch call on the launching thread, each when its span holds the call (ASOF joins: a
# thread's comms ops are matched to its launches in one sorted pass, however many collectives it ran).
DIMS_OPS = ("SELECT pid, tid, start_ns, end_ns, nccl_message_bytes AS b FROM _k_comms "
            "WHERE nccl_size_field = '{field}' AND {test}")
COMMS_JOIN = f"""LEFT JOIN (SELECT DISTINCT ON (external_id) * FROM _k_comms WHERE op = '{COMMS_OP}'
                   ORDER BY external_id, start_ns) c
    ON c.external_id = g.external_id AND n.category = 'nccl'
LEFT JOIN (
  SELECT l.correlation_id, nullif(max(greatest(CASE WHEN f.end_ns >= l.end_ns THEN f.b ELSE 0 END,
                                               CASE WHEN i.end_ns >= l.end_ns THEN i.b ELSE 0 END)), 0)
           AS nccl_message_bytes, '{SIZE_FIELDS[1]}' AS nccl_size_field
  FROM (SELECT DISTINCT a.correlation_id, a.pid, a.tid, a.start_ns, a.end_ns
        FROM _k_gpu k JOIN names kn ON kn.value = k.name AND kn.category = 'nccl'
        JOIN cuda_api a ON a.correlation_id = k.correlation_id WHERE k.kind = 'kernel') l
  ASOF LEFT JOIN ({DIMS_OPS.format(field=SIZE_FIELDS[1], test=f"op LIKE '{FULL_BUFFER_OP}%'")}) f
    ON f.pid = l.pid AND f.tid = l.tid AND f.start_ns <= l.start_ns
  ASOF LEFT JOIN ({DIMS_OPS.format(field=SIZE_FIELDS[1], test=f"op NOT LIKE '{FULL_BUFFER_OP}%'")}) i
    ON i.pid = l.pid AND i.tid = l.tid AND i.start_ns <= l.start_ns
  GROUP BY l.correlation_id) d
    ON d.correlation_id = g.correlation_id AND d.nccl_message_bytes IS NOT NULL AND n.category = 'nccl'"""
