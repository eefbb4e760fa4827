"""The answer memo: what a read-only command (`triage`, `tool NAME`, `diff`) printed, kept in the cache folder beside
the models, so that asking again answers at once.

A model is immutable once built and these commands are pure functions of the model, their parameters and
stallhound's own code. So the printed answer is kept in <cache folder>/memo/, one file per call (the command, its
parameters, its output form, the profiles as named and resolved), stamped with all the answer depends on: each
profile's identity as the file system gives it (device, inode, size, modification time; any rewrite changes one),
MODEL_VERSION, the installed stallhound's version, the sizes and modification times of its source files (an edited
tree never serves a stale answer) and the STALLHOUND_* settings. Looking is a few stat calls, one small read and
json: nothing that reads a profile (DuckDB, numpy, pydantic, the tools) is imported. A miss runs the command as ever
and keeps its answer (a temporary file, then a rename); a memo that cannot be read is a miss, one that cannot be
written is skipped, and neither ever fails the command.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import stallhound
from stallhound.model.folders import cache_dir
from stallhound.model.schema import MODEL_VERSION

MEMO_FOLDER = "memo"
SOURCE_SUFFIXES = (".py", ".sql", ".md", ".toml")  # what the package's answers are made from
SETTINGS_PREFIX = "STALLHOUND_"  # settings (a result budget, memory limits) that may change an answer


@dataclass(frozen=True)
class Memo:
    path: Path  # the memo file of this call
    stamp: str  # what the kept answer must have been computed from to be served


@functools.cache
def code_stamp() -> str:
    """The installed stallhound: its distribution's name and version (found by listing the folders on sys.path:
    importlib.metadata costs more than a whole hit) and each source file's path, size and modification time."""
    digest = hashlib.blake2b(digest_size=16)
    for entry in sys.path:
        with contextlib.suppress(OSError):
            digest.update(repr(sorted(n for n in os.listdir(entry or ".") if n.startswith("stallhound-"))).encode())
    root = Path(stallhound.__file__).parent
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(n for n in files if n.endswith(SOURCE_SUFFIXES)):
            st = os.stat(os.path.join(folder, name))
            digest.update(f"{folder}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _profile_stamp(path: str) -> str | None:
    """A readable regular file's identity; None for anything else (a folder, a missing file), which is not kept."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.R_OK):
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def find(folder: Path | None, profiles: list[str], call: list[str]) -> Memo | None:
    """The memo of `call` (the command, its parameters and output form) on `profiles`, kept under `folder` (the
    --cache-dir, else the cache folder); None when a profile is not a readable regular file."""
    stamps = [_profile_stamp(p) for p in profiles]
    if None in stamps:
        return None
    named = json.dumps([call, profiles, [os.path.realpath(p) for p in profiles]])
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith(SETTINGS_PREFIX))
    stamp = json.dumps([named, stamps, MODEL_VERSION, code_stamp(), settings])  # the call too: names may collide
    name = hashlib.blake2b(named.encode(), digest_size=16).hexdigest()
    return Memo(path=(folder or cache_dir()) / MEMO_FOLDER / f"{name}.json", stamp=stamp)


def recall(memo: Memo) -> tuple[str, int] | None:
    """The kept (printed answer, exit status) when the memo's stamp is this call's; None otherwise."""
    try:
        kept = json.loads(memo.path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, unreadable, or not JSON (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(kept, dict) or kept.get("stamp") != memo.stamp:
        return None
    out, status = kept.get("out"), kept.get("status")
    return (out, status) if isinstance(out, str) and type(status) is int else None


def keep(memo: Memo, out: str, status: int) -> None:
    """Write the memo (a temporary file renamed into place, so a reader never sees half of one); skipped when the
    cache folder cannot be written."""
    tmp = memo.path.with_name(f".{memo.path.name}.{os.getpid()}.tmp")
    try:
        memo.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"stamp": memo.stamp, "out": out, "status": status}), encoding="utf-8")
        os.replace(tmp, memo.path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def answered(memo: Memo | None, command: Callable[[], int]) -> int:
    """Run `command` (which prints its answer and returns the exit status) through the memo: the kept answer when
    there is one, else the command's, printed when it ends (or fails) and kept when it succeeds."""
    if memo is None:
        return command()
    if (kept := recall(memo)) is not None:
        sys.stdout.write(kept[0])
        return kept[1]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            status = command()
    finally:
        sys.stdout.write(printed.getvalue())
    keep(memo, printed.getvalue(), status)
    return status
