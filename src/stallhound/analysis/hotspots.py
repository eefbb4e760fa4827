"""What a kernel that takes much of the window should be told: whether the trace can show it runs below what the GPU
can do, and what to measure when it cannot. Findings from top_kernels' hot rows and the launch fill of their kernels
(analysis/launch_fill.py).

- undersized-grid, per device and kernel: launches with fewer blocks than the device has SMs leave SMs idle for
  their whole run; time at stake = their idle_sm_ns (duration x (1 - SMs used / SMs)), the most spreading the work
  over every SM could save: an upper bound, worded as such, never more than the kernel's time. The time its launches
  wait on unified-memory pages the driver migrates (migrating_ns) is left out and said: the kernel waits on pages,
  not SMs, and unified-memory-migration claims that time. Fires when that is worth reporting (rules.MIN_STAKE_PCT
  of the window); severity by its share of the window.
- kernel-hotspot, per hot row: a runtime's helper kernel (kind 'runtime') is named as such, not as the program's
  compute. Any other kernel gets its launch configuration, its theoretical occupancy and an honest statement: a
  timeline holds no FLOP or byte counts, so whether the kernel runs near the GPU's limits cannot be told without a
  kernel profiler (Nsight Compute; on AMD the ROCm Compute Profiler: analysis/vendor.py), whose command for this
  kernel the finding gives; its tags are its kind and those that fit the book's fix to the program (fit_tags: the
  optimizer's fix only where the trace shows training, NVIDIA's hardware advice never on AMD). A kernel with an
  undersized-grid finding gets no second finding. Where the launch shape of the program's own kernel (not a library's:
  kernel_kinds.library_of) alone leaves much of the GPU unused whatever the code does (launch_shape: warps partly
  empty, blocks so small the SM's block slots cap its occupancy, or a grid whose waves leave TAIL_WASTE_PCT of their
  block slots idle, with registers capping occupancy at LOW_OCCUPANCY_PCT or less named as its cause), the statement
  says so and its fix is the launch's (tag launch-shape). Time at stake = what that launch shape can be shown to lose
  (launch_loss): its main configuration's time x (1 - used lanes x used block slots of its waves), the empty lanes
  and the empty tail it names, derived in the text as an upper bound (a kernel memory bandwidth limits loses less),
  never more than the hot row's time or the window; a low occupancy alone bounds nothing (it slows only a kernel
  latency limits): 0, and the text says the timeline cannot tell. Severity by that time where it is worth reporting
  (rules.severity); else by its share of the window and the evidence of under-use, never high: medium when it takes
  most of the window (DOMINANT_WINDOW_PCT), or a tenth of it (rules.HIGH_STAKE_PCT) with launches that leave most of
  the GPU unused (occupancy at most LOW_OCCUPANCY_PCT, warps partly empty, or fewer blocks than SMs), else info.
- A hot row of the program's tiny kernels (their mean run under rules.TINY_KERNEL_NS) whose statement bounds nothing
  and holds little of the window (info) is no finding: such kernels run for less than their launch costs, so their
  time is their launches' (small-kernel-overhead's), not their code's, and a kernel profiler has nothing to tune.
- One finding per thing: the kernels of one short name on a device (template instantiations) are one undersized-grid
  finding, their figures summed; a device's hot kernels are one kernel-hotspot finding, most time first, their times
  at stake summed (at most the window; a runtime's helper kernels apart).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass

from stallhound.analysis import rules
from stallhound.analysis.common import RANK_KEY, Finding, Severity, counted, ms, pct
from stallhound.analysis.kernel_kinds import NAME_CHARS, library_of
from stallhound.analysis.launch_fill import KernelFill, LaunchFill
from stallhound.analysis.vendor import AMD, NVIDIA, Vendor

DOMINANT_WINDOW_PCT = 50.0  # a kernel running over half the window is the step: its efficiency is the question
LOW_OCCUPANCY_PCT = 25.0  # a quarter of the SM's warp slots or fewer leaves little to hide memory latency with
PROGRAM_CHARS = 120  # a recorded command line longer than this is shown as <program>
REPORT_CHARS = 40  # a report name longer than this is cut, and a hash of the whole name keeps it unique
REPORT_HASH_CHARS = 8  # hex digits of that hash: a clash among a profile's kernels is one in four billion
NCU_SKIP = 10  # launches of a configuration launched more often to skip before the one measured: their warmup
TILED_KINDS = {"gemm-tensor", "gemm-fp32", "gemm", "attention", "conv"}  # library kernels built on large register
# tiles: a low occupancy is their design, not a sign of under-use
TAIL_WASTE_PCT = 20.0  # a grid whose waves leave fewer of their block slots empty than this loses little to its last,
# partial wave (a grid of more than five waves never reaches it)
CUTLASS_TEMPLATE = re.compile(r"cutlass::gemm::(kernel|device)::")  # CUTLASS's templates instantiated in the
# program's own code; cuBLAS's CUTLASS kernels carry generated names (cutlass_80_tensorop_...): theirs to tune
NOT_THE_PROGRAMS = {"runtime", "nccl"}  # a runtime's helpers, communication: their grids are not the program's choice


@dataclass(frozen=True)
class Hot:
    """A hot row of top_kernels: its kernel (demangled and short name), kind and shares."""
    display_name: str
    name: str
    short_name: str
    kind: str
    kernel_time_pct: float
    window_pct: float
    total_ns: int
    count: int
    device: int | None
    by_short_name: bool  # the row holds every kernel of its short name (else one demangled name, cut at NAME_CHARS)

    def holds(self, k: KernelFill) -> bool:
        return k.short_name == self.short_name if self.by_short_name else k.name[:NAME_CHARS] == self.name


def report_name(short_name: str) -> str:
    """A name for the profiler's report: the kernel's short name, or where longer than REPORT_CHARS its start and a
    hash of the whole (two kernels whose names share a long start never write one report)."""
    if len(short_name) <= REPORT_CHARS:
        return short_name
    digest = hashlib.sha1(short_name.encode()).hexdigest()[:REPORT_HASH_CHARS]
    return f"{short_name[:REPORT_CHARS - REPORT_HASH_CHARS - 1]}-{digest}"


def ncu_command(short_name: str, fill: LaunchFill | None, command: str | None, vendor: Vendor = NVIDIA) -> str:
    """The command that measures the kernel on the profiled command when recorded. NVIDIA: Nsight Compute on one
    launch of this configuration, skipping to it (and past NCU_SKIP of its launches' warmup when it has more). AMD:
    the ROCm Compute Profiler on the kernels whose name holds it (its -k filter matches a substring)."""
    program = command if command and len(command) <= PROGRAM_CHARS else "<program>"
    report, kernel = shlex.quote(report_name(short_name)), shlex.quote(short_name)
    if vendor == AMD:
        return f"rocprof-compute profile -n {report} -k {kernel} -- {program}"
    skip = ((fill.launches_before or 0) + (NCU_SKIP if fill.count > NCU_SKIP else 0)) if fill else 0
    return f"ncu --kernel-name {kernel} --launch-skip {skip} --launch-count 1 --set full -o {report} {program}"


def _blocks(f: LaunchFill) -> str:
    return f"{counted(f.blocks, 'block')} of {f.threads_per_block} threads"


def _resources(f: LaunchFill) -> str:
    """Registers, shared memory, used lanes and theoretical occupancy of a launch configuration."""
    parts = [f"{f.registers_per_thread} registers/thread"] if f.registers_per_thread else []
    parts += [f"{f.shared_bytes_per_block:,} B shared/block"] if f.shared_bytes_per_block else []
    parts += [f"{f.lanes_pct:.0f}% of each {f.warp_word}'s lanes used"] if f.lanes_pct < 100 else []
    if f.occupancy_pct is not None:
        parts.append(f"theoretical occupancy {f.occupancy_pct:.0f}% (limited by {f.limited_by})")
    return ", ".join(parts)


def _shape(f: LaunchFill) -> str:
    resources = _resources(f)
    return _blocks(f) + (f", {resources}" if resources else "")


def _under_used(k: KernelFill) -> bool:
    """Evidence in the main launch configuration that it leaves most of the GPU unused: partly empty warps, fewer
    blocks than SMs, or (for the program's own kernels: library GEMM, attention and convolution kernels run few,
    register-heavy warps by design) a low theoretical occupancy."""
    f = k.main
    return _low(k) or f.lanes_pct < 100 or bool(f.sm_count and f.blocks < f.sm_count)


def launch_shape(k: KernelFill) -> list[str]:
    """What in the main launch configuration of the program's own kernel leaves the GPU unused whatever its code does
    (empty: nothing, or a library's kernel, whose launch the library chooses). A register cap counts only where the
    grid's waves leave slots idle: over many full waves a low occupancy may be the code's design."""
    f, parts = k.main, []
    if library_of(k.name, k.short_name):
        return []
    if f.lanes_pct < 100:
        parts.append(f"{f.threads_per_block} threads per block fill {f.lanes_pct:.0f}% of each {f.warp_word}'s lanes "
                     f"({f.warp_size} wide)")
    if f.limited_by == "block slots" and f.occupancy_pct is not None and f.occupancy_pct < 100:
        parts.append(f"blocks this small hit the SM's limit of {f.blocks_per_sm} resident blocks: "
                     f"{f.occupancy_pct:.0f}% occupancy")
    idle = _idle_slots_pct(f)
    if f.limited_by == "registers" and _low(k) and idle >= TAIL_WASTE_PCT:
        parts.append(f"{f.registers_per_thread} registers per thread allow {counted(f.blocks_per_sm or 0, 'block')} "
                     f"per SM: {f.occupancy_pct:.0f}% occupancy")
    if (waves := _waves(f)) and idle >= TAIL_WASTE_PCT:
        parts.append(f"{f.blocks:,} blocks make {counted(waves.count, 'wave')} of {waves.slots:,} resident blocks, "
                     f"the last {pct(waves.last, waves.slots):.0f}% full")
    return parts


@dataclass(frozen=True)
class Waves:
    """A grid as waves of resident blocks: how many, the block slots of one (SMs x resident blocks per SM), and the
    blocks of the last."""
    count: int
    slots: int
    last: int


def _waves(f: LaunchFill) -> Waves | None:
    """The grid's waves, where it has a block for every SM and the export records the limits (fewer blocks than SMs
    are undersized-grid's)."""
    if not (f.sm_count and f.blocks_per_sm and f.blocks >= f.sm_count):
        return None
    slots = f.sm_count * f.blocks_per_sm
    count = -(-f.blocks // slots)
    return Waves(count=count, slots=slots, last=f.blocks - (count - 1) * slots)


def _last_wave(f: LaunchFill, waves: Waves) -> str:
    """'the last of 2 waves uses 12 of 28 SMs' (one resident block per SM), else its block slots."""
    used = (f"uses {waves.last:,} of {f.sm_count:,} SMs" if f.blocks_per_sm == 1 else
            f"fills {waves.last:,} of its {waves.slots:,} block slots ({f.blocks_per_sm} per SM on {f.sm_count} SMs)")
    return f"the last of {waves.count:,} waves {used}"


@dataclass(frozen=True)
class Loss:
    """The share of a launch configuration's time its launch shape can be shown to lose, and how (empty: none)."""
    share: float
    why: tuple[str, ...]


def launch_loss(k: KernelFill) -> Loss:
    """What the launch shape of the program's own kernel (launch_shape) bounds, from two wastes the trace shows:
    empty lanes (threads fill a share of each warp's lanes: the same threads in full warps issue that share of the
    warp instructions) and a tail wave (the grid's waves leave TAIL_WASTE_PCT or more of their block slots empty:
    blocks of equal work spread evenly over the slots end that much sooner), combined as 1 - used lanes x used slots.
    An upper bound on their cost: a kernel that memory bandwidth limits loses less. A low occupancy alone bounds
    nothing (it slows only a kernel that latency limits): no share."""
    f, why = k.main, []
    if not launch_shape(k):
        return Loss(0.0, ())
    lanes = f.threads_per_block / (-(-f.threads_per_block // f.warp_size) * f.warp_size)
    if lanes < 1:
        why.append(f"{100 - f.lanes_pct:.0f}% of each {f.warp_word}'s lanes hold no thread")
    slots_used = 1.0
    if (waves := _waves(f)) and _idle_slots_pct(f) >= TAIL_WASTE_PCT:
        slots_used = f.blocks / (waves.count * waves.slots)
        why.append(f"{_last_wave(f, waves)}, leaving {_idle_slots_pct(f):.0f}% of the waves' block slots empty")
    return Loss(1 - lanes * slots_used, tuple(why))


def _idle_slots_pct(f: LaunchFill) -> float:
    """The share of the resident-block slots of the grid's waves that its blocks leave empty (0 when the export
    records no limits)."""
    if not (f.sm_count and f.blocks_per_sm):
        return 0.0
    slots = -(-f.blocks // (f.sm_count * f.blocks_per_sm)) * f.sm_count * f.blocks_per_sm
    return pct(slots - f.blocks, slots)


def _low(k: KernelFill) -> bool:
    f = k.main
    return f.occupancy_pct is not None and f.occupancy_pct <= LOW_OCCUPANCY_PCT and k.kind not in TILED_KINDS


def by_short_name(kernels: list[KernelFill]) -> list[KernelFill]:
    """The kernels with fewer blocks than SMs, one per (device, short name): template instantiations of one kernel
    summed, the configurations of the one with the most time of them kept."""
    groups: dict[tuple[int, str], list[KernelFill]] = {}
    for k in kernels:
        if k.undersized is not None:
            groups.setdefault((k.device, k.short_name), []).append(k)
    out = []
    for group in groups.values():
        first = max(group, key=lambda k: k.undersized_ns)
        out.append(first.model_copy(update={key: sum(getattr(k, key) for k in group) for key in (
            "count", "total_ns", "idle_sm_ns", "migrating_ns", "undersized_ns", "undersized_launches")}))
    return out


def _waiting(k: KernelFill) -> str:
    """What of the launches' time is left out as waiting on unified-memory pages (empty: none)."""
    return (f"; for {ms(k.migrating_ns)} of that time unified-memory pages migrate on demand (the kernel waits on "
            "them, not on its SMs: the unified-memory finding's time, left out here)" if k.migrating_ns else "")


def undersized(kernels: list[KernelFill], window_ns: int, command: str | None, vendor: Vendor = NVIDIA
               ) -> list[Finding]:
    """undersized-grid per (device, kernel) whose launches with fewer blocks than SMs leave SM time worth reporting."""
    out = []
    for k in by_short_name(kernels):
        stake = min(k.idle_sm_ns, window_ns)
        if k.undersized is None or k.kind in NOT_THE_PROGRAMS or not rules.worth_reporting(stake, window_ns):
            continue
        f = k.undersized
        ncu = ncu_command(k.short_name, f, command, vendor)
        resources = _resources(f)
        launches = (f"{counted(f.count, 'launch')} of {_blocks(f)}" if f.count == k.undersized_launches else
                    f"{k.undersized_launches:,} launches of fewer blocks than {vendor.units}, most time in "
                    f"{_blocks(f)}")
        out.append(Finding(
            root_cause="undersized-grid", severity=rules.severity(stake, window_ns),
            title=f"{k.short_name} runs {ms(k.undersized_ns)} on device {k.device} in {launches}"
                  f"{f' ({resources})' if resources else ''}, on a GPU with {f.sm_count} {vendor.units}: "
                  f"{f.sms_used} of them {'gets' if f.sms_used == 1 else 'get'} work and the others idle{_waiting(k)}; "
                  f"spreading the work over all of them could save at most {ms(stake)} (an upper bound); measure it "
                  f"with {vendor.profiler}: `{ncu}`",
            evidence={"kernel": k.short_name, "blocks": f.blocks, "sm_count": f.sm_count,
                      "launches": k.undersized_launches, "kernel_ns": k.undersized_ns,
                      "threads_per_block": f.threads_per_block, "ncu": ncu,
                      **({"migrating_ns": k.migrating_ns} if k.migrating_ns else {}),
                      **({"occupancy_pct": f.occupancy_pct} if f.occupancy_pct is not None else {})},
            time_at_stake_ns=stake, device=k.device, tags=[]))
    return out


def _severity(hot: Hot, kernel: KernelFill | None, stake_ns: int, window_ns: int) -> Severity:
    """By the time at stake where its bound is worth reporting (rules.severity); else medium when it runs most of the
    window, or a tenth of it with its launch showing under-use, and info otherwise: never high with nothing bounded."""
    if rules.worth_reporting(stake_ns, window_ns):
        return rules.severity(stake_ns, window_ns)
    evidence = kernel is not None and _under_used(kernel)
    worth = hot.window_pct >= DOMINANT_WINDOW_PCT or (evidence and hot.window_pct >= rules.HIGH_STAKE_PCT)
    return "medium" if worth else "info"


def at_stake(hot: Hot, kernel: KernelFill, window_ns: int) -> tuple[int, str]:
    """The time at stake of a kernel whose launch shape wastes the GPU (launch_loss of its main configuration's time,
    never more than the hot row's time or the window) and the sentence that derives it, or says it cannot."""
    loss, f = launch_loss(kernel), kernel.main
    stake = min(round(f.total_ns * loss.share), hot.total_ns, window_ns)
    if not stake:
        return 0, ("; how much fixing it would save cannot be told from the timeline: a low occupancy slows a kernel "
                   "only where latency, not memory bandwidth, limits it")
    of = f"its {ms(f.total_ns)}" if f.total_ns == hot.total_ns else f"the {ms(f.total_ns)} of its launches so shaped"
    return stake, (f"; the waste the trace shows costs at most {ms(stake)} of {of} (an upper bound: "
                   f"{'; '.join(loss.why)}; less where memory bandwidth limits it)")


def ranked(window_pct: float, window_ns: int) -> dict[str, int]:
    """{RANK_KEY: ns} for kernels holding DOMINANT_WINDOW_PCT of the window or more: they are the program's time, so
    their finding ranks as one with a tenth of the window at stake (rules.HIGH_STAKE_PCT) would, whatever the trace
    can bound (common.leads_first): after costs the trace shows that large, before smaller ones."""
    return {RANK_KEY: round(window_ns * rules.HIGH_STAKE_PCT / 100)} if window_pct >= DOMINANT_WINDOW_PCT else {}


def fit_tags(kind: str, training: bool, vendor: Vendor, library: str | None, name: str = "") -> list[str]:
    """Tags that fit the book's fix to the program: a GEMM that no vendor library's names claim (a Triton or
    hand-written kernel: library tuning and precision flags do not reach it), a GEMM of CUTLASS's templates the
    program instantiates (CUTLASS_TEMPLATE: its template parameters are the program's to tune, not cuBLAS's
    heuristics), element-wise kernels in a program the trace shows training (an optimizer step or a backward pass:
    the optimizer's per-parameter kernels may be among them), and any kind on AMD (NVIDIA's hardware and libraries
    are foreign there)."""
    own_gemm = kind.startswith("gemm") and library is None
    cutlass = kind.startswith("gemm") and bool(CUTLASS_TEMPLATE.search(name))
    return (["gemm-own"] * own_gemm + ["gemm-cutlass"] * cutlass + [f"{kind}-training"] * (kind == "elementwise"
            and training) + [f"{kind}-amd"] * (vendor == AMD))


def statement(hot: Hot, kernels: list[KernelFill], window_ns: int, command: str | None, vendor: Vendor = NVIDIA,
              training: bool = False) -> Finding:
    """kernel-hotspot for a hot row: a runtime kernel named, any other kernel's launch figures, what its launch shape
    bounds (at_stake) and what measures it."""
    where = f" on device {hot.device}" if hot.device is not None else ""
    share = f"takes {hot.kernel_time_pct:.1f}% of kernel time and {hot.window_pct:.1f}% of the window{where}"
    mine = [k for k in kernels if hot.holds(k)]
    kernel = max(mine, key=lambda k: k.total_ns) if mine else None
    evidence = {"kernel_time_pct": hot.kernel_time_pct, "window_pct": hot.window_pct, "total_ns": hot.total_ns,
                "count": hot.count, "kind": hot.kind, "kernel": hot.display_name}
    if hot.kind == "runtime":
        return Finding(root_cause="kernel-hotspot", severity="info", time_at_stake_ns=0, device=hot.device,
                       title=f"{hot.display_name}, a helper kernel of the language runtime (it fills device memory), "
                             f"not the program's compute, {share}", evidence=evidence, tags=["runtime"])
    main = kernel.main if kernel else None
    ncu = ncu_command(hot.short_name, main, command, vendor)
    if main is not None and main.occupancy_pct is not None:
        evidence.update(occupancy_pct=main.occupancy_pct, limited_by=main.limited_by)
    waste = launch_shape(kernel) if kernel else []
    stake, bound = at_stake(hot, kernel, window_ns) if kernel and waste else (0, "")
    shape = (f"; its launch shape leaves much of the GPU unused whatever its code does ({'; '.join(waste)}): fix the "
             f"launch first{bound}" if waste else "")
    low = stake and main and (main.occupancy_pct or 100) < 100
    title = (f"{hot.display_name} ({hot.kind}) {share}{f' ({_shape(main)})' if main else ''}{shape}; the timeline "
             f"holds no FLOP or byte counts, so whether it runs near the GPU's limits"
             f"{', and what a higher occupancy would gain,' if low else ''} cannot be told without {vendor.profiler}: "
             f"`{ncu}`")
    return Finding(root_cause="kernel-hotspot", severity=_severity(hot, kernel, stake, window_ns), title=title,
                   evidence={**evidence, "ncu": ncu, **({"launch_loss_ns": stake} if stake else {}),
                             **ranked(hot.window_pct, window_ns)},
                   time_at_stake_ns=stake, device=hot.device,
                   tags=[hot.kind, *fit_tags(hot.kind, training, vendor, library_of(hot.name, hot.short_name),
                                             hot.name), *(["launch-shape"] if waste else [])])


SEVERITY_ORDER: tuple[Severity, ...] = ("info", "medium", "high")


def one_per_device(statements: list[Finding], window_ns: int) -> list[Finding]:
    """A device's kernel-hotspot statements as one finding, most time first (the order of the hot rows), their
    shares and times at stake summed (at most the window); a runtime's helper kernels apart (they are not the
    program's compute)."""
    groups: dict[tuple[int | None, bool], list[Finding]] = {}
    for f in statements:
        groups.setdefault((f.device, "runtime" in f.tags), []).append(f)
    return [group[0] if len(group) == 1 else _merged(group, window_ns) for group in groups.values()]


def _merged(group: list[Finding], window_ns: int) -> Finding:
    kernel_pct = round(sum(float(f.evidence["kernel_time_pct"]) for f in group), 1)
    window_pct = round(sum(float(f.evidence["window_pct"]) for f in group), 1)
    where = f" on device {group[0].device}" if group[0].device is not None else ""
    title = (f"{len(group)} kernels take {kernel_pct:.1f}% of kernel time and {window_pct:.1f}% of the window{where}: "
             + " | ".join(f"{i}) {f.title}" for i, f in enumerate(group, start=1)))
    tags = list(dict.fromkeys(t for f in group for t in f.tags))
    stake = min(sum(f.time_at_stake_ns for f in group), window_ns)
    return group[0].model_copy(update={
        "title": title, "tags": tags, "severity": max((f.severity for f in group), key=SEVERITY_ORDER.index),
        "time_at_stake_ns": stake,
        "evidence": {**group[0].evidence, "hot_kernels": len(group), "hot_kernel_time_pct": kernel_pct,
                     "hot_window_pct": window_pct, **({"launch_loss_ns": stake} if stake else {}),
                     **ranked(window_pct, window_ns)}})


def read(kernels: list[KernelFill], hot_names: set[str], window_ns: int) -> list[KernelFill]:
    """The kernels the findings read: those of the hot rows (by demangled name, cut, or short name), and those whose
    launches on fewer blocks than SMs leave SM time worth reporting idle."""
    return [k for k in kernels if {k.name[:NAME_CHARS], k.short_name} & hot_names or (
        k.kind not in NOT_THE_PROGRAMS and rules.worth_reporting(k.idle_sm_ns, window_ns))]


def findings(hot: list[Hot], kernels: list[KernelFill], window_ns: int, command: str | None,
             vendor: Vendor = NVIDIA, training: bool = False) -> list[Finding]:
    """undersized-grid findings, then the kernel-hotspot statements of the hot rows whose kernel has none, one per
    device."""
    grids = undersized(kernels, window_ns, command, vendor)
    named = {f.evidence["kernel"] for f in grids}
    said = [(h, statement(h, kernels, window_ns, command, vendor, training)) for h in hot if h.short_name not in named]
    return grids + one_per_device([f for h, f in said if not launch_bound(h, f)], window_ns)


def launch_bound(hot: Hot, said: Finding) -> bool:
    """The program's tiny kernels (mean run under rules.TINY_KERNEL_NS) whose statement is info (nothing bounded,
    little of the window): their time is their launches', which small-kernel-overhead covers; no kernel-hotspot
    finding. A runtime's helper kernels keep theirs: it says they are not the program's compute."""
    return said.severity == "info" and hot.kind != "runtime" and hot.total_ns < rules.TINY_KERNEL_NS * hot.count
