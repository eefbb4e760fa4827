"""`make loadtest` (run by `make bench`): several MCP clients at once over streamable HTTP on loopback.

One server (`stallhound serve --transport http`, 127.0.0.1, a memory budget below the size of all models
together, so the LRU closes and reopens models while clients work) serves the fixtures in
../shared/fixtures/nsys plus `stallhound synth` samples. A quiet run (one client, one call at a time)
records every answer; then CLIENTS clients (handshake sessions and sessionless 2026-07-28 clients
alternately) each load every profile and run every tool on it ROUNDS times in their own shuffled order,
all within TIME_LIMIT_S. A call that raises, times out or answers differently from the quiet run is an
error. Prints a markdown section for BENCHMARKS.md: calls, errors, p50/p99 latency, peak server RSS.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx2
from mcp.client import Client
from mcp.shared.exceptions import MCPError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from httpserver import Served, serving  # noqa: E402

FIXTURES = ROOT.parent / "shared" / "fixtures" / "nsys"
CLIENTS = 4
ROUNDS = 2
TIME_LIMIT_S = 900  # the whole concurrent phase; a stuck call fails the run instead of hanging it
CALL_TIMEOUT_S = 120  # the slowest tool on these profiles takes seconds, even with four clients on two cores
MEMORY_BUDGET_MB = 16  # below the 39 MB of all 11 models: evictions and transparent reopens happen under load
REQUIRED_ARGS = {"query_sql": {"sql": "SELECT short_name, count(*) AS n FROM kernels GROUP BY 1 ORDER BY 2 DESC, 1"},
                 "find_kernels": {"pattern": "gemm"}}
EVICTION_LOG = re.compile(r"to stay within the \d+ MB budget")


@dataclass(frozen=True)
class Call:
    tool: str
    args: dict

    def key(self) -> tuple[str, str]:
        return self.tool, repr(sorted(self.args.items()))


@dataclass
class Outcome:
    calls: int = 0
    tool_errors: int = 0  # one-line error answers, the same as in the quiet run (a profile without NVTX, ...)
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    peak_rss_mb: float = 0.0
    evictions: int = 0


def plan(profiles: list[Path], tools: list[str]) -> list[Call]:
    """load_profile for each profile, then each tool on it by the id load_profile returns (its stem)."""
    loads = [Call("load_profile", {"path": str(p)}) for p in profiles]
    return loads + [Call(t, {"profile": p.stem, **REQUIRED_ARGS.get(t, {})}) for p in profiles for t in tools]


def _answer(result) -> tuple[bool, object]:
    if result.is_error:
        return True, "".join(c.text for c in result.content if getattr(c, "text", None))
    return False, result.structured_content


async def quiet_run(url: str, calls: list[Call]) -> dict[tuple[str, str], tuple[bool, object]]:
    async with Client(url, mode="legacy") as client:
        return {c.key(): _answer(await client.call_tool(c.tool, c.args)) for c in calls}


async def _client(url: str, mode: str, calls: list[Call], seed: int, rounds: int,
                  expected: dict, out: Outcome) -> None:
    loads = [c for c in calls if c.tool == "load_profile"]
    work = [c for c in calls if c.tool != "load_profile"]
    rng = random.Random(seed)
    async with Client(url, mode=mode) as client:
        for r in range(rounds):
            order = loads + rng.sample(work, len(work)) if r == 0 else rng.sample(work, len(work))
            for call in order:
                start = time.perf_counter()
                try:
                    with anyio.fail_after(CALL_TIMEOUT_S):
                        got = _answer(await client.call_tool(call.tool, call.args))
                except (MCPError, httpx2.HTTPError, anyio.BrokenResourceError, TimeoutError) as exc:
                    out.errors.append(f"{mode} {call.tool} {call.args}: {type(exc).__name__}: {exc}")
                    continue
                out.latencies_s.append(time.perf_counter() - start)
                out.calls += 1
                out.tool_errors += got[0]
                if got != expected[call.key()]:
                    said = f" (it answered: {got[1]})" if got[0] else ""
                    out.errors.append(f"{mode} {call.tool} {call.args}: answer differs from the quiet run{said}")


async def load_run(served: Served, calls: list[Call], clients: int, rounds: int, time_limit_s: float) -> Outcome:
    expected = await quiet_run(served.url, calls)
    out = Outcome()
    start = time.perf_counter()
    with anyio.fail_after(time_limit_s):
        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(_client, served.url, "legacy" if i % 2 == 0 else "auto", calls, i, rounds,
                              expected, out)
    out.wall_s = time.perf_counter() - start
    out.peak_rss_mb = served.peak_rss_mb()
    out.evictions = len(EVICTION_LOG.findall(served.log.read_text()))
    return out


def samples(folder: Path) -> list[Path]:
    from stallhound import synth
    paths = [folder / "synth_demo.sqlite", folder / "synth_clean.sqlite"]
    synth.write_sample(paths[0], synth.demo())
    synth.write_sample(paths[1], synth.clean())
    return paths


def run(profiles: list[Path], tools: list[str], *, clients: int = CLIENTS, rounds: int = ROUNDS,
        budget_mb: int = MEMORY_BUDGET_MB, time_limit_s: float = TIME_LIMIT_S,
        cache_dir: Path, extra_roots: tuple[Path, ...] = ()) -> Outcome:
    roots = [arg for r in extra_roots for arg in ("--root", str(r))]
    with serving(FIXTURES, cache_dir, *roots, "--memory-budget-mb", str(budget_mb)) as served:
        return anyio.run(load_run, served, plan(profiles, tools), clients, rounds, time_limit_s)


def percentile(values: list[float], pct: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(pct) - 1] if len(values) > 1 else values[0]


def report(out: Outcome, profiles: int, tools: int, clients: int, rounds: int, budget_mb: int) -> str:
    return "\n".join([
        f"Load (bench/load.py): {clients} clients at once over streamable HTTP on loopback (handshake sessions "
        f"and sessionless 2026-07-28 clients alternately), {profiles} profiles ({profiles - 2} fixtures, 2 synth "
        f"samples) x {tools} tools, {rounds} rounds each in its own order, memory budget {budget_mb} MB.", "",
        "| measure | value |", "|---|---|",
        f"| calls answered | {out.calls} ({out.tool_errors} of them the same one-line error as the quiet run) |",
        f"| errors (raised, timed out, or an answer unlike the quiet run's) | {len(out.errors)} |",
        f"| wall time | {out.wall_s:.1f} s ({out.calls / out.wall_s:.1f} calls/s) |",
        f"| latency p50 / p99 | {percentile(out.latencies_s, 50) * 1000:.0f} ms / "
        f"{percentile(out.latencies_s, 99) * 1000:.0f} ms |",
        f"| peak server RSS | {out.peak_rss_mb:.0f} MB |",
        f"| models closed by the LRU (reopened from the cache when next used) | {out.evictions} |", ""])


def main() -> int:
    from stallhound.tools import TOOL_NAMES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=CLIENTS)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--memory-budget-mb", type=int, default=MEMORY_BUDGET_MB)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stallhound-load-") as tmp:
        profiles = sorted(FIXTURES.glob("*.sqlite")) + samples(Path(tmp))
        out = run(profiles, list(TOOL_NAMES), clients=args.clients, rounds=args.rounds,
                  budget_mb=args.memory_budget_mb, cache_dir=Path(tmp) / "cache", extra_roots=(Path(tmp),))
    print(report(out, len(profiles), len(TOOL_NAMES), args.clients, args.rounds, args.memory_budget_mb))
    for error in out.errors[:20]:
        print(f"error: {error}", file=sys.stderr)
    return 1 if out.errors else 0


if __name__ == "__main__":
    sys.exit(main())
