"""Open models stay within STALLHOUND_MODEL_MEMORY_MB: DuckDB spills past it into a folder beside the model (in the
cache folder, never the profile's), removed when the model closes; a call that cannot fit is one sentence."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from conftest import FIXTURES, one_sentence, text_of
from mcp.client import Client

from stallhound.formats import open_profile
from stallhound.model.duck import remove_dead_spills, spill_folder
from stallhound.model.limits import MODEL_MEMORY_ENV, MemorySettingInvalid
from stallhound.server.app import build_server

EXPORT = FIXTURES / "nsysai_h100_2gpu_1s.sqlite"
SPILLING_MB = "20"  # the sort below holds about 100 MB of rows: at 20 MB DuckDB must spill
FAILING_MB = "1"  # below what profile_summary's queries need on this export, even spilling
COPIES = 2000  # rows of the sort below: each kernel this many times
SORT_SQL = ("SELECT count(*), sum(h) FROM "
            f"(SELECT hash(k.name, r.range) AS h FROM kernels k, range({COPIES}) r ORDER BY h)")


def _raw(sql: str) -> tuple:
    with sqlite3.connect(f"file:{EXPORT}?mode=ro", uri=True) as con:
        return con.execute(sql).fetchone()


def test_model_memory_limit_spills_beside_the_model_and_removes_the_folder_on_close(tmp_path, monkeypatch):
    unlimited = open_profile(EXPORT, cache_dir=tmp_path)
    try:
        expected = unlimited.con.execute(SORT_SQL).fetchone()
    finally:
        unlimited.close()
    monkeypatch.setenv(MODEL_MEMORY_ENV, SPILLING_MB)
    profile = open_profile(EXPORT, cache_dir=tmp_path)
    folder, seen, done = spill_folder(profile.model_path), [], threading.Event()

    def watch() -> None:
        while not done.is_set():
            if folder.exists() and any(folder.iterdir()):
                seen.append(folder)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        limit, freed = profile.con.execute("SELECT current_setting('memory_limit'), "
                                           "current_setting('allocator_bulk_deallocation_flush_threshold')").fetchone()
        rows = profile.con.execute(SORT_SQL).fetchone()
    finally:
        done.set()
        watcher.join()
        profile.close()
    assert limit == "19.0 MiB"  # DuckDB shows 20 MB (decimal) in MiB
    assert freed == "15.2 MiB"  # RETURN_FREED_MEMORY's 16 MB: freed memory goes back to the OS, not kept in RSS
    assert rows == expected and rows[0] == _raw("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0] * COPIES
    assert seen and folder.parent == tmp_path and folder.parent != EXPORT.parent
    assert not folder.exists()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".duckdb", ".lock"]


def test_model_memory_spill_folders_of_killed_processes_are_removed_when_the_model_opens(tmp_path):
    model = open_profile(EXPORT, cache_dir=tmp_path)
    path = model.model_path
    model.close()
    ours = spill_folder(path)
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    dead = ours.with_name(ours.name.replace(f"-{os.getpid()}", f"-{dead_pid}"))
    live = ours.with_name(ours.name.replace(f"-{os.getpid()}", f"-{os.getppid()}"))
    other_host = path.with_name(f"{path.name}.spill-elsewhere-{dead_pid}")
    for folder in (dead, live, other_host):
        folder.mkdir()
        (folder / "duckdb_temp_storage_DEFAULT-0.tmp").write_bytes(b"x" * 1000)
    reopened = open_profile(EXPORT, cache_dir=tmp_path)
    try:
        assert reopened.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == \
            _raw("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    finally:
        reopened.close()
    assert not dead.exists() and live.exists() and other_host.exists()
    assert remove_dead_spills(path) == []


def test_model_memory_setting_is_checked_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv(MODEL_MEMORY_ENV, "lots")
    with pytest.raises(MemorySettingInvalid) as caught:
        open_profile(EXPORT, cache_dir=tmp_path)
    one_sentence(str(caught.value))
    assert f"{MODEL_MEMORY_ENV}='lots' is not a whole number of MB" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.anyio
async def test_model_memory_exhausted_call_is_an_mcp_error_and_the_server_keeps_serving(tmp_path, monkeypatch):
    server = build_server([FIXTURES], cache_dir=tmp_path)
    async with Client(server) as client:
        monkeypatch.setenv(MODEL_MEMORY_ENV, FAILING_MB)
        failed = await client.call_tool("load_profile", {"path": str(EXPORT)})
        assert failed.is_error
        text = text_of(failed)
        one_sentence(text)
        assert "this call needed more than the 1 MB each open profile may use" in text and MODEL_MEMORY_ENV in text
        await client.call_tool("close_profile", {"profile": str(EXPORT)})
        monkeypatch.delenv(MODEL_MEMORY_ENV)
        answer = await client.call_tool("top_kernels", {"profile": str(EXPORT)})
    assert not answer.is_error
    assert answer.structured_content["kernel_count"] == _raw("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
