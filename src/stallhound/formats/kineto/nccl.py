"""NCCL collective metadata of a Kineto trace: what PyTorch records for each collective, as kernel columns.

PyTorch writes a collective's parameters on its `record_param_comms` CPU op and, in recent versions, on the NCCL
kernel too: 'Collective name', 'In msg nelems', 'Out msg nelems', 'dtype', 'Group size', 'Process Group Name',
'Process Group Ranks' and, in some versions, 'Rank' (the process's rank in that group). A kernel without them
takes those of the record_param_comms op with its 'External id' (the op that launched it).

Message size in bytes = max(In msg nelems, Out msg nelems) x the dtype's element size (DTYPE_BYTES): the
collective's whole buffer (AllGather's gathered output, ReduceScatter's input, AllReduce's either), the size
nccl-tests reports. NULL when the dtype is not listed there or no element count is recorded.
"""

from __future__ import annotations

COMMS_OP = "record_param_comms"  # the CPU op PyTorch's c10d wraps every collective in
# torch.dtype names as Kineto writes them (c10::ScalarType) -> bytes per element.
DTYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1, "QUInt4x2": 1, "QUInt2x4": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2,
    "Int": 4, "Float": 4, "QInt32": 4, "ComplexHalf": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8,
    "ComplexDouble": 16,
}
# Staged per kernel and per record_param_comms op, in the order of fields().
COLUMNS = (("nccl_message_bytes", "BIGINT"), ("nccl_group", "VARCHAR"), ("nccl_group_size", "INTEGER"),
           ("nccl_rank", "INTEGER"), ("nccl_group_ranks", "VARCHAR"))
NONE = (None,) * len(COLUMNS)


def as_int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def message_bytes(args: dict) -> int | None:
    counts = [n for n in (as_int(args.get("In msg nelems")), as_int(args.get("Out msg nelems"))) if n is not None]
    size = DTYPE_BYTES.get(str(args.get("dtype")))
    return max(counts) * size if counts and size else None


def fields(args: dict) -> tuple:
    """(message bytes, group name, group size, rank in the group, the group's ranks as written) from an event's
    args; all None when it records no collective."""
    if "Collective name" not in args:
        return NONE
    group = args.get("Process Group Name")
    ranks = args.get("Process Group Ranks")
    return (message_bytes(args), None if group is None else str(group), as_int(args.get("Group size")),
            as_int(args.get("Rank")), None if ranks is None else str(ranks))


# The kernel's own metadata, else its record_param_comms op's (`c`, joined on External id); its rank in the group,
# when not recorded, is the position of the trace's rank ($rank, meta.rank) in the group's ranks.
KERNEL_SQL = """coalesce(g.nccl_message_bytes, c.nccl_message_bytes), coalesce(g.nccl_group, c.nccl_group),
       coalesce(g.nccl_group_size, c.nccl_group_size),
       coalesce(g.nccl_rank, c.nccl_rank,
                nullif(list_position(TRY_CAST(coalesce(g.nccl_group_ranks, c.nccl_group_ranks) AS BIGINT[]),
                                     $rank), 0) - 1)"""
COMMS_JOIN = """LEFT JOIN (SELECT DISTINCT ON (external_id) * FROM _k_comms ORDER BY external_id, start_ns) c
    ON c.external_id = g.external_id AND n.category = 'nccl'"""
