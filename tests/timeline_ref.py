"""Independent references for the timeline tests: lane intervals read from a raw export with sqlite3 and the
export's own enums, and a column's digit computed in plain Python."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

from modeldb import union_ns


def edges(lo: int, hi: int, buckets: int) -> list[int]:
    return [lo + math.ceil(i * (hi - lo) / buckets) for i in range(buckets + 1)]


def levels(intervals: list[tuple[int, int]], lo: int, hi: int, buckets: int) -> str:
    """One digit per column: 0 when the union of `intervals` misses it, else ceil(9 x busy share)."""
    out = []
    for a, b in zip(edges(lo, hi, buckets), edges(lo, hi, buckets)[1:], strict=False):
        busy = union_ns([(max(s, a), min(e, b)) for s, e in intervals if e > a and s < b])
        out.append(str(min(9, math.ceil(9 * busy / (b - a)))) if busy else "0")
    return "".join(out)


def raw_lanes(path: Path, lo: int, hi: int) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """Per (device, lane) the intervals in [lo, hi), read from the export with sqlite3 and the export's own enums."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        out: dict[tuple[int, str], list[tuple[int, int]]] = {}
        kernels = db.execute("SELECT k.deviceId, s.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                             "JOIN StringIds s ON s.id = k.shortName").fetchall()
        for dev, name, s, e in kernels:
            out.setdefault((dev, "nccl" if name.lower().startswith("nccl") else "compute"), []).append((s, e))
        copies = db.execute("SELECT m.deviceId, o.name, m.start, m.end FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                            "JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind").fetchall()
        names = {"CUDA_MEMCPY_KIND_HTOD": "h2d", "CUDA_MEMCPY_KIND_DTOH": "d2h"}
        for dev, kind, s, e in copies:
            out.setdefault((dev, names.get(kind, "other_copy")), []).append((s, e))
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_MEMSET'").fetchone():
            for dev, s, e in db.execute("SELECT deviceId, start, end FROM CUPTI_ACTIVITY_KIND_MEMSET"):
                out.setdefault((dev, "memset"), []).append((s, e))
    return {key: [(max(s, lo), min(e, hi)) for s, e in v if e > lo and s < hi and e > s] for key, v in out.items()}
