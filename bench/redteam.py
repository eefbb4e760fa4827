"""`make redteam`, the catalogue: every attack class of issue 30 run against a fresh `stallhound serve` each, through
tests/security/harness.py, printed as one markdown table (what the closing note gives before and after the fixes).

The hostile inputs are built in each attack's sandbox from copies of the real fixtures (../shared/fixtures, read
only). `--scale full` (the default) uses the sizes of the issue; `--scale ci` scales the heavy inputs down (a 20 MB
array before traceEvents instead of 600 MB, ...). Every attack has a wall limit (a hung server is killed and the row
says so) and an RSS ceiling (the server is killed past it: the machine running this is shared)."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.security.harness import BYSTANDER, Attack, Call, Limits, Outcome, Sandbox, Transport, run_attack  # noqa: E402

FIXTURES = ROOT.parent / "shared" / "fixtures"
MOCK = FIXTURES / "nsys" / "nsysai_mock.sqlite"  # 2 kernels: the bystander's profile and the base of small attacks
H100 = FIXTURES / "nsys" / "nsysai_h100_2gpu_1s.sqlite"  # 3,442 kernels
KINETO = FIXTURES / "kineto" / "hta_sampled_rank0.json.gz"
KINETO_RANK1 = FIXTURES / "kineto" / "hta_sampled_rank1.json.gz"
INT64_MAX = 2**63 - 1
KERNEL_TABLE_PAGE = 32  # the mock export's CUPTI_ACTIVITY_KIND_KERNEL root page (sqlite_master.rootpage)
TRACE_EVENTS = '"traceEvents": ['  # as the fixture spells it
CUT = 120  # characters of the sentence in the table
MODEL_SLACK_MB = 10  # the cache's growth a load of the 3 MB bystander export explains (its model, ~3 MB)


@dataclass(frozen=True)
class Scale:
    """Sizes of the heavy inputs; `full` is issue 30's."""
    nest_depth: int = 30_000  # Kineto JSON nesting
    comment_depth: int = 30_000  # nested /* */ in one query
    bomb_mb: int = 600  # the array before traceEvents, decompressed
    keys_mb: int = 1024  # unique top-level keys
    string_mb: int = 50  # the one string every kernel shares
    unnest_rows: int = 60_000_000
    repeat_rows: int = 1000  # rows of a 1 MB string
    wal_rows: int = 500  # rows of a 1 MB string copied into the WAL, per call
    ranks: int = 32
    workers: int = 64


SCALES = {"full": Scale(),
          "ci": Scale(nest_depth=30_000, comment_depth=15_000, bomb_mb=20, keys_mb=32, string_mb=5,
                      unnest_rows=25_000_000, repeat_rows=200, wal_rows=20, ranks=8, workers=64)}


def _in(box: Sandbox, name: str) -> str:
    return str(box.roots / name)


def _bystander(box: Sandbox) -> str:
    return _in(box, BYSTANDER)


def _sql(sql: str | Callable[[Sandbox], str], **more: object) -> Call:
    """query_sql on the bystander's profile (the attacker loads it first: the same model both sessions use)."""
    return Call("query_sql", lambda box: {"profile": _bystander(box),
                                          "sql": sql(box) if callable(sql) else sql, **more})


LOAD = Call("load_profile", lambda box: {"path": _bystander(box)})


def _load(name: str) -> Call:
    return Call("load_profile", lambda box: {"path": _in(box, name)})


# ---- hostile inputs, built from copies of the real fixtures ----

def _export(source: Path, name: str, *statements: str) -> Callable[[Sandbox], None]:
    """A copy of a real export with `statements` run on it."""
    def prepare(box: Sandbox) -> None:
        target = box.roots / name
        shutil.copyfile(source, target)
        with sqlite3.connect(target) as con:
            for statement in statements:
                con.execute(statement)
    return prepare


def _zeroed_page(box: Sandbox) -> None:
    target = box.roots / "zeroed.sqlite"
    data = bytearray(MOCK.read_bytes())
    page = 4096 * (KERNEL_TABLE_PAGE - 1)
    data[page:page + 4096] = bytes(4096)
    target.write_bytes(bytes(data))


def _kineto_text(source: Path = KINETO) -> str:
    return gzip.decompress(source.read_bytes()).decode()


Pieces = Callable[[], Iterator[str]]  # text written a piece at a time: a large input never sits in memory whole


def _kineto_with(name: str, head: Pieces | str, compress: bool = False) -> Callable[[Sandbox], None]:
    """A copy of a real Kineto trace with `head` (a JSON member, or its pieces) first in its object."""
    def prepare(box: Sandbox) -> None:
        real, path = _kineto_text(), box.roots / name
        with gzip.open(path, "wt", compresslevel=1) if compress else path.open("w") as out:
            out.write("{")
            for piece in ([head] if isinstance(head, str) else head()):
                out.write(piece)
            out.write(", " + real.lstrip()[1:])
    return prepare


def _kineto_event_first(name: str, event: str) -> Callable[[Sandbox], None]:
    """A copy of a real Kineto trace with `event` (JSON text) first in its traceEvents."""
    def prepare(box: Sandbox) -> None:
        real = _kineto_text()
        assert TRACE_EVENTS in real
        (box.roots / name).write_text(real.replace(TRACE_EVENTS, TRACE_EVENTS + event + ", ", 1))
    return prepare


def _chunks(total_bytes: int, piece: str) -> Pieces:
    def gen() -> Iterator[str]:
        chunk = piece * max(1, 2**20 // len(piece))
        for _ in range(max(1, total_bytes // len(chunk))):
            yield chunk
    return gen


def _bomb(mb: int) -> Pieces:
    def gen() -> Iterator[str]:
        yield '"pad": ['
        yield from _chunks(mb * 2**20, "0,")()
        yield "0]"
    return gen


def _keys(mb: int) -> Pieces:
    def gen() -> Iterator[str]:
        per_chunk = 2**20 // 20
        for c in range(max(1, mb)):
            yield ", ".join(f'"k{c:05d}_{i:07d}": 0' for i in range(per_chunk)) + ("" if c == mb - 1 else ", ")
    return gen


def _kineto_events(mutate: Callable[[dict], None], name: str) -> Callable[[Sandbox], None]:
    def prepare(box: Sandbox) -> None:
        trace = json.loads(_kineto_text())
        mutate(trace)
        (box.roots / name).write_text(json.dumps(trace))
    return prepare


def _rank_folder(ranks: int) -> Callable[[Sandbox], None]:
    def prepare(box: Sandbox) -> None:
        (box.roots / "job").mkdir()
        for rank in range(ranks):
            shutil.copyfile(MOCK, box.roots / "job" / f"rank_{rank}.sqlite")
    return prepare


def _job_with_bomb(mb: int) -> Callable[[Sandbox], None]:
    def prepare(box: Sandbox) -> None:
        (box.roots / "job").mkdir()
        shutil.copyfile(KINETO_RANK1, box.roots / "job" / "rank_1.json.gz")
        _kineto_with("job/rank_0.json.gz", _bomb(mb), compress=True)(box)  # rank 0 of the same job, bomb first
    return prepare


def _both(*prepares: Callable[[Sandbox], None]) -> Callable[[Sandbox], None]:
    def prepare(box: Sandbox) -> None:
        for p in prepares:
            p(box)
    return prepare


# ---- what only the attack itself can see ----

def _answered(what: str) -> Callable[[Sandbox, Outcome], str]:
    """Harm when the attack's last call was answered instead of refused."""
    def harm(box: Sandbox, out: Outcome) -> str:
        last = out.answers[-1] if out.answers else None
        return f"{what} (answered, not refused)" if last is not None and not last.is_error else ""
    return harm


def _discloses(box: Sandbox, out: Outcome) -> str:
    said = " ".join(a.text for a in out.answers)
    return "disclosed the cache path" if str(box.cache) in said else ""


def _past_timeout(limit_s: float) -> Callable[[Sandbox, Outcome], str]:
    def harm(box: Sandbox, out: Outcome) -> str:
        return f"ran {out.time_s:.1f} s with timeout_s={limit_s:g}" if out.time_s > limit_s + 2 else ""
    return harm


def _wrote_cache(box: Sandbox, out: Outcome) -> str:
    grown = out.cache_growth_mb
    return f"wrote {grown:.0f} MB into the cache" if grown > MODEL_SLACK_MB else ""


DATA_BLOCK = re.compile(r'<script type="application/json"[^>]*>(.*?)</script>', re.S)


def _report_breaks(box: Sandbox, out: Outcome) -> str:
    """The HTML report of the profile: its data blocks must not open an HTML comment or a script."""
    page = box.base / "report.html"
    done = subprocess.run([sys.executable, "-m", "stallhound", "report", _in(box, "script.sqlite"), "-o", str(page),
                           "--cache-dir", str(box.cache)], capture_output=True, text=True, env=box.env(),
                          cwd=box.cwd, timeout=300, check=False)
    if done.returncode != 0:
        return f"report failed: {done.stderr.strip().splitlines()[-1:]}"
    blocks = DATA_BLOCK.findall(page.read_text())
    return "the report's data block carries '<!--<script'" if any("<!--" in b for b in blocks) else ""


def _token_taken(box: Sandbox, out: Outcome) -> str:
    return "started with a one-character token" if out.started else ""


def _logs_read(box: Sandbox, out: Outcome) -> str:
    last = out.answers[-1] if out.answers else None
    if last is None or last.is_error:
        return ""
    lines = last.text.count("\n")
    return f"read {lines} lines of the instance's query log" if lines else ""


# ---- the catalogue ----

def catalogue(scale: Scale = Scale()) -> list[Attack]:
    """Every attack, in the order of issue 30's classes."""
    return _query_attacks(scale) + _input_attacks(scale) + _answer_attacks()


def _query_attacks(s: Scale) -> list[Attack]:
    """Classes 1-5: query_sql against the instance, its memory, its clock and its files."""
    nested = "SELECT 1 " + "/*" * s.comment_depth + "x" + "*/" * s.comment_depth
    wal = ("EXPLAIN ANALYZE COPY (SELECT repeat('x', 1000000) AS v FROM range({rows})) TO '{path}' (FORMAT csv)")

    def wal_sql(box: Sandbox) -> str:
        model = next(box.cache.rglob("*.duckdb"))
        return wal.format(rows=s.wal_rows, path=f"{model}.wal")

    return [
        Attack(1, "enable_logging(storage='file') in query_sql",
               [LOAD, _sql(lambda box: f"SELECT * FROM enable_logging(storage='file', storage_path='{box.home}/x')")]),
        Attack(2, "enable_logging(['QueryLog']), then read duckdb_logs",
               [LOAD, _sql("SELECT * FROM enable_logging(['QueryLog'])"),
                _sql("SELECT message FROM duckdb_logs")], harm=_logs_read),
        Attack(3, f"SELECT count(*) FROM (SELECT unnest(range({s.unnest_rows:,})))",
               [LOAD, _sql(f"SELECT count(*) FROM (SELECT unnest(range({s.unnest_rows})))")]),
        Attack(3, f"SELECT repeat('x', 1000000) FROM range({s.repeat_rows:,})",
               [LOAD, _sql(f"SELECT repeat('x', 1000000) FROM range({s.repeat_rows})", limit=1000)]),
        Attack(4, f"{s.comment_depth:,} nested /* */ with timeout_s=1 ({len(nested) // 1000} KB)",
               [LOAD, _sql(nested, timeout_s=1)], harm=_past_timeout(1)),
        Attack(5, f"EXPLAIN ANALYZE COPY {s.wal_rows} MB to the model's WAL, twice",
               [LOAD, _sql(wal_sql, timeout_s=60), _sql(wal_sql, timeout_s=60)], harm=_wrote_cache),
        Attack(5, "EXPLAIN ANALYZE CREATE TEMP TABLE",
               [LOAD, _sql("EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1 AS x")],
               harm=_answered("ran CREATE TEMP")),
    ]


def _input_attacks(s: Scale) -> list[Attack]:
    """Classes 6-8: small files that take huge memory or time, loads that cannot be stopped, multiplied workers."""
    return [
        Attack(6, f"Kineto JSON nested {s.nest_depth:,} deep",
               [_load("deep.json")], _kineto_with("deep.json", "[" * s.nest_depth + "]" * s.nest_depth)),
        Attack(6, f"Kineto event args nested {s.nest_depth:,} deep",
               [_load("deepargs.json")],
               _kineto_event_first("deepargs.json", '{"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 1, "tid": 1, '
                                   '"ts": 1682725898236567, "dur": 1, "args": {"d": '
                                   + "[" * s.nest_depth + "]" * s.nest_depth + "}}")),
        Attack(6, f"gzip bomb: {s.bomb_mb} MB array before traceEvents",
               [_load("bomb.json.gz")], _kineto_with("bomb.json.gz", _bomb(s.bomb_mb), compress=True)),
        Attack(6, f"{s.keys_mb} MB of unique top-level keys",
               [_load("keys.json")], _kineto_with("keys.json", _keys(s.keys_mb))),
        Attack(6, f"one {s.string_mb} MB string shared by every kernel (export)",
               [_load("string.sqlite")],
               _export(H100, "string.sqlite", f"UPDATE StringIds SET value = printf('%.*c', {s.string_mb << 20}, 'x') "
                       "WHERE id = (SELECT min(shortName) FROM CUPTI_ACTIVITY_KIND_KERNEL)",
                       "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = (SELECT min(shortName) FROM "
                       "CUPTI_ACTIVITY_KIND_KERNEL), demangledName = (SELECT min(shortName) FROM "
                       "CUPTI_ACTIVITY_KIND_KERNEL)")),
        Attack(6, f"load_job on a folder holding a {s.bomb_mb} MB gzip bomb",
               [Call("load_job", lambda box: {"paths": [_in(box, "job")]})], _job_with_bomb(s.bomb_mb)),
        Attack(7, "activity table is a recursive SQLite VIEW",
               [_load("view.sqlite")],
               _export(MOCK, "view.sqlite", "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO k0",
                       "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL "
                       "SELECT n + 1 FROM r) SELECT k0.* FROM r, k0")),
        Attack(8, f"load_job(workers={s.workers}) over {s.ranks} small ranks",
               [Call("load_job", lambda box: {"paths": [_in(box, "job")], "workers": s.workers})],
               _rank_folder(s.ranks)),
    ]


def _answer_attacks() -> list[Attack]:
    """Classes 9-10: damaged inputs and hostile arguments, each to be answered in one sentence; small leaks."""
    return [
        Attack(9, "a zeroed page in the kernel table", [_load("zeroed.sqlite")], _zeroed_page),
        Attack(9, "one kernel with a NULL process id",
               [_load("nullpid.sqlite")], _export(MOCK, "nullpid.sqlite",
                                                  "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = NULL "
                                                  "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")),
        Attack(9, "one kernel ending at int64 max",
               [_load("maxtime.sqlite")], _export(MOCK, "maxtime.sqlite",
                                                  f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = {INT64_MAX} "
                                                  "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")),
        Attack(9, "Kineto events that are not objects",
               [_load("notobjects.json")],
               _kineto_events(lambda t: t["traceEvents"].extend([1, "x", None, [2]]), "notobjects.json")),
        Attack(9, "Kineto args a list and a string",
               [_load("args.json")], _kineto_events(_args_not_objects, "args.json")),
        Attack(9, "Kineto baseTimeNanoseconds of 10^40",
               [_load("basetime.json")],
               _kineto_events(lambda t: t.update(baseTimeNanoseconds=10**40), "basetime.json")),
        Attack(9, "a parameter of 10^400",
               [LOAD, Call("top_kernels", lambda box: {"profile": _bystander(box), "start_ns": 10**400})]),
        Attack(10, "a 1 MB path", [Call("load_profile", {"path": "/" + "a" * 1_000_000})]),
        Attack(10, "a newline in a path",
               [Call("load_profile", lambda box: {"path": _in(box, "first line\nsecond line.sqlite")})]),
        Attack(10, "duckdb_settings() in query_sql",
               [LOAD, _sql("SELECT name, value FROM duckdb_settings() WHERE value LIKE '%/%'", limit=1000)],
               harm=_discloses),
        Attack(10, "'<!--<script' in a kernel name (HTML report)",
               [_load("script.sqlite"), Call("show_timeline", lambda box: {"profile": _in(box, "script.sqlite")})],
               _export(MOCK, "script.sqlite", "UPDATE StringIds SET value = 'k<!--<script>x' WHERE id IN "
                       "(SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL UNION SELECT demangledName FROM "
                       "CUPTI_ACTIVITY_KIND_KERNEL)"), harm=_report_breaks),
        Attack(10, "a one-character bearer token", [Call("list_profiles", {})], token="x", harm=_token_taken),
    ]


def _args_not_objects(trace: dict) -> None:
    events = [e for e in trace["traceEvents"] if isinstance(e.get("args"), dict)]
    for i, event in enumerate(events[:200]):
        event["args"] = [1, 2] if i % 2 else "a string"


# ---- the table ----

def _cell(text: str) -> str:
    one = text.replace("\n", " ⏎ ").replace("|", "\\|")
    return one[:CUT] + ("…" if len(one) > CUT else "")


def row(attack: Attack, out: Outcome, limits: Limits) -> str:
    up = "refused to start" if not out.started else (out.state if out.up else f"**{out.state}**")
    p99 = "-" if out.other_p99_ms is None else f"{out.other_p99_ms:,.0f}"
    problems = "; ".join(out.problems(limits)) or "held"
    return (f"| {attack.klass} | {_cell(attack.name)} | {up} | {out.peak_rss_mb:,.0f} | {out.time_s:.1f} | {p99} "
            f"| {out.cache_growth_mb:,.0f} | {len(out.written_outside)} | {_cell(problems)} | {_cell(out.sentence)} |")


HEADER = ("| class | attack | server up | peak RSS MB | time s | other client's p99 ms | cache growth MB "
          "| files written outside cache | problems | sentence returned |\n|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--transport", choices=["http", "stdio"], default="http")
    parser.add_argument("--only", default="", help="run only the attacks whose name contains this text")
    parser.add_argument("--wall-s", type=float, default=90.0, help="each attack's wall limit (killed past it)")
    parser.add_argument("--rss-ceiling-mb", type=float, default=4096.0, help="the server is killed past it")
    parser.add_argument("-o", "--output", type=Path, help="also write the table here")
    args = parser.parse_args()
    limits = replace(Limits(), wall_s=args.wall_s, rss_ceiling_mb=args.rss_ceiling_mb)
    transport: Transport = args.transport
    lines = [f"Issue 30's attacks, each on a fresh `stallhound serve` over {transport} (scale {args.scale}: "
             f"{SCALES[args.scale]}); wall limit {limits.wall_s:g} s, RSS ceiling {limits.rss_ceiling_mb:g} MB.",
             "", HEADER]
    print("\n".join(lines), flush=True)
    t0 = time.monotonic()
    for attack in catalogue(SCALES[args.scale]):
        if args.only in attack.name:
            lines.append(row(attack, run_attack(attack, MOCK, transport, limits), limits))
            print(lines[-1], flush=True)
    lines.append(f"\n{len(lines) - 3} attacks in {time.monotonic() - t0:.0f} s.")
    print(lines[-1])
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
