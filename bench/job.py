"""`make bench-job`: load a job of RANKS exports of ~250 MB each, serial (workers=1) vs parallel (workers=cores).

The exports are made under /tmp (never committed) with ../shared/tools/scale_profile.py from
nsysai_h100_2gpu_1s, each with its own gap between copies so that every rank has its own content (a shared
fingerprint would build once and let the cache answer for the others). Each load runs in a fresh subprocess
with an empty cache; it records wall time, the workers' summed build and Parquet-write seconds, and peak memory:
the largest sum of the RSS of the loading process and its pool workers, sampled every SAMPLE_S, plus a reopen
from the cache. Prints one JSON object per measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from run import SHARED

SOURCE = SHARED / "fixtures/nsys/nsysai_h100_2gpu_1s.sqlite"
FOLDER = Path(os.environ.get("STALLHOUND_BENCH_JOB", "/tmp/stallhound-bench/job"))
RANKS = int(os.environ.get("STALLHOUND_BENCH_JOB_RANKS", "8"))
COPIES = int(os.environ.get("STALLHOUND_BENCH_JOB_COPIES", "125"))  # x ~2 MB of source: ~250 MB per rank
GAP_NS = 1_000_000  # scale_profile's gap between copies; rank r adds r ns, so each rank's content differs
SAMPLE_S = 0.2

CHILD = r"""
import json, sys, threading, time
from pathlib import Path
import psutil
from stallhound.jobs.job import load_job
me, peak, stop = psutil.Process(), [0], threading.Event()
def sample():
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(float(sys.argv[4]))
threading.Thread(target=sample, daemon=True).start()
t = time.perf_counter()
job = load_job(sys.argv[1], cache_dir=Path(sys.argv[2]), workers=int(sys.argv[3]))
wall = time.perf_counter() - t
stop.set()
ranks = len(job.ranks)
kernels = job.con.execute("SELECT count(*) FROM kernels").fetchone()[0]
print(json.dumps({"wall_s": wall, "build_s": job.timings.build_s, "parquet_write_s": job.timings.write_s,
                  "reused": job.timings.reused, "ranks": ranks, "kernels": kernels, "peak_rss_mb": peak[0] / 2**20}))
"""


def make_ranks() -> list[Path]:
    FOLDER.mkdir(parents=True, exist_ok=True)
    paths = [FOLDER / f"rank_{r}.sqlite" for r in range(RANKS)]
    for r, path in enumerate(paths):
        if not path.exists():
            subprocess.run([sys.executable, str(SHARED / "tools/scale_profile.py"), str(SOURCE), str(path),
                            "--copies", str(COPIES), "--gap-ns", str(GAP_NS + r)], check=True,
                           stdout=subprocess.DEVNULL)
    return paths


def load(cache: Path, workers: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(FOLDER), str(cache), str(workers), str(SAMPLE_S)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    paths = make_ranks()
    mb = sum(p.stat().st_size for p in paths) / 2**20
    cores = os.cpu_count() or 1
    print(json.dumps({"ranks": RANKS, "export_mb_each": round(mb / RANKS), "cores": cores}))
    for label, workers in (("serial", 1), ("parallel", cores)):
        with tempfile.TemporaryDirectory(prefix="stallhound-bench-job-") as cache:
            cold = load(Path(cache), workers)
            print(json.dumps({"run": label, "workers": workers, **cold}))
            if label == "parallel":
                print(json.dumps({"run": "reopen from the cache", "workers": workers, **load(Path(cache), workers)}))


if __name__ == "__main__":
    main()
