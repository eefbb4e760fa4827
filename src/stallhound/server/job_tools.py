"""The MCP tools of jobs: load_job, list_jobs, close_job, and every tool in JOB_TOOL_NAMES, run on the job
connection through the same validation, cancellation, budget and lease machinery as the profile tools."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import BaseModel, Field

from stallhound import tools
from stallhound.jobs.job import Job
from stallhound.server.builds import follow
from stallhound.server.errors import StallhoundMCP
from stallhound.server.jobs import JobStore, OpenJob
from stallhound.server.sessions import Session, session_of
from stallhound.server.wording import profile_files
from stallhound.server.wrapper import CLOSES, READ_ONLY, Kind, Leased, add_tools, on_one_cursor, text_result

MAX_LISTED_RANKS = 64  # ranks listed in load_job's answer; the job's `ranks` table has them all
# Most build processes a client may ask for: each build holds up to its memory limit (about 1 GB at peak), so more
# than this exhausts a server's memory long before it speeds anything up.
MAX_WORKERS = 64


class RankEntry(BaseModel):
    rank: int
    rank_source: str = Field(description="how the rank was found: distributedInfo, nccl, file name, process, "
                                         "device or order")
    path: str
    part: str | None = Field(None, description="'process <pid>' or 'device <id>' when the rank is part of a profile")


class JobLoaded(BaseModel):
    job: str = Field(description="id to pass as `job` to the job tools")
    ranks_total: int
    rank_sources: dict[str, int] = Field(description="how many ranks each way of finding a rank gave")
    ranks: list[RankEntry] = Field(description=f"the first {MAX_LISTED_RANKS} ranks")
    build_s: float = Field(description="seconds of building (or reopening) the ranks' models, summed over workers")
    parquet_write_s: float = Field(description="seconds of writing the ranks' Parquet, summed; 0 when reused")
    wall_s: float
    reused: bool = Field(description="true when the job's Parquet was in the cache already")


class JobEntry(BaseModel):
    job: str
    ranks: int
    folder: str


class JobList(BaseModel):
    jobs: list[JobEntry]


class JobClosed(BaseModel):
    closed: str


def describe(job_id: str, job: Job) -> tuple[str, JobLoaded]:
    """(text, result) of a loaded job: its ranks, how each was found, and where the time went."""
    t = job.timings
    entries = [RankEntry(rank=s.rank, rank_source=s.rank_source, path=str(s.path),
                         part=f"{s.unit.kind} {s.unit.value}" if s.unit.kind else None) for s in job.ranks]
    sources = dict(Counter(s.rank_source for s in job.ranks))
    result = JobLoaded(job=job_id, ranks_total=len(entries), rank_sources=sources,
                       ranks=entries[:MAX_LISTED_RANKS], build_s=round(t.build_s, 3),
                       parquet_write_s=round(t.write_s, 3), wall_s=round(t.wall_s, 3), reused=t.reused)
    lines = [f"loaded a job of {len(entries)} ranks as '{job_id}' ("
             + ", ".join(f"{n} by {source}" for source, n in sources.items()) + ")"]
    lines += [f"  rank {e.rank}: {e.path}" + (f" ({e.part})" if e.part else "") + f" [{e.rank_source}]"
              for e in result.ranks]
    if len(entries) > MAX_LISTED_RANKS:
        lines.append(f"  ... {len(entries) - MAX_LISTED_RANKS} more ranks: query the job's `ranks` table")
    lines.append(f"built in {t.build_s:.1f} s, Parquet written in {t.write_s:.1f} s (summed over workers), "
                 f"{t.wall_s:.1f} s in all" + (" (Parquet reused from the cache)" if t.reused else ""))
    return "\n".join(lines), result


def job_kind(jobs: JobStore) -> Kind:
    """The tools on every rank of a job (`job`): the job of this session leased from `jobs` for the call."""
    @asynccontextmanager
    async def lease(ctx: Context, ref: str) -> AsyncIterator[Leased]:
        with jobs.leased(session_of(jobs.profiles, ctx), ref) as opened:
            yield Leased(opened.id, opened.job.con)

    return Kind("job", ("job",), lease, on_one_cursor)


async def _load(jobs: JobStore, session: Session, paths: list[str], workers: int | None, ctx: Context) -> OpenJob:
    """The job `paths` name, with MCP progress (each file built, each rank written); a call that ends first leaves
    the load running (server/builds.py), and one that attaches to a load another call takes loads it again from the
    cache."""
    while True:
        ticket = jobs.attach(session, paths, workers)
        try:
            await follow(ticket, ctx)
            opened = jobs.collect(ticket)
        finally:
            jobs.leave(ticket)  # after collect, nothing is left to let go
        if opened is not None:
            return opened


def register_job_tools(mcp: StallhoundMCP, jobs: JobStore) -> None:
    add_tools(mcp, tools.job_tools(), job_kind(jobs))

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def load_job(
        paths: Annotated[list[str], Field(min_length=1, description=(
            f"The job's profiles, one per rank ({profile_files()} files), inside the server's allowed "
            "roots: their paths, their folder, or a glob such as '/runs/42/rank_*.sqlite'; one profile of several "
            "processes or devices is a rank per process or device"))],
        ctx: Context,
        workers: Annotated[int | None, Field(strict=True, ge=1, le=MAX_WORKERS, description=(
            "processes building the ranks' models at once, at most this machine's cores (the default); one "
            "job load builds at a time, others wait their turn"))] = None,
    ) -> Annotated[CallToolResult, JobLoaded]:  # the SDK reads the output schema off JobLoaded
        """Load every rank of a distributed job (built in parallel, cached); returns the job id, its ranks and how
        each rank was found (distributedInfo, NCCL, file name, process, device or the order given).

        A load outlives a call that ends first (a timeout, a cancel, a disconnect): loading the same files again
        attaches to it and reports its progress, or opens what it built; cancel_load stops it."""
        opened = await _load(jobs, session_of(jobs.profiles, ctx), paths, workers, ctx)
        return text_result(*describe(opened.id, opened.job))

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def list_jobs(ctx: Context) -> Annotated[CallToolResult, JobList]:
        """List the jobs loaded in this session with their ids and rank counts."""
        entries = [JobEntry(job=j.id, ranks=len(j.job.ranks), folder=str(j.job.folder))
                   for j in jobs.listing(session_of(jobs.profiles, ctx))]
        text = "\n".join(f"{e.job}: {e.ranks} ranks" for e in entries) or "no jobs loaded"
        return text_result(text, JobList(jobs=entries))

    @mcp.tool(annotations=CLOSES, structured_output=True)
    async def close_job(
        job: Annotated[str, Field(description="Id of a job loaded in this session")],
        ctx: Context,
    ) -> Annotated[CallToolResult, JobClosed]:
        """Close a job loaded in this session (its cached models and Parquet stay on disk)."""
        closed = jobs.close(session_of(jobs.profiles, ctx), job)
        return text_result(f"closed {closed}", JobClosed(closed=closed))
