"""Sessions: each MCP session sees and closes only its own profiles, over models shared underneath."""

from __future__ import annotations

import json

import anyio
import pytest
from conftest import FIXTURES, kernels_in_export
from httpserver import serving
from mcp.client import Client

from stallhound.server.app import build_server
from stallhound.server.store import ProfileStore, UnknownProfile

MOCK = FIXTURES / "nsysai_mock.sqlite"
CLUE = FIXTURES / "clue_t4_report4.sqlite"
SAXPY = FIXTURES / "pipit_saxpy_mpi_a100.sqlite"



def _listed(result) -> list[str]:
    return [p["profile"] for p in result.structured_content["profiles"]]


@pytest.mark.anyio
async def test_sessions_two_http_clients_see_and_close_only_their_own(cache_root):
    with serving(FIXTURES, cache_root) as served:
        async with Client(served.url, mode="legacy") as alice, Client(served.url, mode="legacy") as bob:
            loaded_a = await alice.call_tool("load_profile", {"path": str(CLUE)})
            loaded_b = await bob.call_tool("load_profile", {"path": str(MOCK)})
            assert loaded_a.structured_content["profile"] == "clue_t4_report4"
            assert loaded_b.structured_content["profile"] == "nsysai_mock"
            assert _listed(await alice.call_tool("list_profiles", {})) == ["clue_t4_report4"]
            assert _listed(await bob.call_tool("list_profiles", {})) == ["nsysai_mock"]

            stolen = await bob.call_tool("close_profile", {"profile": "clue_t4_report4"})
            assert stolen.is_error
            assert "no profile 'clue_t4_report4' is loaded in this session (loaded: nsysai_mock)" in \
                stolen.content[0].text
            unseen = await bob.call_tool("top_kernels", {"profile": "clue_t4_report4"})
            assert unseen.is_error and "no profile is loaded with id 'clue_t4_report4'" in unseen.content[0].text

            mine = await alice.call_tool("top_kernels", {"profile": "clue_t4_report4"})
            assert mine.structured_content["kernel_count"] == kernels_in_export(CLUE)


@pytest.mark.anyio
async def test_sessions_a_close_by_one_never_breaks_the_other(cache_root):
    """Both sessions load one file at once; one closes it while the other keeps calling tools on it."""
    with serving(FIXTURES, cache_root) as served:
        async with Client(served.url, mode="legacy") as alice, Client(served.url, mode="legacy") as bob:
            async with anyio.create_task_group() as tg:
                for client in (alice, bob):
                    tg.start_soon(client.call_tool, "load_profile", {"path": str(SAXPY)})
            before = await alice.call_tool("gpu_utilization", {"profile": "pipit_saxpy_mpi_a100"})
            closed = await bob.call_tool("close_profile", {"profile": "pipit_saxpy_mpi_a100"})
            assert closed.structured_content == {"closed": "pipit_saxpy_mpi_a100"}
            assert _listed(await bob.call_tool("list_profiles", {})) == []
            after = await alice.call_tool("gpu_utilization", {"profile": "pipit_saxpy_mpi_a100"})
            assert not after.is_error and after.structured_content == before.structured_content
            kernels = await alice.call_tool("top_kernels", {"profile": "pipit_saxpy_mpi_a100"})
            assert kernels.structured_content["kernel_count"] == kernels_in_export(SAXPY)


@pytest.mark.anyio
async def test_sessions_sessionless_requests_share_one_list(cache_root):
    """The 2026-07-28 protocol has no sessions: its HTTP clients share one list (documented)."""
    with serving(FIXTURES, cache_root) as served:
        async with Client(served.url) as first, Client(served.url) as second:
            await first.call_tool("load_profile", {"path": str(MOCK)})
            assert _listed(await second.call_tool("list_profiles", {})) == ["nsysai_mock"]
            legacy = Client(served.url, mode="legacy")
            async with legacy:
                assert _listed(await legacy.call_tool("list_profiles", {})) == []


@pytest.mark.anyio
async def test_sessions_ending_a_session_closes_the_models_only_it_used(cache_root):
    server = build_server([FIXTURES], cache_dir=cache_root)
    store = server.store
    async with Client(server, mode="legacy") as keeper:
        await keeper.call_tool("load_profile", {"path": str(MOCK)})
        async with Client(server, mode="legacy") as leaver:
            await leaver.call_tool("load_profile", {"path": str(MOCK)})
            await leaver.call_tool("load_profile", {"path": str(CLUE)})
            assert set(store.models) == {MOCK.resolve(), CLUE.resolve()}
        assert set(store.models) == {MOCK.resolve()}
        summary = json.loads((await keeper.read_resource("stallhound://profiles/nsysai_mock")).contents[0].text)
        assert summary["table_rows"]["kernels"] == kernels_in_export(MOCK)
    assert store.models == {}


def test_sessions_store_shares_one_model_and_closes_it_with_its_last_session(cache_root):
    store = ProfileStore(roots=[FIXTURES], cache_dir=cache_root)
    one, two = store.open_session("one"), store.open_session("two")
    with store.leased(one, str(MOCK)) as a, store.leased(two, str(MOCK)) as b:
        assert a.profile is b.profile and (a.id, b.id) == ("nsysai_mock", "nsysai_mock")
    assert store.close(one, "nsysai_mock") == "nsysai_mock"
    with pytest.raises(UnknownProfile, match="loaded in this session"):
        store.close(one, "nsysai_mock")
    assert list(store.models) == [MOCK.resolve()]
    with store.leased(two, "nsysai_mock") as again:
        assert again.profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == kernels_in_export(MOCK)
    store.end_session(two)
    assert store.models == {}


def test_sessions_lru_keeps_open_models_within_the_budget_and_reopens_evicted_ones(cache_root):
    sizes = {}
    probe = ProfileStore(roots=[FIXTURES], cache_dir=cache_root)
    session = probe.open_session("probe")
    for path in (MOCK, CLUE, SAXPY):
        with probe.leased(session, str(path)) as lease:
            sizes[path.resolve()] = lease.profile.model_path.stat().st_size
    probe.end_session(session)
    assert probe.models == {}
    two_fit_mb = -(-(sizes[CLUE.resolve()] + sizes[SAXPY.resolve()]) // (1 << 20))  # ceil: room for these two
    assert two_fit_mb * (1 << 20) < sum(sizes.values())

    store = ProfileStore(roots=[FIXTURES], cache_dir=cache_root, memory_budget_mb=two_fit_mb)
    session = store.open_session("s")
    for path in (MOCK, CLUE, SAXPY):
        with store.leased(session, str(path)):
            pass
    assert list(store.models) == [CLUE.resolve(), SAXPY.resolve()]  # the least recently used one went
    assert store.open_bytes() <= two_fit_mb * (1 << 20)
    assert list(session.ids) == ["nsysai_mock", "clue_t4_report4", "pipit_saxpy_mpi_a100"]
    with store.leased(session, "nsysai_mock") as reopened:  # by id, from the cache, transparently
        assert reopened.profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == kernels_in_export(MOCK)
        assert MOCK.resolve() in store.models
    assert CLUE.resolve() not in store.models
    store.end_session(session)


def test_sessions_lru_never_closes_a_model_a_call_is_using(cache_root):
    store = ProfileStore(roots=[FIXTURES], cache_dir=cache_root, memory_budget_mb=1)
    session = store.open_session("s")
    with store.leased(session, str(CLUE)) as busy:
        with store.leased(session, str(MOCK)):
            assert busy.profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == \
                kernels_in_export(CLUE)
        assert list(store.models) == [CLUE.resolve()]  # the idle one went, the busy one stays
    assert store.models == {}  # over budget once idle


def test_sessions_memory_budget_must_be_positive(capsys):
    from stallhound.cli.main import main
    assert main(["serve", "--root", str(FIXTURES), "--memory-budget-mb", "0"]) == 2
    assert capsys.readouterr().err.strip() == \
        "stallhound: error: --memory-budget-mb 0 is not positive; pass a size in MB"
