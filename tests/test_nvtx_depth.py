"""NVTX push/pop depth as the build computes it (profiles.ingest Builder.nvtx), against planted nesting: ranges added
to a copy of a real export on a thread of their own, each with the depth a per-thread stack gives it."""

from __future__ import annotations

import shutil
import sqlite3

from conftest import FIXTURES

from nsightful.profiles import open_profile

EXPORT = FIXTURES / "nsysai_h100_2gpu_1s.sqlite"
PID, TID, OTHER_TID = 4242, 7, 8
PUSH_POP, START_END, MARK = "NvtxPushPopRange", "NvtxStartEndRange", "NvtxMark"
# (text, start, end, event type, thread, depth the model must give it)
PLANTED = [
    ("outer", 1000, 2000, PUSH_POP, TID, 0),
    ("twin a", 1100, 1500, PUSH_POP, TID, 1),
    ("twin b", 1100, 1500, PUSH_POP, TID, 2),  # same times as its twin: nested inside it, in row order
    ("inner", 1200, 1300, PUSH_POP, TID, 3),
    ("after twins", 1500, 1600, PUSH_POP, TID, 1),  # the twins close at 1500 before it opens
    ("zero length", 1600, 1600, PUSH_POP, TID, 1),  # opens as 'after twins' closes, closes after it opens
    ("top zero length", 2500, 2500, PUSH_POP, TID, 0),
    ("mark", 1250, None, MARK, TID, None),
    ("start/end", 1050, 1900, START_END, TID, None),
    ("unclosed", 1700, None, PUSH_POP, TID, None),
    ("other thread", 900, 2100, PUSH_POP, OTHER_TID, 0),  # its own stack: the ranges above do not count
    ("other inner", 1150, 1160, PUSH_POP, OTHER_TID, 1),
]


def _planted_export(tmp_path):
    path = tmp_path / EXPORT.name
    shutil.copy(EXPORT, path)
    with sqlite3.connect(path) as con:
        codes = dict(con.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE").fetchall())
        con.executemany('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)',
                        [(s, e, codes[kind], text, (PID << 24) | tid) for text, s, e, kind, tid, _ in PLANTED])
    return path


def test_profiles_nvtx_depth_follows_each_threads_stack(tmp_path):
    profile = open_profile(_planted_export(tmp_path), cache_dir=tmp_path / "cache")
    try:
        got = dict(profile.con.execute("SELECT text, depth FROM nvtx WHERE pid = ?", [PID]).fetchall())
        others = profile.con.execute("SELECT count(*), count(depth), min(depth) FROM nvtx WHERE pid <> ?",
                                     [PID]).fetchone()
    finally:
        profile.close()
    assert got == {text: depth for text, *_, depth in PLANTED}
    with sqlite3.connect(f"file:{EXPORT}?mode=ro", uri=True) as raw:
        pushed = raw.execute("SELECT count(*) FROM NVTX_EVENTS e JOIN ENUM_NSYS_EVENT_TYPE t ON t.id = e.eventType "
                             "WHERE t.name = ? AND e.\"end\" >= e.start", [PUSH_POP]).fetchone()[0]
        total = raw.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
    assert others == (total, pushed, 0)  # the export's own ranges keep a depth each, from 0
