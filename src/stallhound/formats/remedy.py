"""What to capture for data a profile lacks, worded by its format: the profile's own format when it can record
everything needed, else the first registered format that can (nsys records what torch.profiler cannot)."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from stallhound.formats import registry
from stallhound.formats.base import Format


def recorder(own: Format, needs: Sequence[str]) -> Format:
    """The format a capture of `needs` is worded for: `own` when it records them all, else the first in
    registry.FORMATS (read at each call) that does."""
    for fmt in (own, *registry.FORMATS):
        if all(need in fmt.options for need in needs):
            return fmt
    raise ValueError(f"no registered format records all of {list(needs)}")


def capture(own: Format, needs: Sequence[str], *, bare: bool = False) -> str:
    fmt = recorder(own, needs)
    return fmt.say([fmt.options[need] for need in needs], bare)


def remedy(con: duckdb.DuckDBPyConnection, needs: Sequence[str], *, bare: bool = False) -> str:
    """The capture that records `needs` (capabilities.data names, or derive.KERNELS_IN_GRAPHS) for the profile in
    `con`: a command such as `nsys profile --trace=cuda,nvtx`, or (bare) just its options, --trace=cuda,nvtx."""
    return capture(registry.format_of(con), needs, bare=bare)
