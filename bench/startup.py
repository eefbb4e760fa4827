"""`make bench`, start-up part: what one command costs in a fresh process on a small profile, as an agent calling
the command line meets it. `stallhound --version`, `--help`, and `triage --json` of a small real export on its
cached model, each the median of REPEATS fresh processes (wall and CPU of the child: CPU is the fairer figure on a
shared machine). A triage asked again is answered from the answer memo (cli/memo.py); the same triage with its memo
removed before each run (the model cached, the answer computed: what the first triage of a cached model costs) is
timed beside it, and so is the first triage of the profile, cold: the cache folder removed before each run, so that
each builds the model.

Beside them, in the same run, nsys-ai 0.3.0's `diagnose --format json` on a copy of the same file (it writes caches
beside the profile), its caches made by one run first, as ours is: installed from the package index into the
benchmark's own virtual environment (NSYS_AI_VENV), never a dependency of the project. DuckDB fetches its SQLite
scanner from DuckDB's own servers on first use, which the machines running this may not reach (nsys-ai then falls
back to slower SQLite reads, with a network timeout on each start); so that venv gets the DuckDB version we use and
its scanner from the package index, put where DuckDB looks for installed extensions in a home folder of the
benchmark's own. Where nsys-ai cannot be installed the section says why and ours runs alone.

Then the MCP server as an assistant meets it: `stallhound serve` over stdio, driven by the MCP SDK's own client, the
small export loaded, MCP_CALLS warm calls of one cheap tool (MCP_TOOL, after one call that warms it), each round trip
timed in the client: p50 and p99.

Every child gets PYTHONPYCACHEPREFIX (a folder of the benchmark's) and not PYTHONDONTWRITEBYTECODE: an installed
package runs from compiled bytecode, and the warm-up run of each command compiles it there.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from load import percentile
from run import ROOT, SHARED, machine, record

from stallhound.cli.memo import MEMO_FOLDER

PROFILE = SHARED / "fixtures/nsys/nsysai_h100_2gpu_1s.sqlite"
BENCH_DIR = Path(os.environ.get("STALLHOUND_BENCH_DIR", "/tmp/stallhound-bench"))
NSYS_AI = "nsys-ai==0.3.0"
NSYS_AI_VENV = BENCH_DIR / "nsys-ai-venv"
REPEATS = 7
INSTALL_TIMEOUT_S = 600
GOALS = {"version": "<= 0.15 s wall", "help": "<= 0.15 s wall", "triage": "<= 0.5 s wall, >= 10x faster than nsys-ai",
         "triage_computed": "<= 0.5 s wall", "triage_cold": "<= 1.5 s wall"}
MCP_CALLS = 200
MCP_TOOL = "gpu_utilization"  # one small query on the loaded model: the round trip is mostly the server's own cost
MCP_GOAL = "<= 30 ms / <= 150 ms"


Command = tuple[list[str], Path | None, Path | None]  # argv, working folder, a folder removed before each run


def timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None,
          forget: Path | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, of the child and what it waited for) of one run, `forget` removed first;
    fails on an error."""
    if forget is not None:
        shutil.rmtree(forget, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def interleaved(commands: dict[str, Command], env: dict[str, str]) -> dict[str, dict]:
    """Per command: one warm-up run (kept as `first`), then the medians of REPEATS runs, the commands taking turns so
    that each sees the same load on a shared machine."""
    first = {k: timed(cmd, env, cwd, forget) for k, (cmd, cwd, forget) in commands.items()}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
    for _ in range(REPEATS):
        for k, (cmd, cwd, forget) in commands.items():
            runs[k].append(timed(cmd, env, cwd, forget))
    return {k: {"first": first[k], "wall": statistics.median(r[0] for r in runs[k]),
                "cpu": statistics.median(r[1] for r in runs[k])} for k in commands}


def child_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(BENCH_DIR / "pycache"), "HOME": str(home)}


def stallhound_command() -> list[str]:
    """The console script beside this interpreter (as installed), else `python -m stallhound`."""
    script = Path(sys.executable).with_name("stallhound")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stallhound"]


def install_nsys_ai() -> Path:
    """nsys-ai's command in the benchmark's venv, installing it there first; RuntimeError says why it could not."""
    command = NSYS_AI_VENV / "bin" / "nsys-ai"
    if command.exists():
        return command
    import duckdb
    pins = [NSYS_AI, f"duckdb=={duckdb.__version__}", f"duckdb-extension-sqlite-scanner=={duckdb.__version__}"]
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(NSYS_AI_VENV)], check=True, capture_output=True)
        subprocess.run([str(NSYS_AI_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", *pins], check=True,
                       capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(NSYS_AI_VENV, ignore_errors=True)
        lines = (exc.stderr or "").strip().splitlines() if isinstance(exc.stderr, str) else []
        raise RuntimeError(f"pip install {' '.join(pins)} failed: {(lines or ['no message'])[-1]}") from exc
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(NSYS_AI_VENV, ignore_errors=True)
        raise RuntimeError(f"pip install {NSYS_AI} took over {INSTALL_TIMEOUT_S} s") from exc
    return command


PLACE_SCANNER = """
import duckdb, duckdb_extension_sqlite_scanner as pkg, pathlib, shutil, sys
version, where = duckdb.__version__, duckdb.sql("PRAGMA platform").fetchone()[0]
found = pathlib.Path(pkg.__file__).parent / "extensions" / f"v{version}" / "sqlite_scanner.duckdb_extension"
target = pathlib.Path(sys.argv[1]) / ".duckdb" / "extensions" / f"v{version}" / where
target.mkdir(parents=True, exist_ok=True)
shutil.copy(found, target)
"""


def nsys_ai_command(home: Path, work: Path) -> list[str]:
    """nsys-ai diagnose on a copy of PROFILE in `work` (it writes beside the profile); RuntimeError says why not."""
    command = install_nsys_ai()
    try:
        subprocess.run([str(NSYS_AI_VENV / "bin" / "python"), "-c", PLACE_SCANNER, str(home)], check=True,
                       env=child_env(home), capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"placing DuckDB's SQLite scanner failed: {exc.stderr.strip()[-200:]}") from exc
    copy = work / PROFILE.name
    shutil.copyfile(PROFILE, copy)
    return [str(command), "diagnose", str(copy), "--format", "json"]


def measure(home: Path, cache: Path, work: Path) -> tuple[dict[str, dict], dict]:
    """Ours (version, help, triage cold, triage computed on the cached model, triage from its memo) and nsys-ai's
    diagnose, or {"failed": why} for nsys-ai. The triages run in that order in each round: each finds what the one
    before it left (the model, then the memo)."""
    cmd = stallhound_command()
    triage = [*cmd, "triage", str(PROFILE), "--json", "--cache-dir", str(cache)]
    commands: dict[str, Command] = {
        "version": ([*cmd, "--version"], None, None), "help": ([*cmd, "--help"], None, None),
        "triage_cold": (triage, None, cache), "triage_computed": (triage, None, cache / MEMO_FOLDER),
        "triage": (triage, None, None)}
    try:
        commands["nsys_ai"] = (nsys_ai_command(home, work), work, None)
        why = None
    except RuntimeError as exc:
        why = str(exc)
    found = interleaved(commands, child_env(home))
    peer = found.pop("nsys_ai", {"failed": why})
    return found, peer


async def _round_trips(cache: Path, home: Path) -> list[float]:
    """Seconds of each of MCP_CALLS warm MCP_TOOL calls on PROFILE, over stdio to a `stallhound serve` child."""
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    cmd = stallhound_command()
    server = StdioServerParameters(command=cmd[0], env=child_env(home), args=[
        *cmd[1:], "serve", "--root", str(PROFILE.parent), "--cache-dir", str(cache)])
    async with Client(server) as client:
        loaded = await client.call_tool("load_profile", {"path": str(PROFILE)})
        args = {"profile": loaded.structured_content["profile"]}
        times = []
        for _ in range(MCP_CALLS + 1):
            start = time.perf_counter()
            result = await client.call_tool(MCP_TOOL, args)
            times.append(time.perf_counter() - start)
            if result.is_error:
                raise RuntimeError(f"{MCP_TOOL} failed: {result.content}")
    return times[1:]


def round_trips(cache: Path, home: Path) -> dict[str, float]:
    import anyio
    times = anyio.run(_round_trips, cache, home)
    return {"p50": percentile(times, 50), "p99": percentile(times, 99), "max": max(times)}


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def report(mine: dict[str, dict], peer: dict, mcp: dict[str, float], loads: tuple[str, str]) -> str:
    label = {"version": "`stallhound --version`", "help": "`stallhound --help`",
             "triage": f"`stallhound triage --json` of {PROFILE.name} asked again (its answer memo)",
             "triage_computed": "`stallhound triage --json`, answer computed on the cached model (memo removed)",
             "triage_cold": "`stallhound triage --json`, cold: the model built (cache folder removed)"}
    rows = [f"| {label[k]} | {r['wall']:.3f} s | {r['cpu']:.3f} s | {GOALS[k]} |" for k, r in mine.items()]
    rows.append(f"| MCP `{MCP_TOOL}` round trip over stdio, warm ({MCP_CALLS} calls): p50 / p99 (max) | "
                f"{1e3 * mcp['p50']:.1f} ms / {1e3 * mcp['p99']:.1f} ms ({1e3 * mcp['max']:.0f} ms) | | {MCP_GOAL} |")
    if "failed" in peer:
        rows.append(f"| {NSYS_AI} `diagnose` | not run: {peer['failed'].replace('|', '/')} | | |")
    else:
        ratio = peer["wall"] / mine["triage"]["wall"]
        rows += [
            f"| {NSYS_AI} `diagnose --format json`, its caches made | {peer['wall']:.3f} s | {peer['cpu']:.3f} s | |",
            f"| {NSYS_AI} `diagnose`, first run (makes its caches) | {peer['first'][0]:.2f} s | "
            f"{peer['first'][1]:.2f} s | |",
            f"| nsys-ai diagnose / our triage asked again (wall) | {ratio:.1f}x | | >= 10x |",
            f"| nsys-ai diagnose / our triage computed on the cached model (wall) | "
            f"{peer['wall'] / mine['triage_computed']['wall']:.1f}x | | |"]
    return "\n".join([
        f"## {date.today().isoformat()}: start-up on a small export (commit {commit()}), {machine()}", "",
        f"Each a fresh process, median of {REPEATS} after one warm-up run; {PROFILE.name} "
        f"({PROFILE.stat().st_size / 1e6:.1f} MB). Load average before / after: {loads[0]} / {loads[1]} "
        f"({os.cpu_count()} cores).", "",
        "| command | wall | CPU | goal |", "|---|---|---|---|", *rows]) + "\n"


def main() -> int:
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="stallhound-startup-") as tmp:
        home, cache, work = (Path(tmp) / name for name in ("home", "cache", "work"))
        for folder in (home, cache, work):
            folder.mkdir()
        mine, peer = measure(home, cache, work)
        mcp = round_trips(cache, home)
    text = report(mine, peer, mcp, (before, load_average()))
    print(text)
    print(json.dumps({"ours": mine, "nsys_ai": peer, "mcp": mcp, "python": platform.python_version()}), file=sys.stderr)
    record(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
