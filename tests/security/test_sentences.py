"""Issue 30, "every failure one sentence" and "sessions", over real MCP clients: damaged exports load what is readable
(the bad rows counted, checked against independent SQL on the file made here) or are refused in one sentence; an input
of any size or bytes comes back cut to one short line; a defect of ours is one sentence naming the input, its
traceback in the server's log only; completions list only the caller's profiles; a weak bearer token is refused."""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, text_of
from mcp.client import Client
from mcp_types import PromptReference, ResourceTemplateReference

from stallhound.formats.nsys.checks import MAX_TIME_NS
from stallhound.model.errors import MAX_ECHO_CHARS, MAX_SAID_CHARS, WeakToken
from stallhound.server.app import build_server
from stallhound.server.http import MIN_TOKEN_CHARS, check_bind
from stallhound.tools import top_kernels

MOCK = FIXTURES / "nsysai_mock.sqlite"  # 2 kernels, 1 memcpy
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
CLI = [sys.executable, "-m", "stallhound"]
HUGE = 10**400  # JSON has no bound on an integer; Python parses this one exactly
# A kernel row as the build keeps it, read by SQLite itself: integers where nsys writes them, a process, times on
# the timeline within MAX_TIME_NS, an end not before the start.
KEPT_KERNELS_SQL = (f"SELECT count(*) FROM {KERNEL} WHERE typeof(start) = 'integer' AND typeof(\"end\") = 'integer' "
                    "AND typeof(deviceId) = 'integer' AND typeof(globalPid) = 'integer' "
                    f"AND start BETWEEN 0 AND {MAX_TIME_NS} AND \"end\" BETWEEN start AND {MAX_TIME_NS}")


def said_once(message: str) -> None:
    """One sentence as issue 30 asks: one line, no traceback, a reason after the SDK's prefix, bounded, every unbroken
    run (a path, a number) within an echo's length."""
    assert message and "\n" not in message and "Traceback" not in message, message[:500]
    assert not re.fullmatch(r"Error executing tool \w+", message), message
    assert len(message) <= MAX_SAID_CHARS + 100, len(message)  # the SDK's "Error executing tool NAME: " prefix
    assert max(len(run) for run in message.split()) <= MAX_ECHO_CHARS, message[:500]


def _loosened(con: sqlite3.Connection) -> None:
    """The kernel table without its declared NOT NULLs (CREATE TABLE AS keeps the columns and types, not those)."""
    con.execute(f"CREATE TABLE loose AS SELECT * FROM {KERNEL}")
    con.execute(f"DROP TABLE {KERNEL}")
    con.execute(f"ALTER TABLE loose RENAME TO {KERNEL}")


def _untyped(con: sqlite3.Connection) -> None:
    names = [r[1] for r in con.execute(f"PRAGMA table_info({KERNEL})")]
    con.execute(f"CREATE TABLE loose ({', '.join(f'{chr(34)}{n}{chr(34)}' for n in names)})")
    con.execute(f"INSERT INTO loose SELECT * FROM {KERNEL}")
    con.execute(f"DROP TABLE {KERNEL}")
    con.execute(f"ALTER TABLE loose RENAME TO {KERNEL}")


def _zero_root_page(path: Path, table: str) -> Path:
    with sqlite3.connect(path) as con:
        (size,), (root,) = (con.execute("PRAGMA page_size").fetchone(),
                            con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone())
    con.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * size: root * size] = bytes(size)
    path.write_bytes(bytes(data))
    return path


# case -> what damages the kernel table (row 1), and the words of its note (None: no row is lost)
DAMAGED_ROWS = {
    "null_process_id": (lambda con: (_loosened(con),
                                     con.execute(f"UPDATE {KERNEL} SET globalPid = NULL WHERE rowid = 1")),
                        "1 without a process id"),
    "int64_max_end": (lambda con: con.execute(f'UPDATE {KERNEL} SET "end" = 9223372036854775807 WHERE rowid = 1'),
                      "1 ending beyond 104 days"),
    "int64_max_times_overflowing": (lambda con: con.execute(
        f'UPDATE {KERNEL} SET start = -9223372036854775807, "end" = 9223372036854775807 WHERE rowid = 1'),
        "1 without a start time"),
    "text_device_id": (lambda con: con.execute(f"UPDATE {KERNEL} SET deviceId = 'gpu0' WHERE rowid = 1"),
                       "1 without a device"),
    "text_in_a_time_column": (lambda con: con.execute(f"UPDATE {KERNEL} SET start = 'abc' WHERE rowid = 1"),
                              "1 without a start time"),
    "fraction_in_a_time_column": (lambda con: con.execute(f"UPDATE {KERNEL} SET start = 1.5e30 WHERE rowid = 1"),
                                  "1 without a start time"),
    "undeclared_column_types": (_untyped, None),
}


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return build_server([root], cache_dir=tmp_path / "cache"), root


def _copy(root: Path, name: str) -> Path:
    path = root / name
    shutil.copyfile(MOCK, path)
    return path


def _count(path: Path, sql: str) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(DAMAGED_ROWS))
async def test_sentences_damaged_rows_are_dropped_counted_and_the_rest_loads(served, case):
    server, root = served
    alter, words = DAMAGED_ROWS[case]
    path = _copy(root, f"{case}.sqlite")
    with sqlite3.connect(path) as con:
        alter(con)
    con.close()
    total, kept = _count(path, f"SELECT count(*) FROM {KERNEL}"), _count(path, KEPT_KERNELS_SQL)
    async with Client(server) as client:
        loaded = await client.call_tool("load_profile", {"path": str(path)})
        assert not loaded.is_error, text_of(loaded)
        top = await client.call_tool("top_kernels", {"profile": str(path)})
    summary = loaded.structured_content["summary"]
    assert summary["table_rows"]["kernels"] == kept == top.structured_content["kernel_count"]
    assert summary["table_rows"]["memcpy"] == _count(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY") == 1
    notes = " ".join(summary["trace_quality"])
    if words:
        assert total - kept == 1 and f"{total - kept} of {total} kernels rows were left out" in notes and words in notes
    else:
        assert kept == total == 2 and "read cell by cell" in notes


@pytest.mark.anyio
async def test_sentences_zeroed_page_of_a_table_leaves_it_out_and_loads_the_rest(served):
    server, root = served
    path = _zero_root_page(_copy(root, "zeroed.sqlite"), KERNEL)
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):  # SQLite itself cannot read the kernels
        con.execute(f"SELECT * FROM {KERNEL}").fetchall()
    con.close()
    async with Client(server) as client:
        loaded = await client.call_tool("load_profile", {"path": str(path)})
    assert not loaded.is_error, text_of(loaded)
    summary = loaded.structured_content["summary"]
    assert summary["table_rows"]["kernels"] == 0
    assert summary["table_rows"]["memcpy"] == _count(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY") == 1
    assert summary["table_rows"]["cuda_api"] == _count(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME") > 0
    assert f"the export's {KERNEL} table is damaged" in summary["trace_quality"][0]


@pytest.mark.anyio
async def test_sentences_zeroed_page_of_what_names_everything_is_one_sentence(served):
    server, root = served
    path = _zero_root_page(_copy(root, "zeroed.sqlite"), "StringIds")
    async with Client(server) as client:
        refused = await client.call_tool("load_profile", {"path": str(path)})
        good = await client.call_tool("top_kernels", {"profile": str(_copy(root, "good.sqlite"))})
    assert refused.is_error and "is not a readable SQLite database (database disk image is malformed)" in text_of(
        refused)
    said_once(text_of(refused))
    assert not good.is_error and good.structured_content["kernel_count"] == 2


@pytest.mark.anyio
async def test_sentences_hostile_inputs_come_back_as_one_short_line(served):
    server, root = served
    (root / "garbage.json").write_bytes(b'{"traceEvents": [' + b"\x00\x1b[31m\xff\n" * 500)
    good = str(_copy(root, "good.sqlite"))
    calls = [("load_profile", {"path": str(root / ("x" * 1_000_000))}),  # 1,000,111 characters of error before
             ("load_profile", {"path": str(root / ("y" * 250)) + ".sqlite"}),
             ("load_profile", {"path": f"{root}/a\nb.sqlite"}),
             ("load_profile", {"path": str(root / "garbage.json")}),
             ("top_kernels", {"profile": good, "start_ns": HUGE}),
             ("gpu_idle_gaps", {"profile": good, "min_gap_ns": HUGE}),
             ("top_kernels", {"profile": good, "device": -HUGE}),
             ("top_kernels", {"profile": good, "bogus" * 10_000: 1})]
    async with Client(server) as client:
        for tool, args in calls:
            result = await client.call_tool(tool, args)
            assert result.is_error, (tool, str(args)[:100])
            said_once(text_of(result))


@pytest.mark.anyio
async def test_sentences_integers_beyond_64_bits_name_the_parameter_and_its_range(served):
    server, root = served
    good = str(_copy(root, "good.sqlite"))
    async with Client(server) as client:
        gaps = await client.call_tool("gpu_idle_gaps", {"profile": good, "min_gap_ns": HUGE})
    assert text_of(gaps) == ("Error executing tool gpu_idle_gaps: min_gap_ns must be an integer from 1000 to "
                             f"{2**63 - 1} (got {str(HUGE)[:57]}...)")


def test_sentences_cli_integer_beyond_64_bits_is_one_line(tmp_path):
    path = _copy(tmp_path, "good.sqlite")
    done = subprocess.run([*CLI, "tool", "gpu_idle_gaps", str(path), "-p", f"min_gap_ns={HUGE}", "--cache-dir",
                           str(tmp_path / "cache")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-800:]
    assert "min_gap_ns must be an integer from 1000 to 9223372036854775807" in done.stderr


@pytest.mark.anyio
async def test_sentences_a_defect_of_ours_is_one_sentence_and_its_traceback_is_logged(served, monkeypatch, caplog):
    server, root = served
    good = str(_copy(root, "good.sqlite"))

    def broken(con, params):
        raise RuntimeError("secret detail at 0x7f3a12b4c5d6 in /etc/private")

    monkeypatch.setattr(top_kernels, "run", broken)
    with caplog.at_level(logging.ERROR, logger="stallhound"):
        async with Client(server) as client:
            result = await client.call_tool("top_kernels", {"profile": good})
            after = await client.call_tool("gpu_utilization", {"profile": good})
    message = text_of(result)
    said_once(message)
    assert message.startswith(f"Error executing tool top_kernels: top_kernels failed on profile {good} with an error "
                              "stallhound did not foresee (RuntimeError; the server logged the details)"), message
    assert "secret" not in message and "0x7f" not in message and "/etc/private" not in message
    logged = [r for r in caplog.records if r.exc_info and "secret detail" in str(r.exc_info[1])]
    assert len(logged) == 1 and "top_kernels failed on profile" in logged[0].getMessage()
    assert not after.is_error


@pytest.mark.anyio
async def test_sentences_out_of_memory_names_our_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("STALLHOUND_MODEL_MEMORY_MB", "8")
    root = tmp_path / "root"
    root.mkdir()
    server = build_server([root], cache_dir=tmp_path / "cache")
    good = str(_copy(root, "good.sqlite"))
    async with Client(server) as client:
        result = await client.call_tool("query_sql", {
            "profile": good, "sql": "SELECT length(string_agg(repeat('x', 100000), '')) AS n FROM range(1000000)"})
    message = text_of(result)
    said_once(message)
    assert "set STALLHOUND_MODEL_MEMORY_MB higher" in message and "memory_limit" not in message, message


@pytest.mark.anyio
async def test_sentences_outside_roots_does_not_say_where_a_link_leads(served, tmp_path):
    server, root = served
    hidden = tmp_path / "hidden-place"
    hidden.mkdir()
    _copy(hidden, "secret.sqlite")
    (root / "link.sqlite").symlink_to(hidden / "secret.sqlite")
    async with Client(server) as client:
        result = await client.call_tool("load_profile", {"path": str(root / "link.sqlite")})
    assert result.is_error and "is outside the allowed roots" in text_of(result)
    assert "hidden-place" not in text_of(result)


@pytest.mark.anyio
async def test_sentences_completions_list_only_the_callers_profiles(served):
    server, root = served
    mine, theirs = _copy(root, "mine.sqlite"), _copy(root, "theirs.sqlite")
    template = ResourceTemplateReference(uri="stallhound://profiles/{id}")
    async with Client(server, mode="legacy") as a, Client(server, mode="legacy") as b:
        await a.call_tool("load_profile", {"path": str(mine)})
        await b.call_tool("load_profile", {"path": str(theirs)})
        for client, own in ((a, ["mine"]), (b, ["theirs"])):
            for ref, argument in ((PromptReference(name="verify_fix"), "before"), (template, "id")):
                done = await client.complete(ref, {"name": argument, "value": ""})
                assert done.completion.values == own, (own, argument, done.completion.values)


@pytest.mark.parametrize("token", [" ", "x", "a" * 40, "abcdefgh" + " " * 8, "abcdefghijklmno"])
def test_sentences_weak_bearer_token_is_refused_at_start(token):
    with pytest.raises(WeakToken) as refused:
        check_bind("0.0.0.0", token)
    message = str(refused.value)
    said_once(message)
    assert f"at least {MIN_TOKEN_CHARS} characters" in message
    assert len(token) < 8 or token.strip() not in message  # its length is said, never its text
    with pytest.raises(WeakToken):
        build_server([FIXTURES], token=token)
    check_bind("0.0.0.0", "Zq3-vK8_pW2mT9xR")  # 16 characters, all different: accepted


def test_sentences_weak_token_stops_the_server_at_start_with_one_line(tmp_path):
    done = subprocess.run([*CLI, "serve", "--transport", "http", "--token", "x", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "too weak to guard the server" in done.stderr


@pytest.mark.anyio
async def test_sentences_errors_do_not_name_the_servers_own_folders(tmp_path, monkeypatch):
    """The build's out-of-memory sentence names where it spills (the cache folder): a client is told it in words."""
    monkeypatch.setenv("STALLHOUND_BUILD_MEMORY_MB", "1")
    root, cache = tmp_path / "root", tmp_path / "private-cache"
    root.mkdir()
    server = build_server([root], cache_dir=cache)
    async with Client(server) as client:
        result = await client.call_tool("load_profile", {"path": str(_copy(root, "good.sqlite"))})
    message = text_of(result)
    said_once(message)
    assert "ran out of memory" in message and "the server's cache folder" in message, message
    assert "private-cache" not in message
