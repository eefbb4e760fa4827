"""Host and GPU timing and sizes of the synthetic job: durations are (low, high) ranges drawn per call,
in ns, unless named otherwise."""

from __future__ import annotations

from .schema import MIB_BYTES

# --- the job --------------------------------------------------------------------------------------
LAUNCHER_PID_RANGE = (20_000, 90_000)
RANK_PID_STRIDE = 17
RANKS_START_NS = 1_350_000_000  # first traced call of a rank, on the capture clock
RANK_START_SPREAD_NS = 400_000
NCCL_BUCKET_NS = (1_400_000, 1_100_000)  # transfer time of each gradient bucket's all-reduce
NCCL_END_JITTER_NS = 3_000

# --- host timing ----------------------------------------------------------------------------------
PYTHON_GAP_NS = (3_000, 14_000)  # host time between two traced calls
NVTX_CALL_NS = (800, 2_000)
LAUNCH_API_NS = (4_000, 9_000)
MEMCPY_API_NS = (5_000, 10_000)
EVENT_API_NS = (1_500, 4_000)
QUEUE_DELAY_NS = (2_000, 6_000)  # launch call end -> GPU start when the stream is free
SYNC_RETURN_NS = (300, 900)  # GPU done -> blocking call returns
AFTER_WAIT_NS = (400_000, 800_000)  # the host uses what it waited for (logging, a branch) before launching more
HOST_LEAD_MAX_NS = 2_000_000  # launch calls block while a stream has more queued work than this
GAP_RESUME_SLACK_NS = 40_000  # host resumes this long before a planted GPU gap ends
STRAGGLER_RESUME_SLACK_NS = 150_000  # ... and before a straggler's late NCCL kernel starts
DATALOADER_POLL_NS = (80_000, 180_000)
SETUP_CALLS = (
    ("cudaGetDeviceProperties_v12000", (8_000, 15_000)),
    ("cudaStreamCreateWithFlags_v5000", (15_000, 30_000)),
    ("cudaMalloc_v3020", (200_000, 600_000)),
    ("cudaMalloc_v3020", (200_000, 600_000)),
    ("cudaStreamIsCapturing_v10000", (2_000, 4_000)),
)

# --- GPU timing and sizes -------------------------------------------------------------------------
KERNEL_JITTER = 0.04  # +-4 % around a kernel's mean duration
BATCH_H2D_BYTES = 2 * MIB_BYTES
PINNED_H2D_PER_ITERATION = 2
PINNED_H2D_BYTES_PER_S = 24_000_000_000
PAGEABLE_H2D_BYTES_PER_S = 9_000_000_000
SMALL_D2H_NS = (1_400, 2_000)
ZERO_GRAD_MEMSETS = 2
ZERO_GRAD_BYTES = 32 * MIB_BYTES
MEMSET_BYTES_PER_S = 1_500_000_000_000
NCCL_BUCKET_BYTES = (96 * MIB_BYTES, 72 * MIB_BYTES)
LOCAL_MEMORY_TOTAL_BYTES = 155_713_536
SHARED_MEMORY_CARVEOUTS_BYTES = (32_768, 65_536, 102_400, 135_168, 167_936, 200_704, 233_472)
