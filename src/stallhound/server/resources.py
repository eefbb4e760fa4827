"""MCP resources, prompts and completions: the book, the questions, the schema, loaded profiles. Their handlers' errors
become ResourceError and invalid-params errors where StallhoundMCP registers them (server/errors.py)."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import Context
from mcp_types import Completion, PromptReference, ResourceTemplateReference
from pydantic import Field

from stallhound import book
from stallhound.analysis.contracts import run_skill
from stallhound.model.schema import describe_schema
from stallhound.server.errors import StallhoundMCP
from stallhound.server.sessions import session_of
from stallhound.server.store import ProfileStore
from stallhound.server.wording import profile_files
from stallhound.tools import profile_summary

MAX_COMPLETIONS = 100  # the protocol's cap on values per completion


def _questions_text(questions: list[book.Question]) -> str:
    lines = []
    for q in questions:
        how = f"answered by: {', '.join(q.answered_by)}" if q.answered_by else "not answerable from a profile"
        lines.append(f"- [{q.id}] ({q.phase}) {q.text}\n  {how}")
        if q.cannot_because:
            lines.append(f"  limit: {q.cannot_because}\n  ask or capture: {q.ask_or_capture}")
    return "\n".join(lines)


def register_resources(mcp: StallhoundMCP, store: ProfileStore) -> None:
    """Every resource, the completion of their arguments, and the prompts."""
    _register_book(mcp)
    _register_loaded(mcp, store)
    register_prompts(mcp)


def _register_book(mcp: StallhoundMCP) -> None:
    """What the server knows without a profile: the book, the questions, the model's schema."""
    @mcp.resource("stallhound://book", name="book", mime_type="text/markdown")
    def book_index() -> str:
        """The root-cause book: one line per known cause of slow GPU jobs."""
        return book.render_index()

    @mcp.resource("stallhound://book/{id}", name="book-entry", mime_type="text/markdown")
    def book_entry(id: str) -> str:  # noqa: A002 - the URI template names it id
        """One root cause: symptom, mechanism, signals, fixes and how to verify."""
        return book.render_entry(book.get_entry(id))

    @mcp.resource("stallhound://questions", name="questions", mime_type="text/markdown")
    def questions() -> str:
        """The veteran questions, every phase, with the tools that answer each."""
        return _questions_text(book.load_questions())

    @mcp.resource("stallhound://questions/{phase}", name="questions-phase", mime_type="text/markdown")
    def questions_phase(phase: str) -> str:
        """The veteran questions of one phase."""
        return _questions_text(book.questions_for_phase(phase))

    @mcp.resource("stallhound://schema", name="schema", mime_type="text/plain")
    def schema() -> str:
        """The profile model that query_sql runs on: tables, columns, units."""
        return describe_schema()


def _register_loaded(mcp: StallhoundMCP, store: ProfileStore) -> None:
    """The profiles loaded in this session, and completing the ids and names every resource and prompt takes."""
    @mcp.resource("stallhound://profiles/{id}", name="profile", mime_type="application/json")
    def profile(id: str, ctx: Context) -> str:  # noqa: A002
        """Summary of a profile loaded in this session."""
        session = session_of(store, ctx)
        if id not in session.ids:
            raise book.UnknownEntry(f"no profile '{id}' is loaded in this session (loaded: {session.listed()}); "
                                    "call load_profile first")
        with store.leased(session, id) as lease, lease.profile.con.cursor() as cur:
            return run_skill(cur, profile_summary, profile_summary.Params(profile=id)).model_dump_json(indent=1)

    @mcp.completion()
    async def complete(ref, argument, context, ctx: Context):
        mine = sorted(session_of(store, ctx).ids)  # only the caller's: another session's ids are its own business
        if isinstance(ref, ResourceTemplateReference):
            options = {"id": list(book.load_book()) if "book" in ref.uri else mine,
                       "phase": list(book.PHASES)}.get(argument.name, [])
        elif isinstance(ref, PromptReference) and argument.name == "finding":
            options = list(book.load_book())
        elif isinstance(ref, PromptReference) and argument.name in ("profile", "before", "after"):
            options = mine
        else:
            return None
        matches = [o for o in options if o.startswith(argument.value or "")]
        return Completion(values=matches[:MAX_COMPLETIONS], total=len(matches),
                          has_more=len(matches) > MAX_COMPLETIONS)


def register_prompts(mcp: StallhoundMCP) -> None:
    @mcp.prompt()
    def triage_profile(
        path: Annotated[str, Field(description=f"Path of the profile ({profile_files()} file)")],
    ) -> str:
        """Find out why a GPU job is slow: triage a profile and explain the top causes."""
        return (f"Load the profile at {path} with load_profile, then call triage on it. "
                "For the top three findings, read the cited stallhound://book/{id} entry and explain: what the "
                "evidence figures show, the root cause, the fix in concrete code or flags, and how to verify it by "
                "re-profiling. Then list what the profile cannot tell and how to capture it. Quote numbers with "
                "units and the scope (devices, window) they cover.")

    @mcp.prompt()
    def explain_finding(
        profile: Annotated[str, Field(description="Loaded profile id or path")],
        finding: Annotated[str, Field(description="Root-cause id of the finding, e.g. gpu-bubbles")],
    ) -> str:
        """Explain one finding in depth with evidence from the profile."""
        book.get_entry(finding)
        return (f"Read stallhound://book/{finding}. For profile {profile}, call each tool named in that entry's "
                "signals and report the figures against the thresholds. Say whether the evidence confirms the "
                "root cause, what else could explain it, which fix to try first and what a re-profile should show.")

    @mcp.prompt()
    def verify_fix(
        before: Annotated[str, Field(description="Profile (id or path) captured before the change")],
        after: Annotated[str, Field(description="Profile (id or path) captured after the change")],
        finding: Annotated[str | None, Field(description="Root-cause id of the finding the change meant to fix, "
                                                         "e.g. gpu-bubbles; omit to check every finding")] = None,
    ) -> str:
        """Compare two profiles to check that a fix worked and introduced no new bottleneck."""
        if finding is None:
            check = ("then, for each finding diff_profiles lists as gone, smaller or bigger, call "
                     f"verify_fix(before={before}, after={after}, root_cause=<its root cause>)")
        else:
            book.get_entry(finding)
            check = (f"then call verify_fix(before={before}, after={after}, root_cause={finding}) and read "
                     f"stallhound://book/{finding} for what its verify step expects")
        return (f"Call diff_profiles(before={before}, after={after}) for the verdict, the step time and what "
                f"moved; {check}. Report whether the fix worked (pass / fail / unclear) and by how much, with the "
                "figures and the threshold the verdict used, any warning that the runs are not comparable, the "
                "findings that disappeared and any new bottleneck, and what to look at next.")
