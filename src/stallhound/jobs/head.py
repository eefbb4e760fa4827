"""Whether a JSON file found in a job's folder (or by its glob) is a torch.profiler trace, from its first bytes.

A folder of runs holds other JSON too, and every file there is read just by being present: parsing each one's
header whole let a 60 KB file nested 30,000 deep take 2.3 GB. Here only the first HEAD_BYTES (decompressed) are
read, and only the bytes that decide nesting are looked at: no value is built.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from stallhound.formats.kineto.read import GZIP_MAGIC, READ_ERRORS

# Bytes read from the head of a JSON file: a trace's top-level values before traceEvents (device properties of 8
# GPUs, distributedInfo) are tens of KB, so its traceEvents key comes well within this.
HEAD_BYTES = 4 << 20
MAX_DEPTH = 64  # Kineto's header nests a few levels; a file nested deeper before traceEvents is no trace
# The traceEvents key, escapes (skipped whole), quotes and brackets: the only bytes that decide where the key is.
TOKENS = re.compile(rb'"traceEvents"\s*:|\\.|["{}\[\]]', re.DOTALL)
EVENTS_KEY = b'"traceEvents"'


def _head(path: Path) -> bytes:
    with path.open("rb") as raw:
        gzipped = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        raw.seek(0)
        if not gzipped:
            return raw.read(HEAD_BYTES)
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            return unzipped.read(HEAD_BYTES)


def holds_trace_events(path: Path) -> bool:
    """Whether a top-level traceEvents key starts within the file's first HEAD_BYTES, at most MAX_DEPTH deep."""
    try:
        data = _head(path)
    except READ_ERRORS:
        return False
    depth, quoted = 0, False
    for match in TOKENS.finditer(data):
        token = match.group()
        if quoted:
            quoted = token[:1] != b'"'  # a string ends at its first quote that no backslash escapes
        elif token.startswith(EVENTS_KEY):
            if depth == 1:
                return True
        elif token == b'"':
            quoted = True
        elif token in (b"{", b"["):
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif token in (b"}", b"]"):
            depth -= 1
            if depth <= 0:
                return False
    return False
