"""`make corpus-review`: restore what can be restored (quietly), triage every corpus profile that is here, each in
its own process, and write out/corpus-review.md: one row per profile (kind expected and detected, the headline, the
top five findings with their ms at stake, and flags: expected finding missing, forbidden finding present, kind
wrong, a bound or forbidden text broken, an invariant broken), then the detail of every flag. Prints a summary."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from corpus import expect, invariants, restore, sources
from corpus.expect import Expectation
from corpus.manifest import cell
from corpus.sources import Profile
from corpus.triaged import Triaged

OUT = sources.ROOT / "out" / "corpus-review.md"
TIMEOUT_S = 300  # one profile; the corpus's largest triage in seconds, a hang costs one row
TOP = 5
FLAGS = {"kind": "kind wrong", "expected": "expected missing", "forbidden": "forbidden present",
         "bounds": "over a bound", "texts": "forbidden text", **{name: f"invariant {name}" for name in
                                                                  invariants.INVARIANTS}, "error": "triage failed"}


@dataclass
class Row:
    profile: Profile
    triaged: Triaged | None = None
    flags: dict[str, list[str]] = field(default_factory=dict)  # FLAGS key -> the lines that failed


def triage_in_child(path: Path) -> Triaged:
    """Triage path in a fresh process (python -m corpus.triaged); RuntimeError carries its last words."""
    try:
        done = subprocess.run([sys.executable, "-m", "corpus.triaged", str(path)], cwd=sources.ROOT,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"no answer in {TIMEOUT_S} s") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(last)
    return Triaged.from_json(done.stdout)


def reviewed(profile: Profile, path: Path, expectation: Expectation | None) -> Row:
    row = Row(profile)
    try:
        row.triaged = triage_in_child(path)
    except RuntimeError as exc:
        row.flags["error"] = [f"triage failed: {exc}"]
        return row
    if expectation:
        row.flags.update({k: failed for k, check in expect.CHECKS.items()
                          if (failed := check(expectation, row.triaged.result))})
    row.flags.update({k: failed for k, check in invariants.INVARIANTS.items() if (failed := check(row.triaged))})
    return row


def _kind(row: Row, expectation: Expectation | None) -> str:
    if row.triaged is None:
        return "-"
    got = row.triaged.result.program.kind
    if expectation and expectation.kinds:
        return got if got in expectation.kinds else f"**{got}** (want {' or '.join(expectation.kinds)})"
    return f"{got} (sources: {cell(row.profile.kind)})"


def _headline(t: Triaged) -> str:
    c = t.result.classification
    return (f"{c.bound}: compute {c.compute_pct:.0f}%, transfer {c.transfer_pct:.0f}%, comm "
            f"{c.communication_pct:.0f}%, idle {c.idle_pct:.0f}%")


def _top(t: Triaged) -> str:
    devices = t.result.window.devices if t.result.window else []
    return "<br>".join(f"{f.root_cause} {f.time_at_stake_ns / 1e6:,.1f}"
                       + (f" (d{f.device})" if len(devices) > 1 and f.device is not None else "")
                       for f in t.result.findings[:TOP]) or "none"


def render(rows: list[Row], expectations: dict[str, Expectation], absent: list[Profile]) -> str:
    lines = ["# Corpus review", "", summary(rows, absent), "",
             "| profile | format | kind | headline | top findings (ms at stake) | flags |", "|---|---|---|---|---|---|"]
    for row in rows:
        exp = expectations.get(row.profile.name)
        t = row.triaged
        lines.append(f"| {row.profile.name} | {row.profile.format} | {_kind(row, exp)} | "
                     f"{cell(_headline(t)) if t else '-'} | {cell(_top(t)) if t else '-'} | "
                     f"{'<br>'.join(FLAGS[k] for k in row.flags) or 'ok'} |")
    lines += ["", "## Flags in detail", ""]
    for row in rows:
        if row.flags:
            seconds = f", triage {row.triaged.seconds:.1f} s" if row.triaged else ""
            lines += [f"### {row.profile.name} ({row.profile.kind}{seconds})", ""]
            lines += [f"- {line}" for failed in row.flags.values() for line in failed] + [""]
    if absent:
        lines += ["## Not here", "", *(f"- {p.name} ({p.source}): {sources.RESTORE_HINT}" for p in absent), ""]
    return "\n".join(lines)


def summary(rows: list[Row], absent: list[Profile]) -> str:
    flagged = Counter(k for row in rows for k in row.flags)
    slowest = max((r.triaged.seconds for r in rows if r.triaged), default=0.0)
    clean = sum(not r.flags for r in rows)
    counts = ", ".join(f"{FLAGS[k]} {n}" for k, n in sorted(flagged.items(), key=lambda kn: list(FLAGS).index(kn[0])))
    return (f"{len(rows)} profiles triaged ({len(absent)} not here): {clean} without a flag, {len(rows) - clean} "
            f"flagged" + (f" ({counts})" if counts else "") + f"; slowest triage {slowest:.1f} s.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corpus.review", description=__doc__)
    parser.add_argument("names", nargs="*", help="profiles to review (default: all)")
    parser.add_argument("--mirror-root", type=Path, help="restore from these bare git mirrors (see corpus.restore)")
    parser.add_argument("--offline", action="store_true", help="restore without GitHub")
    parser.add_argument("--no-restore", action="store_true", help="review only what is already here")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if not args.no_restore:
        restore.restore_all([], args.mirror_root, args.offline, quiet=True)
    expectations = expect.load()
    chosen = [p for p in sources.load() if not args.names or p.name in args.names]
    started = time.perf_counter()
    rows, absent = [], []
    for profile in chosen:
        path = sources.resolve(profile)
        if path is None:
            absent.append(profile)
            continue
        rows.append(reviewed(profile, path, expectations.get(profile.name)))
        print(f"{profile.name}: {', '.join(FLAGS[k] for k in rows[-1].flags) or 'ok'}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(rows, expectations, absent), encoding="utf-8")
    print(summary(rows, absent), f"({time.perf_counter() - started:.0f} s) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
