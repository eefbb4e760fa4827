"""`make corpus-manifest`: corpus/MANIFEST.md, written from corpus/sources/*.toml and corpus/expect/*.toml (never by
hand: tests/test_corpus.py checks it is what render() writes)."""

from __future__ import annotations

import re
import sys
from collections import Counter

from corpus import expect, sources
from corpus.expect import Expectation
from corpus.sources import Profile

MANIFEST = sources.CORPUS / "MANIFEST.md"
HEAD = """# The corpus

Real profiles triage is judged on. Written by `make corpus-manifest` from `corpus/sources/*.toml` (where each profile
comes from) and `corpus/expect/*.toml` (what an expert expects triage to say, read from the raw data): do not edit
by hand, `tests/test_corpus.py` checks this file is up to date.

Shared fixtures are read from `../shared/fixtures`. Public profiles are never committed: `make corpus-restore`
fetches each into `$STALLHOUND_CORPUS` (default `~/.cache/stallhound-corpus`) and checks its sha256. Our own
captures live in `corpus/captures/`, each with the program that made it. `make corpus-review` triages every profile
that is here into `out/corpus-review.md`.
"""
TITLES = {"fixtures.toml": "Shared fixtures", "public-nsys.toml": "Public Nsight Systems exports",
          "public-kineto.toml": "Public torch.profiler (Kineto) traces"}
# The files in corpus/ that are not profiles, so the manifest accounts for the whole folder: (file, program,
# captured, what is in it, expected findings, license).
TOOLING_ROWS = (
    ("`__init__.py`", "none: the package marker of the corpus tooling (never imported by `src/stallhound`)",
     "not a capture", "a docstring naming the modules below", "none: it holds no profile", "the project's"),
    ("`sources.py`, `expect.py`, `invariants.py`, `triaged.py`",
     "the loader, the expectation checks, the invariants, triage in-process", "not captures", "code", "none",
     "the project's"),
    ("`restore.py`, `review.py`, `manifest.py`", "`make corpus-restore`, `corpus-review`, `corpus-manifest`",
     "not captures", "code", "none", "the project's"),
    ("`sources/*.toml`, `expect/*.toml`", "where each profile comes from, what an expert expects of it",
     "not captures", "the tables above are written from them", "as listed above", "the project's"),
    ("`captures/_profiled.py`", "the helper every torch.profiler capture program imports: runs a program's step "
     "under torch.profiler with `schedule(wait, warmup, active, repeat=1)` and writes the Kineto trace; under nsys "
     "(`CAPTURE_WITH=nsys`) it leaves torch.profiler off and wraps each step in an NVTX range 'train_step'",
     "not a capture: it made the 14 Kineto captures and the 4 PyTorch nsys captures above, on the H100 of "
     "2026-11-27 (torch 2.11.0+cu130)", "code",
     "none of its own: each capture's are listed above", "Apache-2.0 (the project's)"),
    ("`captures/capture_all.sh`", "makes every capture above on a GPU machine (`ONLY=\"a b\"`, `NSYS_ONLY=1`)",
     "not a capture: it ran the programs beside it", "code", "none", "Apache-2.0 (the project's)"),
)
TOOLING = "\n".join(["## Files in this folder that are not profiles", "",
                     "| file | program | captured | what is in it | expected findings | license |",
                     "|---|---|---|---|---|---|", *("| " + " | ".join(row) + " |" for row in TOOLING_ROWS), ""])
COLUMNS = ("profile", "program", "written by", "source", "license", "what is in it", "expected", "must not appear")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(p: Profile) -> str:
    if p.origin == "public" or (p.repo and len(p.commit) == 40):
        return f"[{cell(p.source)}](https://github.com/{p.repo}/blob/{p.commit}/{p.path})"
    return cell(p.source)


def _expected(exp: Expectation | None) -> tuple[str, str]:
    """The expected and the forbidden columns of a profile's row."""
    if exp is None:
        return "(no expect file)", ""
    said = [f"kind {' or '.join(exp.kinds)}"] if exp.kinds else []
    said += [" or ".join(group) for group in exp.expect]
    said += [f"{' + '.join(b.root_causes)} <= {b.max_ms:g} ms" for b in exp.bounds]
    banned = list(exp.forbid) + [f"{t.field} of {t.root_cause} matching `{t.pattern}`" for t in exp.texts]
    return cell("; ".join(said)), cell(", ".join(banned))


def _section(file: str, profiles: list[Profile], expectations: dict[str, Expectation]) -> list[str]:
    lines = [f"## {TITLES.get(file, file)} ({file}, {len(profiles)})", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for p in profiles:
        wanted, banned = _expected(expectations.get(p.name))
        lines.append(f"| {p.name} | {cell(p.kind)} | {cell(p.version)} | {_link(p)} | {cell(p.license)}"
                     f" | {cell(p.what)} | {wanted} | {banned} |")
    notes = [f"- **{p.name}**: {cell(expectations[p.name].note)}" for p in profiles
             if p.name in expectations and expectations[p.name].note]
    return lines + (["", "Why these expectations (figures from the raw data):", "", *notes] if notes else []) + [""]


def render(profiles: list[Profile], expectations: dict[str, Expectation]) -> str:
    origins = Counter(p.origin for p in profiles)
    kinds = Counter(re.split(r"[ (]", p.kind)[0] for p in profiles)  # "pytorch-ddp (CNN)" counts as pytorch-ddp
    lines = [HEAD, f"{len(profiles)} profiles: {origins['fixture']} shared fixtures, {origins['public']} public, "
                   f"{origins['capture']} own captures; {len(expectations)} with an expect file. Program kinds: "
                   + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kn: (-kn[1], kn[0]))) + ".",
             ""]
    by_file: dict[str, list[Profile]] = {}
    for p in profiles:
        by_file.setdefault(p.sources_file, []).append(p)
    for file in sorted(by_file, key=lambda f: (f not in TITLES, list(TITLES).index(f) if f in TITLES else 0, f)):
        lines += _section(file, by_file[file], expectations)
    lines.append(TOOLING)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    MANIFEST.write_text(render(sources.load(), expect.load()), encoding="utf-8")
    print(f"wrote {MANIFEST.relative_to(sources.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
