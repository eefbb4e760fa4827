"""SQL that maps a Kineto trace's staged events (_k_gpu, _k_host, see formats.kineto.read) into the model tables.

GPU activity joins the CUDA API call that issued it on Kineto's correlation id alone: a Kineto trace is one
process's, and its correlation ids are unique within it. Copy direction and memory kinds come from the names
Kineto gives copies and sets: 'Memcpy HtoD (Pageable -> Device)', 'Memset (Device)'.
"""

from __future__ import annotations

from stallhound.formats.comm_kernels import COLLECTIVE_SQL, FAMILY_SQL
from stallhound.formats.derive import API_KIND_SQL, KERNEL_CATEGORY_SQL
from stallhound.formats.kineto import nccl as kineto_nccl

# Staging tables, in the column order of kineto_read.gpu_row, host_row and comms_row (and _feed's range rows).
GPU_COLUMNS = (("kind", "VARCHAR"), ("device_id", "INTEGER"), ("context_id", "INTEGER"), ("stream_id", "INTEGER"),
               ("correlation_id", "BIGINT"), ("start_ns", "BIGINT"), ("end_ns", "BIGINT"), ("name", "VARCHAR"),
               ("grid_x", "INTEGER"), ("grid_y", "INTEGER"), ("grid_z", "INTEGER"), ("block_x", "INTEGER"),
               ("block_y", "INTEGER"), ("block_z", "INTEGER"), ("registers", "INTEGER"), ("bytes", "BIGINT"),
               ("collective", "VARCHAR"), ("external_id", "BIGINT"), *kineto_nccl.COLUMNS)
COMMS_COLUMNS = (("op", "VARCHAR"), ("external_id", "BIGINT"), ("pid", "BIGINT"), ("tid", "BIGINT"),
                 ("start_ns", "BIGINT"), ("end_ns", "BIGINT"), ("collective", "VARCHAR"), *kineto_nccl.COLUMNS)
HOST_COLUMNS = (("kind", "VARCHAR"), ("pid", "BIGINT"), ("tid", "BIGINT"), ("correlation_id", "BIGINT"),
                ("name", "VARCHAR"), ("start_ns", "BIGINT"), ("end_ns", "BIGINT"))
RANGE_COLUMNS = (("name", "VARCHAR"),)  # a cuda_profiler_range event: the kernel it measured

# Activity with no launching call traced still belongs to the process: the one with the most host events.
HOST_PID = "(SELECT pid FROM _k_host WHERE pid IS NOT NULL GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1)"
MEMORY_KIND = "coalesce(nullif(replace(lower(regexp_extract(g.name, '{pattern}', {group})), ' ', '_'), ''), 'unknown')"
COPY_KINDS = r"\(([A-Za-z ]+) -> ([A-Za-z ]+)\)"
SET_KIND = r"^Memset \(([A-Za-z ]+)\)"


def _api(*kinds: str) -> str:
    """LEFT JOIN of the earliest API call `a` of these kinds with the activity row's correlation id."""
    listed = ", ".join(f"'{k}'" for k in kinds)
    return (f"LEFT JOIN (SELECT DISTINCT ON (correlation_id) correlation_id, pid, tid, name, start_ns, end_ns "
            f"FROM cuda_api WHERE kind IN ({listed}) ORDER BY correlation_id, start_ns) a "
            "ON a.correlation_id = g.correlation_id")


# Each call's stack from _k_api_stack (formats.kineto.stacks), keyed by the staged row's rowid.
CUDA_API = f"""INSERT INTO cuda_api SELECT h.pid, h.tid, h.correlation_id, h.name, h.start_ns, h.end_ns,
    h.end_ns - h.start_ns, {API_KIND_SQL}, NULL, s.stack_id
FROM _k_host h LEFT JOIN _k_api_stack s ON s.rid = h.rowid WHERE h.kind = 'api'"""

# short_name as nsys gives it: the function's own name, without return type, namespaces, templates or arguments.
KERNELS = f"""INSERT INTO kernels
WITH names AS (
  SELECT value, {KERNEL_CATEGORY_SQL} AS category, {COLLECTIVE_SQL} AS nccl_collective, {FAMILY_SQL} AS comm_family,
         coalesce(nullif(regexp_extract(regexp_extract(replace(value, '(anonymous namespace)', ''), '^[^<(]*', 0),
                                       '([^ :]+)\\s*$', 1), ''), value) AS short
  FROM (SELECT DISTINCT name AS value FROM _k_gpu WHERE kind = 'kernel'))
SELECT g.device_id, g.context_id, g.stream_id, coalesce(a.pid, {HOST_PID}), a.tid, g.correlation_id,
       g.start_ns, g.end_ns, g.end_ns - g.start_ns, n.short, g.name, g.grid_x, g.grid_y, g.grid_z,
       g.block_x, g.block_y, g.block_z, g.registers, NULL, NULL, NULL, NULL, coalesce(n.category, 'other'),
       coalesce(n.nccl_collective, g.collective, c.collective), a.name, a.start_ns, a.end_ns,
       {kineto_nccl.KERNEL_SQL}, n.comm_family
FROM _k_gpu g LEFT JOIN names n ON n.value = g.name {_api('launch', 'graph')}
{kineto_nccl.COMMS_JOIN}
WHERE g.kind = 'kernel'"""

MEMCPY = f"""INSERT INTO memcpy SELECT g.device_id, g.stream_id, coalesce(a.pid, {HOST_PID}), a.tid, g.correlation_id,
    g.start_ns, g.end_ns, g.end_ns - g.start_ns, g.bytes,
    coalesce(nullif(regexp_replace(regexp_extract(g.name, '^Memcpy ([A-Z]to[A-Z])', 1), 'to', '2'), ''), 'unknown'),
    {MEMORY_KIND.format(pattern=COPY_KINDS, group=1)}, {MEMORY_KIND.format(pattern=COPY_KINDS, group=2)},
    NULL, NULL, a.name, a.start_ns, a.end_ns, NULL
FROM _k_gpu g {_api('memcpy')} WHERE g.kind = 'memcpy'"""

MEMSET = f"""INSERT INTO memset SELECT g.device_id, g.stream_id, coalesce(a.pid, {HOST_PID}), a.tid, g.correlation_id,
    g.start_ns, g.end_ns, g.end_ns - g.start_ns, g.bytes,
    {MEMORY_KIND.format(pattern=SET_KIND, group=1)}, a.start_ns, a.end_ns
FROM _k_gpu g {_api('memset')} WHERE g.kind = 'memset'"""

# Depth: the running count of opens minus closes on the thread before a range, in time order: closes first, then
# opens (outer, later-ending, first), each zero-length range closing right after its own open (it contains nothing).
NVTX = """INSERT INTO nvtx
WITH r AS (SELECT row_number() OVER () AS rid, * FROM _k_host WHERE kind IN ('cpu_op', 'user_annotation')),
events AS (SELECT rid, pid, tid, start_ns AS t, 1 AS step, 1 AS rank, end_ns AS tie, rid AS own, 0 AS sub FROM r
           UNION ALL SELECT NULL, pid, tid, end_ns, -1, CASE WHEN end_ns = start_ns THEN 1 ELSE 0 END, end_ns, rid, 1
           FROM r),
depth AS (SELECT rid, (sum(step) OVER (PARTITION BY pid, tid ORDER BY t, rank, tie DESC, own, sub
                                       ROWS UNBOUNDED PRECEDING) - 1)::INTEGER AS depth
          FROM events QUALIFY rid IS NOT NULL)
SELECT r.pid, r.tid, r.kind, r.name, r.start_ns, r.end_ns, r.end_ns - r.start_ns, 'push_pop', d.depth
FROM r JOIN depth d USING (rid)"""

# (model table, query filling it; None: Kineto does not record it, the table stays empty), in dependency order.
MAPPING: tuple[tuple[str, str | None], ...] = (
    ("cuda_api", CUDA_API), ("kernels", KERNELS), ("memcpy", MEMCPY), ("memset", MEMSET), ("nvtx", NVTX),
    ("sync", None), ("graph_exec", None), ("os_runtime", None), ("cpu_samples", None), ("sched", None),
    ("memory_usage", None), ("uvm_faults", None), ("host_modules", None), ("library_api", None),
    ("profiler_overhead", None),
)
