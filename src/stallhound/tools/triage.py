"""Why is this GPU job slow? Every detector on one window, findings ranked by the device time they cost, with
the fix that fits the program.

Window: with window='auto', the steady state when iterations are found (the iterations tool's steps, of
`range_name` when given; step_method says how they were found; from the first steady iteration to the end of
the last; what it leaves out before it is said part by part, by its evidence (analysis/lead_in.py: work still
running whose launches the trace lacks, the time before the first iteration, a warmup first iteration); irregular
steps only when named like steps and more GPU-active time precedes them than they span), else the GPU-active
window; start_ns/end_ns override it. Every detector runs on that window and devices. time at stake is device
time in the window that the fix could recover, per device; causes never share nanoseconds, so a device's
findings add up to at most the window (the warmup findings count time outside it: the first iteration's
excess, and compilation before the first iteration when it outlasts the window).
The fix shown is the book's first fix for the detected program's family (analysis/program.py), or generic.
The run is classified by analysis/shares.py; with no or too little GPU activity to classify, only the findings of
GPU code compiled or loaded inside the window for 1 ms or more stay (ANY_GPU_SHARE, or one-time setup that loads
code: they may be why the GPU did so little).
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Annotated, Literal

import duckdb
from pydantic import Field

from stallhound import book
from stallhound.analysis import attribution, lead_in, program, rules, shares, trace_quality, where
from stallhound.analysis.common import (
    Finding,
    Output,
    Scope,
    ScopedParams,
    as_result,
    leads_first,
    more_rows,
    ms,
    resolve_scope,
    run_once,
    stake_said,
)
from stallhound.analysis.contracts import TRIAGED
from stallhound.analysis.program import Program
from stallhound.analysis.shares import Classification
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest
from stallhound.tools import declared, detectors, iterations

DIAGNOSIS_DATA = ("kernels", "memcpy", "cuda_api", "nvtx", "os_runtime", "cpu_samples", "sched", "gpu_info")  # what
# the detectors read: a capture without it says less (CUDA graphs, memory usage, UVM faults are optional)
MAX_FINDINGS = 100  # every finding cites a book entry; past this a model's context is the limit
ANY_GPU_SHARE = {"module-loading-hot-path", "torch-compile-recompilation"}  # compiling or loading GPU code inside
# the window is a finding however little GPU work there is: it may be why there is so little
ANY_GPU_SHARE_MIN_NS = 1_000_000  # ... once it costs 1 ms: in a one-shot run's short window less is noise
BOOK_NCU = re.compile(r"`ncu [^`]*`")  # a kernel-profiler command in a book fix, in backticks
SETUP_OVER_LOOP = 1.0  # irregular steps still bound the loop when more GPU-active time precedes them than they
# span: a window over both would describe the setup (compilation, loading), not the loop; and compiling before
# the loop for longer than the window lasts makes the capture mostly one-time warmup


class Params(ScopedParams):
    window: Annotated[Literal["auto", "gpu_active", "capture"], Field(
        description="auto: steady-state iterations when found, else GPU-active; ignored with start_ns/end_ns")] = "auto"
    range_name: Annotated[str | None, Field(
        description=f"{iterations.RANGE_NAME}; the steps that bound window 'auto'")] = None
    limit: Annotated[int, Field(description="Most findings returned, costliest first; the rest are counted in "
                                            "total_findings", ge=1, le=MAX_FINDINGS)] = 10


class CitedFinding(Finding):
    source_tool: str = Field(description="the tool whose detector raised it")
    book_uri: str
    book_title: str
    fix: str = Field(description="the book's first fix for this program's family (fix_for), else the generic one")
    fix_for: str = Field(description="the fix family used: pytorch, python, cuda, offload or generic")
    verify: str = Field(description="how to confirm the fix, from the book entry")


class RankedFinding(CitedFinding):
    rank: int


class Result(Output):
    profile: str
    program: Program
    quality: list[str] = Field(description="problems of the trace itself (profile_summary), read these first")
    window: Scope | None = Field(description="the analysed window; null when the export has no timed events")
    window_note: str = Field(description="how the window was chosen and what it leaves out")
    step_method: str | None = Field(None, description="how iterations found the steps window 'auto' looked at "
                                                      "('nvtx:<range>', 'graph:<call>', 'kernel_pattern:<kernel>'); "
                                                      "null when none were found or the window was asked for")
    classification: Classification
    findings: list[RankedFinding] = Field(description="at most `limit`, ranked by time at stake")
    total_findings: int = Field(description="findings before the limit")
    truncated: bool
    time_at_stake_ns: int = Field(description="sum over all findings (each device's share <= its window)")
    missing: list[rules.Missing] = Field(description="what the profile cannot tell, and the capture option that "
                                                     "records it")
    skipped: list[str] = Field(description="detectors that could not run on this profile, with why")
    where_note: str | None = Field(None, description="why findings about host events name no call site (the profile "
                                                     "has no stacks, or none on their events), with the capture "
                                                     "that records them; said once here, not per finding")


def _window(con: duckdb.DuckDBPyConnection, params: Params) -> tuple[Scope, str, list[Finding], str | None]:
    """The analysis window, how it was chosen (by the warmup detector, tools.declared("warmup"), on the steps of
    params.range_name when given), the warmup findings found on the way, and the step method."""
    if params.start_ns is not None or params.end_ns is not None or params.window != "auto":
        default: Literal["capture", "gpu_active"] = "capture" if params.window == "capture" else "gpu_active"
        scope = resolve_scope(con, params, default=default)
        return scope, f"{scope.window_basis} window, as asked", [], None
    gpu = resolve_scope(con, params, default="gpu_active")
    warmup = declared("warmup")
    found = as_result(run_once(con, warmup, warmup.Params(profile=params.profile, device=params.device,
                                                          range_name=params.range_name)), warmup.Result)
    steady, how = warmup.steady_window(found), "steady state"
    if steady is None and found.span_start_ns is not None and warmup.step_named(found) and (
            found.span_start_ns - gpu.start_ns > SETUP_OVER_LOOP * (found.span_end_ns - found.span_start_ns)):
        steady = warmup.steady_window(found, irregular_ok=True)
        how = (f"the loop (steps irregular, p90/p10 = {found.spread_ratio}, but more GPU-active time precedes "
               "them than they span)")
    if steady is None:
        why = found.note or "no steady iterations"
        return gpu, f"GPU-active window ({why})", [], found.method
    scope = gpu.model_copy(update={"start_ns": steady[0], "end_ns": steady[1], "duration_ns": steady[1] - steady[0],
                                   "window_basis": "steady_state"})
    unit = "step" if warmup.marked_steps(found) else "iteration"
    counted = f"{found.iteration_count} {unit}" + ("s" if found.iteration_count != 1 else "")
    assert found.span_start_ns is not None  # set whenever there is a steady window
    left = lead_in.left_out(con, gpu.devices, gpu.start_ns, found.span_start_ns, steady[0], unit,
                            found.first_vs_steady)
    note = f"{how}: {counted} by {found.method}; {left}{lead_in.left_after(con, gpu.devices, steady[1], gpu.end_ns)}"
    return scope, note, found.findings + _setup_compile(con, gpu, scope, found.span_start_ns), found.method


def _setup_compile(con: duckdb.DuckDBPyConnection, gpu: Scope, scope: Scope, loop_start_ns: int) -> list[Finding]:
    """profiler-window-on-warmup per device that idles, before the first iteration, longer waiting on code
    compilation or module loading than the window lasts: the capture is mostly one-time warmup."""
    if loop_start_ns - gpu.start_ns < SETUP_OVER_LOOP * scope.duration_ns:
        return []
    setup = gpu.model_copy(update={"end_ns": loop_start_ns, "duration_ns": loop_start_ns - gpu.start_ns})
    return [Finding(
        root_cause="profiler-window-on-warmup", severity="high",
        title=f"before its first iteration, device {d.device} idles {ms(d.ns('jit'))} while the host compiles or loads "
              f"GPU code ({d.causes['jit'].gaps} gaps), longer than the {ms(scope.duration_ns)} window: the capture "
              "is mostly one-time warmup",
        evidence={"setup_ns": setup.duration_ns, "setup_jit_ns": d.ns("jit"), "window_ns": scope.duration_ns},
        time_at_stake_ns=d.ns("jit"), device=d.device, tags=["setup-compile"])
        for d in attribution.attribute(con, setup).devices.values()
        if d.ns("jit") >= SETUP_OVER_LOOP * scope.duration_ns]


def fitted(fix: str, evidence: dict) -> str:
    """The fix with the book's kernel-profiler command, written for any kernel (`ncu --kernel-name regex:<name>
    --launch-skip 10 --launch-count 3 ...`), replaced by the finding's own where it has one (evidence `ncu`,
    hotspots.ncu_command: the kernel's name, on the profiled command, skipping warmup launches only where the kernel
    has more): a kernel launched once has no 10 launches to skip."""
    own = evidence.get("ncu")
    return BOOK_NCU.sub(lambda _: f"`{own}`", fix) if isinstance(own, str) else fix


def citation(finding: Finding, tool: str, chain: tuple[str, ...], context: tuple[str, ...] = ()) -> dict:
    """The book's fields of a CitedFinding: its entry, and the fix for the first family of `chain` it has, fitted to
    the trace's `context` (fix_context.tags)."""
    entry = book.get_entry(finding.root_cause)
    fix = entry.fix_for(chain, finding.tags, context)
    return {**finding.model_dump(include=set(Finding.model_fields)), "source_tool": tool,
            "book_uri": book.entry_uri(entry.id), "book_title": entry.title,
            "fix": fitted(fix.text, finding.evidence), "fix_for": fix.family,
            "verify": entry.verify_for(finding.tags)}


def cited_lines(finding: CitedFinding, explained: set[str]) -> list[str]:
    """A finding's where (when it has one), cause, fix and verify lines; a cause already explained above (in
    `explained`) only named."""
    placed = [f"   where: {finding.where.text}"] if finding.where else []
    if finding.root_cause in explained:
        return [*placed, f"   cause: {finding.root_cause} (see above)"]
    explained.add(finding.root_cause)
    return [*placed, f"   cause: {finding.book_title} <{finding.book_uri}>",
            f"   fix ({finding.fix_for}): {finding.fix}", f"   verify: {finding.verify}"]


def _rank(found: list[tuple[str, Finding]], chain: tuple[str, ...], context: tuple[str, ...],
          limit: int) -> list[RankedFinding]:
    return [RankedFinding(**citation(f, tool, chain, context), rank=i)
            for i, (tool, f) in enumerate(leads_first(found, lambda tf: tf[1], limit), start=1)]


def _placed(con: duckdb.DuckDBPyConnection, scope: Scope, ranked: list[RankedFinding]) -> list[RankedFinding]:
    """The ranked findings with where in the program their host events were made (analysis/where.py); a profile
    without stacks costs one probe."""
    if not where.has_stacks(con):
        return ranked
    return [f.model_copy(update={"where": where.locate(con, scope, f)}) for f in ranked]


def _nothing(params: Params, prog: Program, quality: list[str], missing: list[rules.Missing],
             capture: str) -> Result:
    """The result for an export without a single timed event: nothing to analyse, said plainly; `capture` says
    what to record."""
    why = ("the export holds no timed events at all (no GPU activity, no CPU or API trace): re-capture with "
           f"{capture} around the workload")
    empty = Classification(bound="no GPU activity", compute_pct=0, copy_kernel_pct=0, transfer_pct=0,
                           communication_pct=0, busy_pct=0, idle_pct=0, overlap_pct=0, gpu_ops=0, reason=why)
    return Result(profile=params.profile, program=prog, quality=quality, window=None, window_note="none",
                  classification=empty, findings=[], total_findings=0, truncated=False, time_at_stake_ns=0,
                  missing=missing, skipped=[])


def _gathered(con: duckdb.DuckDBPyConnection, params: Params, scope: Scope, warmup: list[Finding]
              ) -> tuple[list[tuple[str, Finding]], list[str]]:
    """(detector, finding) of every detector in its declared order, and the detectors that could not run, with why."""
    found: list[tuple[str, Finding]] = []
    skipped: list[str] = []
    for name, module, role in detectors(*TRIAGED):
        if role.how == "warmup":
            found += [(name, f) for f in warmup]
        elif role.how == "idle":
            in_loop = scope.window_basis == "steady_state"
            found += [(name, f) for f in module.window_findings(con, scope, params.device, in_loop)]
        else:
            try:
                found += [(name, f) for f in _window_findings(con, module, params, scope)]
            except InvalidRequest as exc:
                skipped.append(f"{name}: {exc}")
    return found, skipped


def _window_findings(con: duckdb.DuckDBPyConnection, module: ModuleType, params: Params, scope: Scope
                     ) -> list[Finding]:
    """A window detector's findings on triage's window and devices."""
    result = run_once(con, module, module.Params(profile=params.profile, device=params.device,
                                                 start_ns=scope.start_ns, end_ns=scope.end_ns))
    return as_result(result, module.Result).findings


def _loads_code(finding: Finding) -> bool:
    """A finding of GPU code compiled or loaded inside the window for ANY_GPU_SHARE_MIN_NS or more: its own root cause,
    or one-time setup (idle_causes) whose loading part is that long."""
    loading_ns = (int(finding.evidence.get("loading_ns", 0)) if finding.root_cause == "profiler-window-on-warmup"
                  else finding.time_at_stake_ns if finding.root_cause in ANY_GPU_SHARE else 0)
    return loading_ns >= ANY_GPU_SHARE_MIN_NS


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    prog = program.detect(con)
    chain = tuple(prog.fix_chain)
    quality = trace_quality.of_model(con)  # profile_summary's trace_quality, without the rest of the summary
    unset = one_row(con.execute("SELECT capture_start_ns IS NULL FROM meta"))
    if unset[0]:
        return _nothing(params, prog, quality, rules.missing(con, DIAGNOSIS_DATA), remedy(con, ('kernels', 'nvtx')))
    scope, note, warmup, step_method = _window(con, params)
    found, skipped = _gathered(con, params, scope, warmup)
    classification = shares.classify(con, scope, {f.root_cause for _, f in found})
    if classification.bound in ("no GPU activity", "too little GPU activity"):
        found = [tf for tf in found if _loads_code(tf[1])]
    foreign = [(t, f) for t, f in found if not book.get_entry(f.root_cause).applies(chain)]
    skipped += [f"{t}: {f.root_cause} does not occur in {prog.kind} programs" for t, f in foreign]
    found = [tf for tf in found if tf not in foreign]
    missing = rules.missing(con, DIAGNOSIS_DATA)
    ranked = _placed(con, scope, _rank(found, chain, tuple(prog.fix_context), params.limit))
    return Result(profile=params.profile, program=prog, quality=quality, window=scope, window_note=note,
                  classification=classification, step_method=step_method, findings=ranked, total_findings=len(found),
                  truncated=len(found) > len(ranked), time_at_stake_ns=sum(f.time_at_stake_ns for _, f in found),
                  missing=missing, skipped=skipped, where_note=where.note(con, ranked))


def _lacking(missing: list[rules.Missing], quoted: str) -> str:
    """The data the profile lacks, those that one capture would record named together before it."""
    by_flag: dict[str, list[str]] = {}
    for m in missing:
        by_flag.setdefault(m.capture_flag, []).append(m.data)
    return "; ".join(f"{', '.join(data)} ({quoted.format(flag)})" for flag, data in by_flag.items())


def render(result: Result) -> str:
    c = result.classification
    p = result.program
    lines = [f"trace: {q}" for q in result.quality]
    lines += [f"{c.bound}: {c.reason}", shares.shares_line(c),
             (f"window: {ms(result.window.duration_ns)} on device(s) {result.window.devices}, {result.window_note}"
              if result.window else f"window: none ({result.window_note})"),
             f"program: {p.kind} ({p.decided_by}); fixes for {p.fix_chain[0]}"
             + (" on ROCm (an AMD GPU ran the work)" if "amd" in p.fix_context else ""), ""]
    if not result.findings:
        lines.append("Nothing to diagnose." if c.bound in ("no GPU activity", "too little GPU activity")
                     else "No detector fired: nothing above its threshold.")
    explained: set[str] = set()
    for f in result.findings:
        lines.append(f"{f.rank}. [{f.severity}] {f.title}{stake_said(f.time_at_stake_ns)}")
        lines += cited_lines(f, explained)
    if result.truncated:
        lines.extend(more_rows(result, result.total_findings - len(result.findings), "findings"))
    if result.where_note:
        lines += ["", f"Call sites: {result.where_note}"]
    if result.missing:
        lines += ["", "Not in this profile: " + _lacking(result.missing, "{}")]
    return "\n".join(lines)


def _share_table(c: Classification) -> list[str]:
    if c.shares_basis == "not recorded":
        return [shares.shares_line(c).strip() + "."]
    return ["| share | % |", "|---|---|", f"| compute | {c.compute_pct:.1f} |", f"| transfer | {c.transfer_pct:.1f} |",
            f"| communication{shares.families_note(c)} | {c.communication_pct:.1f} |", f"| idle | {c.idle_pct:.1f} |"]


def render_markdown(result: Result) -> str:
    c = result.classification
    quality = [f"> trace: {q}" for q in result.quality] + ([""] if result.quality else [])
    lines = ["## stallhound triage", "", *quality, f"**{c.bound}**: {c.reason}", "",
             f"Program: {result.program.kind}. Window: "
             f"{ms(result.window.duration_ns) + ', ' if result.window else ''}{result.window_note}.", "",
             *_share_table(c), ""]
    if result.findings:
        lines += ["| # | severity | finding | at stake | root cause | fix |", "|---|---|---|---|---|---|"]
        for f in result.findings:
            fix = f.fix.replace("|", "\\|")
            placed = f"<br>where: {f.where.text}" if f.where else ""
            lines.append(f"| {f.rank} | {f.severity} | {(f.title + placed).replace('|', '/')} | "
                         f"{ms(f.time_at_stake_ns)} | [{f.root_cause}]({f.book_uri}) | {fix} |")
    if result.truncated:
        lines += ["", f"{result.total_findings - len(result.findings)} smaller findings not shown."]
    if result.where_note:
        lines += ["", f"**Call sites:** {result.where_note}"]
    if result.missing:
        lines += ["", "**Not in this profile:** " + _lacking(result.missing, "`{}`")]
    return "\n".join(lines)
