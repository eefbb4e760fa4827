"""The rows one rank of the synthetic job writes into the export, in the layout of the nsys tables."""

from __future__ import annotations

from collections import defaultdict

from . import timing
from .kernels import Kernel
from .schema import CACHE_CONFIG, COMPUTE_STREAM, CONTEXT_ID, LAUNCH_REGULAR, NCCL_STREAM, Trace, global_pid


def _shared_memory_executed(kernel: Kernel) -> int:
    needed = kernel.static_shared_bytes + kernel.dynamic_shared_bytes
    carveouts = timing.SHARED_MEMORY_CARVEOUTS_BYTES
    return next((c for c in carveouts if c >= needed), carveouts[-1])


class RankRows:
    """A rank's identity in the export (device, process, main thread), its streams' progress, and the rows of its
    kernels, copies, synchronizations and NVTX events."""

    def __init__(self, trace: Trace, device: int, pid: int) -> None:
        self.trace, self.device, self.pid = trace, device, pid
        self.gpid = global_pid(pid)
        self.gtid = self.gpid | pid
        self.cursor = {COMPUTE_STREAM: 0, NCCL_STREAM: 0}  # end of the last op queued on each stream
        self.counters: dict[str, int] = defaultdict(int)
        self.gpu_ops: list[tuple[int, int]] = []

    def _kernel_row(self, kernel: Kernel, stream: int, correlation: int, start: int, end: int) -> None:
        sid = self.trace.sid
        self.counters["grid"] += 1
        self.trace.rows["CUPTI_ACTIVITY_KIND_KERNEL"].append((
            start, end, self.device, CONTEXT_ID, 0, stream, correlation, self.gpid, sid(kernel.demangled),
            sid(kernel.short), sid(kernel.mangled), LAUNCH_REGULAR, CACHE_CONFIG, kernel.registers,
            *kernel.grid, *kernel.block, kernel.static_shared_bytes, kernel.dynamic_shared_bytes, 0,
            timing.LOCAL_MEMORY_TOTAL_BYTES, self.counters["grid"], _shared_memory_executed(kernel), None, 0))
        self._gpu_op(stream, start, end)

    def _gpu_op(self, stream: int, start: int, end: int) -> None:
        self.cursor[stream] = end
        self.gpu_ops.append((start, end))

    def _memcpy_row(self, correlation: int, start: int, end: int, nbytes: int, copy_kind: int,
                    src_kind: int, dst_kind: int) -> None:
        self.trace.rows["CUPTI_ACTIVITY_KIND_MEMCPY"].append((
            start, end, self.device, CONTEXT_ID, 0, COMPUTE_STREAM, correlation, self.gpid, nbytes,
            copy_kind, None, src_kind, dst_kind, None, None, None, None, None, None, None))
        self._gpu_op(COMPUTE_STREAM, start, end)

    def _sync_row(self, start: int, end: int, stream: int, correlation: int, sync_type: int, event_id: int,
                  event_sync_id: int) -> None:
        self.trace.rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"].append((
            start, end, self.device, CONTEXT_ID, None, stream, correlation, self.gpid, None, sync_type,
            event_id, event_sync_id))

    def _nvtx_row(self, start: int, end: int | None, event_type: int, text: str | None = None,
                  text_id: int | None = None, domain: int | None = None, range_id: int | None = None,
                  end_gtid: int | None = None, payload: int | None = None) -> None:
        self.trace.rows["NVTX_EVENTS"].append((
            start, end, event_type, range_id, None, None, text, self.gtid, end_gtid, text_id, domain or 0,
            payload, None, None, None, None, None, None, None, None))
