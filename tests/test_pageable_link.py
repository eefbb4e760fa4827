"""pageable-host-memory's saving leaves out the staged copies already at the pinned rate (analysis/pageable_link.sql):
uploads whose transfer ran after their call returned (a DMA from the driver's pinned buffer), and copies as fast as the
device's pinned DMAs of 20 us or more. Tiny models for the edges, and two public profiles read on their raw data."""

from __future__ import annotations

import gzip
import json
import sqlite3

import pytest
from modeldb import make_model
from test_memory_transfers import call, copy, k

from stallhound.analysis import pageable_copies
from stallhound.analysis.pageable_copies import Staged, saving
from stallhound.formats import open_profile
from stallhound.tools import memory_transfers as mt
from stallhound.tools import triage

ARGS = {"devices": [0], "start": 0, "end": 10**9}


def staged(at_link_ns: int) -> Staged:
    return Staged(count=2, bytes=2 << 20, time_ns=800, largest_ns=400, async_count=0, pinned_bytes=0,
                  pinned_time_ns=0, small_count=0, exposed_ns=1_000, at_link_ns=at_link_ns)


def test_pinning_saves_no_transfer_time_of_copies_already_at_the_pinned_rate():
    """Of 1,000 ns of exposed transfer (no pinned copy to compare: PINNED_SPEEDUP 2), half of the share not yet at the
    pinned rate."""
    assert [saving(staged(n)) for n in (0, 400, 800)] == [500, 250, 0]


def test_a_staged_upload_sets_the_link_rate_and_a_copy_as_fast_saves_no_transfer():
    """Upload 1 (600,000 B) runs 61-86 us, after its call (0-60 us) returned: the driver had staged it, a 25 us DMA
    from its pinned buffer at 24 GB/s. Upload 2 (1,200,000 B, 100-160 us) transfers 150-200 us at 24 GB/s, partly in
    its call; upload 3 the same bytes 300-360 us at 20 GB/s (0.83 of 24, under LINK_RATE_SHARE); upload 4, 83 KB
    after its call in 4 us, is staged too. At the pinned rate: 25 + 50 + 4 us; upload 3 keeps its 60 us."""
    con = make_model(memcpy=[copy(61_000, 86_000, "H2D", 600_000, "pageable", "device", 1, "cudaMemcpy"),
                             copy(150_000, 200_000, "H2D", 1_200_000, "pageable", "device", 2, "cudaMemcpy"),
                             copy(300_000, 360_000, "H2D", 1_200_000, "pageable", "device", 3, "cudaMemcpy"),
                             copy(400_000, 404_000, "H2D", 83_000, "pageable", "device", 4, "cudaMemcpyAsync")],
                     cuda_api=[call(0, 60_000, "cudaMemcpy", 1), call(100_000, 160_000, "cudaMemcpy", 2),
                               call(250_000, 355_000, "cudaMemcpy", 3), call(380_000, 381_000, "cudaMemcpyAsync", 4)])
    assert pageable_copies.at_link(con, ARGS) == {(0, "H2D"): 79_000}


def test_an_upload_queued_behind_kernels_keeps_its_saving():
    """A kernel runs 0-1,000 ns; the synchronous upload's call (100-2,000) waits for it, and its transfer starts 900 ns
    into the call, 800 ns long: later in its call than it lasts, yet the call still runs: no sign of staging first,
    and no pinned DMA to compare. Pinning saves half its 800 ns of exposed transfer, plus the 200 ns the GPU idles
    after it while the call returns."""
    con = make_model(kernels=[k(0, 1_000)],
                     memcpy=[copy(1_000, 1_800, "H2D", 1 << 20, "pageable", "device", 1, "cudaMemcpy")],
                     cuda_api=[call(100, 2_000, "cudaMemcpy", 1)])
    assert pageable_copies.at_link(con, ARGS) == {(0, "H2D"): 0}
    [f] = [f for f in mt.findings(mt.run(con, mt.Params(profile="t"))) if f.root_cause == "pageable-host-memory"]
    assert (f.time_at_stake_ns, f.evidence["idle_in_pageable_copies_ns"]) == (600, 200)


def test_pinned_copies_set_the_link_rate_for_pageable_reads():
    """A pinned read of 2 MB in 50 us (40 GB/s) sets the rate: a pageable read at 38 GB/s runs at it, one at 20 GB/s
    does not; a pinned read of 4 us (a DMA that short shows its start cost) sets nothing."""
    reads = [copy(0, 50_000, "D2H", 2_000_000, "device", "pinned"),
             copy(100_000, 150_000, "D2H", 1_900_000, "device", "pageable"),
             copy(200_000, 250_000, "D2H", 1_000_000, "device", "pageable")]
    assert pageable_copies.at_link(make_model(memcpy=reads), ARGS) == {(0, "D2H"): 50_000}
    short = [copy(0, 4_000, "D2H", 200_000, "device", "pinned"), *reads[1:]]
    assert pageable_copies.at_link(make_model(memcpy=short), ARGS) == {(0, "D2H"): 0}


def corpus_path(name: str):
    from corpus import sources
    path = sources.resolve(next(p for p in sources.load() if p.name == name))
    if path is None:
        pytest.skip(f"{name} is not restored (make corpus-restore)")
    return path


def pageable_finding(path, cache_root) -> tuple[Staged, mt.Result]:
    con = open_profile(path, cache_dir=cache_root).con
    w = triage.run(con, triage.Params(profile="c")).window
    result = mt.run(con, mt.Params(profile="c", start_ns=w.start_ns, end_ns=w.end_ns))
    assert result._basis is not None
    return result._basis.pageable[0, "H2D"], result


def test_cloverleaf_pinning_saves_the_staging_not_the_transfers(cache_root):
    """cloverleaf_a100_sync_per_kernel: 244 pageable uploads of 64 KiB or more, 9.332 ms; 121 (600 KiB, 25 us DMAs)
    ran after their cudaMemcpy returned, at up to 24.74 GB/s; the 123 others at 23.66 GB/s or more, over 0.9 of it
    (SQL below). All run at the pinned rate: pinning saves the staging, the GPU's idle in their calls, not the 13.601
    ms claimed before (half the transfers plus that idle), and no more than the raw idle between each copy's ready time
    (its call's start, or the device's earlier work's end) and its transfer, 10.504 ms."""
    raw = sqlite3.connect(f"file:{corpus_path('cloverleaf_a100_sync_per_kernel')}?mode=ro", uri=True)
    copies = raw.execute("""SELECT m.start, m."end", m.bytes, r.start, r."end" FROM CUPTI_ACTIVITY_KIND_MEMCPY m
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
        WHERE m.srcKind = 0 AND m.copyKind = 1 AND m.bytes >= 65536""").fetchall()
    after = [b / (e - s) for s, e, b, _, ce in copies if s >= ce and e - s >= 20_000]
    assert len(after) == 121 and all(s >= ce or b / (e - s) >= 0.9 * max(after) for s, e, b, _, ce in copies)
    busy = raw.execute("""SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL
        UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY""").fetchall()
    ready = [min(max([cs] + [be for bs, be in busy if bs < s and be > cs]), s) for s, _, _, cs, _ in copies]
    staging = sum(s - r for (s, *_), r in zip(copies, ready, strict=True))
    assert staging == 10_504_075
    x, result = pageable_finding(corpus_path("cloverleaf_a100_sync_per_kernel"), cache_root)
    assert (x.count, x.time_ns, x.at_link_ns, saving(x)) == (244, sum(e - s for s, e, *_ in copies), x.time_ns, 0)
    [f] = [f for f in mt.findings(result) if f.root_cause == "pageable-host-memory"]
    assert f.time_at_stake_ns == f.evidence["idle_in_pageable_copies_ns"] == 8_935_071 <= staging


def test_param_resnet_uploads_pipelined_with_staging_keep_their_saving(cache_root):
    """param_resnet_train_2080ti: 30 pageable uploads of 77 MB at 3.67 GB/s, each transfer ending after its call
    returned but starting inside it (the host staged it chunk by chunk while the DMA ran: pinning speeds it), no
    pinned copy: nothing at the pinned rate, the saving stays half the exposed transfer time (337.866 ms at stake)."""
    path = corpus_path("param_resnet_train_2080ti")
    events = json.load(gzip.open(path, "rt"))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime" and "args" in e}
    uploads = [e for e in events
               if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"] and e["args"]["bytes"] >= 65536]
    assert {e["name"] for e in uploads} == {"Memcpy HtoD (Pageable -> Device)"} and len(uploads) == 30
    assert all(e["ts"] < calls[e["args"]["correlation"]]["ts"] + calls[e["args"]["correlation"]]["dur"]
               for e in uploads)
    x, result = pageable_finding(path, cache_root)
    assert (x.count, x.at_link_ns, saving(x)) == (30, 0, x.exposed_ns // 2)
    [f] = [f for f in mt.findings(result) if f.root_cause == "pageable-host-memory"]
    assert f.time_at_stake_ns == 337_866_500
