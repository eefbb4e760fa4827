"""Synthetic Nsight Systems exports with planted performance problems of known size.

`write_sample(path, config)` writes a SQLite file laid out like `nsys export --type sqlite` of Nsight
Systems 2025.1.1 (export schema 3.17.1): the table and column names, types, enum codes and id encodings
of a real export, exported lazily (tables without rows are left out). The workload is a data-parallel,
PyTorch-like training loop: one rank process per GPU with one main thread, `iterations` steps wrapped in
NVTX push/pop ranges (`iteration <k>` holding `dataloader`, `forward`, `backward`, `optimizer`),
cuBLAS/FlashAttention/Triton/ATen kernels on stream 7 and NCCL all-reduce kernels on a stream of their
own, two gradient buckets per step. Problems are planted at exactly known places and sizes, and the
ground truth goes beside the export as `<path>.truth.json`, so tests can check that a detector finds
what was planted. `SynthConfig.demo()` plants everything; `SynthConfig.clean()` plants nothing and
keeps every GPU busy (no idle gap of 1 ms or more between a device's first and last kernel).

What every file guarantees:
- each kernel/memcpy/memset/synchronization row joins exactly one CUPTI_ACTIVITY_KIND_RUNTIME row on
  (process, correlationId); a launch call ends before its kernel starts;
- operations of one stream never overlap; unplanted kernels last >= 12 us, planted tiny kernels < 10 us;
- times are integer ns on the export's clock; globalPid = 2**48 + (pid << 24), globalTid = globalPid + tid,
  and a rank's main thread has tid == pid.

Truth JSON (times in ns on the export's clock, sizes in bytes):
  generator, truth_version  "nsightful.profiles.synth", 1
  preset, seed, config      "demo" | "clean" | "custom", the seed, the SynthConfig as a dict
  nsys_version, schema_version
  devices, pids             [CUDA device id, ...], [pid of the rank process driving devices[i], ...]
  launcher_pid              the torchrun process (no events)
  ranks                     [{device, pid, tid, global_pid, global_tid}]
  capture_start_ns, capture_end_ns   earliest start / latest end over every traced event
  iterations   [{index, start_ns, end_ns, per_device: [{device, start_ns, end_ns, duration_ns,
               gpu_start_ns, gpu_end_ns}]}]: the host `iteration <k>` NVTX ranges (start/end: min/max over
               ranks) and the span of the GPU work launched inside each
  planted      [{kind, device, start_ns, end_ns, duration_ns, count, bytes, ...}]; every key always present,
               null where meaningless; duration_ns == end_ns - start_ns. Kinds and their extra keys:
    idle_gap              one per gap: no kernel/memcpy/memset of the device overlaps [start, end), one
                          ends at start and one begins at end; iteration, phase, host_activity ("nothing
                          traced" or "os_runtime:poll"), host_start_ns, host_end_ns
    slow_first_iteration  one per device: iteration 0's NVTX range; count = cuModuleLoadData calls in it;
                          module_load_ns, median_other_iteration_ns, ratio
    tiny_kernels          one per device: first start to last end; count; kernel_time_ns, max_kernel_ns, phase
    pageable_h2d          one per device: H2D copies with srcKind pageable; copy_time_ns, pinned_count,
                          pinned_bytes (the other H2D copies, all pinned)
    device_sync           one per device: cudaDeviceSynchronize calls, each with a context-sync row;
                          blocked_ns
    small_d2h             one per device: D2H copies of bytes_each bytes (the .item() pattern), each followed
                          by cudaStreamSynchronize; bytes_each, blocked_ns (time in those syncs)
    nccl_straggler        one: device = the late rank; count = collectives it delayed (its NCCL kernel began
                          >= delay_ns/2 after every peer's), start/end = first to last of those; delay_ns,
                          peer_devices, delayed (the (iteration, bucket) pairs), peer_extra_ns and lateness_ns
                          (medians over them of the peers' mean NCCL kernel duration minus the straggler's,
                          and of its kernel start minus the latest peer start), host_windows [[start, end]]
    gc_pause              one per (device, iteration): host window without any CUDA/OS-runtime call or NVTX
                          event; iteration, period, gpu_idle_start_ns/gpu_idle_end_ns (the GPU gap it caused,
                          null when queued work covered it)
  gpu_gaps     every idle window >= 1 ms between a device's first and last GPU operation:
               [{device, start_ns, end_ns, duration_ns, causes: [planted kind, ...]}]
  collectives  [{iteration, bucket, name, per_device: [{device, start_ns, end_ns}]}]
  totals       {per_device: [{device, kernels, kernel_time_ns, nccl_kernels, nccl_kernel_time_ns,
               tiny_kernels, memcpy: {H2D: {count, bytes}, D2H: {count, bytes}}, memset: {count, bytes},
               sync: {stream_wait_event, stream_synchronize, context_synchronize}, cuda_api_calls,
               nvtx_events, os_runtime_calls}], kernels, memcpy_bytes_by_direction: {H2D, D2H}}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

GENERATOR = "nsightful.profiles.synth"
TRUTH_VERSION = 1
NSYS_VERSION = "2025.1.1.110"
SCHEMA_VERSION = "3.17.1"
SYNTH_HOST = "nsightful-synth"  # EXPORT_HOST of every file written here: marks it safe to overwrite

_MIB_BYTES = 1 << 20
_NS_PER_S = 1_000_000_000

# --- identifiers ----------------------------------------------------------------------------------
_GLOBAL_ID_HIGH = 1 << 48  # constant high part nsys puts in every globalPid/globalTid (and vmId)
_NO_ID = 0xFFFFFFFF  # streamId/eventId of a sync record without one
_CONTEXT_ID = 1
_COMPUTE_STREAM = 7
_NCCL_STREAM = 21
_EVENT_IDS = {_COMPUTE_STREAM: 1762, _NCCL_STREAM: 6813}  # cudaEvent recorded on each stream
_NCCL_DOMAIN_ID = 1
_LAUNCHER_PID_RANGE = (20_000, 90_000)
_RANK_PID_STRIDE = 17
_SESSION_START_UTC_NS = 1_748_858_412_250_113_481  # 2025-06-02T10:00:12Z
_SESSION_START_UTC = "2025-06-02T10:00:12"

# --- host timing ----------------------------------------------------------------------------------
_RANKS_START_NS = 1_350_000_000  # first traced call of a rank, on the capture clock
_RANK_START_SPREAD_NS = 400_000
_PYTHON_GAP_NS = (3_000, 14_000)  # host time between two traced calls
_NVTX_CALL_NS = (800, 2_000)
_LAUNCH_API_NS = (4_000, 9_000)
_MEMCPY_API_NS = (5_000, 10_000)
_EVENT_API_NS = (1_500, 4_000)
_QUEUE_DELAY_NS = (2_000, 6_000)  # launch call end -> GPU start when the stream is free
_SYNC_RETURN_NS = (300, 900)  # GPU done -> blocking call returns
_AFTER_WAIT_NS = (400_000, 800_000)  # the host uses what it waited for (logging, a branch) before launching more
_HOST_LEAD_MAX_NS = 2_000_000  # launch calls block while a stream has more queued work than this
_GAP_RESUME_SLACK_NS = 40_000  # host resumes this long before a planted GPU gap ends
_STRAGGLER_RESUME_SLACK_NS = 150_000  # ... and before a straggler's late NCCL kernel starts
_DATALOADER_POLL_NS = (80_000, 180_000)
_SETUP_CALLS = (
    ("cudaGetDeviceProperties_v12000", (8_000, 15_000)),
    ("cudaStreamCreateWithFlags_v5000", (15_000, 30_000)),
    ("cudaMalloc_v3020", (200_000, 600_000)),
    ("cudaMalloc_v3020", (200_000, 600_000)),
    ("cudaStreamIsCapturing_v10000", (2_000, 4_000)),
)

# --- GPU timing and sizes -------------------------------------------------------------------------
_KERNEL_JITTER = 0.04  # +-4 % around a kernel's mean duration
_MIN_REGULAR_KERNEL_NS = 12_000
_TINY_KERNEL_MAX_NS = 10_000  # planted tiny kernels are shorter than this
_BATCH_H2D_BYTES = 2 * _MIB_BYTES
_PINNED_H2D_PER_ITERATION = 2
_PINNED_H2D_BYTES_PER_S = 24_000_000_000
_PAGEABLE_H2D_BYTES_PER_S = 9_000_000_000
_SMALL_D2H_NS = (1_400, 2_000)
_ZERO_GRAD_MEMSETS = 2
_ZERO_GRAD_BYTES = 32 * _MIB_BYTES
_MEMSET_BYTES_PER_S = 1_500_000_000_000
_NCCL_BUCKET_NS = (1_400_000, 1_100_000)  # transfer time of each gradient bucket's all-reduce
_NCCL_BUCKET_BYTES = (96 * _MIB_BYTES, 72 * _MIB_BYTES)
_NCCL_END_JITTER_NS = 3_000
_LOCAL_MEMORY_TOTAL_BYTES = 155_713_536
_SHARED_MEMORY_CARVEOUTS_BYTES = (32_768, 65_536, 102_400, 135_168, 167_936, 200_704, 233_472)

_GAP_REPORT_MIN_NS = 1_000_000  # gpu_gaps lists idle windows at least this long
_MIN_IDLE_GAP_NS = 5_000_000  # a planted gap must outlast the host lead to be exact
_MAX_MODULE_LOADS = 16  # distinct kernels launched in a forward+backward pass

# --- enum codes (ENUM_* tables of 2025.1.1) -------------------------------------------------------
_COPY_H2D, _COPY_D2H = 1, 2
_MEM_PAGEABLE, _MEM_PINNED, _MEM_DEVICE = 0, 1, 2
_SYNC_STREAM_WAIT_EVENT, _SYNC_STREAM, _SYNC_CONTEXT = 2, 3, 4
_LAUNCH_REGULAR = 1
_CACHE_CONFIG = 1
_NVTX_MARK, _NVTX_PUSH_POP, _NVTX_START_END, _NVTX_DOMAIN_CREATE = 34, 59, 60, 75
_EVENT_CLASS_RUNTIME, _EVENT_CLASS_DRIVER = 0, 1
_OSRT_EVENT_CLASS = 27

_ENUMS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
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
_NSYS_EVENT_TYPES = (  # ENUM_NSYS_EVENT_TYPE: id is the position, label == name
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
_SCHEMA: dict[str, str] = {
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
    **{name: _ENUM_COLUMNS for name in (*_ENUMS, "ENUM_NSYS_EVENT_TYPE")},
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
_COLUMN_NAMES = {table: tuple(c.split()[0] for c in cols.split(", ")) for table, cols in _SCHEMA.items()}
_EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                 "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS",
                 "OSRT_API")


# --- kernels --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Kernel:
    short: str
    demangled: str
    mangled: str
    api: str  # CUDA call that launches it, as nsys names it
    mean_ns: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int = 32
    static_shared_bytes: int = 0
    dynamic_shared_bytes: int = 0


def _plain(name: str, api: str, mean_ns: int, grid: tuple[int, int, int], block: tuple[int, int, int],
           registers: int, dynamic_shared_bytes: int = 0) -> _Kernel:
    """A kernel whose three names are the same string (cuBLAS, nvjet, Triton)."""
    return _Kernel(name, name, name, api, mean_ns, grid, block, registers, 0, dynamic_shared_bytes)


_LAUNCH = "cudaLaunchKernel_v7000"
_LAUNCH_EX = "cuLaunchKernelEx"
_LAUNCH_DRIVER = "cuLaunchKernel"
_VEC = "void at::native::vectorized_elementwise_kernel"
_KERNELS: dict[str, _Kernel] = {
    "layer_norm": _Kernel(
        "vectorized_layer_norm_kernel",
        "void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, "
        "const T1 *, const T1 *, const T1 *, T2 *, T2 *, T1 *)",
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a28vectorized_layer_norm_kernel"
        "IffLb0EEEviT0_PKT_S6_S6_PS3_S7_PS4_",
        _LAUNCH, 45_000, (16_384, 1, 1), (32, 4, 1), 39),
    "gemm_qkv": _plain(
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"
        "_kernel__5x_cublas", _LAUNCH_EX, 260_000, (132, 1, 1), (384, 1, 1), 168, 213_248),
    "flash_fwd": _Kernel(
        "flash_fwd_kernel",
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, "
        "(bool)0, cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, "
        "cutlass::bfloat16_t>>, (bool)0, (bool)0, (bool)0, (bool)0, (bool)0, (bool)1, (bool)0, (bool)0>"
        "(flash::Flash_fwd_params)",
        "_ZN5flash16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi64ELi4ELb0ELb0EN7cutlass10bfloat"
        "16_tE19Flash_kernel_traitsILi128ELi128ELi64ELi4ES3_EELb0ELb0ELb0ELb0ELb0ELb1ELb0ELb0EEEvNS_16Flash_fwd"
        "_paramsE",
        _LAUNCH, 420_000, (16, 32, 4), (128, 1, 1), 255, 0, 49_152),
    "gemm_out": _plain("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", _LAUNCH_EX, 130_000,
                       (2, 66, 1), (384, 1, 1), 168, 200_704),
    "residual_add_triton": _plain("triton_poi_fused_add_0", _LAUNCH_DRIVER, 26_000,
                                  (4_096, 1, 1), (128, 1, 1), 24),
    "gemm_mlp_up": _plain("nvjet_tst_192x208_64x4_1x1_h_bz_coopB_bias_TNT", _LAUNCH_EX, 340_000,
                          (1, 132, 1), (384, 1, 1), 168, 213_248),
    "gelu": _Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase &, at::native::GeluType)::"
        "[lambda() (instance 1)]::operator ()() const::[lambda() (instance 4)]::operator ()() const::"
        "[lambda(c10::BFloat16) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi8EZZZNS0_18GeluCUDAKernelImplERNS_18TensorIteratorBase"
        "ENS0_8GeluTypeEENKUlvE_clEvENKUlvE2_clEvEUlN3c108BFloat16EE_St5arrayIPcLm2EEEEviT0_T1_",
        _LAUNCH, 62_000, (8_192, 1, 1), (128, 1, 1), 22),
    "gemm_mlp_down": _plain(
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
        "_kernel__5x_cublas", _LAUNCH_EX, 330_000, (132, 1, 1), (256, 1, 1), 168, 164_864),
    "residual_add": _Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char *, (unsigned long)3>>"
        "(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi8ENS0_15CUDAFunctor_addIN3c108BFloat16EEESt5arrayIPcLm"
        "3EEEEviT0_T1_",
        _LAUNCH, 31_000, (8_192, 1, 1), (128, 1, 1), 24),
    "log_softmax_triton": _plain("triton_red_fused__log_softmax_1", _LAUNCH_DRIVER, 110_000,
                                 (8_192, 1, 1), (256, 1, 1), 40),
    "mean_reduce": _Kernel(
        "reduce_kernel",
        "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<"
        "float, float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)",
        "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_7MeanOpsIffffEEjfLi4ELi4EEEEEvT1_",
        _LAUNCH, 18_000, (32, 1, 1), (32, 16, 1), 32, 16),
    "gemm_dgrad": _plain(
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"
        "_kernel__5x_cublas", _LAUNCH_EX, 300_000, (132, 1, 1), (384, 1, 1), 168, 213_248),
    "gemm_wgrad": _plain("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NTN", _LAUNCH_EX, 310_000,
                         (2, 66, 1), (384, 1, 1), 168, 213_248),
    "gelu_backward": _plain("triton_poi_fused_gelu_gelu_backward_2", _LAUNCH_DRIVER, 70_000,
                            (8_192, 1, 1), (128, 1, 1), 28),
    "layer_norm_backward": _Kernel(
        "layer_norm_grad_input_kernel_vectorized",
        "void at::native::<unnamed>::layer_norm_grad_input_kernel_vectorized<float, float>(const T1 *, "
        "const T1 *, const T2 *, const T2 *, const T1 *, T1 *, int)",
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a39layer_norm_grad_input_kernel"
        "_vectorizedIffEEvPKT_S5_PKT0_S8_S5_PS3_i",
        _LAUNCH, 72_000, (16_384, 1, 1), (128, 1, 1), 40),
    "gamma_beta_backward": _Kernel(
        "GammaBetaBackwardCUDAKernelTemplate",
        "void at::native::<unnamed>::GammaBetaBackwardCUDAKernelTemplate<float, float, (unsigned int)32, "
        "(unsigned int)32, (unsigned int)256, (bool)0, (bool)1>(long, long, const T1 *, const T1 *, "
        "const T2 *, const T2 *, T1 *, T1 *)",
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a35GammaBetaBackwardCUDAKernel"
        "TemplateIffLj32ELj32ELj256ELb0ELb1EEEvllPKT_S5_PKT0_S8_PS3_S9_",
        _LAUNCH, 41_000, (128, 1, 1), (32, 32, 1), 64, 8_448),
    "flash_bwd": _Kernel(
        "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
        "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<(int)128, "
        "(int)64, (int)128, (int)8, (int)2, (int)4, (int)2, (bool)0, (bool)0, cutlass::bfloat16_t, "
        "Flash_kernel_traits<(int)128, (int)64, (int)128, (int)8, cutlass::bfloat16_t>>, (bool)1, (bool)0, "
        "(bool)0, (bool)0, (bool)0, (bool)0>(flash::Flash_bwd_params)",
        "_ZN5flash44flash_bwd_dq_dk_dv_loop_seqk_parallel_kernelI23Flash_bwd_kernel_traitsILi128ELi64ELi128ELi"
        "8ELi2ELi4ELi2ELb0ELb0EN7cutlass10bfloat16_tE19Flash_kernel_traitsILi128ELi64ELi128ELi8ES3_EELb1ELb0E"
        "Lb0ELb0ELb0ELb0EEEvNS_16Flash_bwd_paramsE",
        _LAUNCH, 950_000, (32, 32, 4), (256, 1, 1), 255, 0, 147_456),
    "fused_adam": _Kernel(
        "multi_tensor_apply_kernel",
        "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::FusedOptimizer"
        "TensorListMetadata<(int)4>, at::native::<unnamed>::FusedAdamMathFunctor<float, (int)4, "
        "(at::native::ADAM_MODE)1, (bool)0>, double *, double, double, double, double, double, bool, "
        "const float *, const float *>(T1, T2, T3...)",
        "_ZN2at6native12_GLOBAL__N_125multi_tensor_apply_kernelINS1_33FusedOptimizerTensorListMetadataILi4EEE"
        "NS1_20FusedAdamMathFunctorIfLi4ELNS0_9ADAM_MODEE1ELb0EEEJPddddddbPKfSA_EEEvT_T0_DpT1_",
        _LAUNCH, 360_000, (1_480, 1, 1), (512, 1, 1), 72, 0),
    "tiny_add": _Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *, (unsigned long)3>>"
        "(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
        _LAUNCH, 3_000, (1, 1, 1), (128, 1, 1), 32),
    "tiny_mul": _Kernel(
        "elementwise_kernel",
        "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<"
        "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>("
        "at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
        "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastINS0_13BinaryFunctorIfffNS0_"
        "15binary_internal10MulFunctorIfEEEEEEvRNS_18TensorIteratorBaseERKT_EUliE_EEviT1_",
        _LAUNCH, 3_000, (1, 1, 1), (128, 1, 1), 18),
    "tiny_rsqrt": _Kernel(
        "vectorized_elementwise_kernel",
        f"{_VEC}<(int)4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 2)]::"
        "operator ()() const::[lambda() (instance 2)]::operator ()() const::[lambda(float) (instance 1)], "
        "std::array<char *, (unsigned long)2>>(int, T2, T3)",
        "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_17rsqrt_kernel_cudaERNS_18TensorIteratorBaseE"
        "ENKUlvE0_clEvENKUlvE0_clEvEUlfE_St5arrayIPcLm2EEEEviT0_T1_",
        _LAUNCH, 3_000, (1, 1, 1), (128, 1, 1), 16),
    "nccl_allreduce": _Kernel(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
        "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE",
        _LAUNCH_EX, 0, (32, 1, 1), (640, 1, 1), 96, 0, 0),
}
_FORWARD_LAYER = ("layer_norm", "gemm_qkv", "flash_fwd", "gemm_out", "residual_add_triton", "layer_norm",
                  "gemm_mlp_up", "gelu", "gemm_mlp_down", "residual_add")
_LOSS = ("log_softmax_triton", "mean_reduce")
_BACKWARD_LAYER = ("residual_add_triton", "gemm_dgrad", "gemm_wgrad", "gelu_backward", "gemm_dgrad",
                   "gemm_wgrad", "layer_norm_backward", "gamma_beta_backward", "gemm_dgrad", "gemm_wgrad",
                   "flash_bwd", "gemm_dgrad", "gemm_wgrad", "layer_norm_backward")
_FUSED_OPTIMIZER = ("fused_adam", "fused_adam")
_TINY = ("tiny_mul", "tiny_add", "tiny_rsqrt")
_NCCL_KERNEL = "nccl_allreduce"

# --- the GPU (H100 SXM5 80GB) ---------------------------------------------------------------------
_GPU: dict[str, Any] = {
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
_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


# --- configuration --------------------------------------------------------------------------------
HostActivity = Literal["untraced", "poll"]


@dataclass(frozen=True)
class IdleGap:
    """A GPU idle window of exactly `duration_ns` on `device` in `iteration` (>= 1).

    host "untraced": the rank's thread runs untraced code after the forward pass's first layer;
    "poll": it waits for the data loader in an OS-runtime poll() call inside the `dataloader` range.
    """
    device: int
    iteration: int
    duration_ns: int
    host: HostActivity = "untraced"


@dataclass(frozen=True)
class SynthConfig:
    """Workload and planted problems; a zero count (or None) switches a problem off."""
    seed: int = 0
    devices: int = 4
    iterations: int = 12
    layers: int = 4
    preset: str = "custom"
    idle_gaps: tuple[IdleGap, ...] = ()
    first_iteration_extra_ns: int = 0  # iteration 0 spends this long in cuModuleLoadData calls
    module_loads: int = 16  # ... split over this many calls, before first launches
    tiny_kernels_per_iteration: int = 0  # optimizer phase: unfused per-tensor ops instead of fused Adam
    tiny_kernel_ns: int = 3_000
    pageable_h2d_per_iteration: int = 0
    pageable_h2d_bytes: int = 8 * _MIB_BYTES
    pin_pageable_h2d: bool = False  # the fix of pageable_h2d: the same copies, from pinned memory (nothing planted)
    device_syncs_per_iteration: int = 0
    small_d2h_per_iteration: int = 0  # .item(): first after the loss, the rest at the end of the step
    small_d2h_bytes: int = 4
    straggler_device: int | None = None
    straggler_delay_ns: int = 4_000_000
    gc_pause_period: int = 0  # every k-th iteration (k, 2k, ...) the host pauses at the forward's start
    gc_pause_ns: int = 15_000_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "idle_gaps", tuple(
            g if isinstance(g, IdleGap) else IdleGap(**g) for g in self.idle_gaps))
        problems = _config_problems(self)
        if problems:
            raise ValueError("invalid synth config: " + "; ".join(problems))

    @classmethod
    def clean(cls, **overrides: Any) -> SynthConfig:
        """No planted problem: every GPU stays busy from its first to its last kernel."""
        return cls(**{"preset": "clean", **overrides})

    @classmethod
    def demo(cls, **overrides: Any) -> SynthConfig:
        """Every problem planted once or more, sized to stand out (fits any devices/iterations)."""
        devices = overrides.get("devices", 4)
        iterations = overrides.get("iterations", 12)
        last = iterations - 1
        gaps = () if iterations < 2 else (
            IdleGap(0, min(5, last), 20_000_000, "untraced"),
            IdleGap(min(1, devices - 1), min(8, last), 12_000_000, "poll"))
        planted = dict(
            preset="demo", idle_gaps=gaps, first_iteration_extra_ns=64_000_000,
            tiny_kernels_per_iteration=300, pageable_h2d_per_iteration=1, device_syncs_per_iteration=1,
            small_d2h_per_iteration=2, gc_pause_period=3,
            straggler_device=min(2, devices - 1) if devices > 1 else None)
        return cls(**{**planted, **overrides})


def _config_problems(cfg: SynthConfig) -> list[str]:
    problems = []
    if not 1 <= cfg.devices <= 64:
        problems.append(f"devices must be 1..64, got {cfg.devices}")
    if not 1 <= cfg.iterations <= 10_000:
        problems.append(f"iterations must be 1..10000, got {cfg.iterations}")
    if cfg.layers < 1:
        problems.append("layers must be at least 1")
    problems += [p for g in cfg.idle_gaps for p in _gap_problems(cfg, g)]
    if len({(g.device, g.iteration, g.host) for g in cfg.idle_gaps}) < len(cfg.idle_gaps):
        problems.append("two idle gaps share device, iteration and host activity")
    if cfg.first_iteration_extra_ns < 0 or not 1 <= cfg.module_loads <= _MAX_MODULE_LOADS:
        problems.append(f"first_iteration_extra_ns must be >= 0 and module_loads 1..{_MAX_MODULE_LOADS}")
    if not 1_000 <= cfg.tiny_kernel_ns < _TINY_KERNEL_MAX_NS * 10 // 13:
        problems.append(f"tiny_kernel_ns must be 1000..{_TINY_KERNEL_MAX_NS * 10 // 13 - 1}")
    if not 1 <= cfg.small_d2h_bytes <= 64 or cfg.pageable_h2d_bytes < 1:
        problems.append("small_d2h_bytes must be 1..64 and pageable_h2d_bytes positive")
    if cfg.straggler_device is not None and not (cfg.devices > 1 and 0 <= cfg.straggler_device < cfg.devices):
        problems.append("straggler_device must be one of at least two devices")
    counts = (cfg.tiny_kernels_per_iteration, cfg.pageable_h2d_per_iteration, cfg.device_syncs_per_iteration,
              cfg.small_d2h_per_iteration, cfg.gc_pause_period, cfg.gc_pause_ns, cfg.straggler_delay_ns)
    if min(counts) < 0:
        problems.append("counts, periods and durations must not be negative")
    return problems


def _gap_problems(cfg: SynthConfig, gap: IdleGap) -> list[str]:
    problems = []
    if not 0 <= gap.device < cfg.devices:
        problems.append(f"idle gap device {gap.device} is not one of the {cfg.devices} devices")
    if not 1 <= gap.iteration < cfg.iterations:
        problems.append(f"idle gap iteration {gap.iteration} must be 1..{cfg.iterations - 1}")
    if gap.duration_ns < _MIN_IDLE_GAP_NS:
        problems.append(f"idle gap duration_ns must be at least {_MIN_IDLE_GAP_NS}")
    if gap.host not in ("untraced", "poll"):
        problems.append(f"idle gap host must be 'untraced' or 'poll', got {gap.host!r}")
    return problems


def demo(**overrides: Any) -> SynthConfig:
    """The preset that plants every problem (SynthConfig.demo)."""
    return SynthConfig.demo(**overrides)


def clean(**overrides: Any) -> SynthConfig:
    """The preset that plants nothing (SynthConfig.clean)."""
    return SynthConfig.clean(**overrides)


PRESETS: dict[str, Callable[..., SynthConfig]] = {"demo": demo, "clean": clean}


# --- simulation -----------------------------------------------------------------------------------
def _global_pid(pid: int) -> int:
    return _GLOBAL_ID_HIGH | pid << 24


def _transfer_ns(nbytes: int, bytes_per_s: int) -> int:
    return max(1, nbytes * _NS_PER_S // bytes_per_s)


def _event_class(api: str) -> int:
    return _EVENT_CLASS_RUNTIME if api.startswith("cuda") else _EVENT_CLASS_DRIVER


def _shared_memory_executed(kernel: _Kernel) -> int:
    needed = kernel.static_shared_bytes + kernel.dynamic_shared_bytes
    carveouts = _SHARED_MEMORY_CARVEOUTS_BYTES
    return next((c for c in carveouts if c >= needed), carveouts[-1])


class _Trace:
    """Row buffers of every table, shared by all ranks, and the string table."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {table: [] for table in _SCHEMA}

    def sid(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings))

    def add(self, table: str, **values: Any) -> None:
        """A row given by column name (for the small tables); unnamed columns are NULL."""
        unknown = set(values) - set(_COLUMN_NAMES[table])
        if unknown:
            raise KeyError(f"{table} has no column {sorted(unknown)}")
        self.rows[table].append(tuple(values.get(c) for c in _COLUMN_NAMES[table]))


@dataclass
class _Arrival:
    """A rank's NCCL kernel of one collective is ready to start at start_ns."""
    iteration: int
    bucket: int
    start_ns: int


class _Rank:
    """One rank process: its main thread's host timeline and its device's streams."""

    def __init__(self, cfg: SynthConfig, trace: _Trace, device: int, pid: int, start_ns: int) -> None:
        self.cfg, self.trace, self.device, self.pid = cfg, trace, device, pid
        self.gpid = _global_pid(pid)
        self.gtid = self.gpid | pid
        self.rng = random.Random(f"{cfg.seed}:rank:{device}")
        self.host_ns = start_ns
        self.cursor = {_COMPUTE_STREAM: 0, _NCCL_STREAM: 0}  # end of the last op queued on each stream
        self.forced_start_ns = 0  # the next GPU op starts no earlier than this
        self.counters: dict[str, int] = defaultdict(int)
        self.nvtx_stack: list[tuple[int, str, int | None, int | None]] = []  # start, text, domain, payload
        self.loads_left = cfg.module_loads if cfg.first_iteration_extra_ns else 0
        self.loaded: set[str] = set()
        self.iteration = -1
        self.gpu_ops: list[tuple[int, int]] = []
        self.log: dict[str, list] = defaultdict(list)
        self.iterations: list[dict[str, int]] = []
        self.epoch_start_ns = 0

    # -- program -----------------------------------------------------------------------------------
    def program(self) -> Generator[_Arrival, int, None]:
        self._setup()
        for it in range(self.cfg.iterations):
            yield from self._iteration(it)
        self._teardown()

    def _setup(self) -> None:
        if self.cfg.devices > 1:
            self._nvtx_row(self.host_ns, None, _NVTX_DOMAIN_CREATE, text="NCCL", domain=_NCCL_DOMAIN_ID)
        for name, duration in _SETUP_CALLS:
            self._python_gap()
            self._api(name, self.rng.randint(*duration))
        self._python_gap()
        self.epoch_start_ns = self.host_ns

    def _teardown(self) -> None:
        self._python_gap()
        self.counters["range"] += 1
        self._nvtx_row(self.epoch_start_ns, self.host_ns, _NVTX_START_END, text="epoch 0",
                       range_id=self.counters["range"], end_gtid=self.gtid)

    def _iteration(self, it: int) -> Generator[_Arrival, int, None]:
        self.iteration = it
        first_op = len(self.gpu_ops)
        start = self._push(f"iteration {it}")
        self._dataloader(it)
        self._push("forward")
        self._forward(it)
        self._pop()
        self._push("backward")
        half = self.cfg.layers // 2
        self._backward(range(self.cfg.layers - 1, half - 1, -1))
        yield from self._allreduce(it, 0)
        self._backward(range(half - 1, -1, -1))
        yield from self._allreduce(it, 1)
        self._pop()
        self._push("optimizer")
        self._optimizer()
        self._pop()
        for _ in range(self.cfg.small_d2h_per_iteration - 1):
            self._small_d2h()
        self._mark(f"step {it}")
        end = self._pop()
        ops = self.gpu_ops[first_op:]
        self.iterations.append({"start_ns": start, "end_ns": end, "gpu_start_ns": min(s for s, _ in ops),
                                "gpu_end_ns": max(e for _, e in ops)})

    def _dataloader(self, it: int) -> None:
        self._push("dataloader")
        gap = self._planned_gap(it, "poll")
        if gap:
            self._plant_gap(gap, "dataloader", lambda until: self._osrt("poll", until - self.host_ns))
        else:
            self._python_gap()
            self._osrt("poll", self.rng.randint(*_DATALOADER_POLL_NS))
        for _ in range(_PINNED_H2D_PER_ITERATION):
            self._h2d(_BATCH_H2D_BYTES, pageable=False)
        for _ in range(self.cfg.pageable_h2d_per_iteration):
            self._h2d(self.cfg.pageable_h2d_bytes, pageable=not self.cfg.pin_pageable_h2d)
        self._pop()

    def _forward(self, it: int) -> None:
        period = self.cfg.gc_pause_period
        if period and self.cfg.gc_pause_ns and it > 0 and it % period == 0:
            self._python_gap()
            start = self.host_ns
            self.host_ns += self.cfg.gc_pause_ns
            self.log["gc_pause"].append({"iteration": it, "start_ns": start, "end_ns": self.host_ns})
        for layer in range(self.cfg.layers):
            for key in _FORWARD_LAYER:
                self._launch(key)
            gap = self._planned_gap(it, "untraced") if layer == 0 else None
            if gap:
                self._plant_gap(gap, "forward", self._idle_until)
        for key in _LOSS:
            self._launch(key)
        if self.cfg.small_d2h_per_iteration:
            self._small_d2h()

    def _backward(self, layers: Iterable[int]) -> None:
        for _ in layers:
            for key in _BACKWARD_LAYER:
                self._launch(key)

    def _allreduce(self, it: int, bucket: int) -> Generator[_Arrival, int, None]:
        if self.cfg.devices < 2:
            return
        if bucket == 0 and self.device == self.cfg.straggler_device and self.cfg.straggler_delay_ns:
            self._straggle()
        self._wait_event(_COMPUTE_STREAM, _NCCL_STREAM)
        self._push("ncclAllReduce", domain=_NCCL_DOMAIN_ID, payload=_NCCL_BUCKET_BYTES[bucket])
        self._python_gap()
        api_end, start = self._enqueue(_NCCL_STREAM, self.rng.randint(*_LAUNCH_API_NS))
        correlation = self._api(_KERNELS[_NCCL_KERNEL].api, api_end - self.host_ns)
        end = yield _Arrival(it, bucket, start)
        self._kernel_row(_KERNELS[_NCCL_KERNEL], _NCCL_STREAM, correlation, start, end)
        self._pop()

    def _optimizer(self) -> None:
        if self.cfg.devices > 1:
            self._wait_event(_NCCL_STREAM, _COMPUTE_STREAM)
        for i in range(self.cfg.tiny_kernels_per_iteration):
            nominal = self.cfg.tiny_kernel_ns
            duration = self.rng.randint(nominal * 7 // 10, nominal * 13 // 10)
            self.log["tiny_kernels"].append(self._launch(_TINY[i % len(_TINY)], duration))
        if not self.cfg.tiny_kernels_per_iteration:
            for key in _FUSED_OPTIMIZER:
                self._launch(key)
        for _ in range(_ZERO_GRAD_MEMSETS):
            self._memset(_ZERO_GRAD_BYTES)
        for _ in range(self.cfg.device_syncs_per_iteration):
            self._device_sync()

    # -- planted host stalls -----------------------------------------------------------------------
    def _planned_gap(self, it: int, host: str) -> IdleGap | None:
        return next((g for g in self.cfg.idle_gaps
                     if (g.device, g.iteration, g.host) == (self.device, it, host)), None)

    def _plant_gap(self, gap: IdleGap, phase: str, wait_until: Callable[[int], None]) -> None:
        """Hold the host so that the device runs nothing for exactly gap.duration_ns from now on."""
        drained = max(self.cursor.values())
        resume = drained + gap.duration_ns - _GAP_RESUME_SLACK_NS
        self._python_gap()
        if resume <= self.host_ns:
            raise RuntimeError(f"host is {self.host_ns - drained} ns past the GPU, cannot plant a gap")
        host_start = self.host_ns
        wait_until(resume)
        self.forced_start_ns = drained + gap.duration_ns
        activity = "nothing traced" if gap.host == "untraced" else "os_runtime:poll"
        self.log["idle_gap"].append({
            "iteration": gap.iteration, "phase": phase, "start_ns": drained, "end_ns": self.forced_start_ns,
            "host_activity": activity, "host_start_ns": host_start, "host_end_ns": resume})

    def _idle_until(self, until_ns: int) -> None:
        self.host_ns = until_ns

    def _straggle(self) -> None:
        """Arrive late: the NCCL kernel starts straggler_delay_ns after the GPU could have run it."""
        target = max(self.cursor.values()) + self.cfg.straggler_delay_ns
        resume = max(self.host_ns, target - _STRAGGLER_RESUME_SLACK_NS)
        self.log["straggler"].append((self.host_ns, resume))
        self.host_ns = resume
        self.forced_start_ns = target

    # -- CUDA calls --------------------------------------------------------------------------------
    def _python_gap(self) -> None:
        self.host_ns += self.rng.randint(*_PYTHON_GAP_NS)

    def _api(self, name: str, duration_ns: int) -> int:
        """A CUDA API call from now on; returns its correlationId."""
        self.counters["correlation"] += 1
        correlation = self.counters["correlation"]
        end = self.host_ns + duration_ns
        self.trace.rows["CUPTI_ACTIVITY_KIND_RUNTIME"].append(
            (self.host_ns, end, _event_class(name), self.gtid, correlation, self.trace.sid(name), 0, None))
        self.host_ns = end
        return correlation

    def _enqueue(self, stream: int, api_cost_ns: int) -> tuple[int, int]:
        """Host end of an asynchronous call and the earliest GPU start of its work."""
        api_end = max(self.host_ns + api_cost_ns, self.cursor[stream] - _HOST_LEAD_MAX_NS)
        start = max(self.cursor[stream], api_end + self.rng.randint(*_QUEUE_DELAY_NS), self.forced_start_ns)
        self.forced_start_ns = 0
        return api_end, start

    def _launch(self, key: str, duration_ns: int | None = None) -> tuple[int, int]:
        kernel = _KERNELS[key]
        self._maybe_load_module(key)
        self._python_gap()
        api_end, start = self._enqueue(_COMPUTE_STREAM, self.rng.randint(*_LAUNCH_API_NS))
        correlation = self._api(kernel.api, api_end - self.host_ns)
        if duration_ns is None:
            duration_ns = round(kernel.mean_ns * self.rng.uniform(1 - _KERNEL_JITTER, 1 + _KERNEL_JITTER))
        self._kernel_row(kernel, _COMPUTE_STREAM, correlation, start, start + duration_ns)
        return start, start + duration_ns

    def _maybe_load_module(self, key: str) -> None:
        if self.loads_left == 0 or self.iteration != 0 or key in self.loaded:
            return
        self.loaded.add(key)
        index = self.cfg.module_loads - self.loads_left
        extra, loads = self.cfg.first_iteration_extra_ns, self.cfg.module_loads
        duration = extra // loads + (1 if index < extra % loads else 0)
        self._python_gap()
        start = self.host_ns
        self._api("cuModuleLoadData", duration)
        self.loads_left -= 1
        self.log["module_load"].append((start, self.host_ns))

    def _kernel_row(self, kernel: _Kernel, stream: int, correlation: int, start: int, end: int) -> None:
        sid = self.trace.sid
        self.counters["grid"] += 1
        self.trace.rows["CUPTI_ACTIVITY_KIND_KERNEL"].append((
            start, end, self.device, _CONTEXT_ID, 0, stream, correlation, self.gpid, sid(kernel.demangled),
            sid(kernel.short), sid(kernel.mangled), _LAUNCH_REGULAR, _CACHE_CONFIG, kernel.registers,
            *kernel.grid, *kernel.block, kernel.static_shared_bytes, kernel.dynamic_shared_bytes, 0,
            _LOCAL_MEMORY_TOTAL_BYTES, self.counters["grid"], _shared_memory_executed(kernel), None, 0))
        self._gpu_op(stream, start, end)

    def _gpu_op(self, stream: int, start: int, end: int) -> None:
        self.cursor[stream] = end
        self.gpu_ops.append((start, end))

    def _memcpy_row(self, correlation: int, start: int, end: int, nbytes: int, copy_kind: int,
                    src_kind: int, dst_kind: int) -> None:
        self.trace.rows["CUPTI_ACTIVITY_KIND_MEMCPY"].append((
            start, end, self.device, _CONTEXT_ID, 0, _COMPUTE_STREAM, correlation, self.gpid, nbytes,
            copy_kind, None, src_kind, dst_kind, None, None, None, None, None, None, None))
        self._gpu_op(_COMPUTE_STREAM, start, end)

    def _h2d(self, nbytes: int, pageable: bool) -> None:
        """A batch copy; from pageable memory the call returns only when the copy is done."""
        self._python_gap()
        cost = self.rng.randint(*_MEMCPY_API_NS)
        if pageable:
            start = max(self.cursor[_COMPUTE_STREAM], self.host_ns + cost, self.forced_start_ns)
            self.forced_start_ns = 0
            end = start + _transfer_ns(nbytes, _PAGEABLE_H2D_BYTES_PER_S)
            correlation = self._api("cudaMemcpyAsync_v3020", end + self.rng.randint(*_SYNC_RETURN_NS)
                                    - self.host_ns)
        else:
            api_end, start = self._enqueue(_COMPUTE_STREAM, cost)
            correlation = self._api("cudaMemcpyAsync_v3020", api_end - self.host_ns)
            end = start + _transfer_ns(nbytes, _PINNED_H2D_BYTES_PER_S)
        src_kind = _MEM_PAGEABLE if pageable else _MEM_PINNED
        self._memcpy_row(correlation, start, end, nbytes, _COPY_H2D, src_kind, _MEM_DEVICE)
        self.log["pageable_h2d" if pageable else "pinned_h2d"].append((start, end, nbytes))

    def _small_d2h(self) -> None:
        """`.item()`: a few bytes copied to pinned memory, then the stream is synchronized."""
        self._python_gap()
        api_end, start = self._enqueue(_COMPUTE_STREAM, self.rng.randint(*_MEMCPY_API_NS))
        correlation = self._api("cudaMemcpyAsync_v3020", api_end - self.host_ns)
        end = start + self.rng.randint(*_SMALL_D2H_NS)
        self._memcpy_row(correlation, start, end, self.cfg.small_d2h_bytes, _COPY_D2H, _MEM_DEVICE,
                         _MEM_PINNED)
        sync_start, sync_end = self._blocking_sync("cudaStreamSynchronize_v3020", _COMPUTE_STREAM,
                                                   _SYNC_STREAM, self.cursor[_COMPUTE_STREAM])
        self.log["small_d2h"].append((start, end, sync_end - sync_start))

    def _device_sync(self) -> None:
        drained = max(self.cursor.values())
        call = self._blocking_sync("cudaDeviceSynchronize_v3020", _NO_ID, _SYNC_CONTEXT, drained)
        self.log["device_sync"].append(call)

    def _blocking_sync(self, api: str, stream: int, sync_type: int, done_ns: int) -> tuple[int, int]:
        """A call that returns when the GPU reaches done_ns, with its SYNCHRONIZATION row; its span."""
        self._python_gap()
        api_start = self.host_ns
        sync_start = api_start + self.rng.randint(600, 1_500)
        sync_end = max(done_ns, sync_start + 500) + self.rng.randint(*_SYNC_RETURN_NS)
        api_end = sync_end + self.rng.randint(200, 500)
        correlation = self._api(api, api_end - api_start)
        self._sync_row(sync_start, sync_end, stream, correlation, sync_type, _NO_ID, _NO_ID)
        self.host_ns += self.rng.randint(*_AFTER_WAIT_NS)  # the drained GPU idles meanwhile
        return api_start, api_end

    def _sync_row(self, start: int, end: int, stream: int, correlation: int, sync_type: int, event_id: int,
                  event_sync_id: int) -> None:
        self.trace.rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"].append((
            start, end, self.device, _CONTEXT_ID, None, stream, correlation, self.gpid, None, sync_type,
            event_id, event_sync_id))

    def _wait_event(self, src: int, dst: int) -> None:
        """cudaEventRecord on src, cudaStreamWaitEvent on dst: dst's later work waits for src's."""
        self._python_gap()
        self._api("cudaEventRecord_v3020", self.rng.randint(*_EVENT_API_NS))
        self._python_gap()
        api_start = self.host_ns
        correlation = self._api("cudaStreamWaitEvent_v3020", self.rng.randint(*_EVENT_API_NS))
        self.counters["event_sync"] += 1
        self._sync_row(api_start + 200, self.host_ns - 200, dst, correlation, _SYNC_STREAM_WAIT_EVENT,
                       _EVENT_IDS[src], self.counters["event_sync"])
        self.cursor[dst] = max(self.cursor[dst], self.cursor[src])

    def _memset(self, nbytes: int) -> None:
        self._python_gap()
        api_end, start = self._enqueue(_COMPUTE_STREAM, self.rng.randint(*_MEMCPY_API_NS))
        correlation = self._api("cudaMemsetAsync_v3020", api_end - self.host_ns)
        end = start + _transfer_ns(nbytes, _MEMSET_BYTES_PER_S)
        self.trace.rows["CUPTI_ACTIVITY_KIND_MEMSET"].append((
            start, end, self.device, _CONTEXT_ID, 0, _COMPUTE_STREAM, correlation, self.gpid, 0, nbytes, None,
            _MEM_DEVICE))
        self._gpu_op(_COMPUTE_STREAM, start, end)

    # -- NVTX and OS runtime -----------------------------------------------------------------------
    def _push(self, text: str, domain: int | None = None, payload: int | None = None) -> int:
        self.host_ns += self.rng.randint(*_NVTX_CALL_NS)
        self.nvtx_stack.append((self.host_ns, text, domain, payload))
        return self.host_ns

    def _pop(self) -> int:
        self.host_ns += self.rng.randint(*_NVTX_CALL_NS)
        start, text, domain, payload = self.nvtx_stack.pop()
        if domain is None:
            self._nvtx_row(start, self.host_ns, _NVTX_PUSH_POP, text=text)
        else:  # NCCL registers its strings: the text is in StringIds, the payload is the message size
            self._nvtx_row(start, self.host_ns, _NVTX_PUSH_POP, text_id=self.trace.sid(text), domain=domain,
                           payload=payload)
        return self.host_ns

    def _mark(self, text: str) -> None:
        self.host_ns += self.rng.randint(*_NVTX_CALL_NS)
        self._nvtx_row(self.host_ns, None, _NVTX_MARK, text=text)

    def _nvtx_row(self, start: int, end: int | None, event_type: int, text: str | None = None,
                  text_id: int | None = None, domain: int | None = None, range_id: int | None = None,
                  end_gtid: int | None = None, payload: int | None = None) -> None:
        self.trace.rows["NVTX_EVENTS"].append((
            start, end, event_type, range_id, None, None, text, self.gtid, end_gtid, text_id, domain or 0,
            payload, None, None, None, None, None, None, None, None))

    def _osrt(self, name: str, duration_ns: int) -> None:
        end = self.host_ns + duration_ns
        self.trace.rows["OSRT_API"].append(
            (self.host_ns, end, _OSRT_EVENT_CLASS, self.gtid, self.trace.sid(name), 0, 0, 0))
        self.host_ns = end


def _advance(program: Generator[_Arrival, int, None], value: int | None) -> _Arrival | None:
    try:
        return program.send(value)  # type: ignore[arg-type]  # send(None) starts the generator
    except StopIteration:
        return None


def _simulate(cfg: SynthConfig) -> tuple[_Trace, list[_Rank], list[dict], int]:
    """Run every rank's program in lockstep: each collective ends when its last rank has arrived."""
    trace = _Trace()
    rng = random.Random(f"{cfg.seed}:world")
    launcher_pid = rng.randint(*_LAUNCHER_PID_RANGE)
    ranks = [_Rank(cfg, trace, d, launcher_pid + _RANK_PID_STRIDE * (d + 1),
                   _RANKS_START_NS + rng.randint(0, _RANK_START_SPREAD_NS)) for d in range(cfg.devices)]
    programs = [rank.program() for rank in ranks]
    collectives: list[dict] = []
    arrivals = [_advance(p, None) for p in programs]
    while any(a is not None for a in arrivals):
        if not all(a is not None and (a.iteration, a.bucket) == (arrivals[0].iteration, arrivals[0].bucket)
                   for a in arrivals):
            raise RuntimeError("ranks left lockstep at a collective")
        first = arrivals[0]
        finish = max(a.start_ns for a in arrivals) + _NCCL_BUCKET_NS[first.bucket]
        ends = [finish + rng.randint(0, _NCCL_END_JITTER_NS) for _ in ranks]
        collectives.append({
            "iteration": first.iteration, "bucket": first.bucket, "name": _KERNELS[_NCCL_KERNEL].short,
            "per_device": [{"device": r.device, "start_ns": a.start_ns, "end_ns": e}
                           for r, a, e in zip(ranks, arrivals, ends, strict=True)]})
        arrivals = [_advance(p, e) for p, e in zip(programs, ends, strict=True)]
    return trace, ranks, collectives, launcher_pid


# --- static tables --------------------------------------------------------------------------------
def _add_static_tables(trace: _Trace, cfg: SynthConfig, ranks: list[_Rank], launcher_pid: int) -> None:
    rng = random.Random(f"{cfg.seed}:static")
    trace.add("PROCESSES", globalPid=_global_pid(launcher_pid), pid=launcher_pid, name="torchrun")
    trace.add("ThreadNames", nameId=trace.sid("torchrun"), priority=20,
              globalTid=_global_pid(launcher_pid) | launcher_pid)
    for rank in ranks:
        uuid = f"{rng.getrandbits(128):032x}"
        bus = _BUS_IDS[rank.device] if rank.device < len(_BUS_IDS) else f"{0xe0 + rank.device:02x}"
        trace.add("PROCESSES", globalPid=rank.gpid, pid=rank.pid, name="python3")
        trace.add("ThreadNames", nameId=trace.sid("pt_main_thread"), priority=20, globalTid=rank.gtid)
        trace.add("TARGET_INFO_GPU", vmId=_GLOBAL_ID_HIGH, id=rank.device, busLocation=f"0000:{bus}:00.0",
                  pwGpuId=rank.device, cuDevice=rank.device,
                  uuid=f"{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}", **_GPU)
        trace.add("TARGET_INFO_CUDA_DEVICE", gpuId=rank.device, cudaId=rank.device, pid=rank.pid)
    for table, (prefix, values) in _ENUMS.items():
        for code, (name, label) in enumerate(values):
            trace.add(table, id=code, name=prefix + name, label=label)
    for code, name in enumerate(_NSYS_EVENT_TYPES):
        trace.add("ENUM_NSYS_EVENT_TYPE", id=code, name=name, label=name)
    trace.add("TARGET_INFO_SESSION_START_TIME", utcEpochNs=_SESSION_START_UTC_NS, utcTime=_SESSION_START_UTC,
              localTime=_SESSION_START_UTC)
    for name, value in _export_metadata():
        trace.add("META_DATA_EXPORT", name=name, value=value)
    for name, value in _capture_metadata(cfg):
        trace.add("META_DATA_CAPTURE", name=name, value=value)


def _export_metadata() -> list[tuple[str, str]]:
    major, minor, micro = SCHEMA_VERSION.split(".")
    return [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_PRODUCT_VERSION", NSYS_VERSION),
        ("EXPORT_PRODUCT_DATE", "2025.1"), ("EXPORT_SCHEMA_VERSION", SCHEMA_VERSION),
        ("EXPORT_SCHEMA_VERSION_MAJOR", major), ("EXPORT_SCHEMA_VERSION_MINOR", minor),
        ("EXPORT_SCHEMA_VERSION_MICRO", micro), ("EXPORT_PLATFORM", "linux-desktop"), ("EXPORT_ARCH", "x64"),
        ("EXPORT_TIME_UTC", "2025-06-02T10:01:40"), ("EXPORT_HOST", SYNTH_HOST), ("EXPORT_USER", ""),
        ("EXPORT_PARAM_INPUT_FILE", "synth.nsys-rep"), ("EXPORT_PARAM_OUTPUT_FILE", "synth.sqlite"),
        ("EXPORT_PARAM_LAZY", "true"), ("EXPORT_PARAM_TIME_NORMALIZE", "false"),
        ("EXPORT_PARAM_TIME_SHIFT", "0"), ("EXPORT_CONFIG_TIME_SHIFT", "0"), ("EXPORT_TIME", "0.05 sec"),
    ]


def _capture_metadata(cfg: SynthConfig) -> list[tuple[str, str]]:
    arguments = [f"--nproc_per_node={cfg.devices}", "train.py", f"--steps={cfg.iterations}"]
    return [
        ("DEVICE_ID", "Local (CLI)"), ("CAPTURE_EVENT_TYPE", "NvtxEvents"), ("CAPTURE_EVENT_TYPE", "Cuda"),
        ("CAPTURE_EVENT_TYPE", "OSRuntime"), ("START_TRIGGER", "Immediate"), ("DEVICE_TYPE", "Unix"),
        ("DEVICE_DISPLAY_NAME", SYNTH_HOST), ("PROCESS_0:HOW_TO_ATTACH", "LaunchAnother"),
        ("PROCESS_0:COMMAND", "torchrun"),
        *((f"PROCESS_0:ARGUMENT_{i}", a) for i, a in enumerate(arguments)),
        ("PROCESS_0:WORKING_DIR", "/workspace"), ("PROCESS_0:COLLECT_NVTX_TRACE", "true"),
        ("PROCESS_0:COLLECT_CUDA_TRACE", "true"), ("INCLUDE_CHILDREN", "true"),
    ]


# --- ground truth ---------------------------------------------------------------------------------
def _entry(kind: str, device: int | None, start: int, end: int, count: int, nbytes: int | None = None,
           **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "device": device, "start_ns": start, "end_ns": end, "duration_ns": end - start,
            "count": count, "bytes": nbytes, **extra}


def _idle_windows(ops: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Windows between a device's first and last op in which none of its ops runs."""
    windows, busy_until = [], None
    for start, end in sorted(ops):
        if busy_until is not None and start > busy_until:
            windows.append((busy_until, start))
        busy_until = end if busy_until is None else max(busy_until, end)
    return windows


def _overlaps(window: tuple[int, int], other: tuple[int, int]) -> bool:
    return window[0] < other[1] and other[0] < window[1]


def _planted(cfg: SynthConfig, ranks: list[_Rank], collectives: list[dict],
             idle: dict[int, list[tuple[int, int]]]) -> list[dict]:
    planted = [_entry("idle_gap", r.device, g["start_ns"], g["end_ns"], 1,
                      **{k: v for k, v in g.items() if k not in ("start_ns", "end_ns")})
               for r in ranks for g in r.log["idle_gap"]]
    planted += [e for r in ranks for e in _per_device_entries(cfg, r)]
    if cfg.straggler_device is not None and cfg.straggler_delay_ns and collectives:
        planted.append(_straggler_entry(cfg, ranks[cfg.straggler_device], collectives))
    for rank in ranks:
        for pause in rank.log["gc_pause"]:
            window = (pause["start_ns"], pause["end_ns"])
            gpu = max((w for w in idle[rank.device] if _overlaps(w, window)), default=None,
                      key=lambda w: min(w[1], window[1]) - max(w[0], window[0]))
            planted.append(_entry("gc_pause", rank.device, *window, 1, iteration=pause["iteration"],
                                  period=cfg.gc_pause_period, gpu_idle_start_ns=gpu[0] if gpu else None,
                                  gpu_idle_end_ns=gpu[1] if gpu else None))
    return planted


def _per_device_entries(cfg: SynthConfig, rank: _Rank) -> Iterable[dict]:
    log, device = rank.log, rank.device
    if log["module_load"]:
        first = rank.iterations[0]
        others = [i["end_ns"] - i["start_ns"] for i in rank.iterations[1:]]
        median = int(statistics.median(others)) if others else None
        duration = first["end_ns"] - first["start_ns"]
        yield _entry("slow_first_iteration", device, first["start_ns"], first["end_ns"],
                     len(log["module_load"]), iteration=0,
                     module_load_ns=sum(e - s for s, e in log["module_load"]),
                     median_other_iteration_ns=median, ratio=round(duration / median, 3) if median else None)
    if log["tiny_kernels"]:
        spans = log["tiny_kernels"]
        yield _entry("tiny_kernels", device, spans[0][0], spans[-1][1], len(spans), phase="optimizer",
                     kernel_time_ns=sum(e - s for s, e in spans), max_kernel_ns=max(e - s for s, e in spans))
    if log["pageable_h2d"]:
        copies, pinned = log["pageable_h2d"], log["pinned_h2d"]
        yield _entry("pageable_h2d", device, copies[0][0], copies[-1][1], len(copies),
                     sum(c[2] for c in copies), copy_time_ns=sum(e - s for s, e, _ in copies),
                     pinned_count=len(pinned), pinned_bytes=sum(c[2] for c in pinned))
    if log["device_sync"]:
        calls = log["device_sync"]
        yield _entry("device_sync", device, calls[0][0], calls[-1][1], len(calls),
                     api="cudaDeviceSynchronize", blocked_ns=sum(e - s for s, e in calls))
    if log["small_d2h"]:
        copies = log["small_d2h"]
        yield _entry("small_d2h", device, copies[0][0], copies[-1][1], len(copies),
                     len(copies) * cfg.small_d2h_bytes, bytes_each=cfg.small_d2h_bytes,
                     blocked_ns=sum(c[2] for c in copies))


def _straggler_entry(cfg: SynthConfig, straggler: _Rank, collectives: list[dict]) -> dict:
    """The collectives the straggler delayed; others (another rank later still, or realigned) are left out."""
    delayed = []
    for collective in collectives:
        ops = {p["device"]: (p["start_ns"], p["end_ns"]) for p in collective["per_device"]}
        mine = ops.pop(straggler.device)
        lateness = mine[0] - max(s for s, _ in ops.values())
        if 2 * lateness >= cfg.straggler_delay_ns:
            extra = statistics.mean(e - s for s, e in ops.values()) - (mine[1] - mine[0])
            delayed.append((collective, lateness, extra))
    spans = [(p["start_ns"], p["end_ns"]) for c, _, _ in delayed for p in c["per_device"]]
    return _entry("nccl_straggler", straggler.device, min(s for s, _ in spans) if spans else 0,
                  max(e for _, e in spans) if spans else 0, len(delayed), delay_ns=cfg.straggler_delay_ns,
                  peer_devices=[d for d in range(cfg.devices) if d != straggler.device],
                  delayed=[[c["iteration"], c["bucket"]] for c, _, _ in delayed],
                  peer_extra_ns=int(statistics.median(x for _, _, x in delayed)) if delayed else None,
                  lateness_ns=int(statistics.median(late for _, late, _ in delayed)) if delayed else None,
                  host_windows=[list(w) for w in straggler.log["straggler"]])


def _gpu_gaps(ranks: list[_Rank], idle: dict[int, list[tuple[int, int]]]) -> list[dict]:
    gaps = []
    for rank in ranks:
        causes = {"idle_gap": [(g["start_ns"], g["end_ns"]) for g in rank.log["idle_gap"]],
                  "gc_pause": [(p["start_ns"], p["end_ns"]) for p in rank.log["gc_pause"]],
                  "nccl_straggler": rank.log["straggler"], "slow_first_iteration": rank.log["module_load"]}
        for window in idle[rank.device]:
            if window[1] - window[0] >= _GAP_REPORT_MIN_NS:
                found = [kind for kind, spans in causes.items() if any(_overlaps(window, w) for w in spans)]
                gaps.append({"device": rank.device, "start_ns": window[0], "end_ns": window[1],
                             "duration_ns": window[1] - window[0], "causes": found})
    return gaps


def _check_idle_gaps(ranks: list[_Rank], idle: dict[int, list[tuple[int, int]]]) -> None:
    for rank in ranks:
        for gap in rank.log["idle_gap"]:
            if (gap["start_ns"], gap["end_ns"]) not in idle[rank.device]:
                raise RuntimeError(f"planted gap {gap} on device {rank.device} did not come out exact")


def _totals(trace: _Trace, ranks: list[_Rank]) -> dict[str, Any]:
    rows = trace.rows
    nccl_name = trace.strings.get(_KERNELS[_NCCL_KERNEL].short)
    per_device = []
    for rank in ranks:
        kernels = [r for r in rows["CUPTI_ACTIVITY_KIND_KERNEL"] if r[7] == rank.gpid]
        nccl = [r for r in kernels if r[9] == nccl_name]
        copies = [r for r in rows["CUPTI_ACTIVITY_KIND_MEMCPY"] if r[7] == rank.gpid]
        sets = [r for r in rows["CUPTI_ACTIVITY_KIND_MEMSET"] if r[7] == rank.gpid]
        syncs = [r[9] for r in rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"] if r[7] == rank.gpid]
        per_device.append({
            "device": rank.device, "kernels": len(kernels),
            "kernel_time_ns": sum(r[1] - r[0] for r in kernels),
            "nccl_kernels": len(nccl), "nccl_kernel_time_ns": sum(r[1] - r[0] for r in nccl),
            "tiny_kernels": sum(1 for r in kernels if r[1] - r[0] < _TINY_KERNEL_MAX_NS),
            "memcpy": {label: {"count": sum(1 for r in copies if r[9] == kind),
                               "bytes": sum(r[8] for r in copies if r[9] == kind)}
                       for label, kind in (("H2D", _COPY_H2D), ("D2H", _COPY_D2H))},
            "memset": {"count": len(sets), "bytes": sum(r[9] for r in sets)},
            "sync": {"stream_wait_event": syncs.count(_SYNC_STREAM_WAIT_EVENT),
                     "stream_synchronize": syncs.count(_SYNC_STREAM),
                     "context_synchronize": syncs.count(_SYNC_CONTEXT)},
            "cuda_api_calls": sum(1 for r in rows["CUPTI_ACTIVITY_KIND_RUNTIME"] if r[3] == rank.gtid),
            "nvtx_events": sum(1 for r in rows["NVTX_EVENTS"] if r[7] == rank.gtid),
            "os_runtime_calls": sum(1 for r in rows["OSRT_API"] if r[3] == rank.gtid),
        })
    return {"per_device": per_device, "kernels": sum(d["kernels"] for d in per_device),
            "memcpy_bytes_by_direction": {k: sum(d["memcpy"][k]["bytes"] for d in per_device)
                                          for k in ("H2D", "D2H")}}


def _iterations(ranks: list[_Rank]) -> list[dict]:
    out = []
    for index in range(len(ranks[0].iterations)):
        per_device = [{"device": r.device, **r.iterations[index],
                       "duration_ns": r.iterations[index]["end_ns"] - r.iterations[index]["start_ns"]}
                      for r in ranks]
        out.append({"index": index, "start_ns": min(d["start_ns"] for d in per_device),
                    "end_ns": max(d["end_ns"] for d in per_device), "per_device": per_device})
    return out


def _truth(cfg: SynthConfig, trace: _Trace, ranks: list[_Rank], collectives: list[dict],
           launcher_pid: int) -> dict[str, Any]:
    idle = {r.device: _idle_windows(r.gpu_ops) for r in ranks}
    _check_idle_gaps(ranks, idle)
    starts = [r[0] for t in _EVENT_TABLES for r in trace.rows[t]]
    ends = [r[1] if r[1] is not None else r[0] for t in _EVENT_TABLES for r in trace.rows[t]]
    return {
        "generator": GENERATOR, "truth_version": TRUTH_VERSION, "preset": cfg.preset, "seed": cfg.seed,
        "config": asdict(cfg), "nsys_version": NSYS_VERSION, "schema_version": SCHEMA_VERSION,
        "devices": [r.device for r in ranks], "pids": [r.pid for r in ranks], "launcher_pid": launcher_pid,
        "ranks": [{"device": r.device, "pid": r.pid, "tid": r.pid, "global_pid": r.gpid, "global_tid": r.gtid}
                  for r in ranks],
        "capture_start_ns": min(starts), "capture_end_ns": max(ends),
        "iterations": _iterations(ranks),
        "planted": _planted(cfg, ranks, collectives, idle),
        "gpu_gaps": _gpu_gaps(ranks, idle),
        "collectives": collectives,
        "totals": _totals(trace, ranks),
    }


# --- writing --------------------------------------------------------------------------------------
def truth_path(path: Path) -> Path:
    """Where write_sample puts the ground truth of the export at path."""
    return Path(f"{path}.truth.json")


def _check_overwritable(path: Path, force: bool) -> None:
    """Refuse to replace anything but a file this module wrote, unless forced (never a directory)."""
    if path.is_dir():
        raise FileExistsError(f"{path} is a directory; give the path of the .sqlite file to write")
    if force or not path.exists():
        return
    refusal = (f"{path} exists and is not a synthetic profile written by nsightful; choose another path "
               "or pass --force")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_HOST'").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise FileExistsError(refusal) from exc
    if row is None or row[0] != SYNTH_HOST:
        raise FileExistsError(refusal)


def _write_sqlite(path: Path, trace: _Trace) -> None:
    trace.rows["StringIds"] = [(i, value) for value, i in trace.strings.items()]
    for table in _EVENT_TABLES:
        trace.rows[table].sort(key=lambda row: row[0])
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("BEGIN")
        for table, columns in _SCHEMA.items():
            rows = trace.rows[table]
            if not rows:  # lazy export
                continue
            con.execute(f"CREATE TABLE {table} (\n    " + ",\n    ".join(columns.split(", ")) + "\n)")
            marks = ", ".join("?" * len(_COLUMN_NAMES[table]))
            con.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        con.execute("COMMIT")
    finally:
        con.close()


def write_sample(path: Path, config: SynthConfig | None = None, *, force: bool = False) -> dict[str, Any]:
    """Write a synthetic export to path and its ground truth to `<path>.truth.json`; return the truth.

    An existing file at path is replaced only when this module wrote it, or when force is true.
    """
    path = Path(path)
    cfg = config or SynthConfig.demo()
    if not path.parent.is_dir():
        raise FileNotFoundError(f"directory {path.parent} does not exist; create it first")
    _check_overwritable(path, force)
    trace, ranks, collectives, launcher_pid = _simulate(cfg)
    _add_static_tables(trace, cfg, ranks, launcher_pid)
    truth = _truth(cfg, trace, ranks, collectives, launcher_pid)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_sqlite(tmp, trace)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    truth_path(path).write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


# --- CLI ------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path,
                        help="SQLite file to write; the ground truth goes to OUT.truth.json")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demo",
                        help="demo: every problem planted (default); clean: none, GPUs kept busy")
    parser.add_argument("--devices", type=int, help="GPUs, one rank process each (default 4)")
    parser.add_argument("--iterations", type=int, help="training steps (default 12)")
    parser.add_argument("--seed", type=int,
                        help="random seed; the same seed writes the same file (default 0)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite OUT even if it is not a sample written by nsightful synth")


def run_cli(args: argparse.Namespace) -> int:
    overrides = {key: getattr(args, key) for key in ("devices", "iterations", "seed")
                 if getattr(args, key) is not None}
    try:
        truth = write_sample(args.out, PRESETS[args.preset](**overrides), force=args.force)
    except (ValueError, OSError) as exc:
        print(f"nsightful synth: {exc}", file=sys.stderr)
        return 2
    size_mb = Path(args.out).stat().st_size / 1e6
    print(f"wrote {args.out} ({size_mb:.1f} MB, preset {args.preset}: devices={len(truth['devices'])}, "
          f"iterations={len(truth['iterations'])}, kernels={truth['totals']['kernels']}, "
          f"planted problems={len(truth['planted'])}) and {truth_path(args.out).name}")
    return 0
