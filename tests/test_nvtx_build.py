"""The model's nvtx table as the build writes it (formats.nsys.nvtx): every kept NVTX event of each fixture, with
its text and its domain's name, against independent SQL on the raw export; and domains named by text, by string id
and by bytes that are not UTF-8."""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter

import pytest
from conftest import FIXTURE_FILES, FIXTURES

from stallhound.formats import open_profile
from stallhound.formats.nsys.nvtx import NVTX_KINDS
from stallhound.formats.nsys.raw import RawExport

TID = 1 << 24  # the planted events' thread
MODEL_SQL = "SELECT pid, tid, domain, text, start_ns, end_ns, duration_ns, kind FROM nvtx"
RAW_SQL = """
WITH domains AS (SELECT e.domainId AS id, coalesce(e.text, s.value) AS name FROM NVTX_EVENTS e
                 LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = :domain GROUP BY e.domainId)
SELECT (e.globalTid >> 24) & 16777215, e.globalTid & 16777215, d.name, coalesce(e.text, s.value), e.start,
       CASE WHEN e."end" >= e.start THEN e."end" END, CASE WHEN e."end" >= e.start THEN e."end" - e.start END,
       e.eventType
FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
LEFT JOIN domains d ON d.id = e.domainId AND e.domainId <> 0
WHERE e.eventType <> :domain"""


def _model_rows(path, cache) -> Counter:
    profile = open_profile(path, cache_dir=cache)
    try:
        return Counter(profile.con.execute(MODEL_SQL).fetchall())
    finally:
        profile.close()


def _raw_rows(path) -> Counter:
    codes, _ = RawExport(path).enum("ENUM_NSYS_EVENT_TYPE")  # the export's own, else nsys' codes
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        if not raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone():
            return Counter()
        domain = next((c for c, n in codes.items() if n == "NvtxDomainCreate"), -1)
        rows = raw.execute(RAW_SQL, {"domain": domain}).fetchall()
    return Counter((*r[:7], NVTX_KINDS[codes[r[7]]]) for r in rows if NVTX_KINDS.get(codes.get(r[7])) is not None)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.stem)
def test_profiles_nvtx_rows_equal_the_raw_export(path, tmp_path):
    assert _model_rows(path, tmp_path / "cache") == _raw_rows(path)


def test_profiles_nvtx_domains_named_by_text_string_id_and_bad_bytes(tmp_path):
    path = tmp_path / "domains.sqlite"
    shutil.copy(FIXTURES / "pipit_saxpy_mpi_a100.sqlite", path)
    with sqlite3.connect(path) as con:
        codes = {name: code for code, name in RawExport(path).enum("ENUM_NSYS_EVENT_TYPE")[0].items()}
        string_id = con.execute("SELECT max(id) + 1 FROM StringIds").fetchone()[0]
        con.execute("INSERT INTO StringIds (id, value) VALUES (?, 'by id')", [string_id])
        domain, push_pop = codes["NvtxDomainCreate"], codes["NvtxPushPopRange"]
        con.executemany('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, textId, domainId, globalTid) '
                        "VALUES (?, ?, ?, CAST(? AS TEXT), ?, ?, ?)",  # text, as nsys writes it, whatever its bytes
                        [(10, None, domain, None, string_id, 77, TID), (10, None, domain, b"bad \xff", None, 78, TID),
                         (20, 30, push_pop, "in 77", None, 77, TID), (20, 30, push_pop, "in 78", None, 78, TID)])
    model = _model_rows(path, tmp_path / "cache")
    named = {text: domain for _, _, domain, text, *_ in model}
    assert (named["in 77"], named["in 78"]) == ("by id", "bad \\xFF")
    raw_named = {text: domain for _, _, domain, text, *_ in _raw_rows(FIXTURES / "pipit_saxpy_mpi_a100.sqlite")}
    assert "MPI" in raw_named.values()  # the export's own ranges keep their domain
    assert named == raw_named | {"in 77": "by id", "in 78": "bad \\xFF"}
