"""Check that what the user pointed at is a readable, non-empty regular file (which format it is, the registry
decides)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stallhound.model.errors import NotAProfile, ProfileNotFound


def check_file(path: Path) -> Path:
    """The absolute path of a readable, non-empty regular file; a clear error otherwise.

    The file is opened non-blocking and checked on its open descriptor: a FIFO (or a device) never
    blocks the caller, and nothing can swap the file between the check and the read.
    """
    path = Path(path).expanduser()
    try:
        if not path.exists():
            raise ProfileNotFound(f"{path} does not exist; pass the path of an nsys .sqlite or .nsys-rep file")
        if path.is_dir():
            raise NotAProfile(f"{path} is a directory; pass one .sqlite or .nsys-rep file inside it")
        path = path.resolve()
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop; ValueError: a NUL byte
        raise ProfileNotFound(f"{path} cannot be opened ({getattr(exc, 'strerror', None) or exc}); check the path "
                              "and its permissions") from exc
    with os.fdopen(fd, "rb"):
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAProfile(f"{path} is not a regular file (a device, FIFO or socket); pass an nsys .sqlite or "
                              ".nsys-rep file")
        if st.st_size == 0:
            raise NotAProfile(f"{path} is empty (0 bytes); re-run `nsys export --type sqlite` on the report")
    return path
