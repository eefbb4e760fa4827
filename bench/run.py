"""`make bench`: load and tool timings on a ~1 GB profile, written to BENCHMARKS-HISTORY.md and BENCHMARKS.md.

Makes the profile with ../shared/tools/scale_profile.py (500 copies of nsysai_h100_2gpu_1s), then
measures, each in a fresh subprocess so peak RSS is the load's own: a cold load (empty cache), a
cached reopen, every tool in-process on the loaded model (median of REPEATS runs, so per-model caches
are warm), a first triage in a fresh process, and the floor: one single-threaded sqlite3 pass over every
column of the activity tables the build reads. Wall and CPU time are both recorded (CPU time is the fairer
figure on a shared machine).

Then the 10 GB case (COPIES_10GB copies, generated under /tmp once: about 10 GB of disk and a few minutes to
make and load): its floor, and the first answer (cold load + first triage in one fresh process) with peak RSS.
STALLHOUND_BENCH_10GB=0 leaves it out.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SOURCE = SHARED / "fixtures/nsys/nsysai_h100_2gpu_1s.sqlite"
BIG = Path(os.environ.get("STALLHOUND_BENCH_PROFILE", "/tmp/stallhound-bench/big.sqlite"))
COPIES = 500
BIG_10GB = BIG.with_name("big10.sqlite")
COPIES_10GB = 5000
WITH_10GB = os.environ.get("STALLHOUND_BENCH_10GB") != "0"
# The activity tables the build scans (formats/nsys/build.py); the floor reads each of their columns once.
FLOOR_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
                "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "NVTX_EVENTS", "OSRT_API", "COMPOSITE_EVENTS", "SCHED_EVENTS",
                "CUDA_GPU_MEMORY_USAGE_EVENTS")
REPEATS = 5
TOOL_ARGS = {"query_sql": {"sql": "SELECT device_id, count(*), sum(duration_ns) FROM kernels GROUP BY 1"},
             "find_kernels": {"pattern": "gemm"}}

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from stallhound.formats import open_profile
from stallhound.model import allocator
allocator.tune()  # as the stallhound command does
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t, c = time.perf_counter(), cpu()
p = open_profile(sys.argv[1], cache_dir=Path(sys.argv[2]))
elapsed = time.perf_counter() - t
workers = resource.getrusage(resource.RUSAGE_CHILDREN)  # a Kineto load's parse workers (formats/kineto/workers.py)
out = {"seconds": elapsed, "cpu_seconds": cpu() - c,
       "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
       "workers_cpu_seconds": workers.ru_utime + workers.ru_stime, "workers_peak_rss_mb": workers.ru_maxrss / 1024}
if sys.argv[3] == "tools":
    import statistics
    from stallhound.tools import skills
    from stallhound.analysis.contracts import run_skill
    extra = json.loads(sys.argv[4])
    times = {}
    for name, module in skills().items():
        params = module.Params(profile="bench", **extra.get(name, {}))
        runs = []
        for _ in range(int(sys.argv[5])):
            t = time.perf_counter()
            with p.con.cursor() as cur:
                run_skill(cur, module, params)  # as the server calls it: figures, then the findings
            runs.append(time.perf_counter() - t)
        times[name] = statistics.median(runs)
    out["tools"] = times
if sys.argv[3] == "triage":  # the call an assistant makes first: nothing computed yet in this process
    from stallhound.tools import triage
    t, c = time.perf_counter(), cpu()
    triage.run(p.con, triage.Params(profile="bench"))
    out["triage_first"], out["triage_first_cpu"] = time.perf_counter() - t, cpu() - c
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def make_profile(path: Path, copies: int) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(SHARED / "tools/scale_profile.py"), str(SOURCE), str(path),
                    "--copies", str(copies)], check=True)


class ChildFailed(Exception):
    """A measuring subprocess exited with an error; the message is the exception line of its traceback."""


def child(profile: Path, cache: Path, mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(profile), str(cache), mode, json.dumps(TOOL_ARGS),
                           str(REPEATS)], capture_output=True, text=True)
    if done.returncode:
        errors = [line for line in done.stderr.splitlines() if re.match(r"[\w.]+(Error|Exception): ", line)]
        raise ChildFailed((errors or [f"exit status {done.returncode}"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def scan_floor(profile: Path) -> dict:
    """Seconds for one single-threaded sqlite3 pass over every column of FLOOR_TABLES (max() decodes each value
    without handing rows to Python)."""
    con = sqlite3.connect(f"file:{profile}?mode=ro", uri=True)
    before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table in FLOOR_TABLES:
        if table in tables:
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
            reads = ", ".join(f'max("{c}")' for c in cols)
            con.execute(f'SELECT {reads} FROM "{table}"').fetchall()
    after = resource.getrusage(resource.RUSAGE_SELF)
    con.close()
    return {"seconds": time.perf_counter() - t,
            "cpu_seconds": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem_gb:.0f} GiB RAM, Python {platform.python_version()}"


def report(cold: dict, warm: dict, first: dict, floor: dict, size: int, big10: dict | None) -> str:
    tools = warm["tools"]
    lines = [f"## {datetime.date.today().isoformat()}: 1 GB export and the 10 GB first answer, {machine()}", "",
             f"Profile: {BIG.name}, {size / 1e9:.2f} GB ({COPIES} copies of {SOURCE.name}).", "",
             "| measure | wall | CPU | goal |", "|---|---|---|---|",
             f"| sqlite3 scan floor (one thread) | {floor['seconds']:.2f} s | {floor['cpu_seconds']:.2f} s | |",
             f"| cold load | {cold['seconds']:.2f} s | {cold['cpu_seconds']:.2f} s | <= 8 s and <= 3x the floor |",
             f"| peak RSS of the cold load | {cold['peak_rss_mb']:.0f} MB | | <= 1,000 MB |",
             f"| cached reopen | {warm['seconds']:.3f} s | | <= 0.1 s |",
             f"| all tools together (medians) | {sum(tools.values()):.2f} s | | <= 3 s |",
             f"| triage, first call after a cached reopen | {first['triage_first']:.2f} s | "
             f"{first['triage_first_cpu']:.2f} s | <= 2 s |"]
    if big10 and "failed" in big10:
        lines += [f"| 10 GB ({big10['gb']:.1f} GB): first answer | failed: {big10['failed']} | | <= 90 s |"]
    elif big10:
        lines += [f"| 10 GB ({big10['gb']:.1f} GB, {COPIES_10GB} copies): sqlite3 scan floor | "
                  f"{big10['floor']['seconds']:.1f} s | {big10['floor']['cpu_seconds']:.1f} s | |",
                  f"| 10 GB: first answer (cold load + first triage) | "
                  f"{big10['first']['seconds'] + big10['first']['triage_first']:.1f} s | "
                  f"{big10['first']['cpu_seconds'] + big10['first']['triage_first_cpu']:.1f} s | <= 90 s |",
                  f"| 10 GB: of which cold load | {big10['first']['seconds']:.1f} s | "
                  f"{big10['first']['cpu_seconds']:.1f} s | |",
                  f"| 10 GB: of which first triage | {big10['first']['triage_first']:.1f} s | "
                  f"{big10['first']['triage_first_cpu']:.1f} s | |",
                  f"| 10 GB: peak RSS of load + triage | {big10['first']['peak_rss_mb']:.0f} MB | | <= 1,000 MB |"]
    lines += ["", f"| tool | median of {REPEATS} |", "|---|---|"]
    lines += [f"| {name} | {sec * 1000:.0f} ms |" for name, sec in sorted(tools.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"


def case_10gb() -> dict:
    """The first answer on a 10 GB export: cold load and first triage in one fresh process (peak RSS of both)."""
    make_profile(BIG_10GB, COPIES_10GB)
    floor = scan_floor(BIG_10GB)
    gb = BIG_10GB.stat().st_size / 1e9
    with tempfile.TemporaryDirectory(prefix="stallhound-bench10-") as tmp:
        try:
            first = child(BIG_10GB, Path(tmp), "triage")
        except ChildFailed as exc:  # recorded, so the 1 GB figures of the same run are kept
            return {"gb": gb, "floor": floor, "failed": str(exc)}
    return {"gb": gb, "floor": floor, "first": first}


HISTORY_HEAD = ("# Benchmark history\n\nEvery run of `make bench`, newest first, with the session's notes on what "
                "changed. The current figures are in BENCHMARKS.md. Runs before 2026-11-27's house move were made "
                "under the project's former name, nsightful (its commands and environment variables then began with "
                "it).\n\n")
CURRENT_HEAD = ("# Benchmarks\n\nThe newest run of each benchmark `make bench` runs; machine, date and commit in each "
                "heading. Every earlier run, with what changed between them, is in "
                "[BENCHMARKS-HISTORY.md](BENCHMARKS-HISTORY.md).\n\n")
# A section's kind is read from its heading; the last kind takes every heading the others do not.
KINDS = ("start-up", "Kineto trace load", "load test", "1 GB export")


def kind_of(heading: str) -> str:
    return next((k for k in KINDS[:-1] if k in heading), KINDS[-1])


def sections(text: str) -> list[str]:
    """The `## ` sections of a benchmarks file, each with its trailing blank line."""
    body = text[text.find("\n## ") + 1:] if "\n## " in text else ""
    return [s if s.startswith("## ") else "## " + s for s in body.split("\n## ") if s.strip()]


def current(history: str) -> str:
    """BENCHMARKS.md: the newest section of each kind, in KINDS' order."""
    newest: dict[str, str] = {}
    for section in sections(history):
        newest.setdefault(kind_of(section.splitlines()[0]), section.rstrip("\n") + "\n")
    return CURRENT_HEAD + "\n".join(newest[k] for k in KINDS if k in newest)


def record(text: str) -> None:
    """Put a section at the top of BENCHMARKS-HISTORY.md and write BENCHMARKS.md's current figures from it."""
    history_md = ROOT / "BENCHMARKS-HISTORY.md"
    old = history_md.read_text().removeprefix(HISTORY_HEAD) if history_md.exists() else ""
    history = HISTORY_HEAD + text + "\n" + old
    history_md.write_text(history)
    (ROOT / "BENCHMARKS.md").write_text(current(history))


def main() -> int:
    make_profile(BIG, COPIES)
    floor = scan_floor(BIG)
    with tempfile.TemporaryDirectory(prefix="stallhound-bench-") as tmp:
        cache = Path(tmp)
        cold = child(BIG, cache, "load")
        warm = child(BIG, cache, "tools")
        first = child(BIG, cache, "triage")
    text = report(cold, warm, first, floor, BIG.stat().st_size, case_10gb() if WITH_10GB else None)
    print(text)
    record(text)
    print(f"peak RSS of this runner: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
