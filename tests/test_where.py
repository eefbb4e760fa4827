"""Findings carry `where`: their host events' top call sites, against independent readings of the raw data."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import Counter
from html import escape
from pathlib import Path

from fixture_guard import FIXTURES_ROOT
from modeldb import make_model

from stallhound.analysis import where
from stallhound.analysis.common import Finding, Scope, pct
from stallhound.formats import open_profile
from stallhound.report import page
from stallhound.report.gather import gather
from stallhound.tools import triage

PIPIT = FIXTURES_ROOT / "nsys" / "pipit_saxpy_mpi_a100.sqlite"
SYNC_PAGEABLE = Path(__file__).parent.parent / "corpus/captures/data/sync_pageable.json.gz"
PROGRAM = "saxpy-mpi-cuda"  # pipit's executable: its frames are the program's, bar cuda_runtime.h's templates


def _triage(con) -> triage.Result:
    return triage.run(con, triage.Params(profile="p"))


def _placed(result: triage.Result, root_cause: str) -> Finding:
    [finding] = [f for f in result.findings if f.root_cause == root_cause]
    assert finding.where is not None
    return finding


def _program_frame(frames: list[tuple[int, str, str]]) -> str | None:
    """The innermost frame of pipit's executable that is not a CUDA runtime template (cudaMalloc<T>)."""
    return next((sym for _, sym, mod in sorted(frames) if mod.endswith("/" + PROGRAM)
                 and not sym.startswith("cudaError cuda")), None)


def _raw(sql: str, *args) -> list[tuple]:
    raw = sqlite3.connect(f"file:{PIPIT.resolve()}?mode=ro", uri=True)
    return raw.execute(sql, args).fetchall()


def _chains(table: str) -> dict[int, list[tuple[int, str, str]]]:
    frames: dict[int, list] = {}
    for cid, depth, sym, mod in _raw(f"""SELECT c.id, c.stackDepth, s.value, m.value FROM {table} c
            JOIN StringIds s ON s.id = c.symbol JOIN StringIds m ON m.id = c.module"""):
        frames.setdefault(cid, []).append((depth, sym, mod))
    return frames


def _raw_copy_sites(device: int, start: int, end: int, where_sql: str) -> Counter:
    """Per copy of `device` starting in [start, end) that `where_sql` keeps: the program frame of its runtime call's
    chain, the chain at callchainId or one past it that holds the call's own name (tests/test_call_sites.py: this
    nsys 2022.2 export counts the calls' chain ids from 0, the chains' from 1). The export records some calls twice
    under one correlation id (the runtime's and the driver's): a copy takes the chain either has."""
    chains = _chains("CUDA_CALLCHAINS")
    calls: dict[tuple, list] = {}
    for copy, corr, name, chain in _raw(f"""SELECT m.start, m.correlationId, s.value, r.callchainId
            FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
             AND r.globalTid / 16777216 = m.globalPid / 16777216
            JOIN StringIds s ON s.id = r.nameId
            WHERE m.deviceId = ? AND m.start >= ? AND m.start < ? AND ({where_sql})""", device, start, end):
        calls.setdefault((copy, corr), []).extend(
            chains[c] for c in ((chain, chain + 1) if chain is not None else ())
            if any(f[1] == name for f in chains.get(c, [])))
    return Counter(_program_frame(own[0]) if own else None for own in calls.values())


def _raw_idle_samples(device: int, start: int, end: int) -> Counter:
    """Per CPU sample of the threads that launched the device's work in [start, end), taken in a gap between two
    busy stretches of the device there (its work clipped to the window and merged): the sample's program frame."""
    work = _raw("""SELECT max(start, ?), min(end, ?), correlationId, globalPid FROM (
            SELECT start, end, correlationId, globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL
            UNION ALL SELECT start, end, correlationId, globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_MEMCPY)
        WHERE deviceId = ? AND end > ? AND start < ? AND end > start ORDER BY 1, 2""", start, end, device, start, end)
    calls = {(corr, tid // 16777216): tid for corr, tid in _raw(
        "SELECT correlationId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
    threads = {calls[(corr, pid // 16777216)] for _, _, corr, pid in work}
    gaps, reach = [], None
    for s, e, _, _ in work:
        if reach is not None and s > reach:
            gaps.append((reach, s))
        reach = e if reach is None else max(reach, e)
    chains = _chains("SAMPLING_CALLCHAINS")
    sites: Counter = Counter()
    for sample, at, tid in _raw("SELECT id, start, globalTid FROM COMPOSITE_EVENTS"):
        if tid in threads and start <= at < end and any(g0 <= at < g1 for g0, g1 in gaps):
            sites[_program_frame(chains[sample])] += 1
    return sites


def test_where_pipit_copies_name_the_raw_chains_call_site(open_fixture):
    result = _triage(open_fixture("pipit_saxpy_mpi_a100").con)
    w = result.window
    for cause, kept in (("pageable-host-memory", "m.srcKind = 0 OR m.dstKind = 0"),  # nsys' kind 0: pageable
                        ("excessive-h2d-transfers", "m.copyKind = 1")):  # 1: host to device
        found = _placed(result, cause)
        expected = _raw_copy_sites(found.device, w.start_ns, w.end_ns, kept)
        top = found.where.sites[0]
        assert (top.function, top.events) == expected.most_common(1)[0], cause
        assert found.where.matched == found.where.with_stack == sum(expected.values()), cause
        assert top.share_pct == 100.0 and top.calls == "cudaMemcpy"
    assert result.where_note is None


def test_where_pipit_cpu_work_names_the_samples_raw_site_and_share(open_fixture):
    result = _triage(open_fixture("pipit_saxpy_mpi_a100").con)
    found = _placed(result, "cpu-bottleneck")
    expected = _raw_idle_samples(found.device, result.window.start_ns, result.window.end_ns)
    (site, count), = expected.most_common(1)
    top = found.where.sites[0]
    assert (top.function, top.events) == (site, count) == ("main", count)
    assert found.where.matched == found.where.with_stack == sum(expected.values())
    assert top.share_pct == pct(count, sum(expected.values()))
    assert found.where.text.startswith(f"its {found.where.matched:,} CPU samples") and "% of the samples: `main`" \
        in found.where.text


def _readback_syncs(events: list[dict]) -> list[dict]:
    """The synchronize calls whose thread's last CUDA call before them (ended at most 100 us earlier) copied 1 KiB
    or less device to host: a read-back (.item())."""
    small_d2h = {e["args"]["correlation"] for e in events if e.get("cat") == "gpu_memcpy"
                 and "DtoH" in e["name"] and e["args"]["bytes"] <= 1024}
    calls = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    out = []
    for sync in (c for c in calls if c["name"] == "cudaStreamSynchronize"):
        before = [c for c in calls if c["tid"] == sync["tid"] and c["ts"] + c["dur"] <= sync["ts"]]
        last = max(before, key=lambda c: c["ts"] + c["dur"], default=None)
        if last and sync["ts"] - (last["ts"] + last["dur"]) <= 100 and last["args"]["correlation"] in small_d2h:
            out.append(sync)
    return out


def _python_site(events: list[dict], call: dict) -> tuple[str, str | None]:
    """The call's innermost enclosing python_function, up its parents past built-ins and torch/ files: (that frame's
    name, as 'file.py(line): function', and the name of the frame it called)."""
    frames = [e for e in events if e.get("cat") == "python_function" and e["tid"] == call["tid"]]
    by_id = {f["args"]["Python id"]: f for f in frames}
    frame = max((f for f in frames if f["ts"] <= call["ts"] < f["ts"] + f["dur"]), key=lambda f: f["ts"])
    callee = None
    while frame["name"].startswith(("<built-in", "torch/")):
        callee, frame = frame, by_id[frame["args"]["Python parent id"]]
    return frame["name"], callee["name"].split(" at 0x")[0] + ">" if callee else None


def test_where_kineto_readback_names_the_planted_item_in_step(cache_root):
    """The planted `.item()` readbacks cost little in this capture (the same work without them idles about as much:
    sync_pageable_fixed), so triage reports no blocking-d2h-sync; placed as such a finding's events, over triage's
    window, they are the planted line."""
    con = open_profile(SYNC_PAGEABLE, cache_dir=cache_root).con
    result = _triage(con)
    assert "blocking-d2h-sync" not in {f.root_cause for f in result.findings} and result.window is not None
    readbacks = Finding(root_cause="blocking-d2h-sync", severity="info", title="readbacks", evidence={},
                        time_at_stake_ns=0, device=result.window.devices[0])
    found = readbacks.model_copy(update={"where": where.locate(con, result.window, readbacks)})
    assert found.where is not None
    with gzip.open(SYNC_PAGEABLE) as fh:
        events = json.load(fh)["traceEvents"]
    syncs = _readback_syncs(events)
    sites = Counter(_python_site(events, s) for s in syncs)
    (name, callee), count = sites.most_common(1)[0]
    top = found.where.sites[0]
    assert (f"{top.module}({top.line}): {top.function}", top.calls, top.events) == (name, callee, count)
    assert (name, callee) == ("sync_pageable.py(29): step", "<built-in method item of Tensor object>")
    assert found.where.matched == found.where.with_stack == len(syncs) == 6
    assert top.share_pct == 100.0 and found.where.basis == "blocked time"
    assert "100% of the blocked time: `step` in sync_pageable.py:29 (calls <built-in method item" in found.where.text


# Tiny models: device 0 runs kernels at 0-10 and 50-60 us; the host thread (1, 1) launched them.
KERNELS = [{"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "correlation_id": c, "start_ns": s,
            "end_ns": s + 10_000, "name": "k", "short_name": "k"} for c, s in ((1, 0), (2, 50_000))]
LAUNCHES = [{"pid": 1, "tid": 1, "correlation_id": c, "name": "cudaLaunchKernel", "kind": "launch", "start_ns": s,
             "end_ns": s + 2_000} for c, s in ((1, -3_000), (2, 46_000))]
SCOPE = Scope(profile="p", devices=[0], start_ns=-5_000, end_ns=60_000, duration_ns=65_000, window_basis="requested")


def _frames(stack: int, *names: tuple[str, str | None]) -> list[dict]:
    return [{"stack_id": stack, "depth": d, "function": f, "module": "train.py" if layer is None else "libtorch.so",
             "line": 10 * stack if layer is None else None, "kind": "python", "resolved": True, "layer": layer}
            for d, (f, layer) in enumerate(names)]


def _finding(root_cause: str, device: int | None = 0, tags: list[str] | None = None) -> Finding:
    return Finding(root_cause=root_cause, severity="medium", title="t", evidence={}, time_at_stake_ns=1, device=device,
                   tags=tags or [])


def _readback_model(stacked: tuple[int | None, ...]):
    """Three .item() reads in the gap (a 4-byte D2H copy, then a sync 1 us after it returns), their syncs' stacks
    `stacked` (None: no stack): 1 is `loss_of` (line 10) calling item, 2 `log` (line 20)."""
    calls, copies = list(LAUNCHES), []
    for i, stack in enumerate(stacked):
        at = 12_000 + 10_000 * i
        calls += [{"pid": 1, "tid": 1, "correlation_id": 10 + i, "name": "cudaMemcpyAsync", "kind": "memcpy",
                   "start_ns": at, "end_ns": at + 1_000},
                  {"pid": 1, "tid": 1, "correlation_id": 20 + i, "name": "cudaStreamSynchronize", "kind": "sync",
                   "start_ns": at + 2_000, "end_ns": at + 2_000 + 1_000 * (i + 1), "stack_id": stack}]
        copies.append({"device_id": 0, "stream_id": 7, "pid": 1, "tid": 1, "correlation_id": 10 + i, "bytes": 4,
                       "direction": "D2H", "src_kind": "device", "dst_kind": "pinned", "start_ns": at + 500,
                       "end_ns": at + 600})
    frames = _frames(1, ("item", "framework"), ("loss_of", None), ("main", None)) + _frames(
        2, ("item", "framework"), ("log", None), ("main", None))
    return make_model(kernels=KERNELS, cuda_api=calls, memcpy=copies, stacks=frames)


def test_where_readbacks_share_their_blocked_time_by_first_user_frame():
    con = _readback_model((1, 1, 2))
    placed = where.locate(con, SCOPE, _finding("blocking-d2h-sync"))
    assert [(s.function, s.line, s.calls, s.events, s.share_pct) for s in placed.sites] == [
        ("loss_of", 10, "item", 2, 50.0), ("log", 20, "item", 1, 50.0)]  # blocked 1 + 2 us, then 3 us
    assert (placed.matched, placed.with_stack, placed.coverage_pct) == (3, 3, 100.0)
    assert placed.text == ("its 3 blocking small device-to-host reads (the copy, or the synchronize right after it), "
                           "all with a call stack: 50% of the blocked time: `loss_of` in train.py:10 (calls item); "
                           "50%: `log` in train.py:20 (calls item)")


def test_where_partial_coverage_says_the_share_is_of_the_stacked_events():
    placed = where.locate(_readback_model((1, None, None)), SCOPE, _finding("blocking-d2h-sync"))
    assert (placed.matched, placed.with_stack, placed.sites[0].share_pct) == (3, 1, 100.0)
    assert ", 1 with a call stack: 100% of the blocked time of those 1: `loss_of`" in placed.text


def test_where_cpu_work_counts_the_launching_threads_samples_in_the_idle_gap():
    samples = [{"pid": 1, "tid": 1, "time_ns": t, "stack_id": s} for t, s in (
        (20_000, 1), (30_000, 1), (40_000, 2), (5_000, 2), (70_000, 2))]  # two outside the gap 10-50 us
    samples.append({"pid": 1, "tid": 2, "time_ns": 25_000, "stack_id": 2})  # a thread that launched nothing
    frames = _frames(1, ("memcpy", "system"), ("collate", None)) + _frames(2, ("parse", None))
    con = make_model(kernels=KERNELS, cuda_api=LAUNCHES, cpu_samples=samples, stacks=frames)
    placed = where.locate(con, SCOPE, _finding("cpu-bottleneck", tags=["host-cpu"]))
    assert [(s.function, s.events, s.share_pct) for s in placed.sites] == [("collate", 2, 66.67), ("parse", 1, 33.33)]
    assert placed.basis == "samples" and placed.matched == 3


def test_where_only_for_findings_about_host_events_on_a_device():
    con = _readback_model((1,))
    assert where.locate(con, SCOPE, _finding("undersized-grid")) is None
    assert where.locate(con, SCOPE, _finding("blocking-d2h-sync", device=None)) is None
    assert where.locate(con, SCOPE, _finding("alloc-in-loop")) is None  # no allocation in the window


def test_where_note_no_stacks_is_said_once_with_the_capture():
    con = make_model(kernels=KERNELS, cuda_api=LAUNCHES)
    text = where.note(con, [_finding("blocking-d2h-sync"), _finding("alloc-in-loop"), _finding("undersized-grid")])
    assert text.startswith("this profile has no call stacks, so 2 findings about host events cannot say where")
    assert text.count("--cudabacktrace=all --python-backtrace=cuda") == 1
    assert where.note(con, [_finding("undersized-grid")]) is None


def test_where_line_is_rendered_before_the_cause():
    con = _readback_model((1,))
    placed = where.locate(con, SCOPE, _finding("blocking-d2h-sync"))
    cited = triage.RankedFinding(**triage.citation(_finding("blocking-d2h-sync").model_copy(
        update={"where": placed}), "gpu_idle_gaps", ("python",)), rank=1)
    lines = triage.cited_lines(cited, set())
    assert lines[0] == f"   where: {placed.text}" and lines[1].startswith("   cause: ")


def test_where_report_shows_each_placed_finding_its_call_sites(open_fixture):
    con = open_fixture("pipit_saxpy_mpi_a100").con
    side = gather(con, "pipit", str(PIPIT))
    html = page.report(side)
    placed = [f for f in side.triage.findings if f.where]
    assert {f.root_cause for f in placed} == {"cpu-bottleneck", "pageable-host-memory", "excessive-h2d-transfers"}
    for f in placed:
        block = html[html.index(escape(f.title)):]
        assert block.index("where: its ") < block.index("cause: ") < block.index("</div>")
    assert "<code>main</code> in saxpy-mpi-cuda (calls cudaMemcpy)" in html


def test_where_text_cuts_a_long_signature_but_keeps_the_function_whole():
    long_name = "CLUEAlgo<TilesConstants, 100>::verboseResults(std::basic_string<char> const&, int) const"
    template = "cudaError cudaMemcpyFromSymbol<int>(void*, int const&, unsigned long, unsigned long, cudaMemcpyKind)"
    frames = [{"stack_id": 1, "depth": d, "function": f, "module": "/bin/main", "kind": "native", "resolved": True,
               "layer": layer} for d, (f, layer) in enumerate(((template, "cuda"), (long_name, None)))]
    samples = [{"pid": 1, "tid": 1, "time_ns": 20_000, "stack_id": 1}]
    con = make_model(kernels=KERNELS, cuda_api=LAUNCHES, cpu_samples=samples, stacks=frames)
    placed = where.locate(con, SCOPE, _finding("cpu-bottleneck"))
    assert (placed.sites[0].function, placed.sites[0].calls) == (long_name, template)
    assert placed.text.endswith("100% of the samples: `CLUEAlgo<TilesConstants, 100>::verboseResults(...)` in main "
                                "(calls cudaError cudaMemcpyFromSymbol<int>(...))")
