"""Which rank of a job is slow, and why: per-rank GPU time, step times, waits inside collectives, the straggler.

Input: a job connection, where every model table is a view with a leading `rank` column, plus `ranks`.

Per rank (its window: its own GPU-active span, gpu_start_ns..gpu_end_ns in its meta; capacity = window x the
devices it ran work on): compute_ns = union of its non-NCCL kernels and CUDA graph executions, copy_ns = union
of its memcpy and memset, communication_ns = union of its communication kernels (category 'nccl': NCCL's and the
other families of formats/comm_kernels.py), idle_ns = capacity - union of all of them; each *_pct is over
capacity. Steps: the iterations tool's boundaries on each rank alone (ProfilerStep#N, a step-like NVTX range or a
kernel rhythm; `range_name` as iterations takes it), its method in step_method. Ranks are compared on the steps of
the same index (rank_figures.matched_steps): by the number in the marker's name (ProfilerStep#10 on every rank)
when every rank's steps carry one and some number is common to all, else by position (the k-th step of each);
step_ns = the median of the compared steps after the first (the first may be warmup), the only one's duration
when one is compared.

Clocks: 'same_host' when every rank's meta names the same host, 'different_hosts' when two name different
ones, 'unknown' otherwise. Basis 'arrival' compares kernel start times on the ranks' clocks, unless the hosts
differ or the ranks' GPU-active spans do not overlap at all (the clocks evidently disagree): then 'durations',
which needs no common clock.
- arrival: collectives are matched as nccl_breakdown matches them across devices, with ranks in their place
  (per kind, each rank's instances aligned on the reference rank's by kernel ends, a shift of up to MAX_SHIFT
  instances; a matched collective has an instance on every rank that ran the kind, all running at one moment).
  A rank's wait: its kernel time before the last rank starts, [own start, min(last start, own end)).
- durations: collective k of a kind is the k-th NCCL kernel of that kind on each rank that ran it (start
  order). A rank's wait: its kernel duration minus the shortest of the collective (the last rank finds
  everyone there and runs the transfer alone).
The rank that waits least arrived last (lowest rank on a tie); skew = most - least wait; lead = second-least
- least wait (how much sooner the collective could have begun without its last rank); transfer = the last
rank's kernel duration. Per rank: wait_ns summed over its matched collectives, wait_share_pct = wait_ns / its
NCCL kernel time in them (the share of its NCCL time spent waiting for other ranks), last_count,
last_share_pct = last_count / its matched collectives.

Straggler: of the ranks in MIN_MATCHED matched collectives or more, the one with the highest last_share_pct
(lowest rank on a tie), named when its last_share_pct >=
LAST_SHARE_MIN_PCT and its lateness_ns >= max(MIN_SKEW_NS, SKEW_TRANSFER_RATIO x median transfer), where
lateness_ns ("by how much") is the median of its lead over the collectives it arrived last to: how far behind
the next-latest rank it arrives. peer_wait_ns: median over the other ranks of their wait in those collectives.
Why: its compute_pct and idle_pct minus the other ranks' medians; 'compute' when the compute excess is the
larger and positive (more GPU work), 'idle' when the idle excess is (its GPU waits on its host), else 'unclear'.

Kernel spread: the rank_figures.KERNELS_SHOWN non-NCCL kernels (by short name) with the most time, over the
ranks that run them (two or more): min, median and max over ranks of the per-rank mean duration; spread_pct =
(max - min) / median. Rows: the `limit` worst ranks (last_share_pct, then step_ns, then compute_ns, highest first);
histograms cover every rank. Findings (job-wide, device null, the rank in evidence): nccl-straggler when a
straggler is named, at stake peer_wait_ns; compute-communication-imbalance when none is but the median skew
reaches the same threshold over MIN_MATCHED collectives and the median rank spends NCCL_SHARE_PCT of its
capacity in NCCL, at stake the median rank's wait_ns. Times in ns.
"""

from __future__ import annotations

import statistics
from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis import rank_figures as figures
from stallhound.analysis import rules
from stallhound.analysis.common import MAX_LIMIT, Finding, Output, more_rows, ms, pct
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.nccl_arrival import LAST_SHARE_MIN_PCT, MIN_MATCHED, MIN_SKEW_NS, SKEW_TRANSFER_RATIO
from stallhound.analysis.step_boundaries import steady_median_ns
from stallhound.model.duck import one_row
from stallhound.tools import iterations
from stallhound.tools.nccl_breakdown import NCCL_SHARE_PCT

TRIAGE = TriageRole("job")  # triage_job ranks its cross-rank findings
RANKS_SHOWN = 8  # worst ranks listed by default: the histograms carry the rest of a large job

CAUSE_SAID = {"compute": "it computes longer than the others", "idle": "its GPU idles longer than the others' "
                                                                    "(its host is late to launch)",
              "unclear": "its GPU time splits like the others'"}

JobRef = Annotated[str, Field(description="Job id returned by load_job")]
Clock = Literal["same_host", "different_hosts", "unknown"]
Basis = Literal["arrival", "durations"]


class Params(BaseModel):
    job: JobRef
    range_name: Annotated[str | None, Field(
        description=iterations.Params.model_fields["range_name"].description)] = None
    limit: Annotated[int, Field(description=f"ranks to list, worst first (1-{MAX_LIMIT}); histograms cover all",
                                ge=1, le=MAX_LIMIT)] = RANKS_SHOWN


class RankRow(BaseModel):
    rank: int
    window_ns: int = Field(description="its GPU-active span")
    compute_ns: int
    copy_ns: int
    communication_ns: int
    idle_ns: int
    compute_pct: float
    copy_pct: float
    communication_pct: float
    idle_pct: float
    steps: int = Field(description="iterations found on this rank")
    step_method: str | None = Field(description="how iterations found them: 'nvtx:<range>', 'graph:<call>' or "
                                                "'kernel_pattern:<kernel>'; null when none")
    step_ns: float | None = Field(description="median of the compared steps (steps_compared) after the first, the "
                                              "only one's duration when one; null without steps")
    collectives: int = Field(description="matched collectives it took part in")
    wait_ns: int
    wait_share_pct: float = Field(description="wait_ns / its NCCL kernel time in the matched collectives")
    last_count: int
    last_share_pct: float


class Straggler(BaseModel):
    rank: int
    last_count: int
    collectives: int
    last_share_pct: float
    lateness_ns: int = Field(description="median over the collectives it arrived last to of how far behind the "
                                         "next-latest rank it arrived")
    peer_wait_ns: int = Field(description="median over the other ranks of their wait in those collectives")
    compute_excess_pct: float = Field(description="its compute_pct minus the other ranks' median")
    idle_excess_pct: float = Field(description="its idle_pct minus the other ranks' median")
    compute_excess_per_step_ns: float | None = Field(description="its compute_ns minus the other ranks' median, "
                                                                 "per step of its own; null without steps")
    idle_excess_per_step_ns: float | None = Field(description="the same for idle_ns")
    cause: Literal["compute", "idle", "unclear"]


class Result(Output):
    job: str
    ranks: int
    rank_sources: list[str] = Field(description="how the ranks were numbered (the `ranks` table)")
    clock: Clock
    basis: Basis
    basis_note: str = Field(description="why that basis")
    matched: int = Field(description="collectives matched across their ranks")
    unmatched_kernels: int = Field(description="NCCL kernels left out of every matched collective")
    median_skew_ns: int
    p90_skew_ns: int
    median_transfer_ns: int
    skew_threshold_ns: int = Field(description="lateness (median skew for imbalance) needed to name a cause")
    median_window_ns: int = Field(description="median over ranks of window_ns")
    median_communication_pct: float = Field(description="median over ranks of communication_pct")
    median_wait_ns: int = Field(description="median over ranks of wait_ns")
    step_match: figures.StepMatch | None = Field(
        description="how steps were matched across ranks: by the number in their marker's name (ProfilerStep#10 "
                    "on every rank), or by position; null when no rank has steps")
    steps_compared: list[str] = Field(description="the marker numbers (or 0-based positions) of the steps every "
                                                  "rank with steps has, compared in step_ns")
    step_note: str = Field(description="how the ranks' steps were found and matched")
    straggler: Straggler | None
    verdict: str = Field(description="why a straggler is or is not named")
    rows: list[RankRow] = Field(description="the worst ranks first")
    truncated: bool
    histograms: list[figures.Histogram]
    kernel_spread: list[figures.KernelSpread]
    findings: list[Finding] = []


def _clock(con: duckdb.DuckDBPyConnection) -> Clock:
    hosts = [h for (h,) in con.execute("SELECT host FROM meta").fetchall()]
    if len({h for h in hosts if h is not None}) > 1:
        return "different_hosts"
    return "same_host" if hosts and None not in hosts else "unknown"


def _basis(con: duckdb.DuckDBPyConnection, clock: Clock) -> tuple[Basis, str]:
    if clock == "different_hosts":
        return "durations", ("the ranks ran on different hosts, whose clocks cannot be compared: waits are read "
                             "from kernel durations instead of arrival times")
    apart = one_row(con.execute("SELECT max(gpu_start_ns) >= min(gpu_end_ns) FROM meta"))
    if apart[0]:
        return "durations", ("the ranks' GPU activity does not overlap in time on their clocks, so the clocks "
                             "disagree: waits are read from kernel durations instead of arrival times")
    where = "one host" if clock == "same_host" else "hosts not recorded, taken as one clock"
    return "arrival", f"arrival times compared ({where})"


def _steps(con: duckdb.DuckDBPyConnection, ranks: list[int], range_name: str | None
           ) -> tuple[dict[int, figures.RankSteps | None], figures.MatchedSteps, str]:
    """Each rank's steps, the steps matched across ranks, and a note saying how."""
    steps = {rank: figures.rank_steps(con, rank, range_name) for rank in ranks}
    matched = figures.matched_steps(steps)
    methods = sorted({s.method for s in steps.values() if s is not None and s.durations and s.method})
    missing = [r for r, s in steps.items() if s is None or not s.durations]
    if matched.by is None:
        note = "no steps found on any rank" + (f" with range '{range_name}'" if range_name else "")
    else:
        note = (f"{len(matched.keys)} step(s) common to every rank with steps, matched by {matched.by}; found by "
                f"{', '.join(methods)}" + (f"; no steps on rank(s) {', '.join(map(str, missing))}" if missing
                                           else ""))
    return steps, matched, note


def _rows(con: duckdb.DuckDBPyConnection, ranks: list[int], waits: dict[int, figures.RankWait],
          steps: dict[int, figures.RankSteps | None], matched: figures.MatchedSteps) -> list[RankRow]:
    shares = {r[0]: r[1:] for r in con.execute(figures.SHARES_SQL).fetchall()}
    rows = []
    for rank in ranks:
        window, devices, compute, copy, comm, busy = shares.get(rank, (0, 0, 0, 0, 0, 0))
        capacity = window * max(devices, 1)
        own, compared = steps[rank], matched.durations.get(rank)
        step = (steady_median_ns(compared) or compared[0]) if compared else None
        w = waits.get(rank, figures.RankWait())
        rows.append(RankRow(
            rank=rank, window_ns=window, compute_ns=compute, copy_ns=copy, communication_ns=comm,
            idle_ns=capacity - busy, compute_pct=pct(compute, capacity), copy_pct=pct(copy, capacity),
            communication_pct=pct(comm, capacity), idle_pct=pct(capacity - busy, capacity),
            steps=len(own.durations) if own else 0, step_method=own.method if own else None, step_ns=step,
            collectives=w.collectives, wait_ns=w.wait_ns, wait_share_pct=pct(w.wait_ns, w.nccl_ns),
            last_count=w.last_count, last_share_pct=pct(w.last_count, w.collectives)))
    return rows


def _straggler(rows: list[RankRow], waits: dict[int, figures.RankWait], matched: int, threshold: int
               ) -> tuple[Straggler | None, str]:
    if len(rows) < 2:
        return None, "one rank: a straggler needs two or more ranks to compare"
    if not matched:
        return None, "no NCCL collective ran on two ranks or more: nothing to compare arrival on"
    enough = [r for r in rows if r.collectives >= MIN_MATCHED]  # a rank in one collective is last to all of it
    if not enough:
        return None, (f"only {matched} collectives matched across ranks: too few to tell a habit from chance "
                      f"(at least {MIN_MATCHED} per rank needed)")
    top = max(enough, key=lambda r: (r.last_share_pct, r.last_count, -r.rank))
    late = waits[top.rank]
    said = (f"rank {top.rank} arrives last to {top.last_count} of {top.collectives} collectives "
            f"({top.last_share_pct:.1f}%), {ms(late.lateness_ns)} behind the next-latest rank (median)")
    if top.last_share_pct < LAST_SHARE_MIN_PCT:
        return None, f"balanced: no rank arrives last to {LAST_SHARE_MIN_PCT:.0f}% of collectives; most often {said}"
    if late.lateness_ns < threshold:
        return None, f"{said}, below the {ms(threshold)} worth chasing"
    others = [r for r in rows if r.rank != top.rank]
    compute = round(top.compute_pct - statistics.median(r.compute_pct for r in others), 2)
    idle = round(top.idle_pct - statistics.median(r.idle_pct for r in others), 2)
    cause = "compute" if compute >= idle and compute > 0 else "idle" if idle > 0 else "unclear"
    per_step = {what: round((getattr(top, what) - statistics.median(getattr(r, what) for r in others)) / top.steps, 1)
                if top.steps else None for what in ("compute_ns", "idle_ns")}
    peer = int(statistics.median(waits[r.rank].waits_by_last.get(top.rank, 0) if r.rank in waits else 0
                                 for r in others))
    return Straggler(rank=top.rank, last_count=top.last_count, collectives=top.collectives,
                     last_share_pct=top.last_share_pct, lateness_ns=late.lateness_ns, peer_wait_ns=peer,
                     compute_excess_pct=compute, idle_excess_pct=idle, cause=cause,
                     compute_excess_per_step_ns=per_step["compute_ns"], idle_excess_per_step_ns=per_step["idle_ns"]
                     ), f"straggler: {said}"


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM ranks ORDER BY rank").fetchall()]
    sources = [s for (s,) in con.execute("SELECT DISTINCT rank_source FROM ranks ORDER BY 1").fetchall()]
    clock = _clock(con)
    basis, note = _basis(con, clock)
    matched, skew, p90, transfer, kernels, matched_kernels = figures.summary(con, basis)
    waits = figures.rank_waits(con, basis)
    steps, same_steps, step_note = _steps(con, ranks, params.range_name)
    rows = _rows(con, ranks, waits, steps, same_steps)
    threshold = int(max(MIN_SKEW_NS, SKEW_TRANSFER_RATIO * (transfer or 0)))
    straggler, verdict = _straggler(rows, waits, matched, threshold)
    worst = sorted(rows, key=lambda r: (-r.last_share_pct, -(r.step_ns or 0), -r.compute_ns, r.rank))
    metrics = ("step_ns", "compute_pct", "idle_pct", "wait_share_pct")
    histograms = [figures.histogram(m, [getattr(r, m) for r in rows if getattr(r, m) is not None]) for m in metrics
                  if any(getattr(r, m) is not None for r in rows)]
    return Result(job=params.job, ranks=len(ranks), rank_sources=sources, clock=clock, basis=basis,
                  basis_note=note, matched=matched, unmatched_kernels=kernels - matched_kernels,
                  median_skew_ns=int(skew or 0), p90_skew_ns=int(p90 or 0),
                  median_transfer_ns=int(transfer or 0), skew_threshold_ns=threshold,
                  median_window_ns=int(statistics.median(r.window_ns for r in rows)) if rows else 0,
                  median_communication_pct=statistics.median(r.communication_pct for r in rows) if rows else 0.0,
                  median_wait_ns=int(statistics.median(r.wait_ns for r in rows)) if rows else 0,
                  step_match=same_steps.by, steps_compared=[".".join(map(str, k)) for k in same_steps.keys],
                  step_note=step_note, straggler=straggler,
                  verdict=verdict, rows=worst[:params.limit], truncated=len(worst) > params.limit,
                  histograms=histograms, kernel_spread=figures.kernel_spread(con))


def findings(result: Result) -> list[Finding]:
    """Cross-rank findings; job-wide, so device is null and the ranks are in the evidence."""
    s, window = result.straggler, result.median_window_ns
    if s is not None:
        stake = min(s.peer_wait_ns, window)
        return [Finding(
            root_cause="nccl-straggler", severity=rules.severity(stake, window),
            title=f"rank {s.rank} arrives last to {s.last_count} of {s.collectives} collectives, "
                  f"{ms(s.lateness_ns)} behind the next rank (median); the other ranks wait {ms(s.peer_wait_ns)} "
                  f"each (median); {CAUSE_SAID[s.cause]}",
            evidence={"straggler_rank": s.rank, "last_share_pct": s.last_share_pct, "lateness_ns": s.lateness_ns,
                      "peer_wait_ns": s.peer_wait_ns, "compute_excess_pct": s.compute_excess_pct,
                      "idle_excess_pct": s.idle_excess_pct, "cause": s.cause, "basis": result.basis,
                      **{k: v for k, v in (("compute_excess_per_step_ns", s.compute_excess_per_step_ns),
                                           ("idle_excess_per_step_ns", s.idle_excess_per_step_ns)) if v is not None}},
            time_at_stake_ns=stake, device=None, tags=[f"straggler-{s.cause}"])]
    if (result.matched >= MIN_MATCHED and result.median_skew_ns >= result.skew_threshold_ns
            and result.median_communication_pct >= NCCL_SHARE_PCT and result.median_wait_ns > 0):
        stake = min(result.median_wait_ns, window)
        return [Finding(
            root_cause="compute-communication-imbalance", severity="medium",
            title=f"ranks arrive {ms(result.median_skew_ns)} apart at a typical collective with no fixed late "
                  f"rank, and NCCL takes {result.median_communication_pct:.1f}% of a typical rank's GPU time; "
                  f"{ms(stake)} waiting per rank (median)",
            evidence={"median_skew_ns": result.median_skew_ns, "matched": result.matched,
                      "median_communication_pct": result.median_communication_pct,
                      "median_wait_ns": result.median_wait_ns, "basis": result.basis},
            time_at_stake_ns=stake, device=None)]
    return []


def _shown(metric: str, value: float) -> str:
    return ms(value) if metric.endswith("_ns") else f"{value:.1f}%"


def render(result: Result) -> str:
    r = result
    lines = [f"job {r.job}: {r.ranks} ranks (numbered by {', '.join(r.rank_sources)}); {r.basis_note}",
             f"collectives: {r.matched:,} matched ({r.unmatched_kernels:,} NCCL kernels unmatched); skew median "
             f"{ms(r.median_skew_ns)}, p90 {ms(r.p90_skew_ns)}; "
             f"transfer median {ms(r.median_transfer_ns)}", f"steps: {r.step_note}", r.verdict]
    if r.straggler:
        s = r.straggler
        lines.append(f"rank {s.rank} is late by {ms(s.lateness_ns)} per collective; others wait {ms(s.peer_wait_ns)} "
                     f"for it; vs the others its compute is {s.compute_excess_pct:+.1f} and its idle "
                     f"{s.idle_excess_pct:+.1f} points of its GPU time ({ms(s.compute_excess_per_step_ns)} and "
                     f"{ms(s.idle_excess_per_step_ns)} per step): {s.cause}")
    lines.extend(f"  rank {w.rank}: step {ms(w.step_ns)} ({w.steps} steps by {w.step_method}), compute "
                 f"{w.compute_pct:.1f}%, copy {w.copy_pct:.1f}%, NCCL {w.communication_pct:.1f}%, idle "
                 f"{w.idle_pct:.1f}%"
                 + (f"; waits {ms(w.wait_ns)} ({w.wait_share_pct:.1f}% of its NCCL time), last to {w.last_count} "
                    f"of {w.collectives}" if w.collectives else "") for w in r.rows)
    if r.truncated:
        lines.extend(f"  {line}" for line in more_rows(r, r.ranks - len(r.rows), "ranks"))
    lines.extend(f"ranks by {h.metric}, {_shown(h.metric, h.low)}..{_shown(h.metric, h.high)} in "
                 f"{len(h.counts)} bins: {h.counts}" for h in r.histograms)
    lines.extend(f"kernel {k.kernel}: mean {ms(k.min_mean_ns)}..{ms(k.max_mean_ns)} over {k.ranks} ranks "
                 f"(spread {k.spread_pct:.1f}%, slowest rank {k.slowest_rank})" for k in r.kernel_spread)
    lines.extend(f"finding [{f.severity}] {f.title}" for f in r.findings)
    return "\n".join(lines)
