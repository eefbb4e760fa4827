"""`python bench/triage_memory.py EXPORT CACHE_DIR`: where triage's memory goes on a cached model.

Runs the first triage once in this process while a sampler thread reads the RSS (/proc/self/statm) and, near
each new peak, DuckDB's own accounting (duckdb_memory(), per tag, in memory and spilled) on a second cursor.
Their difference at the peak is memory DuckDB's memory limit does not govern (Python objects, the allocator's
retained pages, operators outside the buffer manager). Prints CPU time, wall time, peak RSS and that breakdown.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path

from stallhound.formats import open_profile
from stallhound.tools import triage

PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_S = 0.2  # often enough to see a query's peak, rare enough not to slow it
NEAR_PEAK_MB = 30  # read duckdb_memory() only near the peak: the query costs a little CPU
DUCK_MEMORY = ("SELECT tag, round(memory_usage_bytes / 2**20) AS mb, round(temporary_storage_bytes / 2**20) AS "
               "spilled_mb FROM duckdb_memory() WHERE memory_usage_bytes > 0 OR temporary_storage_bytes > 0")


def rss_mb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE // 2**20


def main(export: str, cache: str) -> None:
    model = open_profile(export, cache_dir=Path(cache))
    side, peak, done = model.con.cursor(), {"rss_mb": 0, "duckdb": []}, threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = rss_mb()
            if now > peak["rss_mb"] - NEAR_PEAK_MB:
                tags = side.execute(DUCK_MEMORY).fetchall()
                if now > peak["rss_mb"]:
                    peak.update(rss_mb=now, duckdb=tags)
            time.sleep(SAMPLE_S)

    threading.Thread(target=sample, daemon=True).start()
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    result = triage.run(model.con, triage.Params(profile="bench"))
    after = resource.getrusage(resource.RUSAGE_SELF)
    done.set()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"triage {time.perf_counter() - start:.1f} s wall, {cpu:.1f} s CPU, peak RSS {after.ru_maxrss // 1024} MB, "
          f"{result.total_findings} findings")
    in_duck = sum(mb for _, mb, _ in peak["duckdb"])
    print(f"sampled peak RSS {peak['rss_mb']} MB: DuckDB holds {in_duck:.0f} MB of it ({peak['duckdb']}), "
          f"{peak['rss_mb'] - in_duck:.0f} MB outside its accounting")


if __name__ == "__main__":
    main(*sys.argv[1:3])
