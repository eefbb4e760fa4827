"""Answers to the veteran questions, each read from the tools' results on triage's window, with no SQL of its own.

Triage runs first (once per model, through run_once); the answers then read its result, the idle attribution
of its window, and the results of the tools it ran, asked for with the same parameters so that they come from
the per-model cache. The questions no triage detector covers compute only the figure they need where it is
cheap (tools/answers/figures.py: tiny kernels, device-wide syncs), else run their tool (gpu_utilization;
thread_utilization only where its basis is time on a CPU), each once per model and window.
An answerer returns (value, evidence) when the data gives a real answer to its question, else None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stallhound.analysis import attribution
from stallhound.analysis.common import ms, pct
from stallhound.analysis.rules import HOTSPOT_PCT, SMALL_READ_BYTES
from stallhound.model.errors import InvalidRequest
from stallhound.tools import (
    gpu_utilization,
    iterations,
    memory_transfers,
    nccl_breakdown,
    thread_utilization,
    top_kernels,
)
from stallhound.tools.answers import parallelism
from stallhound.tools.answers.evidence import Evidence

HOT_THREAD_PCT = 90.0  # veteran question 25
MOSTLY_PINNED_PCT = 90.0  # veteran question 17: "mostly" pinned when this share of the H2D bytes is
TOP_KERNELS = 5  # veteran question 11 asks for the top five
TOP_CAUSES = 3  # idle causes named in the answer to question 8, the costliest first
SPREAD_STEADY = 1.2  # p90/p10 of iteration times under this: the steps are even
Answer = tuple[str, dict[str, Any]] | None


def _hardware(e: Evidence) -> Answer:
    devices = e.summary.devices
    names = sorted({d.name for d in devices if d.name})
    ids = {"devices": [d.device for d in devices]}
    if names:
        return f"{len(devices)} device(s): {', '.join(names)}", ids
    top = e.tool("top_kernels", top_kernels.Result)
    arch = max((g.min_arch_from_names or 0 for g in top.gemms), default=0) if top else 0
    if not devices or not arch:
        return None
    return (f"{len(devices)} device(s), model not recorded in this export; their kernels were built for sm_{arch} "
            "or newer", {**ids, "min_arch": arch})


def _framework(e: Evidence) -> Answer:
    p = e.triage.program
    if p.kind == "unknown":
        return None
    return (f"{p.kind} ({p.decided_by}); frameworks seen: {', '.join(p.frameworks) or 'none'}",
            {"kind": p.kind, "frameworks": p.frameworks})


def _length(e: Evidence) -> Answer:
    s, it = e.summary, e.tool("iterations", iterations.Result, window_scoped=False)
    if s.capture is None:
        return None
    steps = (f", {it.iteration_count} iterations by {it.method}" if it and it.iteration_count
             else ", no iterations found")
    active = ms(s.gpu_active.duration_ns) if s.gpu_active else "none"
    return (f"capture {ms(s.capture.duration_ns)}, GPU active {active}{steps}",
            {"duration_ns": s.capture.duration_ns, "iterations": it.iteration_count if it else 0})


def _warmup(e: Evidence) -> Answer:
    it = e.tool("iterations", iterations.Result, window_scoped=False)
    if not it or it.iteration_count < iterations.MIN_ITERATIONS:
        return None
    both = iterations.first_is_warmup(it)
    verdict = "both: the first iteration is warmup" if both else "steady state"
    return (f"{verdict} (first {ms(it.first_ns)} vs steady median {ms(it.steady_median_ns)}); triage analyses: "
            f"{e.triage.window_note}", {"first_vs_steady": it.first_vs_steady})


def _utilization(e: Evidence) -> Answer:
    idle = e.idle
    if not idle.devices:
        return None
    busy = {d.device: d.busy_pct for d in idle.devices.values()}
    return (f"busy (kernels, copies, memsets) over {ms(e.window.duration_ns)}: "
            + ", ".join(f"device {d} {b:.1f}%" for d, b in busy.items()), {"busy_pct": busy})


def _idle_gaps(e: Evidence) -> Answer:
    idle = e.idle
    if not idle.devices:
        return None
    causes: dict[str, int] = {}
    for d in idle.devices.values():
        for cause, t in d.causes.items():
            causes[cause] = causes.get(cause, 0) + t.ns
    top = ", ".join(f"{c} {ms(n)}" for c, n in sorted(causes.items(), key=lambda kv: -kv[1])[:TOP_CAUSES])
    gap_time = sum(g.end_ns - g.start_ns for g in idle.long_gaps)
    return (f"{len(idle.long_gaps)} gaps of {ms(attribution.BUBBLE_MIN_NS)} or more ({ms(gap_time)}); idle by cause: "
            f"{top}", {"gap_count": len(idle.long_gaps), "gap_time_ns": gap_time})


def _idle_distribution(e: Evidence) -> Answer:
    util = e.tool("gpu_utilization", gpu_utilization.Result)
    if not util or not util.devices:
        return None
    patterns = {d.device: d.idle_pattern for d in util.devices}
    return (", ".join(f"device {d}: {p} ({u.idle_concentration_pct:.0f}% of idle in the worst fifth)"
                      for (d, p), u in zip(patterns.items(), util.devices, strict=True)), {"pattern": patterns})


def _streams(e: Evidence) -> Answer:
    util = e.tool("gpu_utilization", gpu_utilization.Result)
    if not util or not util.devices:
        return None
    return ("; ".join(f"device {d.device}: {d.stream_count} stream(s), busiest "
                      f"{d.streams[0].busy_pct:.1f}% of the window" for d in util.devices if d.streams),
            {"streams": {d.device: d.stream_count for d in util.devices}})


def _top5(e: Evidence) -> Answer:
    top = e.tool("top_kernels", top_kernels.Result)
    if not top or not top.rows:
        return None
    rows = top.rows[:TOP_KERNELS]
    return "; ".join(f"{r.display_name} {r.kernel_time_pct:.1f}%" for r in rows), {"top_ns": [r.total_ns for r in rows]}


def _dominant(e: Evidence) -> Answer:
    top = e.tool("top_kernels", top_kernels.Result)
    if not top or not top.rows:
        return None
    r = top.rows[0]
    verdict = "yes" if r.kernel_time_pct > HOTSPOT_PCT else "no"
    return (f"{verdict}: the largest, {r.display_name} ({r.kind}), is {r.kernel_time_pct:.1f}% of kernel time",
            {"kernel_time_pct": r.kernel_time_pct})


def _small(e: Evidence) -> Answer:
    k = e.tiny_kernels()
    if not k.kernel_count:
        return None
    idle = sum(d.ns("launch_tiny") for d in e.idle.devices.values())
    return (f"{k.tiny_count:,} of {k.kernel_count:,} kernels ({k.tiny_kernel_pct:.1f}%) run under "
            f"{k.threshold_ns / 1000:g} us; the devices idle {ms(idle)} waiting for their launches",
            {"tiny_count": k.tiny_count, "kernel_count": k.kernel_count, "launch_idle_ns": idle})


def _flash(e: Evidence) -> Answer:
    libs = {lib.library: lib for lib in e.summary.libraries}
    flash = libs.get("FlashAttention / fused attention")
    if flash is None:
        return ("no FlashAttention kernels in this capture", {}) if e.summary.devices else None
    hint = flash.version_hint or "no "
    version = ("unknown (fused attention without flash-attn 2/3 names)" if hint.startswith("no ")
               else "3 (Hopper)" if "flash-attn 3" in hint else "2")
    return f"yes, version {version} by kernel names: {flash.example}", {"kernels": flash.kernel_count}


def _h2d(e: Evidence) -> Answer:
    m = e.tool("memory_transfers", memory_transfers.Result)
    if not m or not m.copy_count:
        return None
    rows = {r.direction: r for r in m.rows}
    uvm = rows.get("UVM_H2D")
    migrations = (f"; plus {uvm.count:,} unified-memory migrations host to device ({uvm.bytes / 2**20:,.1f} MiB in "
                  f"{ms(uvm.time_ns)})" if uvm else "")
    if "H2D" not in rows:
        return f"no host-to-device copies in the window{migrations}", {"count": 0, "bytes": 0}
    r = rows["H2D"]
    evidence = {"count": r.count, "bytes": r.bytes, **({"uvm_count": uvm.count, "uvm_bytes": uvm.bytes} if uvm else {})}
    return (f"{r.count:,} H2D copies, {r.bytes / 2**20:,.1f} MiB in {ms(r.time_ns)} ({r.window_pct:.1f}% of the "
            f"window), {r.exposed_pct:.0f}% of it with no kernel running{migrations}", evidence)


def _peak_memory(e: Evidence) -> Answer:
    peaks = [(d, d.peak_memory_bytes) for d in e.summary.devices if d.peak_memory_bytes is not None]
    if not peaks:
        return None
    parts = [f"device {d.device}: peak {peak / 2**30:,.2f} GiB"
             + (f" of {d.memory_bytes / 2**30:,.1f} GiB ({pct(peak, d.memory_bytes):.1f}%)"
                if d.memory_bytes else "") for d, peak in peaks]
    return ("; ".join(parts) + " (allocations made inside the capture only)",
            {"peak_bytes": {d.device: peak for d, peak in peaks}})


def _pinned(e: Evidence) -> Answer:
    m = e.tool("memory_transfers", memory_transfers.Result)
    rows = [r for r in m.rows if r.direction == "H2D"] if m else []
    if not rows:
        return None
    r, steps = rows[0], e.steps_in_window()
    share = pct(r.pinned_bytes, r.bytes)
    per_step = f", {r.pageable_count / steps:.1f} pageable copies per iteration" if steps and r.pageable_count else ""
    verdict = "yes" if r.pageable_bytes == 0 else "mostly" if share >= MOSTLY_PINNED_PCT else "no"
    return (f"{verdict}: {share:.1f}% of H2D bytes come from pinned memory ({r.pageable_count} pageable copies, "
            f"{r.pageable_bytes / 2**20:,.1f} MiB{per_step})",
            {"pinned_bytes": r.pinned_bytes, "pageable_bytes": r.pageable_bytes, "pageable_count": r.pageable_count})


def _d2h(e: Evidence) -> Answer:
    m = e.tool("memory_transfers", memory_transfers.Result)
    if not m or not m.copy_count:
        return None
    reads = e.finding("blocking-d2h-sync")  # the same reads: SMALL_READ_BYTES, blocking by the same rules
    cost = sum(f.time_at_stake_ns for f in reads)
    calls = sum(int(f.evidence.get("calls", 0)) for f in reads)
    after = f" after {calls:,} of those reads" if reads else " after small read-backs"
    return (f"{m.small_d2h_count:,} small D2H copies (<= {SMALL_READ_BYTES:,} bytes: values, not data), "
            f"{m.small_d2h_blocking:,} of them blocking the host; the devices idle {ms(cost)}{after}",
            {"small_d2h": m.small_d2h_count, "small_d2h_blocking": m.small_d2h_blocking, "readback_idle_ns": cost,
             "readback_calls": calls})


def _nccl(field: Callable[[Any], Answer]) -> Callable[[Evidence], Answer]:
    def answer(e: Evidence) -> Answer:
        nccl = e.tool("nccl_breakdown", nccl_breakdown.Result)
        if nccl is None:
            return None
        if not nccl.has_nccl:
            return "no NCCL kernels in this profile", {}
        return field(nccl)
    return answer


def _nccl_balance(n: Any) -> Answer:
    a = n.arrival
    if a is None or not a.matched:
        return None
    return f"{a.verdict} (median skew {ms(a.median_skew_ns)} over {a.matched} collectives)", {
        "straggler_device": a.straggler_device, "median_skew_ns": a.median_skew_ns}


def _hot_thread(e: Evidence) -> Answer:
    try:  # decided before running the tool: traced API time is not time on a CPU, so it cannot answer
        if thread_utilization.basis(e.con) == "cuda_api":
            return None
    except InvalidRequest:
        return None
    t = e.tool("thread_utilization", thread_utilization.Result)
    if not t or not t.rows:
        return None
    r = t.rows[0]
    figures = {"busy_pct": r.busy_pct, "net_busy_pct": r.net_busy_pct}
    busiest = f"the busiest, {r.name or r.tid}, is busy {r.busy_pct:.1f}% of the window"
    if r.busy_pct <= HOT_THREAD_PCT:
        return f"no: {busiest}", figures
    if r.net_busy_pct > HOT_THREAD_PCT:
        return f"yes: {busiest}, {r.net_busy_pct:.1f}% outside blocking CUDA calls: work of its own on the CPU", figures
    return (f"yes: {busiest}, but {r.busy_pct - r.net_busy_pct:.1f} points of it inside blocking CUDA calls "
            "(synchronizes, synchronous or pageable copies, which keep it on a CPU while it waits or stages data) "
            f"and {r.net_busy_pct:.1f}% outside them: it mostly waits on the GPU or copies, it is not short of CPU",
            figures)


def _gc(e: Evidence) -> Answer:
    p = e.triage.program
    if p.language == "unknown":
        return None  # nothing says which language drives the GPU
    if p.language != "python":
        return f"not a Python program ({p.kind}, {p.language} host code): no Python collector", {}
    if "python" not in p.fix_chain:
        return f"a Python program whose GPU work is {p.kind}'s: its collector pauses are not looked for", {}
    found = e.finding("gc-pauses")
    if found:
        return f"likely: {found[0].title}", {"gc_like_ns": sum(f.time_at_stake_ns for f in found)}
    return "no periodic idle gaps with the host outside CUDA calls", {}


def _first_iteration(e: Evidence) -> Answer:
    it = e.tool("iterations", iterations.Result, window_scoped=False)
    if not it or it.iteration_count < iterations.MIN_ITERATIONS:
        return None
    return (f"first {ms(it.first_ns)}, {it.first_vs_steady}x the steady median {ms(it.steady_median_ns)}",
            {"first_vs_steady": it.first_vs_steady})


def _device_sync(e: Evidence) -> Answer:
    if not e.summary.table_rows.get("cuda_api"):
        return None
    s = e.device_syncs()
    n = s.count
    return ((f"yes: {n:,} device-wide synchronize calls blocking the host {ms(s.blocked_ns)}"
             if n else "no device-wide synchronize calls in the window"), {"count": n})


def _compile(e: Evidence) -> Answer:
    p = e.triage.program
    if p.kind != "pytorch":
        return f"not a PyTorch program ({p.kind})", {}
    if "Triton" not in p.frameworks:
        return "no Triton kernels: eager mode", {"triton": False}
    cost = sum(f.time_at_stake_ns for f in e.finding("torch-compile-recompilation"))
    return f"yes (Triton kernels run); compiling inside the analysed window costs {ms(cost)} of device idle", {
        "triton": True, "compile_idle_ns": cost}


def _bound(e: Evidence) -> Answer:
    c = e.triage.classification
    if c.bound == "no GPU activity":
        return None
    return f"{c.bound}: {c.reason}", c.model_dump(exclude={"bound", "reason"})


def _expected(e: Evidence) -> Answer:
    """From the costliest finding inside the window: a warmup finding's time lies outside it and speeds no step."""
    inside = [f for f in e.triage.findings if f.root_cause != "profiler-window-on-warmup"]
    if not inside:
        return None
    f, w = inside[0], e.window
    return (f"at most {ms(f.time_at_stake_ns)} of device {f.device}'s {ms(w.duration_ns)} window "
            f"({pct(f.time_at_stake_ns, w.duration_ns):.1f}%) from the costliest finding inside it ({f.root_cause}): "
            "an upper bound", {"time_at_stake_ns": f.time_at_stake_ns, "window_ns": w.duration_ns})


def _enough_iterations(e: Evidence) -> Answer:
    it = e.tool("iterations", iterations.Result, window_scoped=False)
    if not it or not it.iteration_count:
        return None
    enough = it.iteration_count >= iterations.MIN_ITERATIONS
    even = it.spread_ratio is not None and it.spread_ratio < SPREAD_STEADY
    return (f"{it.iteration_count} iterations ({'enough' if enough else 'too few'}), p90/p10 spread "
            f"{it.spread_ratio} ({'even' if even else 'uneven'})", {"iterations": it.iteration_count})


ANSWERERS: dict[str, Callable[[Evidence], Answer]] = {
    "q01-gpu-hardware": _hardware, "q02-gpu-count-parallelism": parallelism.answer, "q03-framework": _framework,
    "q05-profile-length": _length, "q06-warmup-or-steady": _warmup, "q07-gpu-utilization": _utilization,
    "q08-idle-gaps": _idle_gaps, "q09-idle-distribution": _idle_distribution, "q10-stream-balance": _streams,
    "q11-top-kernels": _top5, "q12-dominant-kernel": _dominant, "q13-small-kernels": _small,
    "q15-flashattention": _flash, "q16-h2d-volume": _h2d, "q17-pin-memory": _pinned, "q18-unexpected-d2h": _d2h,
    "q19-peak-memory": _peak_memory,
    "q20-nccl-share": _nccl(lambda n: (f"{n.window_pct:.1f}% of the window per device", {"window_pct": n.window_pct})),
    "q21-nccl-overlap": _nccl(lambda n: (f"{n.overlapped_pct:.1f}% of NCCL time overlaps compute; "
                                         f"{ms(n.exposed_ns)} exposed", {"overlapped_pct": n.overlapped_pct})),
    "q22-dominant-collective": _nccl(lambda n: ("; ".join(f"{r.collective} x{r.count:,} {ms(r.total_ns)}"
                                                          for r in n.rows[:3]), {"rows": len(n.rows)})),
    "q23-rank-balance": _nccl(_nccl_balance), "q25-hot-cpu-thread": _hot_thread, "q26-gc-pauses": _gc,
    "q27-slow-first-iteration": _first_iteration, "q28-device-synchronize": _device_sync, "q29-torch-compile": _compile,
    "q30-bound-type": _bound, "q35-expected-speedup": _expected, "meta-enough-iterations": _enough_iterations,
    "meta-right-workload": _warmup,
}
