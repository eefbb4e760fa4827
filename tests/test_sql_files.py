"""SQL kept in .sql files: each has its header, is shipped in the wheel's package data, and is read by a module."""

from __future__ import annotations

from pathlib import Path

from stallhound.model.sql_files import sql_beside

SRC = Path(__file__).resolve().parents[1] / "src" / "stallhound"


def test_sql_files_each_starts_with_a_header_comment_and_is_used():
    for path in sorted(SRC.rglob("*.sql")):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("-- "), f"{path.relative_to(SRC)} has no header comment"
        users = [m for m in path.parent.glob("*.py") if f'"{path.name}"' in m.read_text(encoding="utf-8")]
        assert users, f"{path.relative_to(SRC)} is read by no module beside it"


def test_sql_files_sql_beside_reads_the_packaged_text():
    assert sql_beside("stallhound.model", "sql_files.py").startswith('"""SQL kept in')
