"""PyTorch profiler (Kineto) traces: the model built from real traces, checked against an independent reading of
their JSON (plain json/gzip, Decimal times), every tool through an MCP client, and damaged or foreign JSON."""

from __future__ import annotations

import collections
import gzip
import hashlib
import heapq
import json
import re
import shutil
import statistics
import subprocess
import sys
import threading
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import anyio
import jsonschema
import pytest
from conftest import REQUIRED_ARGS
from mcp.client import Client

from stallhound.analysis import step_boundaries
from stallhound.formats import open_profile
from stallhound.model.errors import LoadCancelled, NotAProfile
from stallhound.server.app import build_server
from stallhound.tools import TOOL_NAMES
from stallhound.tools import iterations as it
from stallhound.tools import nccl_breakdown as nb

KINETO = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "kineto"
REALPROF = Path(__file__).resolve().parents[1].parent / "realprof"
REAL_TRAIN = REALPROF / "kineto_torch_train.json.gz"  # a real torch.profiler capture of a small training loop (H100)
SHARED = sorted(KINETO.glob("*.json.gz"))
TRACES = [pytest.param(p, id=p.name) for p in SHARED] + [pytest.param(
    REAL_TRAIN, id=REAL_TRAIN.name,
    marks=pytest.mark.skipif(not REAL_TRAIN.exists(), reason=f"{REAL_TRAIN} is not on this machine"))]
NCCL_NAMES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "SendRecv", "AllToAll", "Send", "Recv")


def _digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(KINETO.glob("*"))}


BEFORE = _digests()


def read_json(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as fh:
        return json.load(fh, parse_float=Decimal)


def ns(us) -> int:
    return int((Decimal(us) * 1000).to_integral_value(ROUND_HALF_EVEN))


def xs(doc: dict, *cats: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def span(e: dict) -> tuple[int, int]:
    return ns(e["ts"]), ns(Decimal(e["ts"]) + Decimal(e.get("dur", 0)))


@pytest.fixture(scope="module")
def loaded(cache_root):
    opened: dict[Path, tuple] = {}

    def get(path: Path):
        if path not in opened:
            opened[path] = (open_profile(path, cache_dir=cache_root), read_json(path))
        return opened[path]
    yield get
    for profile, _ in opened.values():
        profile.close()


@pytest.mark.parametrize("path", TRACES)
def test_kineto_kernels_match_the_json(loaded, path):
    profile, doc = loaded(path)
    expected = sorted((*span(e), e["args"]["correlation"], e["args"]["device"], e["args"]["stream"],
                       *e["args"]["grid"], *e["args"]["block"], e["args"]["registers per thread"], e["name"])
                      for e in xs(doc, "kernel"))
    got = profile.con.execute("""SELECT start_ns, end_ns, correlation_id, device_id, stream_id, grid_x, grid_y, grid_z,
        block_x, block_y, block_z, registers_per_thread, name FROM kernels ORDER BY ALL""").fetchall()
    assert [tuple(r) for r in got] == expected and len(expected) > 100
    total = profile.con.execute("SELECT sum(duration_ns) FROM kernels").fetchone()[0]
    assert total == sum(end - start for start, end, *_ in expected)


@pytest.mark.parametrize("path", TRACES)
def test_kineto_memcpy_and_memset_bytes_match_the_json(loaded, path):
    profile, doc = loaded(path)
    copies = collections.Counter()
    for e in xs(doc, "gpu_memcpy"):
        src, dst, src_kind, dst_kind = re.match(r"Memcpy (\w)to(\w) \((\w+) -> (\w+)\)", e["name"]).groups()
        key = (f"{src}2{dst}", src_kind.lower(), dst_kind.lower())
        copies.update({(*key, "n"): 1, (*key, "bytes"): e["args"]["bytes"], (*key, "ns"): span(e)[1] - span(e)[0]})
    got = collections.Counter()
    for *key, n, size, time in profile.con.execute(
            "SELECT direction, src_kind, dst_kind, count(*), sum(bytes), sum(duration_ns) FROM memcpy GROUP BY ALL"
    ).fetchall():
        got.update({(*key, "n"): n, (*key, "bytes"): size, (*key, "ns"): time})
    assert got == copies and copies
    sets = xs(doc, "gpu_memset")
    assert profile.con.execute("SELECT count(*), sum(bytes), sum(duration_ns) FROM memset").fetchone() == (
        len(sets), sum(e["args"]["bytes"] for e in sets), sum(span(e)[1] - span(e)[0] for e in sets))


@pytest.mark.parametrize("path", TRACES)
def test_kineto_launch_calls_link_to_their_kernels(loaded, path):
    profile, doc = loaded(path)
    calls = {e["args"]["correlation"]: e for e in xs(doc, "cuda_runtime", "cuda_driver")}
    expected = sorted((e["args"]["correlation"], calls[e["args"]["correlation"]]["name"],
                       ns(calls[e["args"]["correlation"]]["ts"]), calls[e["args"]["correlation"]]["tid"])
                      for e in xs(doc, "kernel") if e["args"]["correlation"] in calls)
    got = profile.con.execute("""SELECT correlation_id, launch_api, launch_start_ns, tid FROM kernels
                                 WHERE launch_api IS NOT NULL ORDER BY ALL""").fetchall()
    assert [tuple(r) for r in got] == expected and len(expected) == len(xs(doc, "kernel"))
    assert profile.con.execute("SELECT count(*) FROM cuda_api").fetchone()[0] == len(calls)


@pytest.mark.parametrize("path", TRACES)
def test_kineto_nccl_collectives_match_the_json(loaded, path):
    profile, doc = loaded(path)
    expected = collections.Counter()
    for e in xs(doc, "kernel"):
        if "nccl" in e["name"].lower():
            kind = next(c for c in NCCL_NAMES if c in e["name"])
            expected[(kind, "n")] += 1
            expected[(kind, "ns")] += span(e)[1] - span(e)[0]
            if "Collective name" in e["args"]:  # Kineto's own label agrees with the kernel's name
                assert e["args"]["Collective name"].replace("_", "").lower() == kind.lower()
    result = nb.run(profile.con, nb.Params(profile="t"))
    got = collections.Counter()
    for row in result.rows:
        got.update({(row.collective, "n"): row.count, (row.collective, "ns"): row.total_ns})
    assert got == expected
    if path.name.startswith("hta_"):
        assert expected, "the HTA traces are of NCCL jobs"


@pytest.mark.parametrize("path", TRACES)
def test_kineto_profiler_steps_are_the_iterations(loaded, path):
    profile, doc = loaded(path)
    result = it.run(profile.con, it.Params(profile="t"))
    assert (result.method, result.duration_basis) == ("nvtx:ProfilerStep#N", "range")
    assert [(r.start_ns, r.end_ns) for r in result.rows] == lived_steps(doc)


def lived_steps(doc: dict) -> list[tuple[int, int]]:
    """The ProfilerStep ranges as the device lived them, without a last one the window cut off."""
    steps = sorted((e["pid"], e["tid"], *span(e)) for e in xs(doc, "user_annotation")
                   if e["name"].startswith("ProfilerStep#"))
    lived = device_side(doc, steps)
    own = [e - s for s, e in lived[:-1]]
    if own and lived[-1][1] - lived[-1][0] < step_boundaries.LAST_RANGE_MIN_SHARE * statistics.median(own):
        return lived[:-1]
    return lived


def device_side(doc: dict, steps: list[tuple]) -> list[tuple[int, int]]:
    """Each step range (sorted by thread, then time) as the device lived it, read from the JSON: from its start, or
    when the GPU work launched before it (by its thread, or never seen launched) ends if later, no later than its
    own first GPU work on its main stream (the stream with most of its GPU time) starts; to its end, or the end of
    the GPU work it launched if later; a range of a thread then ends no later than the next one starts. Launches
    matched by args.correlation. (The first range's check that the GPU worked through the wait is not here: the
    traces read with it never stall there.)"""
    launches = {e["args"]["correlation"]: (e["pid"], e["tid"], ns(e["ts"]))
                for e in xs(doc, "cuda_runtime", "cuda_driver") if "correlation" in e.get("args", {})}
    gpu = [(launches.get(e.get("args", {}).get("correlation")), e["args"].get("stream"), *span(e))
           for e in xs(doc, "kernel", "gpu_memcpy", "gpu_memset")]
    lived: list[list] = []
    for pid, tid, start, end in steps:
        mine = [(launch[2], stream, s, e) for launch, stream, s, e in gpu if launch and launch[:2] == (pid, tid)]
        inside = [(stream, s, e) for at, stream, s, e in mine if start <= at < end]
        if inside:
            held = collections.Counter()
            for stream, s, e in inside:
                held[stream] += e - s
            main = max(held, key=lambda k: (held[k], -min(s for st, s, _ in inside if st == k)))
            first = min(s for stream, s, _ in inside if stream == main)
            earlier = [e for at, _, s, e in mine if at < start] + [e for launch, _, s, e in gpu
                                                                  if not launch and s < first]
            end = max(end, *(e for _, _, e in inside))
            start = max(start, min(max(earlier, default=0), first, end))
        if lived and lived[-1][:2] == [pid, tid]:
            start = max(start, lived[-1][2])
            lived[-1][3] = max(lived[-1][2], min(lived[-1][3], start))
        lived.append([pid, tid, start, end])
    return [(s, e) for _, _, s, e in lived]


@pytest.mark.parametrize("path", TRACES)
def test_kineto_cpu_ops_nest_as_ranges(loaded, path):
    """Depth of each CPU op and annotation = ranges opened before it on its thread and not yet closed."""
    profile, doc = loaded(path)
    by_thread = collections.defaultdict(list)
    for e in xs(doc, "cpu_op", "user_annotation"):
        by_thread[(e["pid"], e["tid"])].append((*span(e), e["cat"]))
    expected = collections.Counter()
    for (pid, tid), ranges in by_thread.items():
        open_ends: list[int] = []
        for start, end, cat in sorted(ranges, key=lambda r: (r[0], -r[1])):
            while open_ends and open_ends[0] <= start:
                heapq.heappop(open_ends)
            expected[(pid, tid, start, end, cat, len(open_ends))] += 1
            heapq.heappush(open_ends, end)
    got = collections.Counter(tuple(r) for r in profile.con.execute(
        "SELECT pid, tid, start_ns, end_ns, domain, depth FROM nvtx WHERE kind = 'push_pop'").fetchall())
    assert got == expected and max(d for *_, d in expected) >= 3


@pytest.mark.parametrize("path", TRACES)
def test_kineto_devices_rank_names_and_window(loaded, path):
    profile, doc = loaded(path)
    props = {p["id"]: p for p in doc.get("deviceProperties", [])}
    for device, name, sms, memory, cc in profile.con.execute(
            "SELECT device_id, name, sm_count, memory_bytes, compute_capability FROM gpus").fetchall():
        p = props.get(device)
        assert (name, sms, memory, cc) == ((p["name"], p["numSms"], p["totalGlobalMem"],
                                            f"{p['computeMajor']}.{p['computeMinor']}") if p else (None,) * 4)
    info = doc.get("distributedInfo")
    notes = [t for (t,) in profile.con.execute("SELECT text FROM diagnostics WHERE source = 'kineto'").fetchall()]
    assert notes == ([f"torch.profiler trace of rank {info['rank']} of world size {info['world_size']}"
                      f" (backend {info['backend']}" + (f", nccl_version {info['nccl_version']})"
                                                        if "nccl_version" in info else ")")] if info else [])
    named = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    hosts = {e["pid"] for e in xs(doc, "cpu_op", "cuda_runtime")}
    assert profile.con.execute("SELECT pid, name FROM processes").fetchall() == sorted(
        (pid, named[pid]) for pid in hosts)
    events = xs(doc, "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation")
    assert profile.con.execute("SELECT capture_start_ns, capture_end_ns, platform FROM meta").fetchone() == (
        min(span(e)[0] for e in events), max(span(e)[1] for e in events), "torch.profiler (Kineto)")
    missing = {d for (d,) in profile.con.execute("SELECT data FROM capabilities WHERE NOT present").fetchall()}
    assert {"os_runtime", "sched", "cpu_samples"} <= missing and "kernels" not in missing


@pytest.mark.parametrize("path", TRACES)
def test_kineto_every_tool_on_every_trace(cache_root, path):
    """Through an in-memory MCP client: every tool answers (no error) and validates against its output schema."""
    async def main():
        server = build_server([path.parent], cache_dir=cache_root)
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            loaded = await client.call_tool("load_profile", {"path": str(path)})
            assert not loaded.is_error
            pid = loaded.structured_content["profile"]
            for name in TOOL_NAMES:
                result = await client.call_tool(name, {"profile": pid, **REQUIRED_ARGS.get(name, {})})
                assert not result.is_error, (name, result.content)
                jsonschema.validate(result.structured_content, tools[name].output_schema)
    anyio.run(main)


def test_kineto_diff_profiles_compares_two_ranks(cache_root):
    """diff_profiles leases both ranks of one job; each side's window is its two ProfilerSteps in its own JSON."""
    rank0, rank1 = (KINETO / f"hta_sampled_rank{r}.json.gz" for r in (0, 1))

    def gpu_span(path: Path) -> tuple[int, int]:
        steps = lived_steps(read_json(path))
        return steps[0][0], steps[-1][1]

    async def main():
        async with Client(build_server([KINETO], cache_dir=cache_root)) as client:
            schema = {t.name: t for t in (await client.list_tools()).tools}["diff_profiles"].output_schema
            result = await client.call_tool("diff_profiles", {"before": str(rank0), "after": str(rank1)})
            assert not result.is_error, result.content
            jsonschema.validate(result.structured_content, schema)
            return result.structured_content
    diff = anyio.run(main)
    for side, path in (("before", rank0), ("after", rank1)):
        window = diff[side]["window"]
        assert (window["start_ns"], window["end_ns"]) == gpu_span(path)


def test_kineto_trace_is_known_by_content_not_name(tmp_path, loaded, cache_root):
    source = SHARED[0]
    packed = tmp_path / "rank0.data"
    shutil.copyfile(source, packed)
    plain = tmp_path / "rank0.log"
    plain.write_bytes(gzip.decompress(source.read_bytes()))
    expected = loaded(source)[0].con.execute("SELECT count(*), sum(duration_ns) FROM kernels").fetchone()
    for path in (packed, plain):
        profile = open_profile(path, cache_dir=cache_root)
        try:
            assert profile.con.execute("SELECT count(*), sum(duration_ns) FROM kernels").fetchone() == expected
        finally:
            profile.close()


def test_kineto_cli_runs_a_tool_on_a_trace(tmp_path):
    path = SHARED[0]
    events = xs(read_json(path), "kernel")
    done = subprocess.run([sys.executable, "-m", "stallhound", "tool", "top_kernels", str(path), "--json",
                           "--cache-dir", str(tmp_path)], capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(done.stdout)
    assert (result["kernel_count"], result["kernel_time_ns"]) == (len(events), sum(span(e)[1] - span(e)[0]
                                                                                  for e in events))


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    raw = gzip.decompress(SHARED[0].read_bytes())
    foreign = "is not an SQLite file (its first bytes are not an SQLite header) nor a JSON object"
    cases = {
        "truncated_gzip": (SHARED[0].read_bytes()[: SHARED[0].stat().st_size // 2], "not a complete torch.profiler"),
        "truncated_json": (raw[: len(raw) // 2], "not a complete torch.profiler"),
        "no_trace_events": (b'{"schemaVersion": 1, "events": []}', "has no top-level traceEvents array"),
        "json_array": (b"[1, 2, 3]", foreign),
        "gzipped_text": (gzip.compress(b"hello, world"), foreign),
    }
    out = {}
    for name, (content, message) in cases.items():
        (tmp_path / f"{name}.json.gz").write_bytes(content)
        out[name] = (tmp_path / f"{name}.json.gz", message)
    return out


def test_kineto_damaged_or_foreign_json_gives_one_clear_error(tmp_path, cache_root):
    for name, (path, message) in _bad_files(tmp_path).items():
        with pytest.raises(NotAProfile) as caught:
            open_profile(path, cache_dir=cache_root)
        text = str(caught.value)
        assert message in text and "\n" not in text and str(path) in text, (name, text)
    assert not list(cache_root.glob("*.duckdb.tmp*")), "a failed build leaves no temporary model"


def test_kineto_damaged_trace_over_mcp_is_one_error_and_the_server_keeps_serving(tmp_path, cache_root):
    bad = _bad_files(tmp_path)
    shutil.copyfile(SHARED[-1], tmp_path / "good.json.gz")

    async def main():
        async with Client(build_server([tmp_path], cache_dir=cache_root)) as client:
            for path, message in bad.values():
                result = await client.call_tool("load_profile", {"path": str(path)})
                text = "".join(c.text for c in result.content)
                assert result.is_error and message in text and "Traceback" not in text
            good = await client.call_tool("load_profile", {"path": str(tmp_path / "good.json.gz")})
            assert not good.is_error
    anyio.run(main)


def test_kineto_load_interrupted_while_streaming_stops_and_leaves_no_model(tmp_path):
    cancelled = threading.Event()

    def progress(done, total, label):  # cancel once streaming starts: the first batch insert stops it
        if label == "reading trace events":
            cancelled.set()
    with pytest.raises(LoadCancelled):
        open_profile(SHARED[0], cache_dir=tmp_path, progress=progress, cancelled=cancelled)
    assert [p.name for p in tmp_path.iterdir() if ".duckdb" in p.name] == []


def test_kineto_fixture_files_are_unchanged():
    """Runs last in this module: loading never wrote into the fixtures' folder or changed a file."""
    assert _digests() == BEFORE
