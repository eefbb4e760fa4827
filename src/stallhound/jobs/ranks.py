"""How each file of a job becomes one rank or several: what a built model says about its rank, and the assignment.

A file's rank comes from, in this order: the model's meta.rank (torch.profiler's distributedInfo), NCCL metadata
(kernels.nccl_rank in the world group), the file
name (rank_3, _r3, .3., rank3), else its position in the order given. A file whose GPU work comes from several
processes is a rank per process (by NCCL rank when each has one, else by pid), and one process driving several
devices a rank per device; such a file's ranks follow the ranks of the files before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import duckdb

from stallhound.jobs.files import rank_in_name
from stallhound.model.errors import RanksInvalid

RankSource = Literal["distributedInfo", "nccl", "file name", "process", "device", "order"]
UnitKind = Literal["process", "device"]
# torch.distributed's name for the default (world) group: a rank in it is the global rank, while a rank in a
# subgroup (tensor or pipeline parallel) is not.
WORLD_GROUP = "0"
GPU_WORK_SQL = """SELECT pid, device_id FROM kernels UNION SELECT pid, device_id FROM memcpy
    UNION SELECT pid, device_id FROM memset"""


@dataclass(frozen=True)
class Unit:
    """The part of a model that is one rank: all of it (kind None), or one process's or one device's rows."""

    kind: UnitKind | None = None
    value: int | None = None
    nccl_rank: int | None = None


@dataclass(frozen=True)
class Probe:
    """What a built model says about its rank; made where the model was built (a pool or Dask worker)."""

    path: Path
    fingerprint: str
    model_path: Path
    distributed_rank: int | None
    nccl_rank: int | None
    units: tuple[Unit, ...]
    build_s: float


@dataclass(frozen=True)
class RankSpec:
    rank: int
    rank_source: RankSource
    path: Path
    fingerprint: str
    model_path: Path
    unit: Unit


DISTRIBUTED_RANK_SQL = "SELECT rank FROM meta WHERE rank IS NOT NULL"
# pid -> its one rank in the world group, for processes whose NCCL kernels name exactly one
NCCL_RANKS_SQL = """SELECT pid, min(nccl_rank) FROM kernels WHERE nccl_rank IS NOT NULL AND nccl_group = $world
    GROUP BY pid HAVING count(DISTINCT nccl_rank) = 1"""


def _distributed_rank(con: duckdb.DuckDBPyConnection) -> int | None:
    row = con.execute(DISTRIBUTED_RANK_SQL).fetchone()
    return int(row[0]) if row else None


def _nccl_ranks(con: duckdb.DuckDBPyConnection) -> dict[int, int]:
    return {int(pid): int(rank) for pid, rank in con.execute(NCCL_RANKS_SQL, {"world": WORLD_GROUP}).fetchall()}


def probe(con: duckdb.DuckDBPyConnection, path: Path, fingerprint: str, model_path: Path, build_s: float) -> Probe:
    work = con.execute(f"SELECT pid, device_id FROM ({GPU_WORK_SQL}) ORDER BY 1, 2").fetchall()
    pids = sorted({pid for pid, _ in work if pid is not None})
    devices = sorted({device for _, device in work if device is not None})
    nccl = _nccl_ranks(con)
    units: tuple[Unit, ...] = (Unit(),)
    if len(pids) > 1:
        units = tuple(Unit("process", pid, nccl.get(pid)) for pid in pids)
    elif len(devices) > 1:
        units = tuple(Unit("device", device) for device in devices)
    nccl_rank = nccl[pids[0]] if len(pids) == 1 and pids[0] in nccl else None
    return Probe(path, fingerprint, model_path, _distributed_rank(con), nccl_rank, units, build_s)


def _file_rank(p: Probe) -> tuple[int, RankSource] | None:
    found: tuple[tuple[int | None, RankSource], ...] = (
        (p.distributed_rank, "distributedInfo"), (p.nccl_rank, "nccl"), (rank_in_name(p.path), "file name"))
    for rank, source in found:
        if rank is not None:
            return rank, source
    return None


def _spec(p: Probe, rank: int, source: RankSource, unit: Unit) -> RankSpec:
    return RankSpec(rank, source, p.path, p.fingerprint, p.model_path, unit)


def assign(probes: list[Probe]) -> list[RankSpec]:
    """Ranks for the files in the order given (see the module's rules), sorted by rank; RanksInvalid when two
    claim one rank or some between 0 and the highest are missing."""
    specs: list[RankSpec] = []
    position = 0  # ranks before this file, counting a file of several processes or devices as that many
    for p in probes:
        if len(p.units) > 1:
            by_nccl = all(u.nccl_rank is not None for u in p.units)
            for i, unit in enumerate(p.units):
                if by_nccl and unit.nccl_rank is not None:  # by_nccl: every unit has one
                    specs.append(_spec(p, unit.nccl_rank, "nccl", unit))
                else:
                    assert unit.kind is not None  # a file's several units are its processes or its devices
                    specs.append(_spec(p, position + i, unit.kind, unit))
        else:
            found = _file_rank(p)
            specs.append(_spec(p, *(found or (position, "order")), p.units[0]))
        position += len(p.units)
    _check(specs)
    return sorted(specs, key=lambda s: s.rank)


def _check(specs: list[RankSpec]) -> None:
    claims: dict[int, list[RankSpec]] = {}
    for spec in specs:
        claims.setdefault(spec.rank, []).append(spec)
    clashes = {rank: found for rank, found in sorted(claims.items()) if len(found) > 1}
    if clashes:
        said = "; ".join(f"rank {rank} by " + ", ".join(f"{s.path.name} ({_how(s)})" for s in found)
                         for rank, found in clashes.items())
        raise RanksInvalid(f"two parts of the job claim one rank ({said}); pass each rank's profile once, or rename "
                           "the files rank_<N> and pass them in rank order")
    missing = sorted(set(range(max(claims) + 1)) - set(claims))
    if missing:
        given = ", ".join(f"{s.rank} ({_how(s)})" for s in sorted(specs, key=lambda s: s.rank))
        raise RanksInvalid(f"ranks {_listed(missing)} are missing from the job (found {given}); add their profiles: a "
                           "job's ranks run from 0 without gaps")


def _how(spec: RankSpec) -> str:
    unit = f" {spec.unit.kind} {spec.unit.value}" if spec.unit.kind else ""
    return f"{spec.rank_source}{unit}"


def _listed(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:10]))
    return shown + (f" and {len(ranks) - 10} more" if len(ranks) > 10 else "")
