"""The profile model: canonical DuckDB tables every tool queries.

Units are explicit: times are integer nanoseconds on the export's own clock
(`*_ns`), sizes integer bytes (`*_bytes`). Codes are decoded into lower-case
labels through the profile's own ENUM_* tables. `pid`/`tid` are the OS ids
decoded from nsys' globalPid/globalTid. A table exists even when the export
lacks its source (then it is empty and `capabilities` says how to capture it).
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_VERSION = 21  # bump when a table or column changes: cached models rebuild


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[tuple[str, str, str], ...]  # (name, duckdb type, description)


TABLES: tuple[Table, ...] = (
    Table("meta", "One row: where the profile came from and its capture window.", (
        ("source_path", "VARCHAR", "absolute path of the export that was loaded"),
        ("source_bytes", "BIGINT", "size of that file"),
        ("fingerprint", "VARCHAR", "content fingerprint the cache is keyed by"),
        ("model_version", "INTEGER", "version of this model's layout"),
        ("nsys_version", "VARCHAR", "Nsight Systems version that exported it, NULL if unknown"),
        ("schema_version", "VARCHAR", "export schema version, NULL if unknown"),
        ("metadata_table", "VARCHAR", "META_DATA_EXPORT, EXPORT_META_DATA or NULL (none)"),
        ("enum_source", "VARCHAR", "'profile' when every code was decoded by the export's ENUM tables, "
                                   "else 'profile+builtin' (a missing ENUM table fell back to nsys' values)"),
        ("platform", "VARCHAR", "export platform, e.g. linux-desktop, windows"),
        ("host", "VARCHAR", "host name recorded by the export"),
        ("command_line", "VARCHAR", "profiled command line, when recorded"),
        ("session_start_utc", "VARCHAR", "wall-clock start of the capture session"),
        ("capture_start_ns", "BIGINT", "earliest traced event (any table)"),
        ("capture_end_ns", "BIGINT", "latest traced event end (any table)"),
        ("duration_ns", "BIGINT", "capture_end_ns - capture_start_ns"),
        ("gpu_start_ns", "BIGINT", "first kernel/memcpy/memset/graph_exec start, NULL without GPU activity"),
        ("gpu_end_ns", "BIGINT", "last kernel/memcpy/memset/graph_exec end"),
        ("machine_gpus", "VARCHAR", "names of the CUDA GPUs the export lists for the machine (TARGET_INFO_GPU or "
                                    "TARGET_INFO_CUDA_GPU), comma-separated, whether or not they ran work; NULL "
                                    "when it lists none"),
        ("derived_from", "VARCHAR", "'<source> by <tool>, window <a>-<b> ns' when another tool cut or rewrote "
                                    "this export and recorded it (DERIVED_* metadata keys); NULL for an export as "
                                    "nsys wrote it"),
        ("rank", "INTEGER", "global rank of the process that wrote the profile in its distributed job; NULL when "
                            "not recorded"),
        ("world_size", "INTEGER", "ranks in that job; NULL when not recorded"),
        ("rank_source", "VARCHAR", "where rank and world_size come from: 'distributedInfo' (a torch.profiler "
                                   "trace's own block); NULL when unknown (nsys exports record no rank)"),
        ("comm_backend", "VARCHAR", "torch.distributed backend of the job (distributedInfo.backend: nccl, gloo, ...); "
                                    "NULL when not recorded"),
        ("process_group_sizes", "INTEGER[]", "ranks in each of the job's process groups (distributedInfo.pg_config, "
                                             "in its order); NULL when not recorded"),
        ("os_release", "VARCHAR", "kernel release of the profiled machine's OS as nsys recorded it "
                                  "(TARGET_INFO_SYSTEM_ENV SoftwareReleaseVersion), e.g. "
                                  "6.6.36.3-microsoft-standard-WSL2; NULL when not recorded (torch.profiler traces)"),
        ("profiler_ranges", "BIGINT", "torch.profiler traces: cuda_profiler_range events, kernels measured by CUPTI's "
                                      "range profiler (hardware counters in their args), which records them instead "
                                      "of kernel activity; NULL for nsys exports"),
    )),
    Table("capabilities", "Which data this profile has; for what it lacks, the capture option that records it.", (
        ("data", "VARCHAR", "kernels, memcpy, memset, cuda_api, sync, nvtx, os_runtime, cpu_samples, "
                            "sched, graph_exec, memory_usage, uvm_faults, stacks, gpu_info"),
        ("present", "BOOLEAN", "true when the export has rows for it (gpu_info: a hardware name for a device)"),
        ("rows", "BIGINT", "rows in the model table (gpu_info: devices with a hardware name)"),
        ("capture_flag", "VARCHAR", "the capture option that records it; for gpu_info what the profile lacks, with a "
                                    "remedy only where one is known"),
    )),
    Table("gpus", "Devices seen in GPU activity (kernels, memcpy, memset, graph_exec), with hardware details "
                  "from TARGET_INFO_GPU (or TARGET_INFO_CUDA_GPU in exports before mid-2021) where the export has "
                  "them.", (
        ("device_id", "INTEGER", "CUDA device id used by kernels/memcpy (deviceId)"),
        ("name", "VARCHAR", "marketing name, e.g. NVIDIA H100 80GB HBM3; NULL if not recorded"),
        ("chip", "VARCHAR", "chip name, e.g. GH100"),
        ("sm_count", "INTEGER", "streaming multiprocessors"),
        ("memory_bytes", "BIGINT", "device memory"),
        ("memory_bandwidth_bytes_per_s", "BIGINT", "peak memory bandwidth"),
        ("clock_rate_hz", "BIGINT", "SM clock"),
        ("compute_capability", "VARCHAR", "e.g. 9.0"),
        ("bus_location", "VARCHAR", "PCI bus id"),
        ("max_warps_per_sm", "INTEGER", "warps resident on one SM at most (occupancy's denominator)"),
        ("max_blocks_per_sm", "INTEGER", "thread blocks resident on one SM at most"),
        ("max_registers_per_sm", "INTEGER", "32-bit registers of one SM"),
        ("max_shared_per_sm_bytes", "BIGINT", "shared memory one SM holds for its resident blocks"),
        ("warp_size", "INTEGER", "threads per warp as the trace records it (Kineto's warpSize: 32 on NVIDIA, an AMD "
                                 "wavefront 64 on CDNA); NULL when not recorded (nsys)"),
    )),
    Table("processes", "Processes in the capture.", (
        ("pid", "BIGINT", "OS process id"),
        ("name", "VARCHAR", "process name"),
    )),
    Table("threads", "Named threads.", (
        ("pid", "BIGINT", "OS process id"),
        ("tid", "BIGINT", "OS thread id"),
        ("name", "VARCHAR", "thread name"),
    )),
    Table("kernels", "CUDA kernel executions (CUPTI_ACTIVITY_KIND_KERNEL), joined to their launch API call.", (
        ("device_id", "INTEGER", "CUDA device"),
        ("context_id", "INTEGER", "CUDA context"),
        ("stream_id", "INTEGER", "CUDA stream"),
        ("pid", "BIGINT", "process that launched it"),
        ("tid", "BIGINT", "launching thread (NULL when the launch API call was not traced)"),
        ("correlation_id", "BIGINT", "joins to cuda_api on (pid, correlation_id)"),
        ("start_ns", "BIGINT", "GPU start"),
        ("end_ns", "BIGINT", "GPU end"),
        ("duration_ns", "BIGINT", "end_ns - start_ns"),
        ("short_name", "VARCHAR", "short kernel name"),
        ("name", "VARCHAR", "demangled kernel name"),
        ("grid_x", "INTEGER", "grid dimensions"), ("grid_y", "INTEGER", ""), ("grid_z", "INTEGER", ""),
        ("block_x", "INTEGER", "block dimensions"), ("block_y", "INTEGER", ""), ("block_z", "INTEGER", ""),
        ("registers_per_thread", "INTEGER", "registers per thread"),
        ("static_shared_bytes", "BIGINT", "static shared memory per block"),
        ("dynamic_shared_bytes", "BIGINT", "dynamic shared memory per block"),
        ("graph_id", "BIGINT", "CUDA graph id when launched from a graph (NULL otherwise or if not recorded)"),
        ("graph_node_id", "BIGINT", "CUDA graph node id, NULL when not in a graph"),
        ("category", "VARCHAR", "compute | nccl | copy | other (see formats.derive.KERNEL_CATEGORY_SQL); 'nccl' is "
                                "every communication kernel, NCCL's and those of the libraries in comm_family"),
        ("nccl_collective", "VARCHAR", "AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, SendRecv, "
                                       "AllToAll, ... for communication kernels whose name or recorded metadata "
                                       "says it; Dispatch and Combine for expert-parallel kernels; NULL otherwise"),
        ("launch_api", "VARCHAR", "name of the CUDA API call that launched it, e.g. cudaLaunchKernel"),
        ("launch_start_ns", "BIGINT", "start of that API call"),
        ("launch_end_ns", "BIGINT", "end of that API call"),
        ("nccl_message_bytes", "BIGINT", "NCCL kernels: bytes of the collective's whole buffer, the larger of its "
                                         "input and output element counts x the element size (AllGather: the "
                                         "gathered output); NULL when not recorded (nsys exports, traces without "
                                         "the fields of nccl_size_field)"),
        ("nccl_size_field", "VARCHAR", "the trace field nccl_message_bytes came from: 'msg nelems' (In/Out msg "
                                       "nelems x dtype), 'Input Dims' (tensor shapes x Input type, on the ops "
                                       "around the launch) or 'split size' (all_to_all's per-peer element counts "
                                       "x dtype); see formats/kineto/nccl.py. NULL without a size"),
        ("nccl_group", "VARCHAR", "NCCL kernels: name of the process group (torch.distributed's, e.g. '0'); NULL "
                                  "when not recorded"),
        ("nccl_group_size", "INTEGER", "NCCL kernels: ranks in that process group; NULL when not recorded"),
        ("nccl_rank", "INTEGER", "NCCL kernels: rank of the launching process within that group; NULL when not "
                                 "recorded"),
        ("comm_family", "VARCHAR", "communication kernels: the library by name (formats.comm_kernels.FAMILIES): NCCL "
                                   "(with RCCL), MSCCL, expert-parallel (DeepEP), NVSHMEM, custom all-reduce; NULL "
                                   "for every other kernel"),
    )),
    Table("memcpy", "Memory copies (CUPTI_ACTIVITY_KIND_MEMCPY).", (
        ("device_id", "INTEGER", "device that executed the copy"),
        ("stream_id", "INTEGER", "CUDA stream"),
        ("pid", "BIGINT", "process"),
        ("tid", "BIGINT", "thread of the copy API call (NULL if not traced)"),
        ("correlation_id", "BIGINT", "joins to cuda_api on (pid, correlation_id)"),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""), ("duration_ns", "BIGINT", ""),
        ("bytes", "BIGINT", "bytes copied"),
        ("direction", "VARCHAR", "H2D, D2H, D2D, H2H, P2P, H2A, A2H, A2A, A2D, D2A, UVM_H2D, ... or unknown"),
        ("src_kind", "VARCHAR", "pageable, pinned, device, array, managed, device_static, managed_static, unknown"),
        ("dst_kind", "VARCHAR", "same labels as src_kind"),
        ("src_device_id", "INTEGER", "source device for D2D/P2P"),
        ("dst_device_id", "INTEGER", "destination device for D2D/P2P"),
        ("api_name", "VARCHAR", "CUDA API call that issued it, e.g. cudaMemcpyAsync"),
        ("launch_start_ns", "BIGINT", "start of that API call"),
        ("launch_end_ns", "BIGINT", "end of that API call"),
        ("migration_cause", "VARCHAR", "UVM_* rows: why the driver migrated the pages: user_prefetch "
                                       "(cudaMemPrefetchAsync), page_fault (a kernel or host thread touched a page "
                                       "not resident), speculative_prefetch (the driver's, around a fault), eviction, "
                                       "access_counters, unknown; NULL for other copies"),
    )),
    Table("memset", "Memory sets (CUPTI_ACTIVITY_KIND_MEMSET).", (
        ("device_id", "INTEGER", ""), ("stream_id", "INTEGER", ""), ("pid", "BIGINT", ""),
        ("tid", "BIGINT", "thread of the API call (NULL if not traced)"),
        ("correlation_id", "BIGINT", ""),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""), ("duration_ns", "BIGINT", ""),
        ("bytes", "BIGINT", "bytes set"),
        ("mem_kind", "VARCHAR", "memory kind label, as memcpy.src_kind"),
        ("launch_start_ns", "BIGINT", "start of the CUDA API call that issued it"),
        ("launch_end_ns", "BIGINT", "end of that API call"),
    )),
    Table("graph_exec", "Whole CUDA graph executions (CUPTI_ACTIVITY_KIND_GRAPH_TRACE): what nsys records for "
                        "each graph launch under --cuda-graph-trace=graph (its default); the kernels inside such a "
                        "graph have no rows in `kernels`.", (
        ("device_id", "INTEGER", "CUDA device"),
        ("context_id", "INTEGER", "CUDA context"),
        ("stream_id", "INTEGER", "stream the graph was launched into"),
        ("pid", "BIGINT", "process that launched it"),
        ("tid", "BIGINT", "launching thread (NULL when the launch API call was not traced)"),
        ("correlation_id", "BIGINT", "joins to cuda_api on (pid, correlation_id)"),
        ("start_ns", "BIGINT", "GPU start of the graph's first work"),
        ("end_ns", "BIGINT", "GPU end of its last work"),
        ("duration_ns", "BIGINT", "end_ns - start_ns"),
        ("graph_id", "BIGINT", "id of the CUDA graph"),
        ("graph_exec_id", "BIGINT", "id of the instantiated executable graph"),
        ("launch_api", "VARCHAR", "CUDA API call that launched it, e.g. cudaGraphLaunch"),
        ("launch_start_ns", "BIGINT", "start of that API call"),
        ("launch_end_ns", "BIGINT", "end of that API call"),
    )),
    Table("cuda_api", "CUDA runtime and driver API calls on CPU threads (CUPTI_ACTIVITY_KIND_RUNTIME).", (
        ("pid", "BIGINT", ""), ("tid", "BIGINT", ""),
        ("correlation_id", "BIGINT", "joins to kernels/memcpy/memset/sync on (pid, correlation_id)"),
        ("name", "VARCHAR", "API name with nsys' version suffix removed, e.g. cudaLaunchKernel"),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""), ("duration_ns", "BIGINT", ""),
        ("kind", "VARCHAR", "launch | graph | sync | memcpy (copies and unified-memory prefetches, whose "
                                 "migrations are memcpy rows) | memset | module | alloc | other"),
        ("return_value", "BIGINT", "CUDA error code returned (0 = success)"),
        ("stack_id", "BIGINT", "the call's stack in `stacks` (nsys CUDA_CALLCHAINS; Kineto: the innermost "
                               "python_function around the call); NULL when none was recorded"),
    )),
    Table("sync", "Synchronization records (CUPTI_ACTIVITY_KIND_SYNCHRONIZATION).", (
        ("device_id", "INTEGER", ""), ("stream_id", "INTEGER", "stream waited on (-1/NULL when none)"),
        ("pid", "BIGINT", ""), ("tid", "BIGINT", "thread of the sync API call (NULL if not traced)"),
        ("correlation_id", "BIGINT", ""),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""), ("duration_ns", "BIGINT", ""),
        ("sync_type", "VARCHAR", "event_synchronize | stream_wait_event | stream_synchronize | "
                                 "context_synchronize | unknown"),
        ("api_name", "VARCHAR", "API call behind it, e.g. cudaStreamSynchronize"),
    )),
    Table("nvtx", "NVTX ranges and marks (NVTX_EVENTS), on the thread that opened them.", (
        ("pid", "BIGINT", ""), ("tid", "BIGINT", ""),
        ("domain", "VARCHAR", "NVTX domain name; NULL for the default domain"),
        ("text", "VARCHAR", "range or mark text"),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", "NULL for marks and unclosed ranges"),
        ("duration_ns", "BIGINT", ""),
        ("kind", "VARCHAR", "push_pop | start_end | mark"),
        ("depth", "INTEGER", "push/pop nesting depth on its thread, 0 = outermost; NULL for start_end/mark"),
    )),
    Table("os_runtime", "OS runtime calls (OSRT_API): blocking libc/pthread calls on CPU threads.", (
        ("pid", "BIGINT", ""), ("tid", "BIGINT", ""), ("name", "VARCHAR", "function, e.g. pthread_cond_wait"),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""), ("duration_ns", "BIGINT", ""),
        ("stack_id", "BIGINT", "the call's stack in `stacks` (OSRT_CALLCHAINS: nsys records one for calls longer "
                               "than its backtrace threshold); NULL when none was recorded"),
    )),
    Table("cpu_samples", "CPU instruction-pointer samples (COMPOSITE_EVENTS).", (
        ("pid", "BIGINT", ""), ("tid", "BIGINT", ""), ("time_ns", "BIGINT", ""), ("cpu", "INTEGER", ""),
        ("stack_id", "BIGINT", "the sampled stack in `stacks` (SAMPLING_CALLCHAINS); NULL when none was recorded"),
    )),
    Table("stacks", "Call stacks, one row per frame, each distinct stack once (events with the same frames share "
                    "its stack_id): nsys' CUDA_CALLCHAINS, OSRT_CALLCHAINS and SAMPLING_CALLCHAINS, and a Kineto "
                    "trace's python_function events (with_stack=True). cuda_api, os_runtime and cpu_samples rows "
                    "point at theirs by stack_id. The first user frame of a stack is its lowest depth with a NULL "
                    "layer (analysis.stacks).", (
        ("stack_id", "BIGINT", "the stack"),
        ("depth", "INTEGER", "0 = the innermost frame (the one running when the stack was recorded), up to the "
                             "outermost"),
        ("function", "VARCHAR", "symbol or Python function; for a symbol nsys did not resolve, its address as nsys "
                                "wrote it (0x...)"),
        ("module", "VARCHAR", "native frames: the library or executable's path; Python frames: the file as "
                              "recorded (relative to its sys.path entry in Kineto traces); NULL for built-ins"),
        ("line", "INTEGER", "source line (Python frames); NULL when not recorded"),
        ("kind", "VARCHAR", "native | python"),
        ("resolved", "BOOLEAN", "false when nsys could not resolve the symbol (function is then an address)"),
        ("address", "BIGINT", "instruction address nsys recorded (originalIP); NULL for Python frames"),
        ("layer", "VARCHAR", "what the frame belongs to when it is not the user's code: profiler, cuda (driver, "
                             "runtime and CUDA libraries), system (C/C++ runtime, loader, MPI), interpreter (Python's "
                             "eval loop, built-ins, standard library), framework (PyTorch's dispatch, autograd and "
                             "modules); NULL for the user's own code (formats.frames)"),
    )),
    Table("python_frames", "Python frames as timed host work of their thread: a Kineto trace's python_function "
                           "events (with_stack=True) on threads that launch GPU work, that launched none themselves "
                           "(no launch, copy or memset call begins in them) and last long enough to explain host "
                           "idle (formats.kineto.stacks: the longest, up to a bound). Empty for nsys exports and for "
                           "traces without with_stack.", (
        ("pid", "BIGINT", ""), ("tid", "BIGINT", ""), ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""),
        ("depth", "INTEGER", "frames above it on its thread's stack (0: an outermost frame)"),
        ("function", "VARCHAR", "Python function, or a built-in's name"),
        ("file", "VARCHAR", "the file as recorded (relative to its sys.path entry); NULL for built-ins"),
        ("line", "INTEGER", "the function's first line; NULL for built-ins"),
    )),
    Table("sched", "Thread scheduling events (SCHED_EVENTS).", (
        ("pid", "BIGINT", ""), ("tid", "BIGINT", ""), ("time_ns", "BIGINT", ""), ("cpu", "INTEGER", ""),
        ("is_sched_in", "BOOLEAN", "true when the thread was switched onto a CPU"),
    )),
    Table("memory_usage", "Device memory allocations and frees (CUDA_GPU_MEMORY_USAGE_EVENTS, recorded with "
                          "--cuda-memory-usage=true). Memory in use on a device at time t = the running sum, in "
                          "time order, of +bytes per allocation and -bytes per deallocation of its device-resident "
                          "kinds (see DEVICE_MEMORY_KINDS, PEAK_MEMORY_SQL); it counts only what was allocated "
                          "inside the capture.", (
        ("device_id", "INTEGER", "CUDA device"),
        ("pid", "BIGINT", "process"),
        ("time_ns", "BIGINT", "when the allocation or free happened"),
        ("operation", "VARCHAR", "allocation | deallocation | unknown"),
        ("mem_kind", "VARCHAR", "device, device_static, array, managed, managed_static, pinned, pageable, unknown"),
        ("bytes", "BIGINT", "bytes allocated or freed"),
        ("address", "BIGINT", "virtual address of the allocation"),
        ("correlation_id", "BIGINT", "joins to cuda_api on (pid, correlation_id); 0 when no API call made it"),
    )),
    Table("uvm_faults", "Unified Memory page faults (CUDA_UM_CPU_PAGE_FAULT_EVENTS, CUDA_UM_GPU_PAGE_FAULT_EVENTS; "
                        "recorded with --cuda-um-cpu-page-faults/--cuda-um-gpu-page-faults). The bytes that "
                        "migrated are the memcpy rows with a UVM_* direction.", (
        ("side", "VARCHAR", "cpu (a host thread touched a page resident on a GPU) | gpu (a kernel touched a page "
                            "not resident on its GPU)"),
        ("device_id", "INTEGER", "GPU that faulted; NULL for cpu faults"),
        ("pid", "BIGINT", "process"),
        ("start_ns", "BIGINT", "fault time (gpu: start of the fault group)"),
        ("end_ns", "BIGINT", "gpu: end of the fault group; NULL for cpu faults"),
        ("address", "BIGINT", "virtual address of the faulting page"),
        ("faults", "BIGINT", "page faults in this row (gpu rows group faults on one page; cpu rows are one)"),
    )),
    Table("host_modules", "Host libraries and executables the processes ran, from the call stacks nsys recorded: "
                          "CPU samples (SAMPLING_CALLCHAINS, captured with -s cpu) and OS runtime and CUDA API calls "
                          "traced with backtraces (OSRT_CALLCHAINS, CUDA_CALLCHAINS). A module shows what code a "
                          "process loaded and used, e.g. libpython3.12.so, libjulia.so, libcudf.so.", (
        ("pid", "BIGINT", "process whose call stacks pass through it"),
        ("module", "VARCHAR", "module path as nsys recorded it (or its marks such as [Unknown])"),
        ("stacks", "BIGINT", "call stacks of that process (samples and traced calls) with a frame in it"),
    )),
    Table("library_api", "Calls into GPU libraries and directive runtimes that nsys traces apart from the CUDA API: "
                         "openacc (CUPTI_ACTIVITY_KIND_OPENACC_DATA/LAUNCH/OTHER, --trace=openacc), cublas "
                         "(CUBLAS_EVENTS, --trace=cublas), cudnn (CUDNN_EVENTS, --trace=cudnn).", (
        ("pid", "BIGINT", ""), ("tid", "BIGINT", ""),
        ("library", "VARCHAR", "openacc | cublas | cudnn"),
        ("name", "VARCHAR", "the call or event, e.g. cublasSgemm_v2, acc_enqueue_launch"),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""), ("duration_ns", "BIGINT", ""),
    )),
    Table("profiler_overhead", "The profiler's own work inside the profiled process (PROFILER_OVERHEAD): CUPTI "
                               "buffer flushes and the like, during which the process's CUDA calls can stall; time "
                               "the program does not spend without the profiler.", (
        ("pid", "BIGINT", "process whose profiling it was"),
        ("tid", "BIGINT", "thread that did it (the profiler's own thread, not the program's)"),
        ("name", "VARCHAR", "what it was, e.g. CUPTI Buffer flush"),
        ("start_ns", "BIGINT", ""), ("end_ns", "BIGINT", ""), ("duration_ns", "BIGINT", ""),
    )),
    Table("diagnostics", "Messages nsys recorded about the capture itself (DIAGNOSTIC_EVENT), e.g. 'CUDA profiling "
                         "might have not been started correctly'; severity and source decoded by the export's "
                         "ENUM_DIAGNOSTIC_* tables.", (
        ("time_ns", "BIGINT", "when it was recorded, on the export's clock; NULL for stallhound's notes"),
        ("severity", "VARCHAR", "error | warning | info | verbose | unknown"),
        ("source", "VARCHAR", "injection (inside the profiled process), daemon, analysis, unknown; stallhound for "
                              "what loading left out of this model (damaged rows, unreadable tables)"),
        ("pid", "BIGINT", "process it is about; NULL for session-wide messages"),
        ("text", "VARCHAR", "the message"),
    )),
)

# Kinds of memory_usage rows that live in device memory: pinned and pageable memory are host memory,
# managed memory migrates between host and device, so neither counts toward device memory in use.
DEVICE_MEMORY_KINDS = ("device", "device_static", "array")
# Peak device memory in use per device: the running sum described at memory_usage, bound $kinds to
# list(DEVICE_MEMORY_KINDS). The sum starts at 0 when the capture starts, so the peak (at least 0) is the
# most memory in use beyond what was already allocated then, and peak_time_ns is NULL when nothing was added;
# frees of memory allocated before the capture make the sum negative. On equal times frees count first:
# the lower of the two possible peaks.
PEAK_MEMORY_SQL = """
SELECT device_id, greatest(max(in_use), 0) AS peak_bytes,
       CASE WHEN max(in_use) > 0 THEN arg_max(time_ns, in_use) END AS peak_time_ns FROM (
  SELECT device_id, time_ns, sum(CASE operation WHEN 'allocation' THEN bytes WHEN 'deallocation' THEN -bytes
                                   ELSE 0 END)
           OVER (PARTITION BY device_id ORDER BY time_ns, operation DESC ROWS UNBOUNDED PRECEDING) AS in_use
  FROM memory_usage WHERE mem_kind IN (SELECT unnest($kinds)))
GROUP BY device_id ORDER BY device_id"""

TABLE_NAMES = tuple(t.name for t in TABLES)


def ddl(name: str) -> str:
    """CREATE TABLE statement for a model table, from the columns listed above."""
    table = next(t for t in TABLES if t.name == name)
    return f"CREATE TABLE {name} ({', '.join(f'{c} {typ}' for c, typ, _ in table.columns)})"


def describe_schema() -> str:
    """The model as text: one block per table, a line per column."""
    out = [__doc__.strip(), ""]
    for table in TABLES:
        out.append(f"{table.name}: {table.doc}")
        out.extend(f"  {name} {typ}" + (f"  -- {desc}" if desc else "") for name, typ, desc in table.columns)
        out.append("")
    return "\n".join(out)
