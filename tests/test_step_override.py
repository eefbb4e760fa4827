"""range_name in every tool that uses steps (issue 31 item 2): triage, diff and verify_fix take the step range as
iterations does, over the CLI (--range-name) and MCP, and report the method; a name that matches nothing is one
sentence naming the ranges that do qualify.

Real trace: our H100 capture annotated_steps (5 record_function 'train_step' ranges, each with torch.optim's
'Optimizer.step#AdamW.step' inside). Auto-detection takes train_step; range_name='Optimizer.step#AdamW.step' takes the
optimizer ranges, a different window. Each window is checked against the ranges read from the JSON and timed as the
device lived them (test_kineto.device_side)."""

from __future__ import annotations

import json
import statistics

import pytest
from conftest import one_sentence, text_of
from mcp.client import Client
from test_kineto import device_side, read_json, span, xs

from corpus import sources
from stallhound.analysis.contracts import run_skill
from stallhound.cli.main import main
from stallhound.formats import open_profile
from stallhound.model.errors import InvalidRequest
from stallhound.server.app import build_server
from stallhound.tools import iterations, triage

OPTIMIZER = "Optimizer.step#AdamW.step"
BY_NAME = {p.name: p for p in sources.load()}


@pytest.fixture(scope="module")
def capture():
    path = sources.resolve(BY_NAME["annotated_steps"])
    if path is None:
        pytest.skip("annotated_steps is not here")
    return path


def steady(path, name: str) -> tuple[tuple[int, int], float]:
    """((start, end) of the steady window, the median steady step) of the `name` ranges read from the JSON: each
    range as the device lived it; the first left out when over 1.5x the median of the rest (warmup)."""
    ranges = sorted((e["pid"], e["tid"], *span(e)) for e in xs(read_json(path), "user_annotation")
                    if e["name"] == name)
    lived = device_side(read_json(path), ranges)
    durations = [e - s for s, e in lived]
    rest = statistics.median(durations[1:])
    first = 1 if durations[0] > iterations.WARMUP_RATIO * rest else 0
    return (lived[first][0], lived[-1][1]), rest


def test_triage_range_name_picks_the_window_the_json_gives(capture, cache_root):
    profile = open_profile(capture, cache_dir=cache_root)
    auto = run_skill(profile.con, triage, triage.Params(profile="p"))
    picked = run_skill(profile.con, triage, triage.Params(profile="p", range_name=OPTIMIZER))
    assert (auto.step_method, picked.step_method) == ("nvtx:train_step", f"nvtx:{OPTIMIZER}")
    for result, name in ((auto, "train_step"), (picked, OPTIMIZER)):
        assert (result.window.start_ns, result.window.end_ns) == steady(capture, name)[0]
    assert picked.window.duration_ns < auto.window.duration_ns  # the override changed the window
    letters = run_skill(profile.con, triage, triage.Params(profile="p", range_name="optimizer step adamw step"))
    assert letters.window == picked.window  # letters compared, as iterations does


def test_triage_range_name_over_the_cli(capture, cache_root, capsys):
    assert main(["triage", str(capture), "--json", "--cache-dir", str(cache_root), "--range-name", OPTIMIZER]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["step_method"] == f"nvtx:{OPTIMIZER}"
    assert (got["window"]["start_ns"], got["window"]["end_ns"]) == steady(capture, OPTIMIZER)[0]
    assert main(["triage", str(capture), "--cache-dir", str(cache_root), "--range-name", "forward_pass"]) == 2
    err = capsys.readouterr().err.strip()
    one_sentence(err)
    assert "no NVTX range 'forward_pass'" in err and "'train_step'" in err


def test_unmatched_range_name_names_the_ranges_that_qualify(capture, cache_root):
    con = open_profile(capture, cache_dir=cache_root).con
    with pytest.raises(InvalidRequest) as raised:
        run_skill(con, iterations, iterations.Params(profile="p", range_name="forward_pass"))
    assert str(raised.value) == ("no NVTX range 'forward_pass' in this window: the ranges that qualify as steps here "
                                 "(repeating with GPU work, or named as one step) are 'train_step'; pass one of them "
                                 "as range_name, or omit it to auto-detect")


def test_diff_and_verify_fix_take_range_name_on_both_sides(capture, cache_root, capsys):
    window, median = steady(capture, OPTIMIZER)
    args = [str(capture), str(capture), "--cache-dir", str(cache_root), "--range-name", OPTIMIZER]
    assert main(["diff", *args, "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    for side in (got["before"], got["after"]):
        assert (side["window"]["start_ns"], side["window"]["end_ns"], side["step_method"]) == (
            *window, f"nvtx:{OPTIMIZER}")
    assert (got["basis"], got["decision"]["figure"], got["decision"]["before"]) == ("per_iteration", "step_time_ns",
                                                                                    median)
    assert main(["verify-fix", *args[:2], "kernel-hotspot", *args[2:], "--format", "json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["decision"]
    assert (verdict["basis"], verdict["before"], verdict["after"]) == ("per_iteration", median, median)


@pytest.mark.anyio
async def test_range_name_over_mcp(capture, cache_root):
    window, median = steady(capture, OPTIMIZER)
    server = build_server([capture.parent], cache_dir=cache_root)
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ("triage", "diff_profiles", "verify_fix", "iterations"):
            assert tools[name].input_schema["properties"]["range_name"]["description"].startswith("NVTX range")
        found = await client.call_tool("triage", {"profile": str(capture), "range_name": OPTIMIZER})
        got = found.structured_content
        assert (got["window"]["start_ns"], got["window"]["end_ns"], got["step_method"]) == (
            *window, f"nvtx:{OPTIMIZER}")
        pair = {"before": str(capture), "after": str(capture), "range_name": OPTIMIZER}
        diff = (await client.call_tool("diff_profiles", pair)).structured_content
        assert [(s["window"]["start_ns"], s["window"]["end_ns"]) for s in (diff["before"], diff["after"])] == [
            window, window]
        fixed = (await client.call_tool("verify_fix", {**pair, "root_cause": "kernel-hotspot"})).structured_content
        assert (fixed["decision"]["basis"], fixed["decision"]["before"]) == ("per_iteration", median)
        wrong = await client.call_tool("triage", {"profile": str(capture), "range_name": "forward_pass"})
        assert wrong.is_error and "'train_step'" in text_of(wrong)
        one_sentence(text_of(wrong))
