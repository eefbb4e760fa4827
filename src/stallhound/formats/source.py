"""Check what the user pointed at (an nsys export or a Kineto trace), convert .nsys-rep/.qdrep, and fingerprint
its content."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

from stallhound.formats.kineto import read as kineto_read
from stallhound.formats.nsys.raw import SQLITE_MAGIC
from stallhound.model.errors import ConversionFailed, ConversionNeeded, NotAProfile, ProfileNotFound

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
SAMPLE_BLOCK_BYTES = 64 * 1024  # fingerprint reads this much at each sampled offset
SAMPLE_BLOCKS = 64  # evenly spaced blocks: ~4 MiB read even for a multi-GB export
NSYS_EXPORT_TIMEOUT_S = 1800  # a multi-GB report converts in minutes, not hours


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
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAProfile(f"{path} is not a regular file (a device, FIFO or socket); pass an nsys .sqlite or "
                              ".nsys-rep file")
        if st.st_size == 0:
            raise NotAProfile(f"{path} is empty (0 bytes); re-run `nsys export --type sqlite` on the report")
        head = fh.read(len(SQLITE_MAGIC))
    if path.suffix.lower() in REPORT_SUFFIXES:
        return path
    if head != SQLITE_MAGIC and not kineto_read.is_trace(path):
        raise NotAProfile(f"{path} is not an SQLite file (its first bytes are not an SQLite header) nor a JSON "
                          "object; export the report with `nsys export --type sqlite report.nsys-rep`, or pass a "
                          "torch.profiler trace (.json or .json.gz)")
    return path


def identity(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, size, modification time): any rewrite of the file while it is read changes it."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def fingerprint(path: Path) -> str:
    """Content key: size plus a hash of the first, last and evenly spaced blocks of the file.

    Reading every byte of a multi-GB export would cost seconds on each reopen; sampled blocks
    catch any re-export (SQLite rewrites its header and pages on every write).
    """
    size = path.stat().st_size
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    step = max(size // SAMPLE_BLOCKS, 1)
    offsets = sorted({*range(0, size, step), max(size - SAMPLE_BLOCK_BYTES, 0)})
    with path.open("rb") as fh:
        for offset in offsets:
            fh.seek(offset)
            digest.update(fh.read(SAMPLE_BLOCK_BYTES))
    return digest.hexdigest()


def convert_report(report: Path, cache_dir: Path) -> Path:
    """Run `nsys export` on a .nsys-rep into the cache (never beside the report)."""
    nsys = shutil.which("nsys")
    out = cache_dir / "exports" / f"{fingerprint(report)}.sqlite"
    if out.exists():
        return out
    if nsys is None:
        raise ConversionNeeded(
            f"{report} is an Nsight Systems report and `nsys` is not on PATH to convert it; run "
            f"`nsys export --type sqlite --output {report.with_suffix('.sqlite')} {report}` and pass the .sqlite")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConversionFailed(f"the converted export of {report} cannot be written to {out.parent} "
                               f"({exc.strerror}); set STALLHOUND_CACHE_DIR (or --cache-dir) to a writable folder, "
                               "or convert it yourself with `nsys export --type sqlite` and pass the .sqlite") from exc
    tmp = out.with_suffix(".partial.sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(tmp), str(report)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=NSYS_EXPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ConversionFailed(f"`nsys export` on {report} took over {NSYS_EXPORT_TIMEOUT_S} s; "
                               "export it yourself and pass the .sqlite") from exc
    if done.returncode != 0 or not tmp.exists():
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionFailed(f"`nsys export` failed on {report} ({last[0]}); "
                               "check the report opens in the Nsight Systems GUI")
    tmp.replace(out)
    return out
