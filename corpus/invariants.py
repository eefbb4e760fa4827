"""What every triage must satisfy, whatever the program: each check takes a corpus.triaged.Triaged and returns the
lines that break it (empty when it holds). tests/test_corpus.py runs each over every available profile, review.py
flags them."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from corpus.triaged import Triaged
from stallhound.analysis.common import SEVERITY_RANK, UNSEEN, rank_ns

# A negative duration in text: "-6.092 ms", "-1,234 us"; not the second number of a range ("1-2 ms",
# "155330248986-156330248986 ns") nor a word with a dash.
NEGATIVE_DURATION = re.compile(r"(?<![\w.,)\]-])-\d[\d,]*(\.\d+)? ?(ms|us|µs|ns|s)\b")
# A zero duration in text: "0.000 ms", "0 us"; not the end of a number ("10 ms", "1.0 ms", "2,0 s") nor of a range.
ZERO_DURATION = re.compile(r"(?<![\w.,)\]-])0(\.0+)? ?(ms|us|µs|ns|s)\b")
# JSON keys whose numbers are durations, sizes, shares or counts: never negative.
NON_NEGATIVE_KEY = re.compile(r"(_ns|_ms|_us|_s|_bytes|_pct|_count|count|gaps|calls|launches|kernels|copies|"
                              r"iterations)$", re.I)


def within_window(t: Triaged) -> list[str]:
    """Every finding's time at stake is within triage's window (a warmup finding's: within the capture)."""
    r = t.result
    window = r.window.duration_ns if r.window else 0
    broken = []
    for f in r.findings:
        limit, what = (t.capture_ns or window, "capture") if f.source_tool == t.warmup_tool else (window, "window")
        if f.time_at_stake_ns > limit:
            broken.append(f"#{f.rank} {f.root_cause}: {f.time_at_stake_ns / 1e6:.3f} ms at stake, over the "
                          f"{limit / 1e6:.3f} ms {what}")
    return broken


def device_sums(t: Triaged) -> list[str]:
    """A device's findings (warmup ones aside) share no nanoseconds, so together they fit in the window."""
    r = t.result
    window = r.window.duration_ns if r.window else 0
    per_device: dict[int | None, int] = defaultdict(int)
    for f in r.findings:
        if f.source_tool != t.warmup_tool:
            per_device[f.device] += f.time_at_stake_ns
    return [f"device {d}: findings add up to {ns / 1e6:.3f} ms, over the {window / 1e6:.3f} ms window"
            for d, ns in sorted(per_device.items(), key=str) if ns > window]


def _numbers(value: Any, key: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{key}.{k}" if key else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{key}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield key, value


def no_negative(t: Triaged) -> list[str]:
    """No negative duration in what a user reads, and no negative duration, size, share or count in the result."""
    first: dict[str, str] = {}  # the plain and the markdown rendering say the same things: each once
    for m in NEGATIVE_DURATION.finditer(t.text):
        first.setdefault(m.group(0), t.text[max(0, m.start() - 60):m.end()])
    text = [f"negative duration in the text: ...{context!r}" for context in first.values()]
    data = t.result.model_dump(mode="json")
    numbers = [f"negative figure in the result: {k} = {v}" for k, v in _numbers(data)
               if v < 0 and NON_NEGATIVE_KEY.search(re.sub(r"\[\d+\]$", "", k))]
    return text + numbers


def no_zero_duration(t: Triaged) -> list[str]:
    """No clause about zero time in the notes or in a finding's texts ("0.000 ms more in the same setup gap", "ended
    0.000 ms before the capture did"): a clause about nothing is left out or says what the trace shows. The rendered
    summary's time at stake of an info finding (nothing bounded) is a column, not a clause: not read here."""
    r = t.result
    texts = [("window note", r.window_note or ""), *(("trace note", q) for q in r.quality)]
    texts += [(f"#{f.rank} {f.root_cause} {field}", text) for f in r.findings for field, text in (
        ("title", f.title), ("fix", f.fix), ("verify", f.verify), ("where", f.where.text if f.where else ""))]
    return [f"zero duration in the {what}: ...{text[max(0, m.start() - 60):m.end() + 20]!r}"
            for what, text in texts for m in ZERO_DURATION.finditer(text)]


def fix_fits_program(t: Triaged) -> list[str]:
    """Every fix is of a family the detected program's chain holds (a C++ program never gets a PyTorch fix)."""
    chain = t.result.program.fix_chain
    return [f"#{f.rank} {f.root_cause}: fix for {f.fix_for!r}, not in the {t.result.program.kind} chain {chain}"
            for f in t.result.findings if f.fix_for not in chain]


def _cost(f: Any) -> tuple[bool, bool, int, int]:
    """Triage's order (common.leads_first): findings of severity info after all others, whatever their time; findings
    tagged UNSEEN (the trace shows no evidence of most of their cause) after all others with evidence; the rest by
    rank_ns (time at stake, or more for a kernel that holds most of the window)."""
    return f.severity == "info", UNSEEN in f.tags, -rank_ns(f), SEVERITY_RANK[f.severity]


def ranked(t: Triaged) -> list[str]:
    """Ranks run 1..n, costliest first (equal cost: more severe first; info last); totals agree with the findings;
    nothing is high severity with nothing at stake."""
    r = t.result
    broken = []
    if [f.rank for f in r.findings] != list(range(1, len(r.findings) + 1)):
        broken.append(f"ranks are {[f.rank for f in r.findings]}, not 1..{len(r.findings)}")
    broken += [f"#{b.rank} {b.root_cause} ({b.time_at_stake_ns / 1e6:.3f} ms, {b.severity}) is ranked below "
               f"#{a.rank} {a.root_cause} ({a.time_at_stake_ns / 1e6:.3f} ms, {a.severity})"
               for a, b in itertools.pairwise(r.findings) if _cost(b) < _cost(a)]
    if r.total_findings < len(r.findings) or r.truncated != (r.total_findings > len(r.findings)):
        broken.append(f"total_findings {r.total_findings} and truncated {r.truncated} disagree with the "
                      f"{len(r.findings)} findings shown")
    shown = sum(f.time_at_stake_ns for f in r.findings)
    if r.time_at_stake_ns < shown or (not r.truncated and r.time_at_stake_ns != shown):
        broken.append(f"time_at_stake_ns {r.time_at_stake_ns} is not the sum of the findings' ({shown})")
    broken += [f"#{f.rank} {f.root_cause} is high severity with nothing at stake" for f in r.findings
               if f.severity == "high" and f.time_at_stake_ns == 0]
    return broken


INVARIANTS: dict[str, Callable[[Triaged], list[str]]] = {
    "within-window": within_window, "device-sums": device_sums, "no-negative": no_negative,
    "no-zero-duration": no_zero_duration,
    "fix-fits-program": fix_fits_program, "ranked": ranked}
