"""What every skill shares: parameter types, scope, findings, output caps."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import duckdb
from pydantic import BaseModel, Field

from stallhound.analysis.contracts import run_skill
from stallhound.formats.remedy import remedy
from stallhound.model.duck import one_row
from stallhound.model.errors import InvalidRequest

T = TypeVar("T")
R = TypeVar("R", bound="Output")  # a tool's own Result, narrowed from run_once's Output
DEFAULT_LIMIT = 20  # rows: keeps a result well under ~20,000 characters
MAX_LIMIT = 500  # rows: beyond this a model's context is the bottleneck, use query_sql
MAX_OFFSET = 1_000_000  # rows: paging further than this is reading a table, which query_sql's aggregates do better

ProfileRef = Annotated[str, Field(
    description="Profile id returned by load_profile, or a path to an nsys .sqlite/.nsys-rep export")]
DeviceParam = Annotated[int | None, Field(
    description="CUDA device id to restrict to; omit for all devices", ge=0)]
StartParam = Annotated[int | None, Field(
    description="Window start in ns on the profile clock (as in start_ns of results); omit for the start "
                "of the default window", ge=0)]
EndParam = Annotated[int | None, Field(
    description="Window end in ns on the profile clock; omit for the end of the default window", ge=0)]
LimitParam = Annotated[int, Field(
    description=f"Maximum rows to return (1-{MAX_LIMIT}); results say truncated=true when more exist",
    ge=1, le=MAX_LIMIT)]
OffsetParam = Annotated[int, Field(
    description=f"Rows to skip before the first one returned (0-{MAX_OFFSET:,}): a result cut by `limit` names "
                "the offset of its next page", ge=0, le=MAX_OFFSET)]


CutBy = Literal["limit", "characters"]


class Output(BaseModel):
    """What every tool result carries besides its figures: whether rows were left out, by what, and what to change.
    Both fields are absent when nothing was cut (stallhound.server.budget fills them)."""
    cut_by: CutBy | None = Field(None, exclude_if=lambda v: v is None, description=(
        "present only when rows were left out: 'limit' when more rows exist than `limit` asked for, 'characters' "
        "when rows or long text values were cut to fit the result budget (STALLHOUND_MAX_RESULT_CHARS)"))
    cut_note: str | None = Field(None, exclude_if=lambda v: v is None, description=(
        "present only when rows were left out: one sentence saying what was cut and which parameter to change"))


class Paged(Output):
    """The result of a tool whose rows (the list named by `page_field`) can be read page by page (its Params take
    `offset`)."""
    page_field: ClassVar[str] = "rows"
    offset: int = Field(0, exclude_if=lambda v: v == 0, description=(
        "present only when not 0: the rows skipped before the first one (the `offset` asked for)"))
    next_offset: int | None = Field(None, exclude_if=lambda v: v is None, description=(
        "present only when rows were left out after this page: the `offset` that returns the next rows"))

    def rows_after(self, total: int) -> int:
        """Rows of `total` after this page."""
        return total - self.offset - len(getattr(self, self.page_field))


def next_page(offset: int, shown: int, more: bool) -> int | None:
    """The offset of the page after one that showed `shown` rows from `offset` (None: it was the last)."""
    return offset + shown if more else None


def more_rows(result: Output, more: int | None, what: str, remedy: str = "raise `limit` to see them") -> list[str]:
    """The line a render puts after its rows when `more` were left out (None: an unknown number); `remedy` holds
    for a `limit` cut, while a cut to fit the result budget points at the budget's own last line."""
    if more == 0:
        return []
    if result.cut_by == "characters":
        remedy = "cut to fit the result budget (see the last line)"
    elif (next_offset := getattr(result, "next_offset", None)) is not None:
        remedy = f"{remedy}, or ask again with `offset`={next_offset:,} for the next page"
    return [f"... {'' if more is None else f'{more:,} '}more {what}: {remedy}"]


class ProfileParams(BaseModel):
    profile: ProfileRef


class ScopedParams(ProfileParams):
    device: DeviceParam = None
    start_ns: StartParam = None
    end_ns: EndParam = None


WindowBasis = Literal["capture", "gpu_active", "requested", "steady_state"]


class Scope(BaseModel):
    """What a result covers: echoed in every result."""
    profile: str
    devices: list[int] = Field(description="devices included")
    start_ns: int
    end_ns: int
    duration_ns: int
    window_basis: WindowBasis = Field(
        description="capture: whole capture; gpu_active: first to last GPU activity; requested: start_ns/end_ns; "
                    "steady_state: the steady iterations (triage)")


class Window(BaseModel):  # a stretch of the profile clock: profile_summary's capture and GPU-active spans
    start_ns: int
    end_ns: int
    duration_ns: int


Severity = Literal["high", "medium", "low", "info"]
SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2, "info": 3}


class CallSite(BaseModel):
    """A place in the program that made some of a finding's events: the first user frame of their stacks
    (analysis/stacks.py)."""
    function: str | None
    module: str | None = Field(description="file (Python) or library/executable path (native)")
    line: int | None = Field(description="nsys: none; Kineto: the line the function starts at")
    calls: str | None = Field(description="the function it called on the way to the events: which call in it")
    user_frame: bool = Field(description="false when the stacks hold no frame of the user's code and this is the "
                                         "library frame nearest it")
    events: int
    share_pct: float = Field(description="of the finding's events with a stack, on Where.basis")


class Where(BaseModel):
    """Where in the program a finding's events were made (analysis/where.py): its top call sites and coverage."""
    events: str = Field(description="the events placed: the finding's own, on its device in the window")
    basis: str = Field(description="what share_pct is a share of: the events' time, or their count")
    matched: int = Field(description="the finding's events in the window")
    with_stack: int = Field(description="those with a call stack")
    coverage_pct: float
    sites: list[CallSite] = Field(description="the top call sites, largest share first")
    text: str = Field(description="the top sites in one line")


class Finding(BaseModel):
    """A problem a detector found, tied to a root cause in the book."""
    root_cause: str = Field(description="id of the entry in the root-cause book (stallhound://book/{id})")
    severity: Severity
    title: str = Field(description="one line: what was found")
    evidence: dict[str, int | float | str] = Field(description="the figures that decided it, units in keys")
    time_at_stake_ns: int = Field(description="device time in the analysed window that fixing it could recover, on "
                                              "`device`, ns; never more than the window; 0 when the data cannot say")
    device: int | None = Field(None, description="the device whose time is at stake; null only when nothing is")
    tags: list[str] = Field(default_factory=list, description="what kind of case this is (e.g. 'pinned', "
                                                             "'gemm-fp32'): picks the fitting fix from the book")
    where: Where | None = Field(None, description="triage: where in the program its host events were made; null "
                                                  "when it is not about host events or the profile has no stacks")


MODEL_CACHE_ENTRIES = 64  # results remembered across calls: a triage run asks for a handful, a session for a few more
_model_cache: dict[tuple, object] = {}
_model_cache_lock = threading.Lock()  # calls run on worker threads: eviction must not race another call's insert


_fingerprints: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, str] = weakref.WeakKeyDictionary()


def _fingerprint(con: duckdb.DuckDBPyConnection) -> str | None:
    """The model's fingerprint, asked once per connection (a triage calls per_model some twenty times); test models
    (none, or 'test') are asked each time, as a test may fill their meta after opening them."""
    with _model_cache_lock:
        if (known := _fingerprints.get(con)) is not None:
            return known
    found = con.execute("SELECT fingerprint FROM meta").fetchone()
    fingerprint = found[0] if found else None
    if fingerprint not in (None, "test"):
        with _model_cache_lock:
            _fingerprints[con] = fingerprint
    return fingerprint


def per_model(con: duckdb.DuckDBPyConnection, key: tuple, compute: Callable[[], T]) -> T:
    """compute() once per model and key. A model file never changes once built (its fingerprint names its
    content), so a result is never stale; in-memory test models (no fingerprint, or 'test') are not cached."""
    fingerprint = _fingerprint(con)
    if fingerprint in (None, "test"):
        return compute()
    full = (fingerprint, *key)
    with _model_cache_lock:
        if full in _model_cache:
            return _model_cache[full]  # type: ignore[return-value]
    value = compute()  # outside the lock: two calls may both compute a missing entry, neither waits on the other
    with _model_cache_lock:
        if len(_model_cache) >= MODEL_CACHE_ENTRIES and full not in _model_cache:
            _model_cache.pop(next(iter(_model_cache)))
        _model_cache[full] = value
    return value


def run_once(con: duckdb.DuckDBPyConnection, module: ModuleType, params: BaseModel) -> Output:
    """run_skill(con, module, params), computed once per model and parameters (the profile id aside) for the tools
    that run others' detectors (triage, answer_questions); each caller gets its own copy, as results are mutable.
    Narrow it to the tool's Result with as_result."""
    key = ("run", module.__name__, params.model_dump_json(exclude={"profile"}))
    return per_model(con, key, lambda: run_skill(con, module, params)).model_copy(deep=True)


def as_result(result: Output, kind: type[R]) -> R:
    """`result` (from run_skill or run_once, which type every result as Output) as its tool's own Result `kind`."""
    if not isinstance(result, kind):
        raise TypeError(f"expected a {kind.__module__}.{kind.__qualname__}, got a {type(result).__qualname__}")
    return result


def packed(values: Iterable[int | None]) -> str:
    """Integers (None for NULL) as one string for SQL's unpacked(): DuckDB's Python binding converts a list
    parameter element by element (slow for long lists), a string in one go."""
    return ",".join("" if v is None else str(v) for v in values)


def unpacked(param: str) -> str:
    """SQL for the BIGINT list a `packed` parameter holds; `param` is a constant like '$ids'."""
    return f"list_transform(string_split({param}, ','), v -> TRY_CAST(v AS BIGINT))"


FINDINGS_SHOWN = 10  # findings a single tool lists: per-device repeats on an 8-GPU node would fill the context


UNSEEN = "unseen"  # the tag of a finding whose cause the trace shows no evidence of (a bubble with nothing seen)
RANK_KEY = "rank_ns"  # evidence: the time a finding ranks by where more than its time at stake (hotspots.ranked)


def rank_ns(f: Finding) -> int:
    """The time a finding ranks by: its time at stake, or its evidence's RANK_KEY where larger."""
    return max(f.time_at_stake_ns, int(f.evidence.get(RANK_KEY, 0)))


def leads_first(items: list[T], finding: Callable[[T], Finding], limit: int) -> list[T]:
    """The `limit` costliest items in cost order, each root cause's costliest kept before any per-device repeat,
    so eight devices with one problem cannot push a different cause off the list. Findings of severity info come
    after all others, whatever their time: they are for information (a figure the trace cannot vouch for); findings
    tagged UNSEEN (no evidence of their cause in the trace) after all others with evidence; the rest by rank_ns."""
    def cost(item: T) -> tuple:
        f = finding(item)
        return (f.severity == "info", UNSEEN in f.tags, -rank_ns(f), SEVERITY_RANK[f.severity], f.root_cause,
                -1 if f.device is None else f.device)
    ordered = sorted(items, key=cost)
    leads: list[T] = []
    repeats: list[T] = []
    seen: set[str] = set()
    for item in ordered:
        (repeats if finding(item).root_cause in seen else leads).append(item)
        seen.add(finding(item).root_cause)
    chosen = {id(i) for i in (leads + repeats)[:limit]}
    return [i for i in ordered if id(i) in chosen]


def devices_of(con: duckdb.DuckDBPyConnection) -> list[int]:
    """The model's device ids, ascending (asked once per model: every scoped tool of a triage resolves its scope)."""
    return list(per_model(con, ("devices",), lambda: [r[0] for r in con.execute(
        "SELECT device_id FROM gpus ORDER BY device_id").fetchall()]))


def resolve_scope(con: duckdb.DuckDBPyConnection, params: ScopedParams,
                  default: Literal["capture", "gpu_active"] = "capture") -> Scope:
    """Check device and window against the profile; raise InvalidRequest with the valid values."""
    devices = devices_of(con)
    if params.device is not None and params.device not in devices:
        listed = ", ".join(map(str, devices)) or "none: the profile has no GPU activity"
        raise InvalidRequest(f"device {params.device} is not in this profile (devices: {listed})")
    cap_start, cap_end, gpu_start, gpu_end = per_model(con, ("windows",), lambda: one_row(con.execute(
        "SELECT capture_start_ns, capture_end_ns, gpu_start_ns, gpu_end_ns FROM meta")))  # asked once: as devices_of
    if cap_start is None:
        raise InvalidRequest("this profile has no timed events at all, so there is no window to analyse; "
                             f"re-capture with {remedy(con, ('kernels', 'nvtx'))}")
    basis: WindowBasis = default
    lo, hi = (gpu_start, gpu_end) if default == "gpu_active" and gpu_start is not None else (cap_start, cap_end)
    if default == "gpu_active" and gpu_start is None:
        basis = "capture"
    if params.start_ns is not None or params.end_ns is not None:
        lo = params.start_ns if params.start_ns is not None else lo
        hi = params.end_ns if params.end_ns is not None else hi
        basis = "requested"
        if hi <= lo:
            raise InvalidRequest(f"the window {lo}..{hi} ns is empty: end_ns must be greater than start_ns")
        if hi <= cap_start or lo >= cap_end:
            raise InvalidRequest(f"the window {lo}..{hi} ns lies outside the capture ({cap_start}..{cap_end} ns); "
                                 "pick start_ns/end_ns inside it")
        lo, hi = max(lo, cap_start), min(hi, cap_end)
    chosen = devices if params.device is None else [params.device]
    return Scope(profile=params.profile, devices=chosen, start_ns=lo, end_ns=hi,
                 duration_ns=hi - lo, window_basis=basis)


def scope_args(scope: Scope) -> dict[str, object]:
    """Bound SQL parameters for a scope: $start, $end, $devices (a list)."""
    return {"start": scope.start_ns, "end": scope.end_ns, "devices": scope.devices}


def fetch_capped(con: duckdb.DuckDBPyConnection, sql: str, args: dict[str, object], limit: int
                 ) -> tuple[list[tuple], bool]:
    """Run `sql` (which must end with `LIMIT $limit`) for limit + 1 rows; say whether rows were cut."""
    rows = con.execute(sql, {**args, "limit": limit + 1}).fetchall()
    return rows[:limit], len(rows) > limit


def records(con: duckdb.DuckDBPyConnection, sql: str, args: dict[str, object]) -> list[dict[str, Any]]:
    """The rows of `sql`, each a dict by column name."""
    cur = con.execute(sql, args)
    columns = [d[0] for d in cur.description]
    return [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]


def pct(part: float, whole: float) -> float:
    """part/whole in percent, rounded to 0.01; 0 when whole is 0."""
    return round(100.0 * part / whole, 2) if whole else 0.0


def ms(ns: float | int | None) -> str:
    """ns as a short human string in ms, for render()."""
    return "-" if ns is None else f"{ns / 1e6:,.3f} ms"


def shown(ns: float | int) -> bool:
    """Whether ns prints above zero in ms(): a clause about less time than that says nothing, so it is left out."""
    return ns > 0 and ms(ns) != ms(0)


def stake_said(ns: int) -> str:
    """A ranked line's ': ~X ms at stake', or nothing where no time is bounded (the finding says so in words)."""
    return f": ~{ms(ns)} at stake" if shown(ns) else ""


def counted(n: int, noun: str) -> str:
    """'1 gap', '3 gaps', '2 launches': a count with its noun in the right number."""
    return f"{n:,} {noun}{'' if n == 1 else 'es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's'}"
