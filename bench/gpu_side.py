"""The GPU side of one export's build alone (formats.nsys.build's gpu_side, on one cursor, the host side not run):
CPU seconds per step and per SQL statement, and with --figures each GPU table's row count and per-column hash sums,
to check that a change to the build keeps every figure.

Run two versions in one sitting to compare CPU (wall time is noise on a shared machine), e.g. the branch's parent
unpacked under /tmp/base: `PYTHONPATH=/tmp/base .venv/bin/python bench/gpu_side.py EXPORT` and the branch without it.
"""

from __future__ import annotations

import argparse
import re
import resource
import tempfile
import time
from pathlib import Path

from stallhound.formats import build_steps
from stallhound.formats.build_steps import NO_PROGRESS_BAR
from stallhound.formats.nsys.build import Builder
from stallhound.formats.nsys.raw import RawExport
from stallhound.model.duck import load_sqlite_scanner

GPU_STEPS = (  # each builds the model table of its name
    "cuda_api", "kernels", "memcpy", "memset", "sync", "graph_exec", "memory_usage", "uvm_faults")
SHOWN_CPU_S = 0.05  # statements cheaper than this are left out of the listing


def timed_sql(log: list[tuple[float, str]]):
    plain = build_steps.BuildSteps.sql

    def sql(self, query, cur=None, params=None):
        started = time.process_time()
        plain(self, query, cur, params)
        log.append((time.process_time() - started, re.sub(r"\s+", " ", query)[:100]))
    return sql


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--figures", action="store_true", help="print row counts and per-column hash sums")
    args = parser.parse_args()
    log: list[tuple[float, str]] = []
    build_steps.BuildSteps.sql = timed_sql(log)
    with tempfile.TemporaryDirectory(prefix="stallhound-gpu-side-") as tmp:
        raw = RawExport(args.export)
        b = Builder(raw, Path(tmp) / "model.duckdb")
        with b.running():
            load_sqlite_scanner(b.con)
            b.sql(f"ATTACH '{raw.scan_path}' AS raw (TYPE sqlite, READ_ONLY)")
            b.strings()
            b.enums()
            cur = b.con.cursor()
            cur.execute(NO_PROGRESS_BAR)
            log.clear()
            steps = {}
            for step in GPU_STEPS:
                started = time.process_time()
                getattr(b, step)(cur)
                steps[step] = time.process_time() - started
            print(f"GPU side CPU {sum(steps.values()):.2f} s, peak RSS "
                  f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")
            print("  ".join(f"{step} {cpu:.2f}" for step, cpu in steps.items()))
            for cpu, query in log:
                if cpu >= SHOWN_CPU_S:
                    print(f"  {cpu:6.2f} s  {query}")
            if args.figures:
                for table in GPU_STEPS:
                    print(table, cur.execute(f"SELECT count(*), sum(hash(COLUMNS(*))) FROM {table}").fetchone())
            cur.close()


if __name__ == "__main__":
    main()
