"""A capture nsys's timer stopped while the program ran (--duration): the note that says so, and what it changes in
the note on lost CUDA events. Golden on ltgemm_llm_duration_cut (corpus/sources/public-nsys.toml), edges on planted
copies of a real export whose program ended its own capture."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import FIXTURES
from test_idle_evidence import corpus_profile

from stallhound.formats import open_profile
from stallhound.formats.nsys.hardware import time_limit_note
from stallhound.formats.nsys.raw import RawExport
from stallhound.tools import triage

LTGEMM_SHA256 = "4d811273361a194be628a8603cf7084ee437a66181e0f00ce70f415024ecb720"
LIMIT_NOTE = "nsys stopped this capture at its time limit"


def _capture(path: Path) -> tuple[int, int]:
    """(RUN_DURATION_MS, ANALYSIS_DETAILS.duration) of an export, read with SQLite."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        limit = raw.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = 'RUN_DURATION_MS'").fetchone()[0]
        session = raw.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    raw.close()
    return int(limit), int(session)


def test_capture_limit_ltgemm_says_the_timer_cut_the_run_and_why_cuda_events_were_lost(cache_root):
    """ltgemm (an LLM runner on an RTX 5060 Ti, nsys 2025.1.3): RUN_DURATION_MS 10000 while the session ran
    10,005,434,939 ns, and nsys's diagnostics say 'Not all CUDA events might have been collected.' with 3 CUDA
    events in 10 s (SQL): the timer stopped the running program, so its buffered CUDA records were lost; no advice
    about an nsys release that does not match the driver."""
    path = corpus_profile("ltgemm_llm_duration_cut", LTGEMM_SHA256)
    assert _capture(path) == (10_000, 10_005_434_939)
    profile = open_profile(path, cache_dir=cache_root)
    try:
        quality = triage.run(profile.con, triage.Params(profile="ltgemm")).quality
    finally:
        profile.close()
    assert quality[0].startswith(f"{LIMIT_NOTE} (10,000 ms, --duration; the session lasted 10,005.435 ms) while "
                                 "the program was still running")
    assert "--cuda-flush-interval=1000" in quality[0]
    lost = next(q for q in quality if q.startswith("nsys reports that its CUDA trace of this capture is incomplete"))
    assert "3 CUDA calls, 0 copies and 0 memsets but no kernel" in lost
    assert "timer stopped the capture while the program ran" in lost and "matches the CUDA driver" not in lost


@pytest.mark.parametrize("limit_ms, session_ns, cut", [
    (None, None, False),  # as captured: the program's exit ended it (RUN_DURATION_MS 1872, session 1,871,570,402 ns)
    (1_800, None, True),  # the session ran 71.57 ms past a 1,800 ms limit
    (1_800, 1_800_000_000, False),  # a run exactly as long as its rounded length: not past it
    (1_800, 1_800_000_001, True),
    (0, None, False),  # no length recorded
])
def test_capture_limit_only_a_session_past_its_recorded_length(tmp_path, limit_ms, session_ns, cut):
    """nsys records RUN_DURATION_MS as the session's length rounded up when the program ends the capture (27 of the
    28 exports at hand that record both; nsysai_mock: 1872 for 1,871,570,402 ns) and as the limit when its timer
    does: only a session longer than it was cut."""
    path = shutil.copyfile(FIXTURES / "nsysai_mock.sqlite", tmp_path / "planted.sqlite")
    assert _capture(path) == (1_872, 1_871_570_402)
    with sqlite3.connect(path) as con:
        if limit_ms is not None:
            con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE name = 'RUN_DURATION_MS'", (str(limit_ms),))
        if session_ns is not None:
            con.execute("UPDATE ANALYSIS_DETAILS SET duration = ?", (session_ns,))
    con.close()
    note = time_limit_note(RawExport(path))
    assert (note is not None) == cut
    if note is not None:
        lasted = (session_ns or 1_871_570_402) / 1e6
        assert note.startswith(f"{LIMIT_NOTE} ({limit_ms:,} ms, --duration; the session lasted {lasted:,.3f} ms)")


def test_capture_limit_data_the_traced_option_did_not_record_is_not_asked_for(cache_root):
    """ltgemm traced CUDA (3 CUDA calls, SQL) and holds no kernel or copy: triage's 'Not in this profile' asks for no
    --trace=cuda (it was on; the trace notes say why the work is missing) and still names what was off (NVTX events
    were requested but none came: 'No NVTX events collected' in its diagnostics, so nvtx stays)."""
    path = corpus_profile("ltgemm_llm_duration_cut", LTGEMM_SHA256)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        assert raw.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone() == (3,)
        assert not raw.execute("SELECT name FROM sqlite_master WHERE name IN "
                               "('CUPTI_ACTIVITY_KIND_KERNEL', 'CUPTI_ACTIVITY_KIND_MEMCPY')").fetchall()
    raw.close()
    profile = open_profile(path, cache_dir=cache_root)
    try:
        missing = triage.run(profile.con, triage.Params(profile="ltgemm")).missing
    finally:
        profile.close()
    assert [m.data for m in missing] == ["cpu_samples", "gpu_info", "nvtx", "os_runtime", "sched"]
    assert not any("--trace=cuda" == m.capture_flag for m in missing)
