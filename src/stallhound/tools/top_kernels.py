"""Which kernels take the most GPU time, what kind are they, and do the GEMMs use the tensor cores?

Counts every kernel on the chosen devices whose start lies in the window (a kernel counts in full).
Rows group them by demangled name (group_by='name', as `nsys stats`: each template instantiation is
its own kernel) or by short name (group_by='short_name'), across devices or per device (per_device).
Per row: total_ns = sum of durations (overlapping kernels count in full); kernel_time_pct = total_ns /
kernel time of the devices the row covers (all devices in scope, or its device when per_device);
window_pct = total_ns / (window length x those devices); count, mean/median/min/max/std of durations.
name = the demangled name (cut; with short_name grouping, the variant with the most time), variants =
distinct demangled names in the row, display_name = short name plus the template arguments that set
the name apart from the other demangled names with the same short name in the profile (see
kernel_kinds.display_names), kind = kernel_kinds.kind_of of name. hotspots = rows (same grouping)
above HOTSPOT_PCT of their kernel time (with two names or more), or above hotspots.DOMINANT_WINDOW_PCT of the window
(a single kernel running most of it), NCCL excluded, whatever `limit`. launch_fill: the launch configurations
(analysis/launch_fill.py) of the hotspots' kernels and of every kernel launched with fewer blocks than its device has
SMs long enough to leave SM time idle; findings from them (analysis/hotspots.py).

gemms, per device with kernels in the window: kernel_time_ns (all its kernels), gemm_fp32_ns /
gemm_tensor_ns / gemm_other_ns = time of kernels of kind 'gemm-fp32' / 'gemm-tensor' / 'gemm', and
gemm_fp32_pct = gemm_fp32_ns / kernel_time_ns. tf32_tensor_cores says whether the device has TF32
tensor cores (compute capability >= 8.0): decided by gpus.compute_capability when the export records
it (basis 'compute_capability'), else by kernel names built for sm80+ on that device in the window
(basis 'kernel_names', min_arch_from_names), else null (basis 'unknown'); on AMD null (basis 'amd': the gfx
version is no compute capability). fp16_tensor_cores likewise from 7.0; on 7.x, FP16 only, conv_fp32_ns (cuDNN
convolutions whose names mark FP32 math) joins the FP32 GEMMs as the work FP16 mixed precision moves. Durations in ns.
Unfused attention (softmax launches between two GEMMs, no fused attention kernel): analysis/attention.py.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Literal

import duckdb
from pydantic import BaseModel, Field, PrivateAttr

from stallhound.analysis import attention, hotspots, launch_fill, quantiles, vendor
from stallhound.analysis.common import (
    DEFAULT_LIMIT,
    Finding,
    LimitParam,
    OffsetParam,
    Paged,
    Scope,
    ScopedParams,
    more_rows,
    ms,
    next_page,
    pct,
    resolve_scope,
    scope_args,
)
from stallhound.analysis.contracts import TriageRole
from stallhound.analysis.kernel_kinds import KINDS, NAME_CHARS, display_names, fp32_conv, kind_of, min_arch_of
from stallhound.analysis.launch_fill import KernelFill, capability_number
from stallhound.analysis.rules import HOTSPOT_PCT
from stallhound.analysis.vendor import AMD, NVIDIA, Vendor
from stallhound.model.duck import one_row
from stallhound.model.sql_files import sql_beside

TRIAGE = TriageRole("window", order=4)
MIN_NAMES_FOR_HOTSPOT = 2  # with a single kernel name its 100% share says nothing
DOMINANT_PCT = 50.0  # an FP32 GEMM share above this is most of the device's work: severity high
FP32_GEMM_MIN_PCT = 10.0  # book fp32-gemm-no-tensor-cores: FP32 GEMMs above ~10% of kernel time are worth moving
TF32_MIN_ARCH = 80  # TF32 (and bf16) tensor cores arrived with compute capability 8.0 (Ampere)
FP16_MIN_ARCH = 70  # FP16 tensor cores arrived with 7.0 (Volta): on 7.x (V100, T4) mixed precision is FP16 only
# FP16 tensor cores (FP32 accumulation, as autocast and cuBLAS use) peak at ~8x the FP32 rate on 7.x (V100 125 vs
# 15.7 TFLOP/s, T4 65 vs 8.1): mixed precision saves at most 7/8 of the FP32 work it moves, an upper bound; GeForce
# RTX 20xx run that math at half rate, ~4x (2080 Ti 56.9 vs 14.2): at most 3/4 there
FP16_PEAK_SPEEDUP, GEFORCE_TURING_FP16_SPEEDUP = 8.0, 4.0
# TF32 tensor cores peak at ~8x (A100) / ~7x (H100) the FP32 FMA rate; real GEMMs reach less, so 2x is a floor.
TF32_MIN_SPEEDUP = 2.0
# The kinds that make up GEMM time, and the share of DeviceGemms each one feeds.
GEMM_KINDS = {"gemm-fp32": "fp32", "gemm-tensor": "tensor", "gemm": "other"}
Basis = Literal["compute_capability", "kernel_names", "unknown", "amd"]
TRAINING_SQL = sql_beside(__package__, "top_kernels_training.sql")  # whether the program trains, anywhere in the trace


class Params(ScopedParams):
    group_by: Annotated[Literal["name", "short_name"], Field(
        description="name: one row per demangled name, so each template instantiation is its own kernel "
                    "(as nsys stats); short_name: instantiations merged under their short name")] = "name"
    per_device: Annotated[bool, Field(description="One row per (kernel, device) instead of per kernel")] = False
    limit: LimitParam = DEFAULT_LIMIT
    offset: OffsetParam = 0


class KernelRow(BaseModel):
    display_name: str = Field(description="short name plus the template arguments that set it apart")
    name: str = Field(description=f"demangled name, cut at {NAME_CHARS} characters; with group_by=short_name "
                                  "the variant with the most time")
    short_name: str
    kind: str = Field(description=f"from the names: {', '.join(KINDS)}")
    variants: int = Field(description="distinct demangled names in this row")
    device: int | None = Field(description="device, when per_device; else null (all devices in scope)")
    count: int
    total_ns: int
    mean_ns: float
    median_ns: float
    min_ns: int
    max_ns: int
    std_ns: float
    kernel_time_pct: float = Field(description="share of the kernel time of the devices the row covers")
    window_pct: float


class DeviceGemms(BaseModel):
    device: int
    kernel_time_ns: int
    gemm_fp32_ns: int = Field(description="FP32 FMA (SIMT) GEMMs: no tensor cores")
    gemm_fp32_count: int
    gemm_fp32_pct: float = Field(description="gemm_fp32_ns / kernel_time_ns")
    gemm_tensor_ns: int = Field(description="tensor-core GEMMs")
    gemm_other_ns: int = Field(description="GEMMs whose precision the name does not tell")
    conv_fp32_ns: int = Field(description="convolutions whose names mark FP32 math (cuDNN scudnn, <float> engines)")
    top_fp32_gemm: str | None = Field(description="display name of the FP32 GEMM with the most time")
    compute_capability: str | None
    min_arch_from_names: int | None = Field(description="highest sm architecture named by its kernels (80 = sm80)")
    tf32_tensor_cores: bool | None = Field(description="null when the profile cannot tell (and on AMD, whose gfx "
                                                       "version is no compute capability)")
    fp16_tensor_cores: bool | None = Field(description="FP16 tensor cores (compute capability 7.0+); null "
                                                             "when the profile cannot tell")
    basis: Basis = Field(description="what decided tf32_tensor_cores and fp16_tensor_cores")
    fp16_peak_speedup: float = Field(FP16_PEAK_SPEEDUP, description="FP16 tensor-core peak / FP32 rate on the GPU")


class Result(Paged):
    scope: Scope
    group_by: str
    kernel_count: int = Field(description="kernels in scope")
    kernel_time_ns: int = Field(description="sum of their durations")
    distinct_names: int = Field(description="groups (demangled or short names) in scope")
    rows: list[KernelRow]
    truncated: bool
    total_rows: int = Field(description="rows before the limit")
    hotspots: list[KernelRow] = Field(description=f"rows above {HOTSPOT_PCT:.0f}% of kernel time, NCCL excluded")
    gemms: list[DeviceGemms] = Field(description="GEMM time by precision, per device with kernels")
    launch_fill: list[KernelFill] = Field(description="per device, the launch configurations of the hotspots' kernels "
                                                      "and of kernels whose launches on fewer blocks than SMs leave "
                                                      "SM time worth reporting idle")
    notes: list[str] = []
    findings: list[Finding] = []
    _command: str | None = PrivateAttr(None)  # the profiled command line, for the kernel profiler's command
    _vendor: Vendor = PrivateAttr(NVIDIA)  # whose GPU: which kernel profiler, what its units are called
    _training: bool = PrivateAttr(False)  # whether the trace shows the program training (TRAINING_SQL)
    _attention: list[attention.DeviceAttention] = PrivateAttr(default_factory=list)  # softmaxes between GEMMs


# Every (device, demangled name, short name) of the profile with its kernels in scope (n, t); names with
# none in scope stay (n = 0): display names are set apart among all names of the profile, so a kernel
# keeps its label whatever the window or device.
NAMES_SQL = """
SELECT device_id, coalesce(name, short_name, '(unnamed)'), coalesce(short_name, name, '(unnamed)'),
       count(*) FILTER (WHERE in_scope), coalesce(sum(duration_ns) FILTER (WHERE in_scope), 0)
FROM (SELECT *, list_contains($devices, device_id) AND start_ns >= $start AND start_ns < $end AS in_scope
      FROM kernels)
GROUP BY ALL ORDER BY 1, 5 DESC, 2
"""

# Shares are taken within the device partition (one partition, NULL, when not per_device). Returns the
# rows $offset + 1 .. $offset + $limit + 1 and every hotspot row, whatever its rank.
ROWS_SQL = """
WITH durations AS NOT MATERIALIZED (
  SELECT CASE WHEN $by = 'name' THEN coalesce(name, short_name, '(unnamed)')
              ELSE coalesce(short_name, name, '(unnamed)') END AS key,
         CASE WHEN $per_device THEN device_id END AS device, duration_ns AS v
  FROM kernels WHERE device_id IN (SELECT unnest($devices)) AND start_ns >= $start AND start_ns < $end),
g AS (
  SELECT key, device, count(*) AS n, sum(v) AS total, avg(v) AS mean, min(v) AS lo, max(v) AS hi,
         coalesce(stddev_pop(v), 0) AS sd
  FROM durations GROUP BY ALL),
""" + quantiles.medians("med", "durations", ("key", "device")) + """,
s AS (
  SELECT *, sum(total) OVER (PARTITION BY device) AS scope_total, count(*) OVER () AS total_rows,
         row_number() OVER (ORDER BY total DESC, key, device) AS rn,
         (total * 100.0 > $hot_pct * sum(total) OVER (PARTITION BY device)
           AND count(*) OVER (PARTITION BY device) >= $min_names) OR total * 100.0 >= $dominant_pct * $capacity AS hot
  FROM g)
SELECT s.key, s.device, n, total, mean, m.median, lo, hi, sd, scope_total, total_rows, rn, hot
FROM s LEFT JOIN med m ON m.key = s.key AND m.device IS NOT DISTINCT FROM s.device
WHERE (rn > $offset AND rn <= $offset + $limit + 1) OR hot ORDER BY rn
"""

CAPABILITY_SQL = "SELECT device_id, compute_capability, name FROM gpus WHERE device_id IN (SELECT unnest($devices))"


class _Names:
    """The NAMES_SQL rows (device, name, short name, kernels in scope, their time), indexed."""

    def __init__(self, rows: list[tuple[int, str, str, int, int]]) -> None:
        self.rows = rows
        self.short_of: dict[str, str] = {}
        self.variants_of: dict[str, set[str]] = defaultdict(set)
        self._labels: dict[str, dict[str, str]] = {}
        for _, name, short, _, _ in rows:
            self.short_of[name] = short
            self.variants_of[short].add(name)

    def display(self, name: str) -> str:
        short = self.short_of[name]
        if short not in self._labels:
            self._labels[short] = display_names(short, self.variants_of[short])
        return self._labels[short][name]

    def time_by_name(self, params: Params) -> dict[tuple[str, int | None], dict[str, int]]:
        """(row key, device or None) -> {demangled name: kernel time in scope}."""
        out: dict[tuple[str, int | None], dict[str, int]] = defaultdict(dict)
        for device, name, short, n, t in self.rows:
            if n:
                times = out[(name if params.group_by == "name" else short, device if params.per_device else None)]
                times[name] = times.get(name, 0) + t
        return out


def _rows(fetched: list[tuple], names: _Names, params: Params, scope: Scope) -> list[KernelRow]:
    by_name = names.time_by_name(params)
    capacity = scope.duration_ns * (1 if params.per_device else len(scope.devices))
    out = []
    for key, device, n, total, mean, med, lo, hi, sd, scope_total, *_ in fetched:
        times = by_name[(key, device)]
        name = max(times, key=lambda v: (times[v], v))  # with short_name grouping, the variant with most time
        short = names.short_of[name]
        out.append(KernelRow(
            display_name=short if params.group_by == "short_name" else names.display(name), name=name[:NAME_CHARS],
            short_name=short, kind=kind_of(name, short), variants=len(times), device=device, count=n,
            total_ns=int(total), mean_ns=round(mean, 1), median_ns=float(med), min_ns=lo, max_ns=hi,
            std_ns=round(sd, 1), kernel_time_pct=pct(total, scope_total), window_pct=pct(total, capacity)))
    return out


def _tensor_cores(capability: str | None, min_arch: int | None, vendor_: Vendor
                  ) -> tuple[bool | None, bool | None, Basis]:
    """(TF32 tensor cores, FP16 tensor cores, what decided them)."""
    known = capability_number(capability)
    if vendor_ == AMD:
        return None, None, "amd"  # its compute capability is the gfx version (vendor.py): NVIDIA's cores not read
    if known is not None:
        return known >= TF32_MIN_ARCH, known >= FP16_MIN_ARCH, "compute_capability"
    if min_arch is not None and min_arch >= TF32_MIN_ARCH:
        return True, True, "kernel_names"
    return None, None, "unknown"  # older architecture names run on newer GPUs too: no upper bound


def fp16_speedup(capability: str | None, name: str | None) -> float:
    """FP16 tensor-core peak over the FP32 rate, with FP32 accumulation: GeForce Turing runs it at half rate."""
    geforce_turing = capability_number(capability) == 75 and "geforce" in (name or "").lower()
    return GEFORCE_TURING_FP16_SPEEDUP if geforce_turing else FP16_PEAK_SPEEDUP


def _gemms(con: duckdb.DuckDBPyConnection, names: _Names, scope: Scope, vendor_: Vendor) -> list[DeviceGemms]:
    gpus = {d: (cc, name) for d, cc, name in con.execute(CAPABILITY_SQL, {"devices": scope.devices}).fetchall()}
    per_device: dict[int, list[tuple[str, str, int, int, str]]] = defaultdict(list)
    for device, name, short, n, t in names.rows:  # per device, most time first
        if n:
            per_device[device].append((name, short, n, t, kind_of(name, short)))
    out = []
    for device, rows in sorted(per_device.items()):
        by = {share: sum(r[3] for r in rows if GEMM_KINDS.get(r[4]) == share) for share in GEMM_KINDS.values()}
        fp32 = [r for r in rows if r[4] == "gemm-fp32"]
        kernel_ns = sum(r[3] for r in rows)
        min_arch = max((a for a in (min_arch_of(r[0]) for r in rows) if a is not None), default=None)
        tf32, fp16, basis = _tensor_cores(gpus.get(device, (None,))[0], min_arch, vendor_)
        out.append(DeviceGemms(
            device=device, kernel_time_ns=kernel_ns, gemm_fp32_ns=by["fp32"], gemm_fp32_count=sum(r[2] for r in fp32),
            gemm_fp32_pct=pct(by["fp32"], kernel_ns), gemm_tensor_ns=by["tensor"], gemm_other_ns=by["other"],
            conv_fp32_ns=sum(r[3] for r in rows if r[4] == "conv" and fp32_conv(r[0], r[1])),
            top_fp32_gemm=names.display(fp32[0][0]) if fp32 else None, compute_capability=gpus.get(device, (None,))[0],
            min_arch_from_names=min_arch, tf32_tensor_cores=tf32, fp16_tensor_cores=fp16, basis=basis,
            fp16_peak_speedup=fp16_speedup(*gpus.get(device, (None, None)))))
    return out


def _notes(gemms: list[DeviceGemms]) -> list[str]:
    """What the FP32 GEMM check could not decide."""
    notes = []
    for g in gemms:
        if g.gemm_fp32_pct < FP32_GEMM_MIN_PCT or g.fp16_tensor_cores or g.basis == "amd":
            continue
        if g.tf32_tensor_cores is None:
            notes.append(f"device {g.device}: FP32 GEMMs take {g.gemm_fp32_pct:.1f}% of kernel time, but the export "
                         "records no compute capability and no kernel name shows sm80 or newer, so whether it has "
                         "TF32 tensor cores cannot be told")
        else:
            notes.append(f"device {g.device}: FP32 GEMMs take {g.gemm_fp32_pct:.1f}% of kernel time on compute "
                         f"capability {g.compute_capability}, which has no tensor cores")
    return notes


def run(con: duckdb.DuckDBPyConnection, params: Params) -> Result:
    scope = resolve_scope(con, params)
    names = _Names(con.execute(NAMES_SQL, scope_args(scope)).fetchall())
    capacity = scope.duration_ns * (1 if params.per_device else len(scope.devices))
    fetched = con.execute(ROWS_SQL, {**scope_args(scope), "by": params.group_by, "per_device": params.per_device,
                                     "hot_pct": HOTSPOT_PCT, "min_names": MIN_NAMES_FOR_HOTSPOT,
                                     "dominant_pct": hotspots.DOMINANT_WINDOW_PCT, "capacity": capacity,
                                     "limit": params.limit, "offset": params.offset}).fetchall()
    total_rows = fetched[0][10] if fetched else 0
    shown = [r for r in fetched if params.offset < r[11] <= params.offset + params.limit]
    more = total_rows > params.offset + params.limit
    hot = [r for r in fetched if r[12]]
    rows = _rows(shown + hot, names, params, scope)
    in_scope = [r for r in names.rows if r[3]]
    vendor_ = vendor.of(con)
    gemms = _gemms(con, names, scope, vendor_)
    hot_rows = [r for r in rows[len(shown):] if r.kind != "nccl"]
    hot_names = {r.name for r in hot_rows if r.display_name != r.short_name} | {
        r.short_name for r in hot_rows if r.display_name == r.short_name}
    fills = launch_fill.numbered(con, hotspots.read(launch_fill.fills(con, scope), hot_names, scope.duration_ns))
    result = Result(scope=scope, group_by=params.group_by, kernel_count=sum(r[3] for r in in_scope),
                    kernel_time_ns=sum(r[4] for r in in_scope),
                    distinct_names=len({r[1] if params.group_by == "name" else r[2] for r in in_scope}),
                    rows=rows[:len(shown)], truncated=more, total_rows=total_rows, offset=params.offset,
                    next_offset=next_page(params.offset, len(shown), more), hotspots=hot_rows, gemms=gemms,
                    launch_fill=fills, notes=_notes(gemms))
    result._command = one_row(con.execute("SELECT command_line FROM meta"))[0]
    result._vendor = vendor_
    result._training = bool(one_row(con.execute(TRAINING_SQL))[0])
    result._attention = attention.read(con, scope)
    return result


def _hot(row: KernelRow, scope: Scope) -> hotspots.Hot:
    device = row.device if row.device is not None else scope.devices[0] if len(scope.devices) == 1 else None
    return hotspots.Hot(display_name=row.display_name, name=row.name, short_name=row.short_name, kind=row.kind,
                        kernel_time_pct=row.kernel_time_pct, window_pct=row.window_pct, total_ns=row.total_ns,
                        count=row.count, device=device, by_short_name=row.display_name == row.short_name)


def _basis(g: DeviceGemms) -> str:
    return {"compute_capability": f"compute capability {g.compute_capability}",
            "kernel_names": f"kernels built for sm{g.min_arch_from_names}",
            "unknown": "no compute capability recorded, no sm80+ kernel names",
            "amd": "an AMD GPU: its gfx version is no compute capability"}[g.basis]


def _fp32_gemm(g: DeviceGemms, scope: Scope) -> Finding:
    proof = ({"compute_capability": g.compute_capability} if g.basis == "compute_capability"
             else {"min_arch_from_names": g.min_arch_from_names})
    return Finding(
        root_cause="fp32-gemm-no-tensor-cores", severity="high" if g.gemm_fp32_pct >= DOMINANT_PCT else "medium",
        title=f"device {g.device}: FP32 GEMMs without tensor cores take {g.gemm_fp32_pct:.1f}% of kernel time "
              f"({g.top_fp32_gemm}) on a GPU with TF32 tensor cores ({_basis(g)})",
        evidence={"gemm_fp32_ns": g.gemm_fp32_ns, "gemm_fp32_pct": g.gemm_fp32_pct,
                  "gemm_fp32_count": g.gemm_fp32_count, "kernel_time_ns": g.kernel_time_ns,
                  "gemm_tensor_ns": g.gemm_tensor_ns, "tensor_core_basis": g.basis, **proof,
                  "tf32_min_speedup": TF32_MIN_SPEEDUP},
        time_at_stake_ns=min(round(g.gemm_fp32_ns * (1 - 1 / TF32_MIN_SPEEDUP)), scope.duration_ns),
        device=g.device, tags=["gemm-fp32"])


def _fp16_ns(g: DeviceGemms) -> int:
    """On a GPU whose tensor cores run FP16 only (7.x), the FP32 work mixed precision moves there: GEMMs and convs."""
    return g.gemm_fp32_ns + g.conv_fp32_ns if g.fp16_tensor_cores and not g.tf32_tensor_cores else 0


def _fp16_amp(g: DeviceGemms, scope: Scope) -> Finding:
    ns = _fp16_ns(g)
    share, stake = pct(ns, g.kernel_time_ns), min(round(ns * (1 - 1 / g.fp16_peak_speedup)), scope.duration_ns)
    parts = [f"GEMMs {ms(g.gemm_fp32_ns)} ({g.top_fp32_gemm})"] * bool(g.gemm_fp32_ns) + [
        f"convolutions {ms(g.conv_fp32_ns)}"] * bool(g.conv_fp32_ns)
    return Finding(
        root_cause="fp32-gemm-no-tensor-cores", severity="high" if share >= DOMINANT_PCT else "medium",
        title=f"device {g.device}: FP32 {' and '.join(parts)} take {share:.1f}% of kernel time on compute capability "
              f"{g.compute_capability}, whose tensor cores run FP16 (no TF32, no bf16): FP16 mixed precision would "
              f"move them there, saving at most {ms(stake)} (their time at the tensor cores' peak "
              f"{g.fp16_peak_speedup:.0f}x rate; casts and memory-bound layers save less)",
        evidence={"gemm_fp32_ns": g.gemm_fp32_ns, "conv_fp32_ns": g.conv_fp32_ns, "fp32_pct": share,
                  "kernel_time_ns": g.kernel_time_ns, "gemm_tensor_ns": g.gemm_tensor_ns,
                  "compute_capability": g.compute_capability, "fp16_peak_speedup": g.fp16_peak_speedup},
        time_at_stake_ns=stake, device=g.device, tags=["fp16-tensor-cores"])


def findings(result: Result) -> list[Finding]:
    fp32 = [_fp32_gemm(g, result.scope) for g in result.gemms
            if g.tf32_tensor_cores and g.gemm_fp32_pct >= FP32_GEMM_MIN_PCT]
    fp32 += [_fp16_amp(g, result.scope) for g in result.gemms
             if pct(_fp16_ns(g), g.kernel_time_ns) >= FP32_GEMM_MIN_PCT]
    hot = [_hot(row, result.scope) for row in result.hotspots]
    return fp32 + attention.findings(result._attention, result.scope.duration_ns) + hotspots.findings(
        hot, result.launch_fill, result.scope.duration_ns, result._command, result._vendor, result._training)


def render(result: Result) -> str:
    lines = [f"{result.kernel_count:,} kernels, {ms(result.kernel_time_ns)} kernel time, {result.distinct_names:,} "
             f"{'names' if result.group_by == 'name' else 'short names'} on device(s) {result.scope.devices}"]
    for r in result.rows:
        where = f" [dev {r.device}]" if r.device is not None else ""
        lines.append(f"{r.kernel_time_pct:6.2f}%  {ms(r.total_ns):>14}  x{r.count:<7,} mean {ms(r.mean_ns)}  "
                     f"{r.kind:<11}  {r.display_name[:100]}{where}")
    if result.truncated:
        lines.extend(more_rows(result, result.rows_after(result.total_rows), "names"))
    for g in result.gemms:
        if g.gemm_fp32_ns or g.gemm_tensor_ns or g.gemm_other_ns:
            cores = {True: "has", False: "has no", None: "may have"}[g.tf32_tensor_cores]
            lines.append(f"GEMMs on device {g.device}: FP32 {ms(g.gemm_fp32_ns)} ({g.gemm_fp32_pct:.1f}% of kernel "
                         f"time), tensor-core {ms(g.gemm_tensor_ns)}, unknown precision {ms(g.gemm_other_ns)}; "
                         f"the device {cores} TF32 tensor cores ({_basis(g)})"
                         + (f"; FP32 convolutions {ms(g.conv_fp32_ns)}" if g.conv_fp32_ns else ""))
    lines.extend(f"NOTE: {n}" for n in result.notes)
    return "\n".join(lines)
