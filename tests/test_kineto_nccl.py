"""NCCL collective metadata of torch.profiler traces (message size and the field it came from, process group, rank)
in the kernels table and in nccl_breakdown, checked against an independent reading of the JSON; NULL for nsys
exports."""

from __future__ import annotations

import collections
import gzip
import json
import math
import re
from contextlib import closing
from pathlib import Path

import pytest
from test_comm import CORPUS, corpus
from test_kineto import KINETO, SHARED, read_json, span, xs

from stallhound.analysis import nccl_sizes
from stallhound.formats import open_profile
from stallhound.tools import nccl_breakdown as nb

NCCL = KINETO / "hta_a100_nccl_rank0.json.gz"
SAMPLED = KINETO / "hta_sampled_rank0.json.gz"  # no msg nelems: sizes from the Input Dims of the ops around launches
# The element sizes of the types these traces' collectives carry: dtype names, then the C++ names of 'Input type'.
ELEMENT_BYTES = {"Float": 4, "Long": 8, "BFloat16": 2, "Byte": 1, "float": 4, "long": 8, "long int": 8, "int": 4,
                 "unsigned char": 1, "signed char": 1, "c10::BFloat16": 2}
WHOLE_INPUT = ("allreduce", "alltoall", "reducescatter", "broadcast", "reduce", "send", "recv")  # input = buffer
METADATA = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
            "Process Group Ranks", "Process Group Description", "In split size", "Out split size")
DIMS_TRACES = [corpus(CORPUS / "hta_torchrec_a100_ws16_rank0.json.gz"),  # c10d:: ops and nccl:* ranges
               corpus(CORPUS / "hta_torchrec_a100_ws8_rank3.json.gz")]  # nccl:* ranges alone


def write_json(path: Path, doc: dict) -> Path:
    """`doc` gzipped at `path`, its Decimal times written with their exact digits."""
    text = re.sub(r'"@@([-0-9.Ee+]+)@@"', r"\1", json.dumps(doc, default=lambda d: f"@@{d}@@"))
    path.write_bytes(gzip.compress(text.encode()))
    return path


def op_dims_bytes(op: dict) -> int | None:
    """An op's largest tensor in bytes when it is the collective's whole buffer: any c10d:: op's (it lists output
    and input), else the input of a collective whose input is the whole buffer (no gather)."""
    a = op["args"]
    sizes = [math.prod(d) * ELEMENT_BYTES[t]
             for d, t in zip(a.get("Input Dims", []), a.get("Input type", []), strict=False)
             if isinstance(d, list) and d and all(isinstance(x, int) for x in d) and t in ELEMENT_BYTES]
    coll = re.sub("[^a-z]", "", str(a.get("Collective name") or op["name"].removeprefix("nccl:")).lower())
    if not sizes or not (op["name"].startswith("c10d::") or coll.startswith(WHOLE_INPUT)):
        return None
    return max(sizes)


def dims_sizes(doc: dict) -> dict[int, int]:
    """Correlation id -> the largest op_dims_bytes over the comms ops whose span holds the kernel's launch call."""
    ops: dict[tuple, list[dict]] = collections.defaultdict(list)
    for e in xs(doc, "cpu_op", "user_annotation"):
        if e["name"].startswith(("c10d::", "nccl:", "record_param_comms")):
            ops[(e["pid"], e["tid"])].append(e)
    nccl = {e["args"].get("correlation") for e in xs(doc, "kernel") if "nccl" in e["name"].lower()}
    sizes = {}
    for launch in (e for e in xs(doc, "cuda_runtime", "cuda_driver") if e["args"].get("correlation") in nccl):
        start, end = span(launch)
        found = [b for op in ops[(launch["pid"], launch["tid"])] if span(op)[0] <= start and end <= span(op)[1]
                 and (b := op_dims_bytes(op)) is not None]
        if found:
            sizes[launch["args"]["correlation"]] = max(found)
    return sizes


def expected_metadata(doc: dict, args_of) -> list[tuple]:
    """(start, end, message bytes, its field, group, group size, rank in group) per NCCL kernel, its metadata from
    args_of, else its size from the Input Dims around its launch."""
    rank = doc.get("distributedInfo", {}).get("rank")
    dims = dims_sizes(doc)
    rows = []
    for e in xs(doc, "kernel"):
        if "nccl" not in e["name"].lower():
            continue
        a = args_of(e)
        if "In msg nelems" not in a:
            size = dims.get(e["args"].get("correlation"))
            rows.append((*span(e), size, None if size is None else "Input Dims", None, None, None))
            continue
        size = max(a["In msg nelems"], a["Out msg nelems"]) * ELEMENT_BYTES[a["dtype"]]
        ranks = json.loads(a["Process Group Ranks"])
        rows.append((*span(e), size, "msg nelems", a["Process Group Name"], a["Group size"], ranks.index(rank)))
    return sorted(rows)


def model_metadata(profile) -> list[tuple]:
    return [tuple(r) for r in profile.con.execute("""SELECT start_ns, end_ns, nccl_message_bytes, nccl_size_field,
        nccl_group, nccl_group_size, nccl_rank FROM kernels WHERE category = 'nccl' ORDER BY ALL""").fetchall()]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in SHARED] + DIMS_TRACES)
def test_kineto_nccl_metadata_matches_the_json(cache_root, path):
    doc = read_json(path)
    expected = expected_metadata(doc, lambda e: e["args"])
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        assert model_metadata(profile) == expected
    fields = collections.Counter(r[3] for r in expected)
    if path == NCCL:
        assert fields == {"msg nelems": 21}
    elif path == SAMPLED:  # all 10 NCCL kernels sized from Input Dims, 2 of them AllGather's (by its c10d:: op)
        assert fields == {"Input Dims": 10}
    elif path.name in ("hta_torchrec_a100_ws16_rank0.json.gz", "hta_torchrec_a100_ws8_rank3.json.gz"):
        assert fields["Input Dims"] >= 60


def test_kineto_nccl_metadata_falls_back_to_record_param_comms(tmp_path, cache_root):
    """A kernel without the metadata (older PyTorch) takes its record_param_comms op's, joined on External id."""
    doc = read_json(NCCL)
    comms = {e["args"]["External id"]: e["args"] for e in xs(doc, "cpu_op") if e["name"] == "record_param_comms"}
    for e in xs(doc, "kernel"):
        for key in METADATA:
            e["args"].pop(key, None)
    bare = write_json(tmp_path / "bare_rank0.json.gz", doc)
    expected = expected_metadata(doc, lambda e: comms.get(e["args"]["External id"], {}))
    with closing(open_profile(bare, cache_dir=cache_root)) as profile:
        assert model_metadata(profile) == expected
        assert profile.con.execute("SELECT count(*) FROM kernels WHERE nccl_message_bytes IS NOT NULL").fetchone()[0] \
            == len(expected) == 21


def test_kineto_nccl_gather_shard_is_no_message_size(tmp_path, cache_root):
    """AllGather's nccl:* range lists one rank's share: without its c10d:: op's output dims the kernel stays unsized."""
    doc = read_json(SAMPLED)
    for e in xs(doc, "cpu_op"):
        if e["name"] == "c10d::_allgather_base_":
            e["args"].pop("Input Dims")
    cut = write_json(tmp_path / "no_gather_dims.json.gz", doc)
    with closing(open_profile(cut, cache_dir=cache_root)) as profile:
        assert model_metadata(profile) == expected_metadata(doc, lambda e: e["args"])
        counts = profile.con.execute("SELECT count(*), count(nccl_message_bytes) FROM kernels "
                                     "WHERE category = 'nccl'").fetchone()
    assert counts == (10, 8)


def test_kineto_nccl_all_to_all_split_sizes(tmp_path, cache_root):
    """all_to_all over tensor lists records each peer's element count: their sum x the dtype when no msg nelems is
    written; all_to_allv's splits count rows, so they give no size."""
    doc = read_json(NCCL)
    splits = {"all_to_all": [3, 5], "all_to_allv": [7, 11]}
    planted = []
    comms = {e["args"]["External id"]: e for e in xs(doc, "cpu_op") if e["name"] == "record_param_comms"}
    for i, e in enumerate(e for e in xs(doc, "kernel") if "Collective name" in e["args"]):
        name = list(splits)[i % 2]
        for event in (e, comms[e["args"]["External id"]]):  # the kernel and the op that launched it
            event["args"].update({"Collective name": name, "In split size": json.dumps(splits[name]),
                                  "Out split size": json.dumps(splits[name][::-1] + [1]), "dtype": "Long"})
            event["args"].pop("In msg nelems"), event["args"].pop("Out msg nelems")
        planted.append((*span(e), (sum(splits[name]) + 1) * 8 if name == "all_to_all" else None))
    cut = write_json(tmp_path / "splits.json.gz", doc)
    with closing(open_profile(cut, cache_dir=cache_root)) as profile:
        got = profile.con.execute("SELECT start_ns, end_ns, nccl_message_bytes, nccl_size_field FROM kernels "
                                  "WHERE category = 'nccl' ORDER BY ALL").fetchall()
    assert got == [(*p, None if p[2] is None else "split size") for p in sorted(planted)]
    assert sum(p[2] is not None for p in planted) == 11


@pytest.mark.parametrize("path", [pytest.param(NCCL, id=NCCL.name), pytest.param(SAMPLED, id=SAMPLED.name)])
def test_nccl_breakdown_message_sizes_and_algorithm_bandwidth(cache_root, path):
    doc = read_json(path)
    groups: dict[tuple, list[int]] = collections.defaultdict(list)
    for start, end, size, field, group, group_size, _ in expected_metadata(doc, lambda e: e["args"]):
        kernel = next(e for e in xs(doc, "kernel") if span(e) == (start, end))
        kind = next(k for k in ("AllReduce", "Broadcast", "SendRecv") if k in kernel["name"])
        groups[(kind, size, group, group_size, field)].append(end - start)
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        sizes = nb.run(profile.con, nb.Params(profile="t", limit=50)).message_sizes
        text = nb.render(nb.run(profile.con, nb.Params(profile="t")))
    got = {(r.collective, r.message_bytes, r.group, r.group_size, r.size_field): (r.count, r.total_ns,
                                                                                 r.algbw_gb_per_s)
           for r in sizes.rows}
    assert got == {key: (len(d), sum(d), round(key[1] * len(d) / sum(d), 3)) for key, d in groups.items()}
    assert [r.total_ns for r in sizes.rows] == sorted((r.total_ns for r in sizes.rows), reverse=True)
    assert (sizes.groups, sizes.sized_kernels, sizes.unsized_kernels) == (len(groups), {NCCL: 21, SAMPLED: 10}[path], 0)
    field = {NCCL: "msg nelems", SAMPLED: "Input Dims"}[path]
    assert "not bus bandwidth" in sizes.note and "algbw" in text and f"(from {field})" in text


def test_nccl_breakdown_says_when_sizes_are_not_recorded(tmp_path, cache_root, open_fixture):
    """A trace without msg nelems, Input Dims or split sizes (the sampled HTA trace with its shapes cut) and an nsys
    export have NCCL kernels but no message sizes: NULL columns, and a note."""
    doc = read_json(SAMPLED)
    for e in xs(doc, "cpu_op", "user_annotation"):
        e["args"].pop("Input Dims", None)
    path = write_json(tmp_path / "no_shapes.json.gz", doc)
    nccl_kernels = sum(1 for e in xs(doc, "kernel") if "nccl" in e["name"].lower())
    nsys = open_fixture("nsysai_mfu_2gpu_before")
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        for con in (profile.con, nsys.con):
            sizes = nb.run(con, nb.Params(profile="t")).message_sizes
            assert sizes.rows == [] and sizes.note == nccl_sizes.NOT_RECORDED
            nulls = con.execute("""SELECT count(*), count(nccl_message_bytes), count(nccl_size_field),
                count(nccl_group), count(nccl_group_size), count(nccl_rank) FROM kernels
                WHERE category = 'nccl'""").fetchone()
            assert nulls[0] > 0 and nulls[1:] == (0, 0, 0, 0, 0)
            if con is profile.con:
                assert sizes.unsized_kernels == nccl_kernels == nulls[0]


def test_kineto_nccl_ranks_place_the_trace_in_its_group(tmp_path, cache_root):
    """Rank in the group = position of distributedInfo's rank in Process Group Ranks: rank 3 of group [5, 3]."""
    doc = read_json(NCCL)
    doc["distributedInfo"]["rank"] = 3
    for e in xs(doc, "kernel"):
        if "Process Group Ranks" in e["args"]:
            e["args"]["Process Group Ranks"] = "[5, 3]"
    moved = write_json(tmp_path / "rank3.json.gz", doc)
    with closing(open_profile(moved, cache_dir=cache_root)) as profile:
        assert profile.con.execute("SELECT DISTINCT nccl_rank FROM kernels WHERE category = 'nccl'").fetchall() == [
            (1,)]
        assert profile.con.execute("SELECT rank, world_size FROM meta").fetchone() == (3, 2)

