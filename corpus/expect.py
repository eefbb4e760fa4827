"""What an expert expects triage to say about a corpus profile: corpus/expect/<name>.toml, read and checked.

    note = "what the raw data shows"      # the expert's reading, with the figures (shown in the manifest)
    kind = "pytorch"                      # program.kind triage must detect (a list: any of them)
    expect = ["cpu-bottleneck", ["nccl-serialization", "nccl-on-compute-stream"]]
                                          # root causes that must be among the findings (a list: any of them)
    forbid = ["dataloader-starvation", "nccl-*"]   # root causes (globs) that must not be among them
    [[bound]]                             # a device's findings of these causes together stay within max_ms
    root_cause = "pageable-host-memory"   # or a list of causes, summed per device
    max_ms = 9.4
    why = "the pageable copies take 9.4 ms in total (SQL: ...)"
    [[forbid_text]]                       # a finding's title, fix or verify must not match
    root_cause = "nccl-*"                 # glob; every finding when left out
    field = "fix"                         # title, fix or verify
    pattern = "DistributedDataParallel"   # Python regex, case-insensitive
    why = "the program already runs FSDP (NVTX FSDP::pre_forward)"

Every figure in a `why` is measured on the raw export or trace (SQL, or a reading of the JSON), never copied from
triage. Each check returns the lines that failed, empty when it holds.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpus.sources import CORPUS

EXPECT = CORPUS / "expect"
KEYS = {"kind", "expect", "forbid", "bound", "forbid_text", "note", "open"}
CHECK_NAMES = ("kind", "expected", "forbidden", "bounds", "texts")  # the keys of CHECKS, below
BOUND_KEYS = {"root_cause", "max_ms", "why"}
TEXT_KEYS = {"root_cause", "field", "pattern", "why"}
TEXT_FIELDS = ("title", "fix", "verify")


@dataclass(frozen=True)
class Bound:
    root_causes: tuple[str, ...]
    max_ms: float
    why: str


@dataclass(frozen=True)
class ForbidText:
    root_cause: str  # glob
    field: str
    pattern: str
    why: str


@dataclass(frozen=True)
class Expectation:
    name: str
    kinds: tuple[str, ...] = ()
    expect: tuple[tuple[str, ...], ...] = ()  # each: any of these root causes
    forbid: tuple[str, ...] = ()
    bounds: tuple[Bound, ...] = ()
    texts: tuple[ForbidText, ...] = ()
    note: str = ""
    open: tuple[tuple[str, str], ...] = ()  # (check, why): a known defect still failing that check, tracked here

    def root_causes(self) -> set[str]:
        """Every root cause id the expectation names (globs left out)."""
        named = {c for group in self.expect for c in group} | {c for b in self.bounds for c in b.root_causes}
        named |= {c for c in self.forbid} | {t.root_cause for t in self.texts}
        return {c for c in named if not any(ch in c for ch in "*?[")}


def _strings(value: Any) -> tuple[str, ...] | None:
    """A string or a list of strings as a tuple; None for anything else."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def parse(name: str, data: dict) -> Expectation:
    """The expectation of one file's data; ValueError lists what is wrong with it."""
    problems = [f"unknown key {k!r}" for k in data if k not in KEYS]
    kinds = _strings(data.get("kind", [])) if "kind" in data else ()
    expect = [_strings(e) for e in data.get("expect", [])]
    forbid = [_strings(f) for f in data.get("forbid", [])]
    if kinds is None:
        problems.append("kind is a string or a list of strings")
    if any(e is None for e in expect) or any(f is None or len(f) != 1 for f in forbid):
        problems.append("expect holds root causes (a list for any of them), forbid holds root causes or globs")
    bounds = [_bound(b, problems) for b in data.get("bound", [])]
    texts = [_text(t, problems) for t in data.get("forbid_text", [])]
    if not isinstance(data.get("note", ""), str):
        problems.append("note is a string")
    opened = data.get("open", {})
    if not isinstance(opened, dict) or any(k not in CHECK_NAMES or not isinstance(v, str) or not v
                                           for k, v in opened.items()):
        problems.append(f"open maps checks ({', '.join(CHECK_NAMES)}) to why each still fails")
    if problems:
        raise ValueError(f"corpus/expect/{name}.toml: " + "; ".join(problems))
    return Expectation(name=name, kinds=kinds or (), expect=tuple(e for e in expect if e),
                       forbid=tuple(f[0] for f in forbid if f), bounds=tuple(b for b in bounds if b),
                       texts=tuple(t for t in texts if t), note=data.get("note", ""),
                       open=tuple(sorted(opened.items())) if isinstance(opened, dict) else ())


def _bound(table: dict, problems: list[str]) -> Bound | None:
    causes = _strings(table.get("root_cause"))
    max_ms = table.get("max_ms")
    if set(table) != BOUND_KEYS or causes is None or not isinstance(max_ms, int | float) or max_ms < 0 \
            or not str(table.get("why", "")).strip():
        problems.append(f"[[bound]] {table}: needs exactly root_cause (a cause or a list), max_ms >= 0 and why")
        return None
    return Bound(root_causes=causes, max_ms=float(max_ms), why=table["why"])


def _text(table: dict, problems: list[str]) -> ForbidText | None:
    if not set(table) <= TEXT_KEYS or table.get("field") not in TEXT_FIELDS \
            or not isinstance(table.get("pattern"), str) or not str(table.get("why", "")).strip():
        problems.append(f"[[forbid_text]] {table}: needs field ({' or '.join(TEXT_FIELDS)}), pattern and why, "
                        "and optionally root_cause")
        return None
    try:
        re.compile(table["pattern"])
    except re.error as exc:
        problems.append(f"[[forbid_text]] pattern {table['pattern']!r}: {exc}")
        return None
    return ForbidText(root_cause=table.get("root_cause", "*"), field=table["field"], pattern=table["pattern"],
                      why=table["why"])


def load(folder: Path = EXPECT) -> dict[str, Expectation]:
    """name -> Expectation of every folder/<name>.toml."""
    return {p.stem: parse(p.stem, tomllib.loads(p.read_text(encoding="utf-8"))) for p in sorted(folder.glob("*.toml"))}


# --- checks: each takes the expectation and the triage result (tools.triage.Result) --------------------------------

def kind(exp: Expectation, result: Any) -> list[str]:
    if not exp.kinds or result.program.kind in exp.kinds:
        return []
    return [f"program kind {result.program.kind!r} ({result.program.decided_by}), expected "
            f"{' or '.join(map(repr, exp.kinds))}"]


def expected(exp: Expectation, result: Any) -> list[str]:
    found = {f.root_cause for f in result.findings}
    return [f"expected finding missing: {' or '.join(group)}" for group in exp.expect if not found & set(group)]


def forbidden(exp: Expectation, result: Any) -> list[str]:
    return [f"forbidden finding present: {f.root_cause} (#{f.rank}, {f.time_at_stake_ns / 1e6:.3f} ms: {f.title})"
            for f in result.findings if any(fnmatch.fnmatchcase(f.root_cause, g) for g in exp.forbid)]


def bounded(exp: Expectation, result: Any) -> list[str]:
    failed = []
    for b in exp.bounds:
        per_device: dict[int | None, int] = defaultdict(int)
        for f in result.findings:
            if f.root_cause in b.root_causes:
                per_device[f.device] += f.time_at_stake_ns
        failed += [f"{' + '.join(b.root_causes)} on device {d}: {ns / 1e6:.3f} ms at stake, over its bound of "
                   f"{b.max_ms:.3f} ms ({b.why})" for d, ns in sorted(per_device.items(), key=str)
                   if ns > b.max_ms * 1e6]
    return failed


def texts(exp: Expectation, result: Any) -> list[str]:
    return [f"{f.root_cause} (#{f.rank}): its {t.field} matches the forbidden /{t.pattern}/ ({t.why})"
            for t in exp.texts for f in result.findings
            if fnmatch.fnmatchcase(f.root_cause, t.root_cause) and re.search(t.pattern, getattr(f, t.field), re.I)]


CHECKS = {"kind": kind, "expected": expected, "forbidden": forbidden, "bounds": bounded, "texts": texts}
