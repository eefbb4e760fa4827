"""Which of the veteran questions does this profile answer, and what are the answers?

Each question from the book's list gets one status: `answered` (value, evidence figures and the tool that
gives the detail) when the profile's data gives a real answer, read from the tools' results on triage's
window (tools/answers/answerers.py); `not_in_profile` when the question is answerable from a trace but this one lacks
the data (how to capture it); `needs_user` when only the user knows (what to ask).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import duckdb
from pydantic import BaseModel, Field

from stallhound import book
from stallhound.analysis.common import Output, ProfileParams
from stallhound.formats.remedy import remedy
from stallhound.tools.answers.answerers import ANSWERERS
from stallhound.tools.answers.evidence import Evidence

Status = Literal["answered", "not_in_profile", "needs_user"]
CAPTURE_NEEDS = ("kernels", "nvtx", "os_runtime")  # what a question the profile cannot answer most often lacks


class Params(ProfileParams):
    phase: Annotated[str | None, Field(description="Only this phase (orientation, gpu-utilization, kernels, memory, "
                                                   "communication, system, hypothesis, verification, meta); "
                                                   "omit for all")] = None


class Answer(BaseModel):
    id: str = Field(description="question id; its full text is in stallhound://questions")
    phase: str
    status: Status
    value: str | None = Field(description="the answer, when answered")
    evidence: dict[str, Any] = Field(default_factory=dict, description="figures behind the answer, units in keys")
    tool: str | None = Field(description="the tool that shows the detail")
    how: str | None = Field(description="what to capture (not_in_profile) or ask (needs_user)")


class Result(Output):
    profile: str
    answered: int
    not_in_profile: int
    needs_user: int
    answers: list[Answer]


def answer(q: book.Question, evidence: Evidence) -> Answer:
    base = {"id": q.id, "phase": q.phase, "tool": q.answered_by[0] if q.answered_by else None}
    found = ANSWERERS[q.id](evidence) if q.id in ANSWERERS and evidence.analysable else None
    if found:
        return Answer(**base, status="answered", value=found[0], evidence=found[1], how=None)
    if q.id in ANSWERERS:
        capture = f"re-capture with {remedy(evidence.con, CAPTURE_NEEDS)}"
        return Answer(**base, status="not_in_profile", value=None, how=q.ask_or_capture or capture)
    return Answer(**base, status="needs_user", value=None,
                  how=q.ask_or_capture or "run triage: it ranks the findings, each with fix and verification")


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    questions = book.questions_for_phase(params.phase) if params.phase else book.load_questions()
    evidence = Evidence(con, params.profile)
    answers = [answer(q, evidence) for q in questions]
    count = {s: sum(a.status == s for a in answers) for s in ("answered", "not_in_profile", "needs_user")}
    return Result(profile=params.profile, answers=answers, **count)


def render(result: Result) -> str:
    lines = [f"{result.answered} answered, {result.not_in_profile} not in this profile, "
             f"{result.needs_user} need you"]
    lines += [f"{a.id}: {a.value}" for a in result.answers if a.status == "answered"]
    for status in ("not_in_profile", "needs_user"):
        ids = [a.id for a in result.answers if a.status == status]
        if ids:
            lines.append(f"{status} (see `how` in the result): {', '.join(ids)}")
    return "\n".join(lines)
