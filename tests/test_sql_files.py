"""SQL kept in .sql files: each has its header, is shipped in the wheel's package data, and is read by a module."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

from stallhound.model.sql_files import sql_beside

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "stallhound"


def _package(path: Path) -> str:
    return ".".join(path.parent.relative_to(SRC.parent).parts)


def test_sql_files_each_starts_with_a_header_comment_and_is_used():
    for path in sorted(SRC.rglob("*.sql")):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("-- "), f"{path.relative_to(SRC)} has no header comment"
        users = [m for m in path.parent.glob("*.py") if f'"{path.name}"' in m.read_text(encoding="utf-8")]
        assert users, f"{path.relative_to(SRC)} is read by no module beside it"


def test_sql_files_sql_beside_reads_each_shipped_file_as_it_is_in_src():
    paths = sorted(SRC.rglob("*.sql"))
    assert paths, "no .sql file under src"
    for path in paths:
        assert sql_beside(_package(path), path.name) == path.read_text(encoding="utf-8"), path.relative_to(SRC)


def test_sql_files_the_wheel_s_package_data_matches_every_sql_file():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"]
    for path in sorted(SRC.rglob("*.sql")):
        patterns = [*package_data.get("*", []), *package_data.get(_package(path), [])]
        assert any(fnmatch(path.name, p) for p in patterns), f"{path.relative_to(SRC)} is not in the wheel"
