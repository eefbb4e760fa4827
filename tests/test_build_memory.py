"""A build that runs out of memory, or of disk to spill to, is one sentence; its files are removed and the server
keeps serving. The limit is STALLHOUND_BUILD_MEMORY_MB."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import pytest
from conftest import FIXTURES, one_sentence, text_of
from mcp.client import Client

from stallhound.formats import open_profile
from stallhound.model.cache import SPILL_SUFFIX, fingerprint
from stallhound.model.limits import BUILD_MEMORY_ENV, BuildOutOfMemory, MemorySettingInvalid, out_of_resources
from stallhound.server.app import build_server

EXPORT = FIXTURES / "nsysai_h100_2gpu_1s.sqlite"  # 2.3 MB; its build needs more than 5 MB of DuckDB memory
TINY_MB = "5"



def _raw_kernels(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]


def test_build_memory_exhausted_is_one_sentence_and_leaves_only_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(BUILD_MEMORY_ENV, TINY_MB)
    with pytest.raises(BuildOutOfMemory) as caught:
        open_profile(EXPORT, cache_dir=tmp_path)
    message = str(caught.value)
    one_sentence(message)
    assert f"{EXPORT.name} (2.3 MB) ran out of memory at the build's 5 MB limit" in message
    assert BUILD_MEMORY_ENV in message and str(tmp_path) in message
    assert [p.suffix for p in tmp_path.iterdir()] == [".lock"]  # no model, no temporary file, no spill folder
    monkeypatch.delenv(BUILD_MEMORY_ENV)
    profile = open_profile(EXPORT, cache_dir=tmp_path)
    try:
        assert profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == _raw_kernels(EXPORT)
    finally:
        profile.close()


def test_build_memory_setting_is_used_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv(BUILD_MEMORY_ENV, "2x")
    with pytest.raises(MemorySettingInvalid) as caught:
        open_profile(EXPORT, cache_dir=tmp_path)
    one_sentence(str(caught.value))
    assert f"{BUILD_MEMORY_ENV}='2x' is not a whole number of MB" in str(caught.value)
    assert [p.suffix for p in tmp_path.iterdir()] == [".lock"]


def test_build_memory_full_disk_while_spilling_isone_sentence(tmp_path):
    full = duckdb.IOException('Could not write file "x.tmp/duckdb_temp_storage-0.tmp": No space left on device')
    message = str(out_of_resources(full, EXPORT, tmp_path))
    one_sentence(message)
    assert f"{EXPORT.name} (2.3 MB) ran out of disk space in {tmp_path}" in message
    assert out_of_resources(duckdb.IOException("file is not a database"), EXPORT, tmp_path) is None


@pytest.mark.anyio
async def test_build_memory_exhausted_load_is_an_mcp_error_and_the_server_keeps_serving(tmp_path, monkeypatch):
    server = build_server([FIXTURES], cache_dir=tmp_path)
    async with Client(server) as client:
        monkeypatch.setenv(BUILD_MEMORY_ENV, TINY_MB)
        failed = await client.call_tool("load_profile", {"path": str(EXPORT)})
        assert failed.is_error
        text = text_of(failed)
        one_sentence(text)
        assert "ran out of memory at the build's 5 MB limit" in text
        monkeypatch.delenv(BUILD_MEMORY_ENV)
        answer = await client.call_tool("top_kernels", {"profile": str(EXPORT)})
    assert not answer.is_error and answer.structured_content["kernel_count"] == _raw_kernels(EXPORT)


def test_build_memory_spill_folder_of_a_killed_build_is_removed_by_the_next(tmp_path):
    """A build killed while spilling leaves its model's temporary file and DuckDB's spill folder beside it."""
    key = fingerprint(EXPORT)
    stale = tmp_path / f".{key}-killed.duckdb.tmp"
    (tmp_path / (stale.name + SPILL_SUFFIX)).mkdir(parents=True)
    (tmp_path / (stale.name + SPILL_SUFFIX) / "duckdb_temp_storage-0.tmp").write_bytes(b"\0" * 4096)
    stale.write_bytes(b"\0" * 4096)
    profile = open_profile(EXPORT, cache_dir=tmp_path)
    try:
        assert profile.con.execute("SELECT count(*) FROM kernels").fetchone()[0] == _raw_kernels(EXPORT)
    finally:
        profile.close()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".duckdb", ".lock"]
