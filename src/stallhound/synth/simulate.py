"""Runs every rank's program in lockstep: a collective ends when the last rank has arrived."""

from __future__ import annotations

import random
from collections.abc import Generator

from . import timing
from .config import SynthConfig
from .kernels import KERNELS, NCCL_KERNEL
from .rank import Arrival, Rank
from .schema import Trace


def _advance(program: Generator[Arrival, int, None], value: int | None) -> Arrival | None:
    try:
        return program.send(value)  # type: ignore[arg-type]  # send(None) starts the generator
    except StopIteration:
        return None


def _lockstep(arrivals: list[Arrival | None]) -> list[Arrival]:
    """The ranks' arrivals at one collective; RuntimeError unless every rank arrived at the same one."""
    first = arrivals[0]
    arrived = [a for a in arrivals if a is not None and first is not None
               and (a.iteration, a.bucket) == (first.iteration, first.bucket)]
    if len(arrived) < len(arrivals):
        raise RuntimeError("ranks left lockstep at a collective")
    return arrived


def simulate(cfg: SynthConfig) -> tuple[Trace, list[Rank], list[dict], int]:
    """Run every rank's program in lockstep: each collective ends when its last rank has arrived."""
    trace = Trace()
    rng = random.Random(f"{cfg.seed}:world")
    launcher_pid = rng.randint(*timing.LAUNCHER_PID_RANGE)
    ranks = [Rank(cfg, trace, d, launcher_pid + timing.RANK_PID_STRIDE * (d + 1),
                   timing.RANKS_START_NS + rng.randint(0, timing.RANK_START_SPREAD_NS)) for d in range(cfg.devices)]
    programs = [rank.program() for rank in ranks]
    collectives: list[dict] = []
    arrivals = [_advance(p, None) for p in programs]
    while any(a is not None for a in arrivals):
        arrived = _lockstep(arrivals)
        first = arrived[0]
        finish = max(a.start_ns for a in arrived) + timing.NCCL_BUCKET_NS[first.bucket]
        ends = [finish + rng.randint(0, timing.NCCL_END_JITTER_NS) for _ in ranks]
        collectives.append({
            "iteration": first.iteration, "bucket": first.bucket, "name": KERNELS[NCCL_KERNEL].short,
            "per_device": [{"device": r.device, "start_ns": a.start_ns, "end_ns": e}
                           for r, a, e in zip(ranks, arrived, ends, strict=True)]})
        arrivals = [_advance(p, e) for p, e in zip(programs, ends, strict=True)]
    return trace, ranks, collectives, launcher_pid


