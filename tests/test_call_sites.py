"""call_sites: the model's stacks and the sites they name, against independent readings of the raw data."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from fixture_guard import FIXTURES_ROOT
from modeldb import make_model

from stallhound.formats import open_profile
from stallhound.model.errors import InvalidRequest
from stallhound.tools import call_sites

PIPIT = FIXTURES_ROOT / "nsys" / "pipit_saxpy_mpi_a100.sqlite"
SYNC_PAGEABLE = Path(__file__).parent.parent / "corpus/captures/data/sync_pageable.json.gz"


def _sites(con, **params) -> call_sites.Result:
    return call_sites.run(con, call_sites.Params(profile="p", **params))


def _raw_pipit_sites(names: tuple[str, ...]) -> Counter:
    """Per call of `names`: its chain is the one (at callchainId or one past it) that holds a frame named for the
    call; its site the innermost frame in the program's executable that is not a cuda_runtime.h template."""
    raw = sqlite3.connect(f"file:{PIPIT.resolve()}?mode=ro", uri=True)
    frames = {}
    for cid, depth, sym, mod in raw.execute("""SELECT c.id, c.stackDepth, s.value, m.value FROM CUDA_CALLCHAINS c
            JOIN StringIds s ON s.id = c.symbol JOIN StringIds m ON m.id = c.module"""):
        frames.setdefault(cid, []).append((depth, sym, mod))
    sites: Counter = Counter()
    for name, chain in raw.execute("""SELECT s.value, r.callchainId FROM CUPTI_ACTIVITY_KIND_RUNTIME r
            JOIN StringIds s ON s.id = r.nameId WHERE r.callchainId IS NOT NULL"""):
        own = [sorted(frames[c]) for c in (chain, chain + 1) if any(f[1] == name for f in frames.get(c, []))]
        if name in names and own:
            sites[next(sym for _, sym, mod in own[0] if mod.endswith("/saxpy-mpi-cuda")
                       and not sym.startswith("cudaError cuda"))] += 1
    return sites


@pytest.mark.parametrize(("events", "names"), [("copies", ("cudaMemcpy",)), ("launches", ("cudaLaunchKernel",)),
                                               ("allocations", ("cudaMalloc", "cudaFree"))])
def test_call_sites_pipit_top_site_matches_the_raw_chains(open_fixture, events, names):
    result = _sites(open_fixture("pipit_saxpy_mpi_a100").con, events=events)
    expected = _raw_pipit_sites(names)
    found = Counter()
    for site in result.sites:  # a site is split by the call it made (cudaMalloc<double>, cudaFree): sum them
        found[site.function] += site.events
    assert found.most_common(1)[0] == expected.most_common(1)[0]
    assert all(site.user_frame for site in result.sites)
    assert result.with_stack == sum(expected.values()) == result.matched_events


def test_call_sites_pipit_keeps_unresolved_frames_as_module_and_address(open_fixture):
    con = open_fixture("pipit_saxpy_mpi_a100").con
    result = _sites(con, events="copies", full_stacks=1)
    assert result.sites[0].stack[0].startswith("libcupti.so.11.7@0x")
    assert con.execute("SELECT count(*) FROM stacks WHERE NOT resolved").fetchone()[0] > 0


def _python_sites(trace: dict, api: str) -> Counter:
    """An independent reading: each `api` call's innermost enclosing python_function on its thread, then up its
    parents to the first frame of a file outside torch/ and not a built-in; (function, line, callee) per call."""
    events = trace["traceEvents"]
    frames = [e for e in events if e.get("cat") == "python_function" and e.get("dur", 0) > 0]
    by_id = {f["args"]["Python id"]: f for f in frames}
    sites: Counter = Counter()
    for call in (e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == api):
        around = [f for f in frames if f["tid"] == call["tid"] and f["ts"] <= call["ts"] < f["ts"] + f["dur"]]
        if not around:
            continue
        frame, callee = max(around, key=lambda f: (f["ts"], -f["dur"])), None
        while frame["name"].startswith(("<built-in", "torch/")):
            callee, frame = frame, by_id[frame["args"]["Python parent id"]]
        sites[(frame["name"], callee["name"].split(" at 0x")[0] + ">" if callee else None)] += 1
    return sites


def test_call_sites_kineto_names_the_planted_step(cache_root):
    con = open_profile(SYNC_PAGEABLE, cache_dir=cache_root).con
    with gzip.open(SYNC_PAGEABLE) as fh:
        expected = _python_sites(json.load(fh), "cudaStreamSynchronize")
    result = _sites(con, events="syncs")
    (name, callee), count = expected.most_common(1)[0]
    top = result.sites[0]
    assert (f"{top.module}({top.line}): {top.function}", top.calls, top.events) == (name, callee, count)
    assert name == "sync_pageable.py(29): step" and callee == "<built-in method to of Tensor object>"


def _tiny(frames: list[dict], calls: list[dict]):
    return make_model(stacks=frames, cuda_api=calls)


def _frame(stack: int, depth: int, function: str, layer: str | None, module: str = "app") -> dict:
    return {"stack_id": stack, "depth": depth, "function": function, "module": module, "kind": "native",
            "resolved": True, "layer": layer}


def test_call_sites_first_user_frame_skips_library_frames():
    frames = [_frame(1, 0, "cuLaunch", "cuda"), _frame(1, 1, "at::native", "framework"),
              _frame(1, 2, "train_step", None), _frame(1, 3, "main", None)]
    calls = [{"pid": 1, "tid": 1, "correlation_id": i, "name": "cudaStreamSynchronize", "kind": "sync",
              "start_ns": 10 * i, "end_ns": 10 * i + 5, "stack_id": 1} for i in range(3)]
    result = _sites(_tiny(frames, calls), events="syncs")
    assert [(s.function, s.events, s.time_ns, s.calls, s.user_frame) for s in result.sites] == [
        ("train_step", 3, 15, "at::native", True)]


def test_call_sites_without_user_frame_falls_back_to_the_framework_then_counts_unstacked():
    frames = [_frame(2, 0, "ioctl", "system"), _frame(2, 1, "cuMemcpy", "cuda"), _frame(2, 2, "at::copy_", "framework"),
              _frame(2, 3, "_PyEval_EvalFrameDefault", "interpreter")]
    calls = [{"pid": 1, "tid": 1, "correlation_id": 1, "name": "cudaDeviceSynchronize", "kind": "sync",
              "start_ns": 0, "end_ns": 4, "stack_id": 2},
             {"pid": 1, "tid": 1, "correlation_id": 2, "name": "cudaDeviceSynchronize", "kind": "sync",
              "start_ns": 10, "end_ns": 12}]
    result = _sites(_tiny(frames, calls), events="syncs")
    assert [(s.function, s.layer, s.user_frame) for s in result.sites] == [("at::copy_", "framework", False)]
    assert (result.matched_events, result.with_stack, result.coverage_pct) == (2, 1, 50.0)
    assert "1 of 2 syncs have no call stack" in result.coverage_note


def test_call_sites_no_stacks_says_the_capture_once():
    calls = [{"pid": 1, "tid": 1, "correlation_id": 1, "name": "cudaMalloc", "kind": "alloc", "start_ns": 0,
              "end_ns": 4}]
    result = _sites(_tiny([], calls), events="allocations")
    assert result.sites == [] and result.coverage_note.count("--cudabacktrace=all --python-backtrace=cuda") == 1


def test_call_sites_a_filter_for_another_set_is_one_clear_error():
    with pytest.raises(InvalidRequest, match=r"^`kernel` narrows only events=launches, not events=syncs; [^.]*$"):
        _sites(_tiny([], []), events="syncs", kernel="gemm")
