"""The words and tags of the idle findings about blocking calls (idle_causes' synchronization and read claims): the
API that holds most of their time, how the calls left the device idle, and the tags the book's fixes follow."""
from __future__ import annotations

from stallhound.analysis import rules
from stallhound.analysis.attribution import DeviceIdle
from stallhound.analysis.common import ms


def sync_tags(d: DeviceIdle, _: object) -> list[str]:
    if d.ns("sync_copy") > d.ns("sync"):
        return ["sync-copy"]
    scope = rules.sync_scope(d.causes["sync"].api) if "sync" in d.causes else "other"
    return [] if scope == "other" else [f"{scope}-sync"]


def api(d: DeviceIdle, cause: str) -> str:
    return (d.causes[cause].api if cause in d.causes else None) or "blocking"


def drained(d: DeviceIdle, cause: str) -> str:
    """How the blocking calls of a cause left the device idle: they drained its queue, or (held gaps, attribution) they
    waited for work it had queued but did not run, held by a wait the trace does not show."""
    held = d.causes[cause].held_ns if cause in d.causes else 0
    if not held:
        return "that drained its queue"
    return (f"that drained its queue or waited for work it held ({ms(held)} of it while the device waited on work "
            "the trace does not show, such as an event of another stream, another process or rank, and the calls "
            "waited for it)")


def held_tags(d: DeviceIdle, _: object) -> list[str]:  # book: reads that mostly waited for work held elsewhere
    return ["held"] if 2 * d.causes["readback"].held_ns >= d.ns("readback") > 0 else []
