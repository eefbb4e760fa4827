"""verify_fix: the figures of a book entry's verify step on a before and an after profile, answered pass / fail /
unclear; synthetic pairs with one planted fix (or regression), the real FSDP pair, a profile against itself, the
MCP tool, its one-sentence error and the verify_fix prompt."""

from __future__ import annotations

import pytest
from conftest import FIXTURES
from mcp.client import Client

from stallhound import book
from stallhound.book import UnknownEntry
from stallhound.server.app import build_server
from stallhound.tools import verify_fix as vf

BEFORE, AFTER = FIXTURES / "nsysai_mfu_2gpu_before.sqlite", FIXTURES / "nsysai_mfu_2gpu_after.sqlite"


def _verify(before, after, cause: str) -> vf.Result:
    return vf.run(before.con, after.con, vf.Params(before="b", after="a", root_cause=cause))


def _moved(result: vf.Result) -> dict[str, str]:
    return {c.figure: c.moved for c in result.checks}


def test_verify_fix_names_diff_figures_for_every_book_entry(synth_pair):
    assert set(vf.VERIFY_FIGURES) == set(book.load_book())
    (before, _), (after, _) = synth_pair("pinned_memory")  # has copies H2D, so every figure name is there
    from stallhound.tools import diff_profiles
    names = {r.figure for r in diff_profiles.run(before.con, after.con, diff_profiles.Params(before="b", after="a"))
             .figures}
    assert {name for checks in vf.VERIFY_FIGURES.values() for name, _ in checks} <= names


@pytest.mark.parametrize(("pair", "cause", "figures"), [
    ("removed_sync", "excessive-synchronization", {"sync calls": "as expected", "sync blocked": "as expected"}),
    ("pinned_memory", "pageable-host-memory", {"pageable copies": "as expected"}),
    ("fewer_tiny_kernels", "small-kernel-overhead", {"tiny kernels": "as expected", "launch API": "unchanged"}),
])
def test_verify_fix_synth_fix_passes_with_its_figures(synth_pair, pair, cause, figures):
    (before, _), (after, _) = synth_pair(pair)
    result = _verify(before, after, cause)
    assert (result.answer, result.finding.status) == ("pass", "gone"), result.reason
    assert result.finding.before_ns > 0 and result.finding.after_ns == 0
    assert _moved(result) == figures
    assert result.decision.verdict == "improved" and result.verify == book.get_entry(cause).verify


def test_verify_fix_synth_fix_counts_the_planted_syncs(synth_pair):
    """One cudaDeviceSynchronize per iteration and rank was planted: 2 per iteration over both ranks, then none."""
    (before, truth), (after, _) = synth_pair("removed_sync")
    calls = {c.figure: c for c in _verify(before, after, "excessive-synchronization").checks}["sync calls"]
    assert (calls.before, calls.after) == (2.0, 0.0)
    assert sum(t["sync"]["context_synchronize"] for t in truth["totals"]["per_device"]) == 2 * 10


def test_verify_fix_new_straggler_fails(synth_pair):
    (before, _), (after, _) = synth_pair("slower_rank")
    result = _verify(before, after, "nccl-straggler")
    assert (result.answer, result.finding.status) == ("fail", "new")
    assert result.reason.startswith("the finding is new after the change")


def test_verify_fix_real_pair_small_kernel_overhead_fails_with_slower_launches(open_fixture):
    result = _verify(open_fixture(BEFORE.stem), open_fixture(AFTER.stem), "small-kernel-overhead")
    assert (result.answer, result.finding.status) == ("fail", "bigger")
    assert _moved(result) == {"tiny kernels": "unchanged", "launch API": "wrong way"}
    assert result.decision.verdict == "regressed"


def test_verify_fix_cause_on_neither_side_or_unchanged_is_unclear(synth_pair, open_fixture):
    (before, _), (after, _) = synth_pair("fewer_tiny_kernels")
    absent = _verify(before, after, "nccl-serialization")
    assert absent.answer == "unclear" and absent.finding is None and "neither side" in absent.reason
    real = open_fixture(BEFORE.stem)
    same = _verify(real, real, "small-kernel-overhead")
    assert (same.answer, same.finding.status) == ("unclear", "same")
    assert set(_moved(same).values()) == {"unchanged"}


def test_verify_fix_unknown_root_cause_names_the_valid_ones():
    with pytest.raises(UnknownEntry, match="valid ids: alloc-in-loop, "):
        vf.Params(before="b", after="a", root_cause="slow")



@pytest.mark.anyio
async def test_verify_fix_through_an_mcp_client_and_its_prompt(cache_root):
    server = build_server([FIXTURES], cache_dir=cache_root)
    async with Client(server) as client:
        args = {"before": str(BEFORE), "after": str(AFTER)}
        result = await client.call_tool("verify_fix", {**args, "root_cause": "small-kernel-overhead"})
        assert not result.is_error and result.structured_content["answer"] == "fail"
        assert result.content[0].text.startswith("fail: the finding is bigger")
        bad = await client.call_tool("verify_fix", {**args, "root_cause": "slow"})
        text = bad.content[0].text
        assert bad.is_error and "no root-cause entry 'slow'; valid ids:" in text and "\n" not in text
        prompt = await client.get_prompt("verify_fix", {**args, "finding": "small-kernel-overhead"})
        body = prompt.messages[0].content.text
        assert "diff_profiles(" in body and "root_cause=small-kernel-overhead" in body
        everything = await client.get_prompt("verify_fix", args)
        assert "for each finding diff_profiles lists" in everything.messages[0].content.text
