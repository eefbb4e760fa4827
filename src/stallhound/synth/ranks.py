"""Synthetic rank sets: one export per rank of a data-parallel job, with a planted straggler of known delay.

`write_rank_set(folder, ranks=4, straggler_rank=2, delay_ns=3_000_000)` simulates the whole job once with
the synth module (one rank process per GPU, two all-reduce buckets per step, every collective shared by all
ranks), then writes what `nsys profile -o rank_%q{RANK}` would have recorded: `rank_<r>.sqlite` holding only
rank r's process, thread and device rows (the machine tables, enums and metadata stay whole, as every rank
records them). The straggler is synth's: before each step's first all-reduce its host works `delay_ns` longer
than the others', so its NCCL kernels start that much after its peers'. With kind 'host' its GPU idles
meanwhile; with kind 'compute' (the default) the compute kernel before that idle stretch runs on until the next
compute kernel starts, so the rank is late because it computes longer. All ranks share one host and one clock.
`straggler_rank=None` writes a balanced set.

Ground truth goes to `<folder>/job.truth.json` (times in ns on the shared clock):
  generator, truth_version  "stallhound.synth.ranks", 1
  ranks                     [{rank, path, device, pid}]
  straggler                 null, or {rank, kind, delay_ns, lateness_ns (median over the collectives it delayed
                            of its NCCL start minus the latest peer start), delayed (collectives it delayed),
                            peer_extra_ns (median of the peers' mean NCCL duration minus its own),
                            extra_compute_ns (kind 'compute': the compute time added per step, median; else 0)}
  collectives               synth's [{iteration, bucket, name, per_device: [{device, start_ns, end_ns}]}]
  iterations                synth's per-step ranges, per device
  job                       the synth truth of the whole job's export (config, totals, planted)
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from stallhound.synth import SynthConfig, truth_path, write_sample

GENERATOR = "stallhound.synth.ranks"
TRUTH_VERSION = 1
TRUTH_NAME = "job.truth.json"
_GLOBAL_PID_MASK = ~0xFFFFFF  # globalTid = globalPid + tid: clearing the low 24 bits gives the process's globalPid
StragglerKind = Literal["compute", "host"]
_KERNELS_SQL = """
SELECT k.rowid, k.start, k.end, s.value LIKE 'nccl%' AS nccl FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN StringIds s ON s.id = k.shortName ORDER BY k.start
"""


def rank_path(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rank_{rank}.sqlite"


def _keep_rank(path: Path, global_pid: int, pid: int, device: int) -> None:
    """Delete every row of another rank's process or device from the export at path."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("BEGIN")
        tables = [name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
            if "deviceId" in columns:
                con.execute(f"DELETE FROM {table} WHERE deviceId <> ?", (device,))
            if "globalPid" in columns:
                con.execute(f"DELETE FROM {table} WHERE globalPid <> ?", (global_pid,))
            elif "globalTid" in columns:
                con.execute(f"DELETE FROM {table} WHERE (globalTid & ?) <> ?", (_GLOBAL_PID_MASK, global_pid))
            elif "pid" in columns and table == "PROCESSES":
                con.execute(f"DELETE FROM {table} WHERE pid <> ?", (pid,))
        con.execute("COMMIT")
    finally:
        con.close()


def _compute_instead(path: Path, firsts: list[int], delay_ns: int) -> list[int]:
    """Before each step's first NCCL kernel (starting at `firsts`), stretch the compute kernel that precedes the
    widest idle stretch of the last 2 x delay_ns up to the next compute kernel's start; return the time added
    per step."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        rows = con.execute(_KERNELS_SQL).fetchall()
        compute = [(rowid, start, end) for rowid, start, end, nccl in rows if not nccl]
        added = []
        con.execute("BEGIN")
        for nccl_start in firsts:
            pairs = [(b[1] - a[2], a, b) for a, b in zip(compute, compute[1:], strict=False)
                     if nccl_start - 2 * delay_ns <= a[2] < nccl_start]
            gap, before, after = max(pairs)
            con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = ? WHERE rowid = ?", (after[1], before[0]))
            added.append(gap)
        con.execute("COMMIT")
    finally:
        con.close()
    return added


def _straggler(truth: dict[str, Any], rank: int | None, kind: StragglerKind, added: list[int]
               ) -> dict[str, Any] | None:
    planted = next((p for p in truth["planted"] if p["kind"] == "nccl_straggler"), None)
    if rank is None or planted is None:
        return None
    return {"rank": rank, "kind": kind, "delay_ns": planted["delay_ns"], "lateness_ns": planted["lateness_ns"],
            "delayed": planted["count"], "peer_extra_ns": planted["peer_extra_ns"],
            "extra_compute_ns": int(statistics.median(added)) if added else 0}


def write_rank_set(folder: Path, ranks: int = 4, iterations: int = 12, straggler_rank: int | None = None,
                   delay_ns: int = 3_000_000, kind: StragglerKind = "compute", seed: int = 0, force: bool = False
                   ) -> dict[str, Any]:
    """Write rank_<r>.sqlite for r in 0..ranks-1 and job.truth.json into folder (which must exist); return the
    truth. Rank r drives device r. Existing rank files are replaced only when force is true."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"directory {folder} does not exist; create it first")
    if straggler_rank is not None and not 0 <= straggler_rank < ranks:
        raise ValueError(f"straggler rank {straggler_rank} is not one of the {ranks} ranks (0-{ranks - 1})")
    taken = [p.name for p in map(lambda r: rank_path(folder, r), range(ranks)) if p.exists()]
    if taken and not force:
        raise FileExistsError(f"{folder} already holds {', '.join(taken)}; choose an empty folder or pass --force")
    config = SynthConfig.clean(devices=ranks, iterations=iterations, seed=seed, straggler_device=straggler_rank,
                               straggler_delay_ns=delay_ns if straggler_rank is not None else 0)
    added: list[int] = []
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        whole = Path(scratch) / "job.sqlite"
        job = write_sample(whole, config)
        truth_path(whole).unlink()
        for r, info in enumerate(job["ranks"]):
            target = rank_path(folder, r)
            part = Path(scratch) / target.name
            part.write_bytes(whole.read_bytes())
            _keep_rank(part, info["global_pid"], info["pid"], info["device"])
            if r == straggler_rank and kind == "compute":
                firsts = [p["start_ns"] for c in job["collectives"] if c["bucket"] == 0
                          for p in c["per_device"] if p["device"] == info["device"]]
                added = _compute_instead(part, firsts, delay_ns)
            part.replace(target)
    truth = {"generator": GENERATOR, "truth_version": TRUTH_VERSION,
             "ranks": [{"rank": r, "path": str(rank_path(folder, r)), "device": info["device"], "pid": info["pid"]}
                       for r, info in enumerate(job["ranks"])],
             "straggler": _straggler(job, straggler_rank, kind, added), "collectives": job["collectives"],
             "iterations": job["iterations"], "job": job}
    (folder / TRUTH_NAME).write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


# --- CLI: `stallhound synth FOLDER --ranks N` (synth's own options --iterations, --seed, --force apply) -------------
def run_cli(args: argparse.Namespace) -> int:
    try:
        truth = write_rank_set(args.out, ranks=args.ranks, iterations=args.iterations or 12,
                               straggler_rank=args.straggler_rank, delay_ns=args.straggler_delay_ns,
                               kind=args.straggler_kind, seed=args.seed or 0, force=args.force)
    except (ValueError, OSError) as exc:
        print(f"stallhound synth: {exc}", file=sys.stderr)
        return 2
    late = truth["straggler"]
    print(f"wrote {len(truth['ranks'])} rank exports to {args.out} ("
          + (f"rank {late['rank']} late by {late['lateness_ns']:,} ns, {late['kind']}" if late else "balanced")
          + f") and {TRUTH_NAME}")
    return 0
