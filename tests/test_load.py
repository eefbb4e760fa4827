"""The load test, small and fast: parallel clients over HTTP answer exactly as a quiet run, within the
memory budget (bench/load.py is the full version, run by `make bench`)."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import FIXTURES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import load  # noqa: E402

PROFILES = [FIXTURES / f"{stem}.sqlite" for stem in ("nsysai_mock", "pipit_saxpy_mpi_a100", "clue_t4_report4")]
TOOLS = ["profile_summary", "top_kernels", "gpu_utilization", "gpu_idle_gaps", "query_sql", "find_kernels"]
CLIENTS = 4
ONE_MODEL_MB = 5  # each of these models is 3.3-4 MB: one fits, so nearly every switch of profile evicts one
RSS_CEILING_MB = 1024  # a few small models and four sessions; a leak of models or connections breaks it


def test_load_parallel_clients_answer_as_a_quiet_run_within_the_memory_budget(tmp_path):
    out = load.run(PROFILES, TOOLS, clients=CLIENTS, rounds=1, budget_mb=ONE_MODEL_MB, time_limit_s=300,
                   cache_dir=tmp_path / "cache")
    assert out.errors == []
    assert out.calls == CLIENTS * len(PROFILES) * (1 + len(TOOLS))
    assert out.evictions > 0  # the LRU closed models under load, and they reopened with the same answers
    assert 0 < out.peak_rss_mb < RSS_CEILING_MB
    assert load.percentile(out.latencies_s, 99) >= load.percentile(out.latencies_s, 50) > 0
