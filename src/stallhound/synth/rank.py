"""One rank process of the synthetic job: its main thread's host timeline (CUDA calls, NVTX ranges, OS
runtime calls) and its device's streams, with the planted problems placed at exact times.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

from . import timing
from .config import IdleGap, SynthConfig
from .kernels import BACKWARD_LAYER, FORWARD_LAYER, FUSED_OPTIMIZER, KERNELS, LOSS, NCCL_KERNEL, TINY
from .rows import RankRows
from .schema import (
    COMPUTE_STREAM,
    CONTEXT_ID,
    COPY_D2H,
    COPY_H2D,
    EVENT_CLASS_DRIVER,
    EVENT_CLASS_RUNTIME,
    EVENT_IDS,
    MEM_DEVICE,
    MEM_PAGEABLE,
    MEM_PINNED,
    NCCL_DOMAIN_ID,
    NCCL_STREAM,
    NO_ID,
    NS_PER_S,
    NVTX_DOMAIN_CREATE,
    NVTX_MARK,
    NVTX_PUSH_POP,
    NVTX_START_END,
    OSRT_EVENT_CLASS,
    SYNC_CONTEXT,
    SYNC_STREAM,
    SYNC_STREAM_WAIT_EVENT,
    Trace,
)


def _transfer_ns(nbytes: int, bytes_per_s: int) -> int:
    return max(1, nbytes * NS_PER_S // bytes_per_s)


def _event_class(api: str) -> int:
    return EVENT_CLASS_RUNTIME if api.startswith("cuda") else EVENT_CLASS_DRIVER


@dataclass
class Arrival:
    """A rank's NCCL kernel of one collective is ready to start at start_ns."""
    iteration: int
    bucket: int
    start_ns: int


class Rank(RankRows):
    """One rank process: its main thread's host timeline and its device's streams (RankRows writes their rows)."""

    def __init__(self, cfg: SynthConfig, trace: Trace, device: int, pid: int, start_ns: int) -> None:
        super().__init__(trace, device, pid)
        self.cfg = cfg
        self.rng = random.Random(f"{cfg.seed}:rank:{device}")
        self.host_ns = start_ns
        self.forced_start_ns = 0  # the next GPU op starts no earlier than this
        self.nvtx_stack: list[tuple[int, str, int | None, int | None]] = []  # start, text, domain, payload
        self.loads_left = cfg.module_loads if cfg.first_iteration_extra_ns else 0
        self.loaded: set[str] = set()
        self.iteration = -1
        self.log: dict[str, list] = defaultdict(list)
        self.iterations: list[dict[str, int]] = []
        self.epoch_start_ns = 0

    # -- program -----------------------------------------------------------------------------------
    def program(self) -> Generator[Arrival, int, None]:
        self._setup()
        for it in range(self.cfg.iterations):
            yield from self._iteration(it)
        self._teardown()

    def _setup(self) -> None:
        if self.cfg.devices > 1:
            self._nvtx_row(self.host_ns, None, NVTX_DOMAIN_CREATE, text="NCCL", domain=NCCL_DOMAIN_ID)
        for name, duration in timing.SETUP_CALLS:
            self._python_gap()
            self._api(name, self.rng.randint(*duration))
        self._python_gap()
        self.epoch_start_ns = self.host_ns

    def _teardown(self) -> None:
        self._python_gap()
        self.counters["range"] += 1
        self._nvtx_row(self.epoch_start_ns, self.host_ns, NVTX_START_END, text="epoch 0",
                       range_id=self.counters["range"], end_gtid=self.gtid)

    def _iteration(self, it: int) -> Generator[Arrival, int, None]:
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
            self._osrt("poll", self.rng.randint(*timing.DATALOADER_POLL_NS))
        for _ in range(timing.PINNED_H2D_PER_ITERATION):
            self._h2d(timing.BATCH_H2D_BYTES, pageable=False)
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
            for key in FORWARD_LAYER:
                self._launch(key)
            gap = self._planned_gap(it, "untraced") if layer == 0 else None
            if gap:
                self._plant_gap(gap, "forward", self._idle_until)
        for key in LOSS:
            self._launch(key)
        if self.cfg.small_d2h_per_iteration:
            self._small_d2h()

    def _backward(self, layers: Iterable[int]) -> None:
        for _ in layers:
            for key in BACKWARD_LAYER:
                self._launch(key)

    def _allreduce(self, it: int, bucket: int) -> Generator[Arrival, int, None]:
        if self.cfg.devices < 2:
            return
        if bucket == 0 and self.device == self.cfg.straggler_device and self.cfg.straggler_delay_ns:
            self._straggle()
        self._wait_event(COMPUTE_STREAM, NCCL_STREAM)
        self._push("ncclAllReduce", domain=NCCL_DOMAIN_ID, payload=timing.NCCL_BUCKET_BYTES[bucket])
        self._python_gap()
        api_end, start = self._enqueue(NCCL_STREAM, self.rng.randint(*timing.LAUNCH_API_NS))
        correlation = self._api(KERNELS[NCCL_KERNEL].api, api_end - self.host_ns)
        end = yield Arrival(it, bucket, start)
        self._kernel_row(KERNELS[NCCL_KERNEL], NCCL_STREAM, correlation, start, end)
        self._pop()

    def _optimizer(self) -> None:
        if self.cfg.devices > 1:
            self._wait_event(NCCL_STREAM, COMPUTE_STREAM)
        for i in range(self.cfg.tiny_kernels_per_iteration):
            nominal = self.cfg.tiny_kernel_ns
            duration = self.rng.randint(nominal * 7 // 10, nominal * 13 // 10)
            self.log["tiny_kernels"].append(self._launch(TINY[i % len(TINY)], duration))
        if not self.cfg.tiny_kernels_per_iteration:
            for key in FUSED_OPTIMIZER:
                self._launch(key)
        for _ in range(timing.ZERO_GRAD_MEMSETS):
            self._memset(timing.ZERO_GRAD_BYTES)
        for _ in range(self.cfg.device_syncs_per_iteration):
            self._device_sync()

    # -- planted host stalls -----------------------------------------------------------------------
    def _planned_gap(self, it: int, host: str) -> IdleGap | None:
        return next((g for g in self.cfg.idle_gaps
                     if (g.device, g.iteration, g.host) == (self.device, it, host)), None)

    def _plant_gap(self, gap: IdleGap, phase: str, wait_until: Callable[[int], None]) -> None:
        """Hold the host so that the device runs nothing for exactly gap.duration_ns from now on."""
        drained = max(self.cursor.values())
        resume = drained + gap.duration_ns - timing.GAP_RESUME_SLACK_NS
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
        resume = max(self.host_ns, target - timing.STRAGGLER_RESUME_SLACK_NS)
        self.log["straggler"].append((self.host_ns, resume))
        self.host_ns = resume
        self.forced_start_ns = target

    # -- CUDA calls --------------------------------------------------------------------------------
    def _python_gap(self) -> None:
        self.host_ns += self.rng.randint(*timing.PYTHON_GAP_NS)

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
        api_end = max(self.host_ns + api_cost_ns, self.cursor[stream] - timing.HOST_LEAD_MAX_NS)
        start = max(self.cursor[stream], api_end + self.rng.randint(*timing.QUEUE_DELAY_NS), self.forced_start_ns)
        self.forced_start_ns = 0
        return api_end, start

    def _launch(self, key: str, duration_ns: int | None = None) -> tuple[int, int]:
        kernel = KERNELS[key]
        self._maybe_load_module(key)
        self._python_gap()
        api_end, start = self._enqueue(COMPUTE_STREAM, self.rng.randint(*timing.LAUNCH_API_NS))
        correlation = self._api(kernel.api, api_end - self.host_ns)
        if duration_ns is None:
            duration_ns = round(kernel.mean_ns * self.rng.uniform(1 - timing.KERNEL_JITTER, 1 + timing.KERNEL_JITTER))
        self._kernel_row(kernel, COMPUTE_STREAM, correlation, start, start + duration_ns)
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

    def _h2d(self, nbytes: int, pageable: bool) -> None:
        """A batch copy; from pageable memory the call returns only when the copy is done."""
        self._python_gap()
        cost = self.rng.randint(*timing.MEMCPY_API_NS)
        if pageable:
            start = max(self.cursor[COMPUTE_STREAM], self.host_ns + cost, self.forced_start_ns)
            self.forced_start_ns = 0
            end = start + _transfer_ns(nbytes, timing.PAGEABLE_H2D_BYTES_PER_S)
            correlation = self._api("cudaMemcpyAsync_v3020", end + self.rng.randint(*timing.SYNC_RETURN_NS)
                                    - self.host_ns)
        else:
            api_end, start = self._enqueue(COMPUTE_STREAM, cost)
            correlation = self._api("cudaMemcpyAsync_v3020", api_end - self.host_ns)
            end = start + _transfer_ns(nbytes, timing.PINNED_H2D_BYTES_PER_S)
        src_kind = MEM_PAGEABLE if pageable else MEM_PINNED
        self._memcpy_row(correlation, start, end, nbytes, COPY_H2D, src_kind, MEM_DEVICE)
        self.log["pageable_h2d" if pageable else "pinned_h2d"].append((start, end, nbytes))

    def _small_d2h(self) -> None:
        """`.item()`: a few bytes copied to pinned memory, then the stream is synchronized."""
        self._python_gap()
        api_end, start = self._enqueue(COMPUTE_STREAM, self.rng.randint(*timing.MEMCPY_API_NS))
        correlation = self._api("cudaMemcpyAsync_v3020", api_end - self.host_ns)
        end = start + self.rng.randint(*timing.SMALL_D2H_NS)
        self._memcpy_row(correlation, start, end, self.cfg.small_d2h_bytes, COPY_D2H, MEM_DEVICE,
                         MEM_PINNED)
        sync_start, sync_end = self._blocking_sync("cudaStreamSynchronize_v3020", COMPUTE_STREAM,
                                                   SYNC_STREAM, self.cursor[COMPUTE_STREAM])
        self.log["small_d2h"].append((start, end, sync_end - sync_start))

    def _device_sync(self) -> None:
        drained = max(self.cursor.values())
        call = self._blocking_sync("cudaDeviceSynchronize_v3020", NO_ID, SYNC_CONTEXT, drained)
        self.log["device_sync"].append(call)

    def _blocking_sync(self, api: str, stream: int, sync_type: int, done_ns: int) -> tuple[int, int]:
        """A call that returns when the GPU reaches done_ns, with its SYNCHRONIZATION row; its span."""
        self._python_gap()
        api_start = self.host_ns
        sync_start = api_start + self.rng.randint(600, 1_500)
        sync_end = max(done_ns, sync_start + 500) + self.rng.randint(*timing.SYNC_RETURN_NS)
        api_end = sync_end + self.rng.randint(200, 500)
        correlation = self._api(api, api_end - api_start)
        self._sync_row(sync_start, sync_end, stream, correlation, sync_type, NO_ID, NO_ID)
        self.host_ns += self.rng.randint(*timing.AFTER_WAIT_NS)  # the drained GPU idles meanwhile
        return api_start, api_end

    def _wait_event(self, src: int, dst: int) -> None:
        """cudaEventRecord on src, cudaStreamWaitEvent on dst: dst's later work waits for src's."""
        self._python_gap()
        self._api("cudaEventRecord_v3020", self.rng.randint(*timing.EVENT_API_NS))
        self._python_gap()
        api_start = self.host_ns
        correlation = self._api("cudaStreamWaitEvent_v3020", self.rng.randint(*timing.EVENT_API_NS))
        self.counters["event_sync"] += 1
        self._sync_row(api_start + 200, self.host_ns - 200, dst, correlation, SYNC_STREAM_WAIT_EVENT,
                       EVENT_IDS[src], self.counters["event_sync"])
        self.cursor[dst] = max(self.cursor[dst], self.cursor[src])

    def _memset(self, nbytes: int) -> None:
        self._python_gap()
        api_end, start = self._enqueue(COMPUTE_STREAM, self.rng.randint(*timing.MEMCPY_API_NS))
        correlation = self._api("cudaMemsetAsync_v3020", api_end - self.host_ns)
        end = start + _transfer_ns(nbytes, timing.MEMSET_BYTES_PER_S)
        self.trace.rows["CUPTI_ACTIVITY_KIND_MEMSET"].append((
            start, end, self.device, CONTEXT_ID, 0, COMPUTE_STREAM, correlation, self.gpid, 0, nbytes, None,
            MEM_DEVICE))
        self._gpu_op(COMPUTE_STREAM, start, end)

    # -- NVTX and OS runtime -----------------------------------------------------------------------
    def _push(self, text: str, domain: int | None = None, payload: int | None = None) -> int:
        self.host_ns += self.rng.randint(*timing.NVTX_CALL_NS)
        self.nvtx_stack.append((self.host_ns, text, domain, payload))
        return self.host_ns

    def _pop(self) -> int:
        self.host_ns += self.rng.randint(*timing.NVTX_CALL_NS)
        start, text, domain, payload = self.nvtx_stack.pop()
        if domain is None:
            self._nvtx_row(start, self.host_ns, NVTX_PUSH_POP, text=text)
        else:  # NCCL registers its strings: the text is in StringIds, the payload is the message size
            self._nvtx_row(start, self.host_ns, NVTX_PUSH_POP, text_id=self.trace.sid(text), domain=domain,
                           payload=payload)
        return self.host_ns

    def _mark(self, text: str) -> None:
        self.host_ns += self.rng.randint(*timing.NVTX_CALL_NS)
        self._nvtx_row(self.host_ns, None, NVTX_MARK, text=text)

    def _osrt(self, name: str, duration_ns: int) -> None:
        end = self.host_ns + duration_ns
        self.trace.rows["OSRT_API"].append(
            (self.host_ns, end, OSRT_EVENT_CLASS, self.gtid, self.trace.sid(name), 0, 0, 0))
        self.host_ns = end


