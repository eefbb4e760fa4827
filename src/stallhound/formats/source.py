"""Check that what the user pointed at is a readable, non-empty regular file (which format it is, the registry
decides); the advice when it is not names what the registered formats read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stallhound.formats import registry
from stallhound.model.errors import NotAProfile, ProfileNotFound, echo


def profile_files() -> str:
    """The files the registered formats read, by writer: `nsys (.sqlite, .nsys-rep, .qdrep) or torch.profiler (.json,
    .json.gz)`."""
    return " or ".join(f"{f.writer} ({', '.join(f.suffixes)})" for f in registry.FORMATS)


def empty_advice(path: Path) -> str:
    """How to get a non-empty file in place of the empty `path`: the advice of the format its name is one of, else
    every format's."""
    name = path.name.lower()
    named = [f for f in registry.FORMATS if name.endswith(f.suffixes)]
    return ", or ".join(f.expects[1] for f in named or registry.FORMATS)


def check_file(path: Path) -> Path:
    """The absolute path of a readable, non-empty regular file; a clear error otherwise.

    The file is opened non-blocking and checked on its open descriptor: a FIFO (or a device) never
    blocks the caller, and nothing can swap the file between the check and the read.
    """
    path = Path(path).expanduser()
    try:
        if not path.exists():
            raise ProfileNotFound(f"{echo(path)} does not exist; pass the path of a profile: {profile_files()}")
        if path.is_dir():
            raise NotAProfile(f"{echo(path)} is a directory; pass one profile inside it: {profile_files()}")
        path = path.resolve()
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop; ValueError: a NUL byte
        raise ProfileNotFound(f"{echo(path)} cannot be opened ({getattr(exc, 'strerror', None) or exc}); check the "
                              "path and its permissions") from exc
    with os.fdopen(fd, "rb"):
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAProfile(f"{echo(path)} is not a regular file (a device, FIFO or socket); pass a profile: "
                              f"{profile_files()}")
        if st.st_size == 0:
            raise NotAProfile(f"{echo(path)} is empty (0 bytes); {empty_advice(path)}")
    return path
