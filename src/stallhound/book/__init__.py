"""The root-cause book and the veteran question list, loaded from the packaged files.

Each entry is one `book/entries/<id>.md` file: TOML front matter between `+++` lines, then a markdown body.
Adding a file adds an entry; there is no registry to edit.

Fixes are written per program family (`for`): pytorch, python (any Python program), cuda (C, C++, CUDA C,
CUDA Fortran), offload (OpenMP/OpenACC offload) and generic; a fix with `when` fits only findings that carry
that tag (e.g. copies that are already pinned), or several joined by '+', all of them. Besides a finding's own tags,
the trace's facts may fit a fix (triage's `context`: 'amd' when an AMD GPU ran the work, so ROCm's knobs replace
CUDA's; 'kineto' when torch.profiler wrote the trace, so its capture options replace nsys'). `applies_to` names the
families in which the cause can occur at all (default: every program).
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stallhound.model.errors import BookError, UnknownEntry, UnknownPhase

Family = Literal["pytorch", "python", "cuda", "offload", "stdpar", "julia", "generic"]
Phase = Literal["orientation", "gpu-utilization", "kernels", "memory", "communication", "system",
                "hypothesis", "verification", "meta"]
PHASES: tuple[str, ...] = get_args(Phase)

_FRONT_MATTER = re.compile(r"\A\+\+\+[ \t]*\r?\n(.*?)\r?\n\+\+\+[ \t]*(?:\r?\n|\Z)(.*)\Z", re.DOTALL)
_NonEmpty = Field(min_length=1)


class _Strict(BaseModel):
    # extra="forbid" turns a misspelt front-matter key into a load error instead of a silent drop
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)


class Signal(_Strict):
    tool: str = _NonEmpty
    figure: str = _NonEmpty
    threshold: str = _NonEmpty


class Fix(_Strict):
    family: Family = Field(alias="for")
    when: str | None = None
    text: str = _NonEmpty


class Entry(_Strict):
    id: str = _NonEmpty
    title: str = _NonEmpty
    symptom: str = _NonEmpty
    mechanism: str = _NonEmpty
    signals: tuple[Signal, ...] = _NonEmpty
    applies_to: tuple[Family, ...] = ("generic",)
    fixes: tuple[Fix, ...] = _NonEmpty
    verify: str = _NonEmpty
    verify_when: dict[str, str] = {}  # a finding's tag -> the verify step for findings that carry it
    related_questions: tuple[str, ...] = _NonEmpty
    sources: tuple[str, ...] = _NonEmpty
    body: str = _NonEmpty

    @model_validator(mode="after")
    def _has_a_fix_for_every_family_it_applies_to(self) -> Entry:
        plain = {f.family for f in self.fixes if f.when is None}
        missing = [family for family in self.applies_to if family not in plain]
        if missing:
            raise ValueError(f"no fix without `when` for {', '.join(missing)} (applies_to needs one per family)")
        return self

    def applies(self, chain: tuple[str, ...]) -> bool:
        """Whether the cause can occur in a program whose fix families are `chain` (most specific first)."""
        return "generic" in self.applies_to or bool(set(chain) & set(self.applies_to))

    def verify_for(self, tags: tuple[str, ...] | list[str] = ()) -> str:
        """The verify step for a finding with `tags`: that of its first tag in verify_when, else the entry's."""
        return next((self.verify_when[t] for t in tags if t in self.verify_when), self.verify)

    def fix_for(self, chain: tuple[str, ...], tags: tuple[str, ...] | list[str] = (),
                context: tuple[str, ...] | list[str] = ()) -> Fix:
        """The first fix of the most specific family in `chain` that has one whose `when` parts are all among
        `tags` and `context`: the one naming most of the finding's `tags`, then most of the trace's `context`, then
        the first in the file (a plain fix names none). `chain` should end with 'generic'."""
        for family in chain:
            fitting = [f for f in self.fixes if f.family == family and set(_parts(f)) <= {*tags, *context}]
            if fitting:  # max keeps the first of equals: file order
                return max(fitting, key=lambda f: (len({*_parts(f)} & {*tags}), len({*_parts(f)} & {*context})))
        return next(f for f in self.fixes if f.when is None and f.family in self.applies_to)


def _parts(fix: Fix) -> tuple[str, ...]:
    """The tags a fix's `when` names ('module-load+amd': both)."""
    return tuple(fix.when.split("+")) if fix.when else ()


class Question(_Strict):
    id: str = _NonEmpty
    number: int | None = Field(default=None, ge=1)
    phase: Phase
    text: str = _NonEmpty
    answered_by: tuple[str, ...] = ()
    cannot_because: str | None = None
    ask_or_capture: str | None = None

    @model_validator(mode="after")
    def _answered_or_explained(self) -> Question:
        if not self.answered_by and not self.cannot_because:
            raise ValueError("a question no tool answers needs cannot_because")
        if bool(self.cannot_because) != bool(self.ask_or_capture):
            raise ValueError("cannot_because and ask_or_capture go together")
        return self


def _data() -> Traversable:
    return files(__package__)


def _parse_entry(name: str, text: str) -> Entry:
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise BookError(f"book/{name} does not start with TOML front matter between '+++' lines; add it")
    try:
        meta = tomllib.loads(match.group(1))
        entry = Entry(**meta, body=match.group(2).strip())
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise BookError(f"book/{name} is malformed, fix it: {exc}") from exc
    stem = name.removesuffix(".md")
    if entry.id != stem:
        raise BookError(f"book/{name} has id {entry.id!r}; the id must equal the file name {stem!r}")
    return entry


@cache
def _ids() -> tuple[str, ...]:
    """Every entry's id (its file's name), in file-name order."""
    return tuple(sorted(p.name.removesuffix(".md") for p in (_data() / "entries").iterdir() if p.name.endswith(".md")))


@cache
def _entry(entry_id: str) -> Entry:
    """One entry, parsed alone: a triage cites a few, and parsing all of them costs a command more than that."""
    return _parse_entry(f"{entry_id}.md", (_data() / "entries" / f"{entry_id}.md").read_text(encoding="utf-8"))


def load_book() -> dict[str, Entry]:
    """Every entry by id, in file-name order."""
    return {entry_id: _entry(entry_id) for entry_id in _ids()}


def get_entry(entry_id: str) -> Entry:
    if entry_id not in _ids():
        raise UnknownEntry(f"no root-cause entry {entry_id!r}; valid ids: {', '.join(_ids())}")
    return _entry(entry_id)


def entry_uri(entry_id: str) -> str:
    return f"stallhound://book/{entry_id}"


@cache
def _questions() -> tuple[Question, ...]:
    text = (_data() / "questions.toml").read_text(encoding="utf-8")
    try:
        rows = tomllib.loads(text).get("question", [])
        return tuple(Question(**row) for row in rows)
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise BookError(f"questions.toml is malformed, fix it: {exc}") from exc


def load_questions() -> list[Question]:
    return list(_questions())


def questions_for_phase(phase: str) -> list[Question]:
    if phase not in PHASES:
        raise UnknownPhase(f"no question phase {phase!r}; valid phases: {', '.join(PHASES)}")
    return [q for q in _questions() if q.phase == phase]


def _cell(text: str) -> str:
    # a bare '|' (e.g. in a regex) would split a markdown table cell
    return " ".join(text.split()).replace("|", "\\|")


def _signals_table(signals: tuple[Signal, ...]) -> list[str]:
    rows = [f"| `{s.tool}` | {_cell(s.figure)} | {_cell(s.threshold)} |" for s in signals]
    return ["| tool | figure | threshold |", "|---|---|---|", *rows]


def render_entry(entry: Entry) -> str:
    """The entry as markdown for the MCP resource."""
    parts = [
        f"# {entry.title}",
        f"`{entry_uri(entry.id)}`",
        f"**Symptom.** {entry.symptom}",
        f"**Mechanism.** {entry.mechanism}",
        "## Signals",
        "\n".join(_signals_table(entry.signals)),
        "## Fixes",
        "\n".join(f"- **{fix.family}**{f' ({fix.when})' if fix.when else ''}: {fix.text}" for fix in entry.fixes),
        "## Verify",
        "\n".join([entry.verify, *(f"- ({tag}): {text}" for tag, text in entry.verify_when.items())]),
        "## In detail",
        entry.body,
        "## Related questions",
        ", ".join(entry.related_questions),
        "## Sources",
        "\n".join(f"- {src}" for src in entry.sources),
    ]
    return "\n\n".join(parts) + "\n"


def render_index() -> str:
    """One line per entry: id (as a resource link), title and symptom."""
    lines = [f"- [{e.id}]({entry_uri(e.id)}) {e.title}: {e.symptom}" for e in load_book().values()]
    return "\n".join([f"# Root-cause book ({len(lines)} entries)", "", *lines]) + "\n"
