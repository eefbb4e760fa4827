"""What a torch.profiler trace says about itself: rank and world size (distributedInfo), device properties and
baseTimeNanoseconds, whether written before or after the events; and the ids traces get in a session."""

from __future__ import annotations

import gzip
import json
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import anyio
import duckdb
import pytest
from mcp.client import Client
from test_kineto import KINETO, SHARED, ns, read_json, xs
from test_kineto_nccl import write_json

from stallhound.formats import open_profile
from stallhound.formats.kineto import read as kineto_read
from stallhound.formats.kineto.build import KinetoBuilder
from stallhound.formats.kineto.stage import BATCH_ROWS, Stage, Writer
from stallhound.model.errors import LoadCancelled
from stallhound.server.app import build_server
from stallhound.server.sessions import Session
from stallhound.tools import profile_summary as ps

NCCL = KINETO / "hta_a100_nccl_rank0.json.gz"
HEAD_KEYS = ("deviceProperties", "distributedInfo")


def _meta(profile) -> tuple:
    return profile.con.execute("SELECT rank, world_size, rank_source, session_start_utc FROM meta").fetchone()


def _started(doc: dict) -> str:
    """The first event's wall-clock second: Kineto counts from baseTimeNanoseconds, or from the epoch without it."""
    first = min(ns(e["ts"]) for e in xs(doc, "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
                                        "cpu_op", "user_annotation"))
    return datetime.fromtimestamp((doc.get("baseTimeNanoseconds", 0) + first) // 10**9, UTC).isoformat()[:19]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in SHARED])
def test_kineto_rank_world_size_and_start_match_the_json(cache_root, path):
    doc = read_json(path)
    info = doc["distributedInfo"]
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        assert _meta(profile) == (info["rank"], info["world_size"], "distributedInfo", _started(doc))
        summary = ps.run(profile.con, ps.Params(profile="t"))
    assert summary.rank == f"rank {info['rank']} of world size {info['world_size']} (distributedInfo)"
    assert summary.rank in ps.render(summary).splitlines()[0]


def test_profile_summary_has_no_rank_for_nsys(open_fixture):
    profile = open_fixture("nsysai_mfu_2gpu_before")
    assert _meta(profile)[:3] == (None, None, None)
    assert ps.run(profile.con, ps.Params(profile="t")).rank is None


def test_kineto_block_written_after_the_events_is_read(tmp_path, cache_root):
    """deviceProperties and distributedInfo moved after traceEvents (as some Kineto versions write them), in a
    plain and a gzipped copy: the same devices, rank and start as the original's."""
    doc = read_json(NCCL)
    moved = {k: v for k, v in doc.items() if k not in HEAD_KEYS} | {k: doc[k] for k in HEAD_KEYS}
    assert list(moved)[-2:] == list(HEAD_KEYS) and list(moved).index("traceEvents") < len(moved) - 2
    packed = write_json(tmp_path / "moved.json.gz", moved)
    plain = tmp_path / "moved.json"
    plain.write_bytes(gzip.decompress(packed.read_bytes()))
    query = "SELECT device_id, name, sm_count, memory_bytes, compute_capability FROM gpus ORDER BY ALL"
    props = {p["id"]: p for p in doc["deviceProperties"]}
    with closing(open_profile(NCCL, cache_dir=cache_root)) as original:
        devices, meta = original.con.execute(query).fetchall(), _meta(original)
    assert [d[:4] for d in devices] == [(i, props[i]["name"], props[i]["numSms"], props[i]["totalGlobalMem"])
                                        for i, *_ in devices]
    for path in (packed, plain):
        with closing(open_profile(path, cache_dir=cache_root)) as profile:
            assert profile.con.execute(query).fetchall() == devices and _meta(profile) == meta == (
                0, 2, "distributedInfo", _started(doc))


def test_kineto_trailing_values_survive_brackets_and_quotes_in_strings():
    """The backward scan of the file's end skips brackets, commas and escaped quotes inside strings, and leaves out
    a value that starts before the bytes kept."""
    after = {"INFO": ['a "quoted", [bracketed] }, {line\\', "x\\\"y],"], "baseTimeNanoseconds": 17, "e": {"k": [1]}}
    events = [{"name": 'odd "}], "traceEvents": [', "args": {"s": "\\"}}, {"name": "],\\\\"}]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, **after}).encode()
    assert kineto_read.trailing(text) == after
    assert kineto_read.trailing(json.dumps({"traceEvents": events}).encode()) == {}
    cut = text[text.index(b'"baseTimeNanoseconds"') - 5:]  # the tail starts inside INFO's list
    assert kineto_read.trailing(cut) == {"baseTimeNanoseconds": 17, "e": {"k": [1]}}


def test_profile_ids_leave_out_trace_and_export_endings():
    session = Session("t")
    names = ["a/rank0.json.gz", "b/rank0.pt.trace.json", "c/rank0.sqlite", "d/Rank 1.JSON", "e/.json", "f/x.tar.gz"]
    assert [session.add(Path(n), "f") for n in names] == ["rank0", "rank0-2", "rank0-3", "rank-1", "json", "x-tar"]


def test_kineto_profile_id_over_mcp_is_the_trace_name(tmp_path, cache_root):
    copies = [tmp_path / "a" / "hta_sampled_rank0.json.gz", tmp_path / "b" / "hta_sampled_rank0.json"]
    for path in copies:
        path.parent.mkdir()
    copies[0].write_bytes((KINETO / "hta_sampled_rank0.json.gz").read_bytes())
    copies[1].write_bytes(gzip.decompress(copies[0].read_bytes()))

    async def main():
        async with Client(build_server([tmp_path], cache_dir=cache_root)) as client:
            ids = [(await client.call_tool("load_profile", {"path": str(p)})).structured_content["profile"]
                   for p in (*copies, copies[0])]
            summary = await client.call_tool("profile_summary", {"profile": "hta_sampled_rank0-2"})
            return ids, summary.structured_content["rank"]
    ids, rank = anyio.run(main)
    assert ids == ["hta_sampled_rank0", "hta_sampled_rank0-2", "hta_sampled_rank0"]
    assert rank == f"rank 0 of world size {read_json(copies[1])['distributedInfo']['world_size']} (distributedInfo)"


def test_kineto_stage_writer_inserts_in_order_and_raises_its_errors(tmp_path):
    """The staging writer thread: batches arrive in order; an insert that fails (its table is gone) is raised to the
    parser on a later batch, never lost or hung on; a cancelled build stops at the next batch."""
    builder = KinetoBuilder(tmp_path / "t.json", tmp_path / "t.duckdb")
    try:
        writer = Writer(builder)
        stage = Stage(writer, "_t", (("x", "INTEGER"),))
        for i in range(3 * BATCH_ROWS + 7):
            stage.add((i,))
        stage.flush()
        writer.close(failed=False)
        assert builder.con.execute("SELECT count(*), sum(x), min(x) FROM _t").fetchone() == (
            3 * BATCH_ROWS + 7, sum(range(3 * BATCH_ROWS + 7)), 0)
        writer = Writer(builder)
        stage = Stage(writer, "_u", (("x", "INTEGER"),))
        builder.con.execute("DROP TABLE _u")
        with pytest.raises(duckdb.CatalogException):
            for i in range(5 * BATCH_ROWS):
                stage.add((i,))
        writer.close(failed=True)
        writer = Writer(builder)
        stage = Stage(writer, "_v", (("x", "INTEGER"),))
        builder.cancelled.set()
        with pytest.raises(LoadCancelled):
            stage.add((1,))
            stage.flush()
        writer.close(failed=True)
    finally:
        builder.con.close()
