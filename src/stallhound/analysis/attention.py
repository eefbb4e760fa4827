"""Does attention run unfused: a softmax between two GEMMs on its stream, with no fused attention kernel on the device?

Per device, over the kernels in scope: each softmax launch (its name says softmax, not log-softmax, which ends a
classifier's loss) is unfused attention when, on its stream, the nearest kernel before it and the nearest after it
that is neither element-wise nor a copy is a GEMM (kernel_kinds.kind_of), with at most MAX_BETWEEN element-wise or
copy kernels between (the scaling, masking, dropout and contiguous copies of the eager path). unfused_ns = the time
of the kernels of those chains, GEMM to GEMM, each kernel once (two chains may share a GEMM). fused_count = kernels of
kind 'attention' (FlashAttention, fmha, efficient_attention, cuDNN SDPA) on the device in scope: where one runs, the
program already has a fused path and the softmaxes are left alone.

The finding (unfused-attention, per device) fires with no fused kernel on the device and unfused_ns at least
UNFUSED_MIN_PCT of its kernel time. Time at stake = unfused_ns (capped at the window): an upper bound, as the fused
kernel that replaces the chain still does the two matrix products; published gains are 2-4x on attention, so most
of it and never all of it is saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from stallhound.analysis import rules
from stallhound.analysis.common import Finding, Scope, counted, ms, pct, scope_args
from stallhound.analysis.kernel_kinds import kind_of
from stallhound.model.sql_files import sql_beside

MAX_BETWEEN = 3  # scale, mask add, dropout or a contiguous copy between a GEMM and the softmax; more is another op
UNFUSED_MIN_PCT = 10.0  # unfused attention below a tenth of kernel time is not where the program's time goes
GEMM_KINDS = {"gemm", "gemm-tensor", "gemm-fp32"}
BETWEEN_KINDS = {"elementwise", "copy"}
FUSED_GAIN = "2-4x"  # FlashAttention papers and PyTorch SDPA benchmarks: attention runs 2-4x faster fused

CHAINS_SQL = sql_beside(__package__, "attention.sql")
DEVICES_SQL = """
SELECT device_id, coalesce(name, short_name, ''), coalesce(short_name, name, ''), count(*), sum(duration_ns)
FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end GROUP BY ALL
"""


@dataclass(frozen=True)
class DeviceAttention:
    device: int
    kernel_time_ns: int  # all its kernels in scope
    softmax_count: int  # softmax launches (log-softmax left out)
    unfused_count: int  # of those, the ones between two GEMMs on their stream
    unfused_ns: int  # time of the kernels of those chains, GEMM to GEMM, each kernel once
    fused_count: int  # fused attention kernels on the device in scope
    softmax_name: str | None  # short name of the softmax with the most unfused chains


def _side(kinds: dict[int, str], step: int) -> int | None:
    """The offset from the softmax to the GEMM on that side (step -1: before, 1: after), through element-wise or copy
    kernels only; None when another kind, or none, comes first."""
    for at in range(step, step * (MAX_BETWEEN + 2), step):
        kind = kinds.get(at)
        if kind in GEMM_KINDS:
            return at
        if kind not in BETWEEN_KINDS:
            return None
    return None


@dataclass
class _Chains:
    """One device's softmax launches and the kernels of its unfused chains."""
    softmax_count: int = 0
    kernels: dict[tuple[int, int], int] = field(default_factory=dict)  # (stream, place on it) -> duration, each once
    softmaxes: list[str] = field(default_factory=list)  # short name of each chain's softmax


def _chains(rows: list[tuple]) -> dict[int, _Chains]:
    """device -> its chains, from CHAINS_SQL's rows (each softmax with its neighbours on its stream)."""
    around: dict[tuple[int, int, int], dict[int, tuple[str, int, str]]] = {}
    for device, stream, rn, at, name, short, duration in rows:
        around.setdefault((device, stream, rn), {})[at] = (short, duration, kind_of(name, short))
    out: dict[int, _Chains] = {}
    for (device, stream, rn), near in around.items():
        chains = out.setdefault(device, _Chains())
        chains.softmax_count += 1
        kinds = {at: kind for at, (_, _, kind) in near.items()}
        first, last = _side(kinds, -1), _side(kinds, 1)
        if first is None or last is None:
            continue
        chains.softmaxes.append(near[0][0])
        chains.kernels.update({(stream, rn + at): near[at][1] for at in range(first, last + 1)})
    return out


def _most(names: list[str]) -> str | None:
    return max(sorted(set(names)), key=names.count) if names else None


def read(con: duckdb.DuckDBPyConnection, scope: Scope) -> list[DeviceAttention]:
    """Per device with a softmax in scope, its unfused attention figures."""
    args = scope_args(scope)
    chains = _chains(con.execute(CHAINS_SQL, {**args, "reach": MAX_BETWEEN + 1}).fetchall())
    kernel_ns: dict[int, int] = {}
    fused: dict[int, int] = {}
    for device, name, short, n, t in con.execute(DEVICES_SQL, args).fetchall():
        kernel_ns[device] = kernel_ns.get(device, 0) + int(t)
        fused[device] = fused.get(device, 0) + (n if kind_of(name, short) == "attention" else 0)
    return [DeviceAttention(
        device=device, kernel_time_ns=kernel_ns[device], softmax_count=c.softmax_count, unfused_count=len(c.softmaxes),
        unfused_ns=sum(c.kernels.values()), fused_count=fused[device], softmax_name=_most(c.softmaxes))
        for device, c in sorted(chains.items())]


def _finding(a: DeviceAttention, window_ns: int) -> Finding:
    stake = min(a.unfused_ns, window_ns)
    share = pct(a.unfused_ns, a.kernel_time_ns)
    return Finding(
        root_cause="unfused-attention", severity=rules.severity(stake, window_ns),
        title=f"device {a.device}: unfused attention, {counted(a.unfused_count, 'softmax launch')} "
              f"({a.softmax_name}) between two GEMMs on their stream and no fused attention kernel on the device: "
              f"{ms(a.unfused_ns)} ({share:.1f}% of kernel time) in those GEMMs, softmaxes and the element-wise "
              f"kernels between; a fused kernel saves at most that (it still does both matrix products; reported "
              f"gains are {FUSED_GAIN} on attention)",
        evidence={"unfused_count": a.unfused_count, "softmax_count": a.softmax_count, "unfused_ns": a.unfused_ns,
                  "unfused_pct": share, "kernel_time_ns": a.kernel_time_ns, "fused_attention_count": a.fused_count,
                  "max_between": MAX_BETWEEN},
        time_at_stake_ns=stake, device=a.device)


def findings(devices: list[DeviceAttention], window_ns: int) -> list[Finding]:
    return [_finding(a, window_ns) for a in devices
            if not a.fused_count and pct(a.unfused_ns, a.kernel_time_ns) >= UNFUSED_MIN_PCT
            and rules.worth_reporting(min(a.unfused_ns, window_ns), window_ns)]
