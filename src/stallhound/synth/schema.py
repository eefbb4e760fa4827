"""The nsys export this package imitates: versions, ids, enum codes (ENUM_* tables of 2025.1.1), every
table's columns as nsys 2025.1.1 writes them, the GPU described, and the row buffers (Trace) filled by the
simulation.
"""

from __future__ import annotations

from typing import Any

NSYS_VERSION = "2025.1.1.110"
SCHEMA_VERSION = "3.17.1"
SYNTH_HOST = "stallhound-synth"  # EXPORT_HOST of every file written here: marks it safe to overwrite
MIB_BYTES = 1 << 20
NS_PER_S = 1_000_000_000
# --- identifiers ----------------------------------------------------------------------------------
GLOBAL_ID_HIGH = 1 << 48  # constant high part nsys puts in every globalPid/globalTid (and vmId)
NO_ID = 0xFFFFFFFF  # streamId/eventId of a sync record without one
CONTEXT_ID = 1
COMPUTE_STREAM = 7
NCCL_STREAM = 21
EVENT_IDS = {COMPUTE_STREAM: 1762, NCCL_STREAM: 6813}  # cudaEvent recorded on each stream
NCCL_DOMAIN_ID = 1
SESSION_START_UTC_NS = 1_748_858_412_250_113_481  # 2025-06-02T10:00:12Z
SESSION_START_UTC = "2025-06-02T10:00:12"

# --- enum codes (ENUM_* tables of 2025.1.1) -------------------------------------------------------
COPY_H2D, COPY_D2H = 1, 2
MEM_PAGEABLE, MEM_PINNED, MEM_DEVICE = 0, 1, 2
SYNC_STREAM_WAIT_EVENT, SYNC_STREAM, SYNC_CONTEXT = 2, 3, 4
LAUNCH_REGULAR = 1
CACHE_CONFIG = 1
NVTX_MARK, NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE = 34, 59, 60, 75
EVENT_CLASS_RUNTIME, EVENT_CLASS_DRIVER = 0, 1
OSRT_EVENT_CLASS = 27

ENUMS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "ENUM_CUDA_MEMCPY_OPER": ("CUDA_MEMCPY_KIND_", (
        ("UNKNOWN", "Unknown"), ("HTOD", "Host-to-Device"), ("DTOH", "Device-to-Host"),
        ("HTOA", "Host-to-Array"), ("ATOH", "Array-to-Host"), ("ATOA", "Array-to-Array"),
        ("ATOD", "Array-to-Device"), ("DTOA", "Device-to-Array"), ("DTOD", "Device-to-Device"),
        ("HTOH", "Host-to-Host"), ("PTOP", "Peer-to-Peer"), ("UVM_HTOD", "Unified Host-to-Device"),
        ("UVM_DTOH", "Unified Device-to-Host"), ("UVM_DTOD", "Unified Device-to-Device"))),
    "ENUM_CUDA_MEM_KIND": ("CUDA_MEMOPR_MEMORY_KIND_", (
        ("PAGEABLE", "Pageable"), ("PINNED", "Pinned"), ("DEVICE", "Device"), ("ARRAY", "Array"),
        ("MANAGED", "Managed"), ("DEVICE_STATIC", "Device Static"), ("MANAGED_STATIC", "Managed Static"),
        ("UNKNOWN", "Unknown"))),
    "ENUM_CUPTI_SYNC_TYPE": ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_", (
        ("UNKNOWN", "Unknown"), ("EVENT_SYNCHRONIZE", "Event sync"),
        ("STREAM_WAIT_EVENT", "Stream wait sync"), ("STREAM_SYNCHRONIZE", "Stream sync"),
        ("CONTEXT_SYNCHRONIZE", "Context sync"))),
    "ENUM_CUDA_KERNEL_LAUNCH_TYPE": ("CUDA_KERNEL_LAUNCH_TYPE_", (
        ("UNKNOWN", "Unknown"), ("REGULAR", "Regular"), ("COOPERATIVE_SINGLE_DEVICE", "Coop Single Device"),
        ("COOPERATIVE_MULTI_DEVICE", "Coop Multi Device"))),
}
NSYS_EVENT_TYPES = (  # ENUM_NSYS_EVENT_TYPE: id is the position, label == name
    "Unknown", "CpuCycles", "Instructions", "CacheReferences", "L1CacheDataWriteMisses",
    "L1CacheDataReadMisses", "L1CacheInstructionMisses", "L2CacheDataWriteMisses",
    "L2CacheDataReadMisses", "L2CacheInstructionMisses", "BranchInstructions", "BranchMisses",
    "BusCycles", "CpuClock", "TaskClock", "PageFault", "ContextSwitches", "CpuMigrations",
    "PageFaultsMin", "PageFaultsMax", "AlignmentFaults", "EmulationFaults", "ThreadState", "Frames",
    "Annotations", "SchedSwitch", "SchedWakeup", "Command", "Mmap", "MemUsage", "Emc", "Composite",
    "NvtxEvents", "NvtxCategory", "NvtxMark", "NvtxPushRange", "NvtxPopRange", "NvtxStartRange",
    "NvtxEndRange", "NvtxThread", "PowerRate", "Sched", "CpuCyclesSelf", "CpuCyclesTotal",
    "CpuCyclesSelfPlus", "Cuda", "CudaDevice", "TraceProcess", "TraceFunctions", "Diagnostic",
    "GlWorkload", "BandwidthUsage", "KhrDebugMark", "KhrDebugPushRange", "KhrDebugPopRange",
    "KhrDebugGpuMark", "KhrDebugGpuPushRange", "KhrDebugGpuPopRange", "GpuCtxsw", "NvtxPushPopRange",
    "NvtxStartEndRange", "ProfTime", "KhrDebugPushPopRange", "KhrDebugGpuPushPopRange", "NvtxtCategory",
    "NvtxtMark", "NvtxtPushRange", "NvtxtPopRange", "NvtxtStartRange", "NvtxtEndRange",
    "NvtxtPushPopRange", "NvtxtStartEndRange", "NvtxtMetaThread", "NvtxtMetaProcess",
    "NvtxtMetaFileDisplay", "NvtxDomainCreate", "NvtxDomainDestroy", "NvnGpuCmdBuf", "TraceVSync",
    "CudaDeviceKernel", "CudaDeviceMemory", "Pmu", "NvnGpuDraw", "NvnGpuCompute", "NvnGpuDebug",
    "OS runtime libraries", "CuDNN", "CuBLAS", "NvMedia", "OpenACC", "Correlation", "DX12",
    "DX12Workload", "PmuRawEvent", "GraphicsFrame", "Vulkan", "VulkanWorkload", "NvtxNameCudaDevice",
    "NvtxNameCudaContext", "NvtxNameCudaStream", "SystemEvent", "GpuMemoryEvent", "DX12CreateObject",
    "VulkanCreateObject", "UnitTraceEvent", "CustomETWEvent", "CudaSyncEvent", "SLIEvent",
    "CudaBacktrace", "WddmEvent", "DX11", "DX11CreateObject", "DXGI", "CudaGraphNodeCreation", "OpenMP",
    "UncorePmuEvent", "UncorePmuCarmel", "CudaDeviceMemoryUsage", "ETWDxgKrnlEvent",
    "CudaUvmCpuPageFaultEvent", "CudaUvmGpuPageFaultEvent", "NICMetricsValuesEvent",
    "NICMetricsListEvent", "InterruptHandler", "NVENC", "NVDEC", "nvJPEG", "CudaEventRecord",
    "PerfEventCountEvent", "CudaDeviceMemoryPool", "CudaDeviceGraph", "CudaGraphExecCreation",
    "CudaGraphCreation", "CudaGraphClone", "GpuMemoryTransferEvent", "GlTrace",
    "GpuVideoEngineWorkload", "IBSwitchMetricsValuesEvent", "GenericEvent", "UncorePmuT23xScf",
    "UncorePmuT23xDsu", "IBSwitchCongestionEvent", "CudaDeviceMemcpy", "PerfMetricValueEvent",
    "OpenXREvent", "TegraInternalEvent", "OSRuntimeStartStop",
)

# --- schema: columns as nsys 2025.1.1 writes them (OSRT_API as in 2023.2+) ------------------------
_ENUM_COLUMNS = "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT"
_META_COLUMNS = "name TEXT NOT NULL, value TEXT"
_TIMED = "start INTEGER NOT NULL, end INTEGER NOT NULL"
_GPU_OP = (f"{_TIMED}, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
           "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER")
SCHEMA: dict[str, str] = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, "
        "l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, "
        "smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, "
        "ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, "
        "maxIPC INTEGER, maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, "
        "maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, "
        "threadsPerWarp INTEGER, asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, "
        "maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER, "
        "maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER, "
        "computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER"),
    "TARGET_INFO_CUDA_DEVICE": "gpuId INTEGER, cudaId INTEGER NOT NULL, pid INTEGER NOT NULL",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "META_DATA_EXPORT": _META_COLUMNS,
    "META_DATA_CAPTURE": _META_COLUMNS,
    **{name: _ENUM_COLUMNS for name in (*ENUMS, "ENUM_NSYS_EVENT_TYPE")},
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        f"{_GPU_OP}, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, "
        "launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, "
        "gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, "
        "blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, "
        "dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL, "
        "localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, "
        "graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        f"{_GPU_OP}, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, "
        "srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, "
        "dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        f"{_GPU_OP}, value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        f"{_TIMED}, eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, "
        "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER"),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
        f"{_GPU_OP}, deprecatedSyncType INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL, "
        "eventSyncId INTEGER"),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
        "textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, "
        "uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, "
        "binaryData TEXT"),
    "OSRT_API": (
        f"{_TIMED}, eventClass INTEGER NOT NULL, globalTid INTEGER, nameId INTEGER NOT NULL, "
        "returnValue INTEGER NOT NULL, nestingLevel INTEGER, callchainId INTEGER NOT NULL"),
}
COLUMN_NAMES = {table: tuple(c.split()[0] for c in cols.split(", ")) for table, cols in SCHEMA.items()}
COLUMN_INDEX = {table: {c: i for i, c in enumerate(names)} for table, names in COLUMN_NAMES.items()}  # row[i]
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                 "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS",
                 "OSRT_API")

# --- the GPU (H100 SXM5 80GB) ---------------------------------------------------------------------
GPU: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3", "isDiscrete": 1, "l2CacheSize": 52_428_800,
    "totalMemory": 85_029_158_912, "memoryBandwidth": 3_352_320_000_000, "clockRate": 1_980_000_000,
    "smCount": 132, "luid": 0, "chipName": "GH100", "ctxswDevPath": "", "ctrlDevPath": "", "revision": 161,
    "nodeMask": 0, "constantMemory": 65_536, "maxIPC": 0, "maxRegistersPerBlock": 65_536,
    "maxShmemPerBlock": 49_152, "maxShmemPerBlockOptin": 232_448, "maxShmemPerSm": 233_472,
    "maxRegistersPerSm": 65_536, "threadsPerWarp": 32, "asyncEngines": 3, "maxWarpsPerSm": 64,
    "maxBlocksPerSm": 32, "maxThreadsPerBlock": 1_024, "maxBlockDimX": 1_024, "maxBlockDimY": 1_024,
    "maxBlockDimZ": 64, "maxGridDimX": 2_147_483_647, "maxGridDimY": 65_535, "maxGridDimZ": 65_535,
    "computeMajor": 9, "computeMinor": 0, "smMajor": 9, "smMinor": 0,
}
BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")

def global_pid(pid: int) -> int:
    return GLOBAL_ID_HIGH | pid << 24


class Trace:
    """Row buffers of every table, shared by all ranks, and the string table."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {table: [] for table in SCHEMA}

    def sid(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings))

    def add(self, table: str, **values: Any) -> None:
        """A row given by column name (for the small tables); unnamed columns are NULL."""
        unknown = set(values) - set(COLUMN_NAMES[table])
        if unknown:
            raise KeyError(f"{table} has no column {sorted(unknown)}")
        self.rows[table].append(tuple(values.get(c) for c in COLUMN_NAMES[table]))


