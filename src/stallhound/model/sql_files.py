"""SQL kept in `.sql` files beside the module that runs it: long statements read as SQL, not as Python strings.

Each file starts with a `--` header saying what the statement computes and which `$name` parameters it binds;
the header stays in the text DuckDB runs (a comment costs nothing there).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def sql_beside(package: str, name: str) -> str:
    """The text of `name` (e.g. "labelled_gaps.sql") in `package`'s folder, as the wheel ships it; pass the
    calling module's `__package__`."""
    return (files(package) / name).read_text(encoding="utf-8")
