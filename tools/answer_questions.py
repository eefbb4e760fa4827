"""Which of the veteran questions does this profile answer, and what are the answers?

Each question from the book's list gets one status: `answered` (value, evidence figures and the
tool that gives the detail), `not_in_profile` (the data is absent: how to capture it) or
`needs_user` (only the user knows: what to ask). Specific answerers read the model directly;
other answerable questions take the headline of the first tool that answers them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import duckdb
from pydantic import BaseModel, Field

from nsightful.profiles.errors import InvalidRequest
from nsightful.resources import book
from nsightful.tools.common import ProfileParams, ms
from nsightful.tools.profile_summary import FA2_RE, FA3_RE

SMALL_KERNEL_NS = 10_000  # 10 us: below this launch cost rivals the kernel (veteran question 13)
DOMINANT_KERNEL_PCT = 30.0  # veteran question 12

Status = Literal["answered", "not_in_profile", "needs_user"]


class Params(ProfileParams):
    phase: Annotated[str | None, Field(description="Only this phase (orientation, gpu-utilization, kernels, memory, "
                                                   "communication, system, hypothesis, verification, meta); "
                                                   "omit for all")] = None


class Answer(BaseModel):
    id: str = Field(description="question id; its full text is in nsightful://questions")
    phase: str
    status: Status
    value: str | None = Field(description="the answer, when answered")
    evidence: dict[str, Any] = Field(default_factory=dict, description="figures behind the answer, units in keys")
    tool: str | None = Field(description="the tool that shows the detail")
    how: str | None = Field(description="what to capture (not_in_profile) or ask (needs_user)")


class Result(BaseModel):
    profile: str
    answered: int
    not_in_profile: int
    needs_user: int
    answers: list[Answer]


Answerer = Callable[[duckdb.DuckDBPyConnection], tuple[str, dict[str, Any]] | None]


def _one(con, sql: str) -> tuple:
    return con.execute(sql).fetchone()


def _hardware(con):
    rows = con.execute("SELECT device_id, coalesce(name, 'unknown model') FROM gpus ORDER BY 1").fetchall()
    if not rows:
        return None
    names = sorted({n for _, n in rows})
    return f"{len(rows)} device(s): {', '.join(names)}", {"devices": [d for d, _ in rows]}


def _parallelism(con):
    devices = _one(con, "SELECT count(*) FROM gpus")[0]
    kinds = [r[0] for r in con.execute("SELECT DISTINCT nccl_collective FROM kernels WHERE nccl_collective IS NOT NULL "
                                       "ORDER BY 1").fetchall()]
    if not devices:
        return None
    if not kinds:
        hint = "no NCCL collectives: single-GPU work, or communication outside this capture"
    elif set(kinds) <= {"AllReduce"}:
        hint = "AllReduce only: plain data parallel (DDP)"
    elif {"AllGather", "ReduceScatter"} & set(kinds):
        hint = "AllGather/ReduceScatter: sharded data parallel (FSDP/ZeRO) or tensor parallel"
    else:
        hint = f"{', '.join(kinds)}: pipeline parallel when SendRecv dominates"
    return f"{devices} device(s) in this profile; {hint}", {"collectives": kinds}


def _framework(con):
    counts = dict(con.execute(r"""SELECT lib, count(*) FROM (SELECT CASE
        WHEN name LIKE '%at::native%' THEN 'PyTorch' WHEN short_name LIKE 'triton%' THEN 'Triton (torch.compile)'
        WHEN lower(name) LIKE '%flash%' OR name LIKE '%fmha%' THEN 'FlashAttention'
        WHEN lower(name) LIKE '%nccl%' THEN 'NCCL' WHEN regexp_matches(lower(name), 'gemm|cublas|cutlass|xmma')
        THEN 'cuBLAS/CUTLASS' END AS lib FROM kernels) WHERE lib IS NOT NULL GROUP BY 1""").fetchall())
    if not counts:
        return None
    return "libraries seen in kernel names: " + ", ".join(f"{k} ({v:,})" for k, v in sorted(counts.items())), counts


def _length(con):
    duration, gpu = _one(con, "SELECT duration_ns, gpu_end_ns - gpu_start_ns FROM meta")
    if duration is None:
        return None
    return f"capture {ms(duration)}, GPU active {ms(gpu)}", {"duration_ns": duration, "gpu_active_ns": gpu}


TOP_KERNELS_SQL = """SELECT short_name, sum(duration_ns) AS t, 100.0 * sum(duration_ns) / sum(sum(duration_ns))
                     OVER () FROM kernels GROUP BY 1 ORDER BY 2 DESC LIMIT $n"""


def _top5(con):
    rows = con.execute(TOP_KERNELS_SQL, {"n": 5}).fetchall()
    if not rows:
        return None
    return "; ".join(f"{n} {p:.1f}%" for n, _, p in rows), {"top_ns": [t for _, t, _ in rows]}


def _dominant(con):
    top = con.execute(TOP_KERNELS_SQL, {"n": 1}).fetchone()
    if top is None:
        return None
    name, _, share = top
    verdict = "yes" if share > DOMINANT_KERNEL_PCT else "no"
    return f"{verdict}: the largest, {name}, is {share:.1f}% of kernel time", {"kernel_time_pct": round(share, 2)}


def _small(con):
    n, tiny, tiny_ns, total_ns = con.execute("""SELECT count(*), count(*) FILTER (duration_ns < $tiny),
        coalesce(sum(duration_ns) FILTER (duration_ns < $tiny), 0), coalesce(sum(duration_ns), 0)
        FROM kernels""", {"tiny": SMALL_KERNEL_NS}).fetchone()
    if not n:
        return None
    return (f"{tiny:,} of {n:,} kernels ({100 * tiny / n:.1f}%) run under 10 us, {ms(tiny_ns)} of {ms(total_ns)}",
            {"tiny_count": tiny, "kernel_count": n})


def _flash(con):
    rows = con.execute("""SELECT DISTINCT short_name, regexp_matches(name, $fa3), regexp_matches(name, $fa2)
                          FROM kernels WHERE lower(name) LIKE '%flash%' OR name LIKE '%fmha%'""",
                       {"fa3": FA3_RE, "fa2": FA2_RE}).fetchall()
    if not rows:
        has_kernels = _one(con, "SELECT count(*) FROM kernels")[0]
        return ("no FlashAttention kernels in this capture", {}) if has_kernels else None
    names = sorted({r[0] for r in rows})[:5]
    # the same naming rules as profile_summary's library hints, so both tools agree
    version = ("3 (Hopper)" if any(r[1] for r in rows) else "2" if any(r[2] for r in rows)
               else "unknown (fused attention without flash-attn 2/3 names)")
    return f"yes, version {version} by kernel names: {', '.join(names)}", {"kernels": names}


def _copies(direction: str):
    def answer(con):
        n, nbytes, t = con.execute("""SELECT count(*), coalesce(sum(bytes), 0), coalesce(sum(duration_ns), 0)
                                      FROM memcpy WHERE direction = $direction""", {"direction": direction}).fetchone()
        if _one(con, "SELECT count(*) FROM memcpy")[0] == 0:
            return None
        return f"{n:,} {direction} copies, {nbytes / 1e6:,.1f} MB in {ms(t)}", {"count": n, "bytes": nbytes}
    return answer


def _pinned(con):
    rows = dict(con.execute("""SELECT src_kind, count(*) FROM memcpy WHERE direction = 'H2D' GROUP BY 1""").fetchall())
    if not rows:
        return None
    pageable = rows.get("pageable", 0)
    verdict = "no: some H2D copies come from pageable memory" if pageable else "yes: H2D copies come from pinned memory"
    return f"{verdict} ({rows})", rows


def _collectives(con):
    rows = con.execute("""SELECT nccl_collective, count(*), sum(duration_ns) FROM kernels WHERE category = 'nccl'
                          GROUP BY 1 ORDER BY 3 DESC""").fetchall()
    if not rows:
        return "no NCCL kernels in this profile", {}
    return "; ".join(f"{c or 'unknown'} x{n:,} {ms(t)}" for c, n, t in rows), {"by_collective_ns": {
        str(c): t for c, _, t in rows}}


def _device_syncs(con):
    n, t = _one(con, "SELECT count(*), coalesce(sum(duration_ns), 0) FROM cuda_api WHERE name LIKE "
                     "'%DeviceSynchronize%' OR name LIKE 'cuCtxSynchronize%'")
    if not _one(con, "SELECT count(*) FROM cuda_api")[0]:
        return None
    return (f"yes: {n:,} calls blocking the host {ms(t)}" if n else "no device-wide synchronize calls"), {"count": n}


def _compile(con):
    n = _one(con, "SELECT count(*) FROM kernels WHERE short_name LIKE 'triton%'")[0]
    if not _one(con, "SELECT count(*) FROM kernels")[0]:
        return None
    return (f"likely: {n:,} Triton kernels (torch.compile generates them)" if n else "no Triton kernels: eager mode",
            {"triton_kernels": n})


ANSWERERS: dict[str, Answerer] = {
    "q01-gpu-hardware": _hardware, "q02-gpu-count-parallelism": _parallelism, "q03-framework": _framework,
    "q05-profile-length": _length, "q11-top-kernels": _top5, "q12-dominant-kernel": _dominant,
    "q13-small-kernels": _small, "q15-flashattention": _flash, "q16-h2d-volume": _copies("H2D"),
    "q17-pin-memory": _pinned, "q18-unexpected-d2h": _copies("D2H"), "q22-dominant-collective": _collectives,
    "q28-device-synchronize": _device_syncs, "q29-torch-compile": _compile,
}


def _bound(con):
    from nsightful.tools.triage import classify
    c = classify(con, None, set())
    if c.bound == "no GPU activity":
        return None
    return f"{c.bound}: {c.reason}", c.model_dump(exclude={"bound", "reason"})


def _utilization(con):
    from nsightful.tools import gpu_utilization as gu
    try:
        result = gu.run(con, gu.Params(profile="-"))
    except InvalidRequest:
        return None
    per_device = {d.device: d.busy_pct for d in result.devices}
    text = ", ".join(f"device {d} {p:.1f}%" for d, p in per_device.items())
    return f"busy (kernels, copies, memsets) over the GPU-active window: {text}", {"busy_pct": per_device}


ANSWERERS["q30-bound-type"] = _bound
ANSWERERS["q07-gpu-utilization"] = _utilization
COSTLY_TOOLS = {"triage"}  # runs every detector: pointed to, not run, per question


class _Headlines:
    """First line of each tool's rendered result, each tool run at most once per call."""

    def __init__(self, con: duckdb.DuckDBPyConnection, pid: str):
        self.con, self.pid, self.lines = con, pid, {}

    def __call__(self, tool: str) -> str | None:
        if tool not in self.lines:
            from nsightful.tools import skills
            module = skills()[tool]
            try:
                result = module.run(self.con, module.Params(profile=self.pid))
                self.lines[tool] = module.render(result).splitlines()[0]
            except InvalidRequest:
                self.lines[tool] = None
        return self.lines[tool]


def answer(con, q: book.Question, headline: _Headlines) -> Answer:
    base = {"id": q.id, "phase": q.phase}
    found = ANSWERERS[q.id](con) if q.id in ANSWERERS else None
    if found:
        return Answer(**base, status="answered", value=found[0], evidence=found[1], tool=q.answered_by[0], how=None)
    tool = q.answered_by[0] if q.answered_by else None
    if tool in COSTLY_TOOLS:
        return Answer(**base, status="needs_user", value=None, tool=tool,
                      how=q.ask_or_capture or "run triage: it ranks the findings, each with fix and verification")
    if tool and q.id not in ANSWERERS and (line := headline(tool)):
        return Answer(**base, status="answered", value=line, tool=tool, how=None)
    if tool:
        return Answer(**base, status="not_in_profile", value=None, tool=tool,
                      how=q.ask_or_capture or "re-capture with `nsys profile --trace=cuda,nvtx,osrt`")
    return Answer(**base, status="needs_user", value=None, tool=None, how=q.ask_or_capture)


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    questions = book.questions_for_phase(params.phase) if params.phase else book.load_questions()
    headline = _Headlines(con, params.profile)
    answers = [answer(con, q, headline) for q in questions]
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
