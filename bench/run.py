"""`make bench`: load and tool timings on a ~1 GB profile, written to BENCHMARKS.md.

Makes the profile with ../shared/tools/scale_profile.py (500 copies of nsysai_h100_2gpu_1s), then
measures, each in a fresh subprocess so peak RSS is the load's own: a cold load (empty cache), a
cached reopen, every tool in-process on the loaded model (median of REPEATS runs, so per-model caches
are warm), and a first triage in a fresh process.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SOURCE = SHARED / "fixtures/nsys/nsysai_h100_2gpu_1s.sqlite"
BIG = Path(os.environ.get("NSIGHTFUL_BENCH_PROFILE", "/tmp/nsightful-bench/big.sqlite"))
COPIES = 500
REPEATS = 5
TOOL_ARGS = {"query_sql": {"sql": "SELECT device_id, count(*), sum(duration_ns) FROM kernels GROUP BY 1"},
             "find_kernels": {"pattern": "gemm"}}

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from nsightful.profiles import open_profile
t = time.perf_counter()
p = open_profile(sys.argv[1], cache_dir=Path(sys.argv[2]))
elapsed = time.perf_counter() - t
out = {"seconds": elapsed, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
if sys.argv[3] == "tools":
    import statistics
    from nsightful.tools import skills
    extra = json.loads(sys.argv[4])
    times = {}
    for name, module in skills().items():
        params = module.Params(profile="bench", **extra.get(name, {}))
        runs = []
        for _ in range(int(sys.argv[5])):
            t = time.perf_counter()
            with p.con.cursor() as cur:
                module.run(cur, params)
            runs.append(time.perf_counter() - t)
        times[name] = statistics.median(runs)
    out["tools"] = times
if sys.argv[3] == "triage":  # the call an assistant makes first: nothing computed yet in this process
    from nsightful.tools import triage
    t = time.perf_counter()
    triage.run(p.con, triage.Params(profile="bench"))
    out["triage_first"] = time.perf_counter() - t
print(json.dumps(out))
"""


def make_profile() -> None:
    if BIG.exists():
        return
    BIG.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(SHARED / "tools/scale_profile.py"), str(SOURCE), str(BIG),
                    "--copies", str(COPIES)], check=True)


def child(cache: Path, mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(BIG), str(cache), mode, json.dumps(TOOL_ARGS),
                           str(REPEATS)], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem_gb:.0f} GiB RAM, Python {platform.python_version()}"


def report(cold: dict, warm: dict, first: dict, size: int) -> str:
    tools = warm["tools"]
    lines = [f"## {datetime.date.today().isoformat()}: {machine()}", "",
             f"Profile: {BIG.name}, {size / 1e9:.2f} GB ({COPIES} copies of {SOURCE.name}).", "",
             "| measure | value | goal |", "|---|---|---|",
             f"| cold load | {cold['seconds']:.2f} s | <= 8 s |",
             f"| peak RSS of the cold load | {cold['peak_rss_mb']:.0f} MB | <= 1,500 MB |",
             f"| cached reopen | {warm['seconds']:.3f} s | <= 0.3 s |",
             f"| all tools together (medians) | {sum(tools.values()):.2f} s | <= 3 s |",
             f"| triage, first call after a cached reopen | {first['triage_first']:.2f} s | |", "",
             f"| tool | median of {REPEATS} |", "|---|---|"]
    lines += [f"| {name} | {sec * 1000:.0f} ms |" for name, sec in sorted(tools.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines) + "\n"


def main() -> int:
    make_profile()
    with tempfile.TemporaryDirectory(prefix="nsightful-bench-") as tmp:
        cache = Path(tmp)
        cold = child(cache, "load")
        warm = child(cache, "tools")
        first = child(cache, "triage")
    text = report(cold, warm, first, BIG.stat().st_size)
    print(text)
    bench_md = ROOT / "BENCHMARKS.md"
    head = "# Benchmarks\n\nWritten by `make bench` (newest first). Machine and date in each heading.\n\n"
    old = bench_md.read_text().removeprefix(head) if bench_md.exists() else ""
    bench_md.write_text(head + text + "\n" + old)
    print(f"peak RSS of this runner: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
