"""Which files make a job: explicit paths, a folder, or a glob; and the rank a file's name gives, if any."""

from __future__ import annotations

import glob
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from stallhound.formats import kineto, registry
from stallhound.jobs import head
from stallhound.model.errors import NoJobFiles, ProfileNotFound

# A rank in a file name: rank_3, rank-3, rank3, _r3, -r3, .3. (as in `nsys -o rank_%q{RANK}`, trace.3.json).
RANK_IN_NAME = (re.compile(r"rank[_-]?(\d+)", re.IGNORECASE), re.compile(r"[_-]r(\d+)(?=\D|$)", re.IGNORECASE),
                re.compile(r"\.(\d+)\."))
GLOB_CHARS = re.compile(r"[*?\[]")


def _natural(path: Path) -> tuple:
    """Sort key putting rank_2 before rank_10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name))


def _is_profile(path: Path) -> bool:
    """Whether a file found in a folder or by a glob is a profile some format takes (hidden files never are); a JSON
    file is judged by its first bytes only (head.holds_trace_events), never parsed whole."""
    if not path.is_file() or path.name.startswith("."):
        return False
    if path.name.lower().endswith(kineto.FORMAT.suffixes):
        return head.holds_trace_events(path)
    return registry.picks(path)


def _expand(item: str, check: Callable[[Path], Path]) -> list[Path]:
    path = Path(item).expanduser()
    if GLOB_CHARS.search(item):
        matches = sorted((Path(p) for p in glob.glob(str(check(path.parent) / path.name))), key=_natural)
        return [check(p) for p in matches if _is_profile(p)]
    full = check(path)
    if full.is_dir():
        return sorted((p for p in full.iterdir() if _is_profile(p)), key=_natural)
    if not full.exists():
        raise ProfileNotFound(f"{item} does not exist; pass the rank profiles' paths, their folder or a glob "
                              "such as 'run/rank_*.sqlite'")
    return [full]


def job_files(spec: str | Path | Sequence[str | Path], check: Callable[[Path], Path] = Path.resolve) -> list[Path]:
    """The files of a job, in rank order where nothing else says it: each item of `spec` is a file, a folder (its
    profiles in natural name order) or a glob; `check` resolves a path (the server's check that it is allowed)."""
    items = [str(spec)] if isinstance(spec, str | Path) else [str(s) for s in spec]
    files: list[Path] = []
    for item in items:
        for path in _expand(item, check):
            if path not in files:
                files.append(path)
    if not files:
        named = ", ".join(registry.profile_suffixes())
        raise NoJobFiles(f"{', '.join(items) or 'nothing'} names no profile ({named} files); "
                         "pass the rank profiles' paths, their folder or a glob such as 'run/rank_*.sqlite'")
    return files


def rank_in_name(path: Path) -> int | None:
    """The rank a file's name gives (rank_3, _r3, .3., rank3), or None."""
    for pattern in RANK_IN_NAME:
        found = pattern.search(path.name)
        if found:
            return int(found.group(1))
    return None
