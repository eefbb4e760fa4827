"""`make bench`, Kineto part: load time and peak RSS of a ~1 GB torch.profiler trace, plain and gzipped.

The trace is made under /tmp (never committed) by repeating the events of the A100 NCCL fixture COPIES times,
each copy shifted past the previous one in time and in correlation ids, so kernels still join their launches.
Each load runs in a fresh subprocess with an empty cache, so its peak RSS is the load's own.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from decimal import Decimal
from pathlib import Path

from run import SHARED, child, machine, record

SOURCE = SHARED / "fixtures/kineto/hta_a100_nccl_rank0.json.gz"
BIG = Path(os.environ.get("STALLHOUND_BENCH_KINETO", "/tmp/stallhound-bench/kineto_big.json"))
SOURCE_DIR = Path(__file__).resolve().parent
COPIES = 116  # x 8.6 MB of events as json.dumps writes them: ~1 GB of JSON
GAP_US = 1000  # between copies, so copies never overlap in time


def _event(e: dict, shift_us: Decimal, shift_ids: int) -> str:
    """The event as JSON, times shifted (written as exact decimals) and correlation ids moved past earlier copies."""
    rest = {k: v for k, v in e.items() if k not in ("ts", "dur")}
    if "correlation" in rest.get("args", {}):
        rest["args"] = {**rest["args"], "correlation": rest["args"]["correlation"] + shift_ids}
    times = f'"ts": {e["ts"] + shift_us}' + (f', "dur": {e["dur"]}' if "dur" in e else "")
    body = json.dumps(rest, default=float)  # other fractions (occupancy, bandwidth) need no exact digits
    return "{" + times + (", " + body[1:] if len(body) > 2 else "}")


def make_trace() -> None:
    if BIG.exists() and BIG.with_suffix(".json.gz").exists():
        return
    BIG.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(SOURCE, "rt") as fh:
        doc = json.load(fh, parse_float=Decimal)
    events = [e for e in doc["traceEvents"] if isinstance(e.get("ts"), int | Decimal)]
    first = min(e["ts"] for e in events)
    period = max(e["ts"] + e.get("dur", 0) for e in events) - first + GAP_US
    ids = max(e.get("args", {}).get("correlation", 0) for e in events) + 1
    head = {k: v for k, v in doc.items() if k in ("schemaVersion", "deviceProperties", "distributedInfo")}
    partial = [BIG.with_suffix(".partial.json"), BIG.with_suffix(".partial.json.gz")]
    with partial[0].open("w") as out, gzip.open(partial[1], "wt", compresslevel=1) as packed:
        for sink in (out, packed):
            sink.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        for copy in range(COPIES):
            chunk = ",\n".join(_event(e, copy * period, copy * ids) for e in events)
            for sink in (out, packed):
                sink.write(("" if copy == 0 else ",\n") + chunk)
        for sink in (out, packed):
            sink.write('\n], "displayTimeUnit": "ms"}\n')
    partial[0].replace(BIG)
    partial[1].replace(BIG.with_suffix(".json.gz"))


def load(path: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="stallhound-bench-") as cache:
        return child(path, Path(cache), "load")


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=SOURCE_DIR)
    return done.stdout.strip() or "unknown"


def _load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    make_trace()
    rows, before = [], _load_average()
    for path in (BIG, BIG.with_suffix(".json.gz")):
        result = load(path)
        rows.append(f"| {path.name} | {path.stat().st_size / 1e9:.2f} GB ({BIG.stat().st_size / 1e9:.2f} GB of JSON) | "
                    f"{result['seconds']:.1f} s | {result['cpu_seconds']:.1f} s + "
                    f"{result['workers_cpu_seconds']:.1f} s | "
                    f"{result['peak_rss_mb']:.0f} MB + {result['workers_peak_rss_mb']:.0f} MB |")
    text = "\n".join([
        f"## {date.today().isoformat()}: Kineto trace load (commit {_commit()}), {machine()}", "",
        f"{COPIES} copies of {SOURCE.name}'s events (shifted in time and correlation id), cut in 4 MB batches "
        "through the reader's bounds (depth, value size, gzip ratio), each parsed with msgspec by a worker process "
        "(one per core; the last events with ijson) and staged into DuckDB on a writer thread; each load in a fresh "
        f"process with an empty cache. Load average before / after: {before} / {_load_average()} "
        f"({os.cpu_count()} cores).", "",
        "| trace | size | cold load (wall) | CPU (this process + workers) | peak RSS (this process + largest worker) |",
        "|---|---|---|---|---|", *rows]) + "\n"
    print(text)
    record(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
