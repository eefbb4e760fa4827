"""`python bench/model_memory.py [CACHE_DIR]`: the first triage on the 1 GB benchmark export under model memory
limits (STALLHOUND_MODEL_MEMORY_MB), A/B in one run.

Each (round, limit) is a fresh process that reopens the cached model (built into CACHE_DIR first if missing)
and runs triage once, then answer_questions (which reads triage's results), recording CPU time, wall time, peak
RSS and triage's costliest queries by CPU time. Limits
interleave round by round so the machine's load falls on all of them alike; CPU seconds compare better than
wall on a shared machine. UNLIMITED stands for no limit (more than the machine's memory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIG = Path("/tmp/stallhound-bench/big.sqlite")  # made by bench/run.py
LIMITS_MB = (500, 750, 1000, 100_000)
UNLIMITED = 100_000
ROUNDS = 2
TOP_QUERIES = 3

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from stallhound.formats import open_profile
from stallhound.tools import answer_questions, triage
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
queries = []
class Timed:  # the model cursor, timing each query (execute and its fetch) by the CPU it costs
    def __init__(self, con):
        self.con = con
    def __getattr__(self, name):
        found = getattr(self.con, name)
        if not name.startswith("fetch"):
            return found
        def fetch(*a, **k):
            c = cpu()
            out = found(*a, **k)
            queries[-1][0] += cpu() - c
            return out
        return fetch
    def execute(self, sql, *a, **k):
        c = cpu()
        self.con.execute(sql, *a, **k)
        queries.append([cpu() - c, " ".join(sql.split())[:60]])
        return self
p = open_profile(sys.argv[1], cache_dir=Path(sys.argv[2]))
t, c = time.perf_counter(), cpu()
triage.run(Timed(p.con), triage.Params(profile="bench"))
wall, used, asked = time.perf_counter() - t, cpu() - c, list(queries)
answer_questions.run(p.con, answer_questions.Params(profile="bench"))
print(json.dumps({"wall": wall, "cpu": used, "queries": sorted(asked, reverse=True),
                  "aq_wall": time.perf_counter() - t - wall, "aq_cpu": cpu() - c - used,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def first_triage(cache: Path, limit_mb: int) -> dict:
    env = {**os.environ, "STALLHOUND_MODEL_MEMORY_MB": str(limit_mb)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(BIG), str(cache)], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(cache: Path) -> int:
    first_triage(cache, UNLIMITED)  # builds the model when the cache lacks it; not counted
    runs: dict[int, list[dict]] = {}
    for _ in range(ROUNDS):
        for limit in LIMITS_MB:
            runs.setdefault(limit, []).append(first_triage(cache, limit))
    print("| model memory limit | triage CPU | triage wall | answer_questions CPU / wall | peak RSS | costliest "
          "queries (CPU s) |\n|---|---|---|---|---|---|")
    for limit, found in runs.items():
        name = "unlimited" if limit == UNLIMITED else f"{limit:,} MB"
        for r in found:
            top = "; ".join(f"{q[0]:.1f} {q[1][:40]}" for q in r["queries"][:TOP_QUERIES])
            print(f"| {name} | {r['cpu']:.1f} s | {r['wall']:.1f} s | {r['aq_cpu']:.1f} s / {r['aq_wall']:.1f} s | "
                  f"{r['peak_rss_mb']:,.0f} MB | {top} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(tmp)))
