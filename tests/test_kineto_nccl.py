"""NCCL collective metadata of torch.profiler traces (message size, process group, rank) in the kernels table and
in nccl_breakdown, checked against an independent reading of the JSON; NULL for nsys exports."""

from __future__ import annotations

import collections
import gzip
import json
import re
from contextlib import closing
from pathlib import Path

import pytest
from test_kineto import KINETO, SHARED, read_json, span, xs

from stallhound.analysis import nccl_sizes
from stallhound.formats import open_profile
from stallhound.tools import nccl_breakdown as nb

NCCL = KINETO / "hta_a100_nccl_rank0.json.gz"
ELEMENT_BYTES = {"Float": 4, "Long": 8}  # the dtypes of the fixture's collectives (torch.float32, torch.int64)
METADATA = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
            "Process Group Ranks", "Process Group Description", "In split size", "Out split size")


def write_json(path: Path, doc: dict) -> Path:
    """`doc` gzipped at `path`, its Decimal times written with their exact digits."""
    text = re.sub(r'"@@([-0-9.Ee+]+)@@"', r"\1", json.dumps(doc, default=lambda d: f"@@{d}@@"))
    path.write_bytes(gzip.compress(text.encode()))
    return path


def expected_metadata(doc: dict, args_of) -> list[tuple]:
    """(start, end, message bytes, group, group size, rank in group) per NCCL kernel, its metadata from args_of."""
    rank = doc.get("distributedInfo", {}).get("rank")
    rows = []
    for e in xs(doc, "kernel"):
        if "nccl" not in e["name"].lower():
            continue
        a = args_of(e)
        if "Collective name" not in a:
            rows.append((*span(e), None, None, None, None))
            continue
        size = max(a["In msg nelems"], a["Out msg nelems"]) * ELEMENT_BYTES[a["dtype"]]
        ranks = json.loads(a["Process Group Ranks"])
        rows.append((*span(e), size, a["Process Group Name"], a["Group size"], ranks.index(rank)))
    return sorted(rows)


def model_metadata(profile) -> list[tuple]:
    return [tuple(r) for r in profile.con.execute("""SELECT start_ns, end_ns, nccl_message_bytes, nccl_group,
        nccl_group_size, nccl_rank FROM kernels WHERE category = 'nccl' ORDER BY ALL""").fetchall()]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in SHARED])
def test_kineto_nccl_metadata_matches_the_json(cache_root, path):
    doc = read_json(path)
    expected = expected_metadata(doc, lambda e: e["args"])
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        assert model_metadata(profile) == expected
    if path == NCCL:
        assert len(expected) == 21 and all(r[2] for r in expected)


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


def test_nccl_breakdown_message_sizes_and_algorithm_bandwidth(cache_root):
    doc = read_json(NCCL)
    groups: dict[tuple, list[int]] = collections.defaultdict(list)
    for e in xs(doc, "kernel"):
        a = e["args"]
        if "Collective name" in a:
            size = max(a["In msg nelems"], a["Out msg nelems"]) * ELEMENT_BYTES[a["dtype"]]
            kind = "AllReduce" if a["Collective name"] == "allreduce" else "Broadcast"
            groups[(kind, size, a["Process Group Name"], a["Group size"])].append(span(e)[1] - span(e)[0])
    with closing(open_profile(NCCL, cache_dir=cache_root)) as profile:
        sizes = nb.run(profile.con, nb.Params(profile="t", limit=50)).message_sizes
        text = nb.render(nb.run(profile.con, nb.Params(profile="t")))
    got = {(r.collective, r.message_bytes, r.group, r.group_size): (r.count, r.total_ns, r.algbw_gb_per_s)
           for r in sizes.rows}
    assert got == {key: (len(d), sum(d), round(key[1] * len(d) / sum(d), 3)) for key, d in groups.items()}
    assert [r.total_ns for r in sizes.rows] == sorted((r.total_ns for r in sizes.rows), reverse=True)
    assert (sizes.groups, sizes.sized_kernels, sizes.unsized_kernels) == (len(groups), 21, 0)
    assert "not bus bandwidth" in sizes.note and "algbw" in text


def test_nccl_breakdown_says_when_sizes_are_not_recorded(cache_root, open_fixture):
    """The sampled HTA traces and nsys exports have NCCL kernels but no message sizes: NULL columns, and a note."""
    path = KINETO / "hta_sampled_rank0.json.gz"
    nccl_kernels = sum(1 for e in xs(read_json(path), "kernel") if "nccl" in e["name"].lower())
    nsys = open_fixture("nsysai_mfu_2gpu_before")
    with closing(open_profile(path, cache_dir=cache_root)) as profile:
        for con in (profile.con, nsys.con):
            sizes = nb.run(con, nb.Params(profile="t")).message_sizes
            assert sizes.rows == [] and sizes.note == nccl_sizes.NOT_RECORDED
            nulls = con.execute("""SELECT count(*), count(nccl_message_bytes), count(nccl_group),
                count(nccl_group_size), count(nccl_rank) FROM kernels WHERE category = 'nccl'""").fetchone()
            assert nulls[0] > 0 and nulls[1:] == (0, 0, 0, 0)
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

