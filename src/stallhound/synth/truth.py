"""The ground truth written beside each synthetic export as `<path>.truth.json`.

Truth JSON (times in ns on the export's clock, sizes in bytes):
  generator, truth_version  "stallhound.synth", 1
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

import statistics
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from .config import TINY_KERNEL_MAX_NS, SynthConfig
from .kernels import KERNELS, NCCL_KERNEL
from .rank import Rank
from .schema import (
    COLUMN_INDEX,
    COPY_D2H,
    COPY_H2D,
    EVENT_TABLES,
    NSYS_VERSION,
    SCHEMA_VERSION,
    SYNC_CONTEXT,
    SYNC_STREAM,
    SYNC_STREAM_WAIT_EVENT,
    Trace,
)

GENERATOR = "stallhound.synth"
TRUTH_VERSION = 1
_GAP_REPORT_MIN_NS = 1_000_000  # gpu_gaps lists idle windows at least this long

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


def _planted(cfg: SynthConfig, ranks: list[Rank], collectives: list[dict],
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


def _per_device_entries(cfg: SynthConfig, rank: Rank) -> Iterable[dict]:
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


def _straggler_entry(cfg: SynthConfig, straggler: Rank, collectives: list[dict]) -> dict:
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


def _gpu_gaps(ranks: list[Rank], idle: dict[int, list[tuple[int, int]]]) -> list[dict]:
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


def _check_idle_gaps(ranks: list[Rank], idle: dict[int, list[tuple[int, int]]]) -> None:
    for rank in ranks:
        for gap in rank.log["idle_gap"]:
            if (gap["start_ns"], gap["end_ns"]) not in idle[rank.device]:
                raise RuntimeError(f"planted gap {gap} on device {rank.device} did not come out exact")


def _totals(trace: Trace, ranks: list[Rank]) -> dict[str, Any]:
    per_device = [_device_totals(trace, rank) for rank in ranks]
    return {"per_device": per_device, "kernels": sum(d["kernels"] for d in per_device),
            "memcpy_bytes_by_direction": {k: sum(d["memcpy"][k]["bytes"] for d in per_device)
                                          for k in ("H2D", "D2H")}}


def _device_totals(trace: Trace, rank: Rank) -> dict[str, Any]:
    k, m, s, y, a, n, o = (COLUMN_INDEX[t] for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "OSRT_API"))
    rows = trace.rows
    nccl_name = trace.strings.get(KERNELS[NCCL_KERNEL].short)
    kernels = [r for r in rows["CUPTI_ACTIVITY_KIND_KERNEL"] if r[k["globalPid"]] == rank.gpid]
    nccl = [r for r in kernels if r[k["shortName"]] == nccl_name]
    copies = [r for r in rows["CUPTI_ACTIVITY_KIND_MEMCPY"] if r[m["globalPid"]] == rank.gpid]
    sets = [r for r in rows["CUPTI_ACTIVITY_KIND_MEMSET"] if r[s["globalPid"]] == rank.gpid]
    syncs = [r[y["syncType"]] for r in rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"] if r[y["globalPid"]] == rank.gpid]
    return {
        "device": rank.device, "kernels": len(kernels),
        "kernel_time_ns": sum(r[k["end"]] - r[k["start"]] for r in kernels),
        "nccl_kernels": len(nccl), "nccl_kernel_time_ns": sum(r[k["end"]] - r[k["start"]] for r in nccl),
        "tiny_kernels": sum(1 for r in kernels if r[k["end"]] - r[k["start"]] < TINY_KERNEL_MAX_NS),
        "memcpy": {label: {"count": sum(1 for r in copies if r[m["copyKind"]] == kind),
                           "bytes": sum(r[m["bytes"]] for r in copies if r[m["copyKind"]] == kind)}
                   for label, kind in (("H2D", COPY_H2D), ("D2H", COPY_D2H))},
        "memset": {"count": len(sets), "bytes": sum(r[s["bytes"]] for r in sets)},
        "sync": {"stream_wait_event": syncs.count(SYNC_STREAM_WAIT_EVENT),
                 "stream_synchronize": syncs.count(SYNC_STREAM),
                 "context_synchronize": syncs.count(SYNC_CONTEXT)},
        "cuda_api_calls": sum(1 for r in rows["CUPTI_ACTIVITY_KIND_RUNTIME"] if r[a["globalTid"]] == rank.gtid),
        "nvtx_events": sum(1 for r in rows["NVTX_EVENTS"] if r[n["globalTid"]] == rank.gtid),
        "os_runtime_calls": sum(1 for r in rows["OSRT_API"] if r[o["globalTid"]] == rank.gtid),
    }


def _iterations(ranks: list[Rank]) -> list[dict]:
    out = []
    for index in range(len(ranks[0].iterations)):
        per_device = [{"device": r.device, **r.iterations[index],
                       "duration_ns": r.iterations[index]["end_ns"] - r.iterations[index]["start_ns"]}
                      for r in ranks]
        out.append({"index": index, "start_ns": min(d["start_ns"] for d in per_device),
                    "end_ns": max(d["end_ns"] for d in per_device), "per_device": per_device})
    return out


def build_truth(cfg: SynthConfig, trace: Trace, ranks: list[Rank], collectives: list[dict],
                launcher_pid: int) -> dict[str, Any]:
    idle = {r.device: _idle_windows(r.gpu_ops) for r in ranks}
    _check_idle_gaps(ranks, idle)
    spans = [(r[c["start"]], r[c["end"]]) for t in EVENT_TABLES for c in (COLUMN_INDEX[t],) for r in trace.rows[t]]
    starts = [start for start, _ in spans]
    ends = [start if end is None else end for start, end in spans]  # an NVTX mark has no end
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


