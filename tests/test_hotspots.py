"""A kernel that takes much of the window: launch fill (analysis/launch_fill.py) and the findings of top_kernels
(analysis/hotspots.py): undersized grids with a time at stake that is an upper bound, runtime helper kernels named
as such, and an honest statement with the Nsight Compute command when a timeline cannot tell. Unit tests on tiny
models; real profiles of the corpus (skipped where it is not restored) against independent SQL on the raw export."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb
import pytest
from modeldb import make_model

from corpus import sources
from stallhound import book
from stallhound.analysis import hotspots, launch_fill, program, vendor
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.tools import top_kernels as tk
from stallhound.tools import triage

MS = 1_000_000
R = TypeVar("R")
H100 = {"device_id": 0, "sm_count": 114, "max_warps_per_sm": 64, "max_blocks_per_sm": 32,
        "max_registers_per_sm": 65536, "max_shared_per_sm_bytes": 233472, "compute_capability": "9.0"}
RTX3060 = {"device_id": 0, "sm_count": 28, "max_warps_per_sm": 48, "max_blocks_per_sm": 16,
           "max_registers_per_sm": 65536, "max_shared_per_sm_bytes": 102400, "compute_capability": "8.6"}


def launch(name: str, s: int, e: int, blocks: int, threads: int, registers: int = 32, pid: int = 1,
           category: str = "compute", corr: int | None = None) -> dict:
    return {"device_id": 0, "stream_id": 7, "pid": pid, "correlation_id": corr, "start_ns": s, "end_ns": e,
            "short_name": name, "name": name, "category": category, "grid_x": blocks, "grid_y": 1, "grid_z": 1,
            "block_x": threads, "block_y": 1, "block_z": 1, "registers_per_thread": registers,
            "static_shared_bytes": 0, "dynamic_shared_bytes": 0}


def run(con, **kw) -> tk.Result:
    return run_skill(con, tk, tk.Params(profile="t", **kw))


@pytest.mark.parametrize("threads, registers, shared, limits, expected", [
    (256, 192, 0, RTX3060, (1, "registers")),  # 192 x 32 = 6,144 registers a warp: 10 warps, one 8-warp block
    (32, 106, 0, H100, (18, "registers")),  # 106 -> 3,584 a warp (units of 256): 18 one-warp blocks
    (16, 16, 0, RTX3060, (16, "block slots")),  # half-warp blocks: 16 block slots, 16 of 48 warps
    (1024, 32, 0, H100, (2, "warps")),
    (128, 32, 50_000, H100, (4, "shared memory")),  # 50,000 + 1 KiB reserved per block on 9.0: 4 of 233,472 B
    (128, 32, 0, {}, (None, None)),  # no limit recorded
])
def test_launch_fill_resident_blocks_as_the_occupancy_calculator(threads, registers, shared, limits, expected):
    limits = {"max_warps": limits.get("max_warps_per_sm"), "max_blocks": limits.get("max_blocks_per_sm"),
              "max_registers": limits.get("max_registers_per_sm"), "max_shared": limits.get("max_shared_per_sm_bytes"),
              "capability": limits.get("compute_capability")}
    assert launch_fill.resident_blocks(threads, registers, shared, limits) == expected


def test_undersized_grid_is_an_upper_bound_on_idle_sms():
    """One 1-block launch of 100 ms on a 114-SM GPU leaves 113/114 of the SMs idle: at most 99.12 ms to save. A
    second configuration of 57 blocks for 10 ms adds half its time. Launches under 10 us are latency-bound and count
    nothing; a full-grid launch counts nothing."""
    kernels = [launch("mm", 0, 100 * MS, 1, 32), launch("mm", 100 * MS, 110 * MS, 57, 32),
               launch("mm", 110 * MS, 110 * MS + 9_000, 1, 32), launch("mm", 111 * MS, 121 * MS, 114, 32)]
    result = run(make_model(kernels=kernels, gpus=[H100]))
    [grid] = [f for f in result.findings if f.root_cause == "undersized-grid"]
    stake = round(100 * MS * 113 / 114) + 5 * MS
    assert (grid.time_at_stake_ns, grid.severity, grid.device) == (stake, "high", 0)
    assert grid.evidence | {"ncu": None} == {"kernel": "mm", "blocks": 1, "sm_count": 114, "launches": 2,
                                             "kernel_ns": 110 * MS, "threads_per_block": 32, "occupancy_pct": 50.0,
                                             "ncu": None}
    assert "1 of them gets work" in grid.title and "at most 104.123 ms (an upper bound)" in grid.title
    assert "--launch-skip 0 " in grid.evidence["ncu"]  # the 1-block configuration is the first launch of mm
    assert [f.root_cause for f in result.findings] == ["undersized-grid"]  # no second finding for the same kernel


@pytest.mark.parametrize("name, category, found", [
    ("mm", "compute", True), ("ncclDevKernel_AllReduce", "nccl", False),  # NCCL runs few blocks by design
    ("__pgi_uacc_cuda_fill_42_gpu", "compute", False),  # a runtime helper is not the program's grid to choose
])
def test_undersized_grid_only_for_the_programs_kernels(name, category, found):
    kernels = [launch(name, 0, 50 * MS, 1, 128, category=category), launch("other", 50 * MS, 100 * MS, 228, 128)]
    result = run(make_model(kernels=kernels, gpus=[H100]))
    assert any(f.root_cause == "undersized-grid" for f in result.findings) == found


def test_undersized_grid_counts_only_time_alone_on_the_device():
    """Three 1-block launches side by side on three streams, then the first runs 10 ms alone: while the others run
    they may use the idle SMs, so only the 10 ms alone count (x 113/114); the time alone never overlaps."""
    kernels = [{**launch(f"mm{s}", 0, 100 * MS, 1, 32), "stream_id": s} for s in (1, 2, 3)]
    kernels.append({**launch("mm1", 100 * MS, 110 * MS, 1, 32), "stream_id": 1})
    grids = [f for f in run(make_model(kernels=kernels, gpus=[H100])).findings if f.root_cause == "undersized-grid"]
    assert [(f.evidence["kernel"], f.time_at_stake_ns, f.evidence["kernel_ns"]) for f in grids] == [
        ("mm1", round(10 * MS * 113 / 114), 110 * MS)]


def test_undersized_grid_capped_at_the_window():
    """A 100 ms 1-block launch that starts in a 50 ms window counts in full (as top_kernels counts kernels), but
    at most the window can be saved."""
    con = make_model(kernels=[launch("mm", 0, 100 * MS, 1, 32), launch("x", 100 * MS, 101 * MS, 114, 32)],
                     gpus=[H100])
    [grid] = run(con, start_ns=0, end_ns=50 * MS).findings
    assert (grid.root_cause, grid.time_at_stake_ns) == ("undersized-grid", 50 * MS)


def migration(s: int, e: int, cause: str | None, device: int = 0, direction: str = "UVM_H2D") -> dict:
    return {"device_id": device, "stream_id": 1, "pid": 1, "start_ns": s, "end_ns": e, "bytes": 65536,
            "direction": direction, "src_kind": "unknown", "dst_kind": "unknown", "migration_cause": cause}


def test_undersized_grid_leaves_out_the_time_pages_migrate_on_demand():
    """A 100 ms 1-block kernel on 114 SMs while the driver migrates pages: a fault 10-20 ms and the speculation
    around it 15-30 ms (once: 20 ms), an eviction back to the host 60-65 ms, one of unknown cause 95-105 ms (5 ms in
    the kernel); a kernel of another stream 25-35 ms overlaps the first (the union counts once). The program's own
    prefetch 40-50 ms and a migration of device 1 leave the time in. Alone and not waiting: 100 - 25 - 5 - 5 = 65 ms;
    migrating 30 ms."""
    kernels = [launch("mm", 0, 100 * MS, 1, 32), {**launch("other", 25 * MS, 35 * MS, 114, 32), "stream_id": 2}]
    memcpy = [migration(10 * MS, 20 * MS, "page_fault"), migration(15 * MS, 30 * MS, "speculative_prefetch"),
              migration(40 * MS, 50 * MS, "user_prefetch"), migration(60 * MS, 65 * MS, "eviction", 0, "UVM_D2H"),
              migration(95 * MS, 105 * MS, None), migration(70 * MS, 80 * MS, "page_fault", device=1)]
    [grid] = [f for f in run(make_model(kernels=kernels, memcpy=memcpy, gpus=[H100])).findings
              if f.root_cause == "undersized-grid"]
    assert (grid.time_at_stake_ns, grid.evidence["kernel_ns"], grid.evidence["migrating_ns"]) == (
        round(65 * MS * 113 / 114), 100 * MS, 30 * MS)
    assert "for 30.000 ms of that time unified-memory pages migrate on demand" in grid.title


def test_undersized_grid_and_unified_memory_share_no_nanosecond():
    """The overlap rule: a 1-block kernel 0-100 ms faults its pages in, 10 migrations of 5 ms each (50 ms). The
    unified-memory finding claims the 50 ms; the undersized grid only the other 50 ms x 113/114: together they stay
    within the 100 ms window (before: 50 + 99.1 ms)."""
    memcpy = [migration(i * 10 * MS, i * 10 * MS + 5 * MS, "page_fault") for i in range(10)]
    con = make_model(kernels=[launch("mm", 0, 100 * MS, 1, 32)], memcpy=memcpy, gpus=[H100])
    result = triage.run(con, triage.Params(profile="t", limit=100))
    stakes = {f.root_cause: f.time_at_stake_ns for f in result.findings}
    assert result.window is not None and result.window.duration_ns == 100 * MS
    assert (stakes["unified-memory-migration"], stakes["undersized-grid"]) == (50 * MS, round(50 * MS * 113 / 114))
    assert sum(stakes.values()) <= result.window.duration_ns


HALF_LANES_TWO_WAVES = 1 - 0.5 * 4096 / (2 * 114 * 32)  # 4,096 16-thread blocks on an H100: half of each warp's
# lanes empty, and 32 blocks per SM x 114 SMs make 2 waves of 3,648 slots, 3,200 of the 7,296 slots empty


@pytest.mark.parametrize("name, threads, registers, share, severity, loss", [
    ("mine", 16, 32, 90, "high", HALF_LANES_TWO_WAVES),  # most of the window, its launch bounding 65 ms of it
    ("mine", 16, 32, 20, "high", HALF_LANES_TWO_WAVES),  # a fifth, its launch bounding 14 ms (over 10%) of it
    ("mine", 256, 32, 20, "info", 0),  # a fifth, full warps and occupancy: nothing in the trace says it is slow
    ("mine", 256, 255, 20, "medium", 0),  # a fifth at 12.5% occupancy in the program's own kernel: no bound
    ("ampere_fp16_s16816gemm_fp16_128x256_ldg8_f2f_stages_64x3_nn", 256, 234, 20, "info", 0),  # a tiled library GEMM:
    # few register-heavy warps by design
])
def test_hotspot_severity_from_the_window_and_the_evidence(name, threads, registers, share, severity, loss):
    """By the time at stake its launch shape bounds where it has one; else medium when the kernel runs most of the
    window or a tenth of it with under-use its launch shows, and never high; each gives the ncu command."""
    kernels = [launch(name, 0, share * MS, 4096, threads, registers=registers),  # over 30% of kernel time
               launch("x", 90 * MS, 95 * MS, 4096, 256), launch("y", 95 * MS, 100 * MS, 4096, 256)]
    findings = run(make_model(kernels=kernels, gpus=[H100])).findings
    [hot] = [f for f in findings if f.evidence["kernel"] == name]
    assert (hot.severity, hot.time_at_stake_ns) == (severity, pytest.approx(share * MS * loss, abs=1))
    assert "cannot be told without Nsight Compute" in hot.title and f"ncu --kernel-name {name} " in hot.title
    assert ("of each warp's lanes used" in hot.title) == (threads == 16)


def test_two_instantiations_of_one_kernel_are_one_undersized_grid_finding():
    """bn<float> 8 ms and bn<half> 4 ms on 57 of 114 SMs each (their demangled names differ, their short name is one):
    one finding, launches, time and idle SM time summed."""
    kernels = [{**launch("bn", i * 10 * MS, i * 10 * MS + 2 * MS, 57, 256), "name": "void bn<float>()"}
               for i in range(4)]
    kernels += [{**launch("bn", (5 + i) * 10 * MS, (5 + i) * 10 * MS + 2 * MS, 57, 256), "name": "void bn<half>()"}
                for i in range(2)]
    [grid] = [f for f in run(make_model(kernels=kernels, gpus=[H100])).findings if f.root_cause == "undersized-grid"]
    assert (grid.evidence["launches"], grid.evidence["kernel_ns"], grid.time_at_stake_ns) == (6, 12 * MS, 6 * MS)
    assert grid.title.startswith("bn runs 12.000 ms on device 0 in 6 launches of fewer blocks than SMs, most time in "
                                 "57 blocks")


def test_hot_kernels_of_a_device_are_one_kernel_hotspot_finding():
    """a (60 ms) and b (35 ms) each above 30% of 100 ms of kernel time on one device: one finding naming both, most
    time first, their shares summed; no waste in their launches, so no time at stake."""
    kernels = [launch("a", 0, 60 * MS, 4096, 256), launch("b", 60 * MS, 95 * MS, 4096, 256),
               launch("c", 95 * MS, 100 * MS, 4096, 256)]
    [hot] = run(make_model(kernels=kernels, gpus=[H100])).findings
    assert (hot.root_cause, hot.time_at_stake_ns, hot.evidence["kernel"], hot.evidence["hot_kernels"]) == (
        "kernel-hotspot", 0, "a", 2)
    assert hot.evidence["hot_kernel_time_pct"] == 95.0 and hot.title.startswith("2 kernels take 95.0% of kernel time")
    assert hot.title.index("1) a (") < hot.title.index("2) b (")


@pytest.mark.parametrize("blocks, threads, registers, gpu, shape, loss", [
    (4096, 16, 16, RTX3060, ["16 threads per block fill 50% of each warp's lanes",
                             "limit of 16 resident blocks: 33% occupancy",
                             "(an upper bound: 50% of each warp's lanes hold no thread;"], 0.5),  # rodinia's Fan2: 4x4
    # blocks; 16 x 28 = 448 slots a wave make 10 waves with 384 of 4,480 slots empty (9%): no tail to count
    (40, 256, 192, RTX3060, ["192 registers per thread allow 1 block per SM: 17% occupancy",
                             "40 blocks make 2 waves of 28 resident blocks, the last 43% full",
                             "(an upper bound: the last of 2 waves uses 12 of 28 SMs, leaving 29% of the waves' "
                             "block slots empty;"], 16 / 56),  # threebody
    (449, 16, 16, RTX3060, ["the last of 2 waves fills 1 of its 448 block slots (16 per SM on 28 SMs), leaving 50%"],
     1 - 0.5 * 449 / 896),  # empty lanes and an empty tail: what is left is half the lanes of 449 of 896 slots
    (4096, 32, 16, RTX3060, ["limit of 16 resident blocks: 33% occupancy", "how much fixing it would save cannot be "
                             "told from the timeline"], 0),  # occupancy alone bounds nothing
    (28 * 6 * 5 + 1, 256, 32, RTX3060, [], 0),  # 6 resident blocks per SM: 6 waves, the last one's tail costs little
    (4096, 256, 32, RTX3060, [], 0),  # full warps, full occupancy, many waves: nothing in the launch is wasted
])
def test_a_dominant_kernel_whose_launch_shape_wastes_the_gpu_is_told_so(blocks, threads, registers, gpu, shape, loss):
    """The launch shape of the program's own kernel and what it bounds: time x (1 - used lanes x used block slots of
    its waves), the tail counted where it leaves TAIL_WASTE_PCT of the slots empty; a low occupancy alone, nothing."""
    [hot] = run(make_model(kernels=[launch("k", 0, 90 * MS, blocks, threads, registers)], gpus=[gpu])).findings
    assert all(part in hot.title for part in shape) and ("launch-shape" in hot.tags) == bool(shape), hot.title
    assert ("fix the launch first" in hot.title) == bool(shape) and "cannot be told without Nsight Compute" in hot.title
    assert hot.time_at_stake_ns == pytest.approx(90 * MS * loss, abs=1)
    assert (hot.severity, hot.evidence.get("launch_loss_ns", 0)) == ("high" if loss else "medium", hot.time_at_stake_ns)
    assert (f"costs at most {hot.time_at_stake_ns / 1e6:,.3f} ms of its 90.000 ms" in hot.title) == bool(loss)


@pytest.mark.parametrize("name, cc, warp_size, width", [
    ("AMD Instinct MI300X", "9.4", 64, 64),  # Kineto's warpSize: a CDNA wavefront
    ("AMD Instinct MI300X", "9.4", None, 64),  # not recorded: AMD before gfx10 runs 64-wide wavefronts
    ("AMD Radeon RX 7900 XTX", "11.0", None, 32),  # RDNA (gfx11): 32-wide wavefronts
    ("AMD Instinct MI300X", "9.4", 32, 32),  # the trace's figure wins
    ("NVIDIA H100 80GB HBM3", "9.0", None, 32),
])
def test_launch_fill_reads_the_warp_width_from_the_trace_then_the_vendor(name, cc, warp_size, width):
    """Blocks of 32 threads fill a 64-wide AMD wavefront half: the launch-shape bound counts the empty lanes of the
    GPU's own width, worded as AMD words it."""
    gpu = {"device_id": 0, "name": name, "sm_count": 304, "max_warps_per_sm": 2048 // width,
           "compute_capability": cc, "warp_size": warp_size}
    result = run(make_model(kernels=[launch("k", 0, 90 * MS, 304 * 64 * 10, 32)], gpus=[gpu]))
    (fill,) = result.launch_fill
    assert (fill.main.warp_size, fill.main.lanes_pct) == (width, 100 * 32 / width)
    [hot] = result.findings
    word = "wavefront" if name.startswith("AMD") else "warp"
    assert fill.main.warp_word == word
    assert (f"32 threads per block fill 50% of each {word}'s lanes (64 wide)" in hot.title) == (width == 64)
    assert hot.time_at_stake_ns == (90 * MS // 2 if width == 64 else 0)


def test_launch_fill_warp_width_rule():
    assert [launch_fill.warp_width(*case) for case in (
        (64, "9.0", True), (None, "9.0", True), (None, None, True), (None, "10.3", True), (None, "9.0", False),
        (32, "9.0", True))] == [64, 64, 64, 32, 32, 32]


def test_launch_bound_never_exceeds_the_window_and_sums_over_hot_kernels():
    """Half-empty warps in full waves (4,480 blocks = 10 waves of 448 slots): a (60 ms) and b (35 ms) bound half their
    time, 47.5 ms together on one finding; a 100 ms kernel counted in full in a 40 ms window bounds at most 40 ms."""
    kernels = [launch("a", 0, 60 * MS, 4480, 16), launch("b", 60 * MS, 95 * MS, 4480, 16),
               launch("c", 95 * MS, 100 * MS, 4480, 256)]
    [hot] = run(make_model(kernels=kernels, gpus=[RTX3060])).findings
    assert (hot.evidence["hot_kernels"], hot.time_at_stake_ns, hot.severity) == (2, 30 * MS + 17_500_000, "high")
    cut = make_model(kernels=[launch("a", 0, 100 * MS, 4480, 16), launch("c", 100 * MS, 101 * MS, 4480, 256)],
                     gpus=[RTX3060])
    [hot] = run(cut, start_ns=0, end_ns=40 * MS).findings
    assert (hot.evidence["total_ns"], hot.time_at_stake_ns) == (100 * MS, 40 * MS)


@pytest.mark.parametrize("name, blocks, shape", [
    ("k", 44, True),  # 2 waves of 28 slots, 12 of 56 empty (21%): the tail wastes
    ("k", 45, False),  # 11 of 56 empty (19.6%): below TAIL_WASTE_PCT, and the register cap alone is no waste
    ("k", 28 * 3 - 1, False),  # 3 waves, 1 slot empty: 12% occupancy by registers over full waves is the code's design
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_warpsize4x2x1_ffma_execute_kernel__5x_cublas",
     44, False),  # cuBLAS chooses its own launch: no advice the program cannot act on
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(Params)", 44, False),
    ("void cub::DeviceReduceKernel<Policy, float*>(float*)", 44, False),
    ("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>()", 44, False),
])
def test_launch_shape_only_for_the_programs_own_kernel_and_a_tail_that_wastes(name, blocks, shape):
    """One block per SM (192 registers x 256 threads on 28 SMs: 17% occupancy). The launch shape is told only for
    the program's own kernel and only where its waves leave TAIL_WASTE_PCT of their block slots empty (alloc_churn's
    cuBLAS GEMM: 384 blocks on 132 SMs, 3 waves with 12 of 396 slots empty, was told to fix its launch)."""
    found = run(make_model(kernels=[launch(name, 0, 90 * MS, blocks, 256, 192)], gpus=[RTX3060])).findings
    [hot] = [f for f in found if f.root_cause == "kernel-hotspot"]
    assert ("launch-shape" in hot.tags, "fix the launch first" in hot.title) == (shape, shape)
    assert ("192 registers per thread allow 1 block per SM" in hot.title) == shape


def _shown_fix(con, chain: str) -> tuple[list[str], str]:
    [hot] = run(con).findings
    return hot.tags, book.get_entry("kernel-hotspot").fix_for(program.FIX_CHAINS[chain], hot.tags).text


ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>()"


@pytest.mark.parametrize("nvtx, other_kernel, trains", [
    ([], "void at::native::reduce_kernel<512>()", False),  # no_grad inference (launch_bound): no optimizer to fuse
    ([], "void hadamard_transform_kernel<128>()", False),  # 'adam' inside a word is no optimizer
    (["Optimizer.step#AdamW.step"], "void at::native::reduce_kernel<512>()", True),
    (["autograd::engine::evaluate_function: AddmmBackward0"], "void at::native::reduce_kernel<512>()", True),
    ([], "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>>()", True),
    ([], "fused_adam_kernel", True),
])
def test_elementwise_hotspot_is_told_the_fused_optimizer_only_when_the_trace_shows_training(nvtx, other_kernel,
                                                                                            trains):
    kernels = [launch(ELEMENTWISE, 0, 90 * MS, 4096, 256), launch(other_kernel, 90 * MS, 91 * MS, 4096, 256)]
    ranges = [{"pid": 1, "tid": 1, "text": t, "start_ns": 0, "end_ns": MS, "duration_ns": MS, "kind": "push_pop",
               "depth": 0} for t in nvtx]
    tags, fix = _shown_fix(make_model(kernels=kernels, nvtx=ranges, gpus=[H100]), "pytorch")
    assert ("elementwise-training" in tags, "AdamW" in fix, "optimizer" in fix) == (trains, trains, trains)
    assert "torch.compile" in fix


@pytest.mark.parametrize("chain", ["pytorch", "cuda", "python"])
@pytest.mark.parametrize("amd", [False, True])
def test_gemm_hotspot_fix_follows_the_vendor(chain, amd):
    """A tensor-core GEMM hotspot: on an AMD GPU (tl_vllm_graph_replay_mi300) no NVIDIA hardware or library advice
    (A100/H100 tiles, Transformer Engine FP8, cuBLASLt); on NVIDIA the NVIDIA advice stays."""
    kernels = [launch("ampere_fp16_s16816gemm_fp16_128x256_ldg8_f2f_stages_64x3_nn", 0, 90 * MS, 4096, 256)]
    gpu = {**H100, "name": "AMD Instinct MI300X" if amd else "NVIDIA H100 80GB HBM3"}
    tags, fix = _shown_fix(make_model(kernels=kernels, gpus=[gpu]), chain)
    nvidia = re.compile(r"A100|H100|Transformer Engine|te\.fp8|cuBLAS|cublas")
    assert ("gemm-tensor-amd" in tags, not nvidia.search(fix)) == (amd, amd), fix
    assert bool(nvidia.search(fix)) != amd


def test_runtime_helper_kernel_is_named_as_such():
    kernels = [launch("__pgi_uacc_cuda_fill_42_gpu", 0, 90 * MS, 1, 128), launch("feed_23_gpu", 90 * MS, 91 * MS,
                                                                                  1024, 128)]
    [fill] = run(make_model(kernels=kernels, gpus=[H100])).findings
    assert (fill.root_cause, fill.tags, fill.severity) == ("kernel-hotspot", ["runtime"], "info")
    assert "a helper kernel of the language runtime" in fill.title and "not the program's compute" in fill.title


def test_ncu_skips_to_the_configuration():
    """The 1-block launches of mm start after five full-grid ones in the same process: skip five, then ten more
    of the configuration's own to pass its warmup (it has twelve)."""
    kernels = [launch("mm", i * MS, i * MS + 500, 114, 32) for i in range(5)]
    kernels += [launch("mm", (10 + i) * 10 * MS, (11 + i) * 10 * MS, 1, 32) for i in range(12)]
    [grid] = run(make_model(kernels=kernels, gpus=[H100])).findings
    assert "--launch-skip 15 --launch-count 1" in grid.evidence["ncu"]


# --- real profiles of the corpus --------------------------------------------------------------------------
CORPUS = {p.name: p for p in sources.load()}


def corpus(name: str) -> Path:
    """The restored file of a public corpus profile (corpus/sources), else the test is skipped."""
    path = sources.resolve(CORPUS[name.removesuffix(".sqlite")])
    if path is None:
        pytest.skip(f"corpus profile {name} is not restored in {sources.cache_dir()} (make corpus-restore)")
    return path


def opened(path: Path, cache: Path, read: Callable[[duckdb.DuckDBPyConnection], R]) -> R:
    profile = open_profile(path, cache_dir=cache)
    try:
        return read(profile.con)
    finally:
        profile.close()


def raw_undersized(path: Path) -> list[tuple[str, int, int, int]]:
    """Independent reading: per kernel, the launches of at least 10 us with fewer blocks than the device's SMs,
    their time and duration x (1 - blocks / SMs), NCCL left out; these captures run one kernel at a time (checked),
    so every launch runs alone on its device."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert not con.execute("""SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL a JOIN CUPTI_ACTIVITY_KIND_KERNEL b
        ON a.deviceId = b.deviceId AND a.rowid < b.rowid AND a.start < b."end" AND b.start < a."end" """).fetchone()
    return con.execute("""
        SELECT s.value, count(*), sum(k."end" - k.start),
               CAST(round(sum((k."end" - k.start) * (1 - (k.gridX * k.gridY * k.gridZ) * 1.0 / g.smCount))) AS INT)
        FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
        JOIN TARGET_INFO_GPU g ON g.cuDevice = k.deviceId
        WHERE k.gridX * k.gridY * k.gridZ < g.smCount AND k."end" - k.start >= 10000 AND s.value NOT LIKE 'nccl%'
        GROUP BY 1 ORDER BY 3 DESC""").fetchall()


@pytest.mark.parametrize("name, kernel, blocks, sms", [
    ("dtuhpc_omp_matmult_mnk.sqlite", "nvkernel_matmult_mnk_offload_F1L115_7", 1, 114),  # naive matmul, one warp
    ("nussinov_mig_onekernel.sqlite", "nussinov_gpu", 10, 28),  # 10 half-warp blocks on a MIG slice
    ("perlmutter_uvm_vecadd_prefetch.sqlite", "add", 1, 108),  # vector add in one block
])
def test_corpus_long_kernel_on_a_few_sms_is_found(tmp_path, name, kernel, blocks, sms):
    path = corpus(name)
    [(raw_kernel, launches, spent, idle)] = raw_undersized(path)[:1]
    result = opened(path, tmp_path, lambda con: triage.run(con, triage.Params(profile=name, limit=100)))
    [grid] = [f for f in result.findings if f.root_cause == "undersized-grid"]
    assert (raw_kernel, grid.evidence["kernel"], grid.evidence["blocks"], grid.evidence["sm_count"]) == (
        kernel, kernel, blocks, sms)
    assert (grid.evidence["launches"], grid.evidence["kernel_ns"], grid.time_at_stake_ns) == (launches, spent, idle)
    assert grid.time_at_stake_ns < spent and grid.severity == "high" and result.classification.bound != (
        "too little GPU activity")


def raw_launch_loss(path: Path, kernel: str, start_ns: int, end_ns: int) -> tuple[int, int, float, float]:
    """Independent reading of a kernel's launches starting in [start_ns, end_ns) (one configuration, checked): their
    time, count, the share of each warp's lanes its threads fill, and the share of its waves' block slots its blocks
    fill, resident blocks per SM by the occupancy calculator from TARGET_INFO_GPU (warps, block slots, registers in
    units of 256 a warp; these kernels use no shared memory)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("""
        WITH k AS (
          SELECT k."end" - k.start AS ns, k.gridX * k.gridY * k.gridZ AS blocks, k.blockX * k.blockY * k.blockZ AS t,
                 (k.blockX * k.blockY * k.blockZ + 31) / 32 AS warps, k.registersPerThread AS regs,
                 k.staticSharedMemory + k.dynamicSharedMemory AS shared, g.*
          FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
          JOIN TARGET_INFO_GPU g ON g.cuDevice = k.deviceId
          WHERE s.value = ? AND k.start >= ? AND k.start < ?),
        per_sm AS (
          SELECT *, min(maxWarpsPerSm / warps, maxBlocksPerSm,
                        maxRegistersPerSm / ((regs * 32 + 255) / 256 * 256) / warps) AS bps FROM k)
        SELECT sum(ns), count(*), count(DISTINCT blocks || ' ' || t || ' ' || regs || ' ' || shared),
               max(shared), max(t * 1.0 / (warps * 32)),
               max(blocks * 1.0 / (((blocks + smCount * bps - 1) / (smCount * bps)) * smCount * bps))
        FROM per_sm""", (kernel, start_ns, end_ns)).fetchone()
    spent, launches, configs, shared, lanes, slots = rows
    assert (configs, shared) == (1, 0)
    return spent, launches, lanes, slots


@pytest.mark.parametrize("name, kernel, lanes, slots, counted", [
    ("threebody_divergence_kernel", "divergence", 1.0, 40 / 56, True),  # 40 blocks at 1 per SM on 28 SMs: 2 waves
    ("rodinia_gaussian_fan", "Fan2", 0.5, None, False),  # 4x4 blocks; 800 waves leave 0.1% empty: no tail counted
])
def test_corpus_dominant_kernel_bounds_what_its_launch_wastes(tmp_path, name, kernel, lanes, slots, counted):
    """threebody: one 50 s kernel of 40 blocks x 256 threads with 192 registers on a 28-SM RTX 3060 (one block per
    SM); rodinia: Fan2, 4,094 launches of 1,048,576 4x4 blocks on an RTX 3090. Each bounds time x (1 - used lanes x
    used slots), against the raw export, and ranks first (rodinia's sync finding: 63 ms)."""
    path = corpus(f"{name}.sqlite")
    result = opened(path, tmp_path, lambda con: triage.run(con, triage.Params(profile=name)))
    window = result.window
    assert window is not None
    spent, launches, raw_lanes, raw_slots = raw_launch_loss(path, kernel, window.start_ns, window.end_ns)
    assert raw_lanes == lanes and (slots is None or raw_slots == pytest.approx(slots))
    stake = round(spent * (1 - raw_lanes * (raw_slots if counted else 1.0)))
    hot = result.findings[0]
    assert (hot.root_cause, hot.severity, hot.evidence["kernel"], hot.evidence["count"]) == (
        "kernel-hotspot", "high", kernel, launches)
    assert (hot.evidence["total_ns"], hot.time_at_stake_ns) == (spent, pytest.approx(stake, abs=1))
    assert all(hot.time_at_stake_ns > f.time_at_stake_ns for f in result.findings[1:])
    assert hot.evidence["ncu"].startswith(f"ncu --kernel-name {kernel} --launch-skip ")


def raw_um_vecadd(path: Path) -> tuple[int, int, int, int, int, int]:
    """Independent reading of a one-kernel managed-memory program: the kernel's time, the device's SMs, the union of
    the unified-memory migrations (copyKind 11/12, none a prefetch: migrationCause 1 is USER) within the kernel, of
    those to the device (11) and of those to the host (12), the span of the latter (the host's reading phase), and the
    window from the kernel's start to the last migration's end."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert con.execute("SELECT count(*), count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone() == (1, 1)
    assert not con.execute("SELECT 1 FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE migrationCause = 1").fetchone()
    union = """WITH m AS (SELECT max(start, $lo) s, min("end", $hi) e FROM CUPTI_ACTIVITY_KIND_MEMCPY
                          WHERE copyKind IN ($a, $b) AND "end" > $lo AND start < $hi),
               o AS (SELECT s, e, max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) pe
                     FROM m)
               SELECT coalesce(sum(max(0, e - max(s, coalesce(pe, s)))), 0) FROM o"""
    start, end, sms = con.execute("""SELECT k.start, k."end", g.smCount FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                     JOIN TARGET_INFO_GPU g ON g.cuDevice = k.deviceId""").fetchone()
    forever = {"lo": 0, "hi": 2**62}
    inside = con.execute(union, {"lo": start, "hi": end, "a": 11, "b": 12}).fetchone()[0]
    to_device = con.execute(union, {**forever, "a": 11, "b": 11}).fetchone()[0]
    to_host = con.execute(union, {**forever, "a": 12, "b": 12}).fetchone()[0]
    first, last = con.execute('SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 12'
                              ).fetchone()
    return end - start, sms, inside, to_device, to_host, last - first, max(end, last) - start


@pytest.mark.parametrize("name", ["csc746_uvm_add_1thread", "csc746_uvm_add_256threads"])
def test_corpus_one_block_kernel_that_faults_its_pages_in_claims_no_migration_time(tmp_path, name):
    """csc746 vecadd on managed memory, add<<<1,1>>> and add<<<1,256>>> on 108-SM A100s: SQL (256 threads):
    1,264.296 ms of kernel with 143.240 ms of unified-memory migrations to the device in it; 79.376 ms of
    migrations to the host over a 1,915.802 ms reading phase after it; 3,180.178 ms window. The unified-memory finding
    claims 143.240 + 1,915.802 = 2,059.042 ms; the undersized grid (1,264.296 - 143.240) x 107/108 = 1,110.676 ms, not
    1,252.590: together 3,169.718 ms, within the window (before: 3,311.631)."""
    path = corpus(name)
    kernel_ns, sms, inside, to_device, to_host, reading, window = raw_um_vecadd(path)
    result = opened(path, tmp_path, lambda con: triage.run(con, triage.Params(profile=name, limit=100)))
    stakes = {f.root_cause: f for f in result.findings}
    grid, um = stakes["undersized-grid"], stakes["unified-memory-migration"]
    assert (grid.evidence["kernel_ns"], grid.evidence["migrating_ns"], grid.time_at_stake_ns) == (
        kernel_ns, inside, round((kernel_ns - inside) * (sms - 1) / sms))
    assert inside == to_device and um.time_at_stake_ns == to_device + reading
    assert um.evidence["host_stall_ns"] == reading - to_host
    assert result.window is not None and result.window.duration_ns == window
    assert sum(f.time_at_stake_ns for f in result.findings) <= window


def test_corpus_runtime_fill_kernels_are_not_the_programs_compute(tmp_path):
    name = "openaccpol_fill_allocloop.sqlite"
    result = opened(corpus(name), tmp_path, lambda con: run(con, limit=5))
    assert [(r.short_name, r.kind) for r in result.rows] == [("__pgi_uacc_cuda_fill_42_gpu", "runtime"),
                                                             ("feed_input_23_gpu", "custom")]
    assert [(f.tags, f.severity) for f in result.findings] == [(["runtime"], "info")]


@pytest.mark.parametrize("calls, gpu_name, amd", [
    (["hipLaunchKernel"] * 3 + ["cudaGetDevice"] * 2, None, True),  # mostly HIP's calls: ROCm
    (["hipLaunchKernel"] * 2 + ["cuLaunchKernel"] * 2, None, False),  # as many of CUDA's: not said to be AMD
    ([], "AMD Instinct MI300X", True),
    ([], "AMD Radeon Graphics", True),
    (["cudaLaunchKernel"], "Tesla V100-SXM2-32GB", False),
    ([], "", False),  # nothing says AMD: nsys and CUPTI trace NVIDIA GPUs
])
def test_vendor_from_runtime_calls_and_device_names(calls, gpu_name, amd):
    con = make_model(cuda_api=[{"name": c, "start_ns": i, "end_ns": i + 1} for i, c in enumerate(calls)],
                     gpus=[{"device_id": 0, "name": gpu_name}])
    assert (vendor.of(con) == vendor.AMD) == amd


def test_report_names_are_unique_and_short():
    """ncu -o names: a kernel name up to REPORT_CHARS as it is; longer ones cut with a hash of the whole, so two kernels
    whose names share their first 40 characters (vLLM's matmul and matmul_swiglu) write two reports."""
    plain, matmul = "a" * 40, "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1"
    assert hotspots.report_name(plain) == plain
    names = {hotspots.report_name(n) for n in (matmul, matmul + "_swiglu", plain + "b")}
    assert len(names) == 3 and all(len(n) == hotspots.REPORT_CHARS for n in names)
    assert hotspots.report_name(matmul).startswith(matmul[:31])


def test_hotspot_on_amd_names_the_rocm_profiler():
    """A HIP trace: the statement names the ROCm Compute Profiler with its command, never ncu, and the undersized
    grid counts compute units."""
    kernels = [launch("mine", 0, 90 * MS, 4, 256), launch("x", 90 * MS, 95 * MS, 4096, 256),
               launch("y", 95 * MS, 100 * MS, 4096, 256)]
    con = make_model(kernels=kernels, gpus=[{**H100, "name": "AMD Instinct MI300X"}],
                     cuda_api=[{"name": "hipLaunchKernel", "start_ns": 0, "end_ns": 1}])
    found = run(con).findings
    [grid] = [f for f in found if f.root_cause == "undersized-grid"]
    assert "on a GPU with 114 compute units" in grid.title
    for f in found:
        assert "`rocprof-compute profile -n mine -k mine -- <program>`" in f.title and "ncu" not in f.title
        assert "ROCm Compute Profiler" in f.title and "Nsight" not in f.title


@pytest.mark.parametrize("name, chain, own, said", [
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1", "pytorch", True, "triton.autotune"),  # tl_vllm MI300 MoE
    ("triton_tem_fused_mm_0", "pytorch", True, "max-autotune"),  # a torch.compile GEMM template
    ("matmul_naive(float const*, float const*, float*, int)", "cuda", True, "cublasGemmEx"),
    ("matmul_kernel", "julia", True, "mul!(C, A, B)"),
    ("ampere_fp16_s16816gemm_fp16_128x256_ldg8_f2f_stages_64x3_nn", "pytorch", False, "MFU"),  # cuBLAS's
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "cuda", False, "cuBLASLt"),  # cuBLAS's
])
def test_gemm_hotspot_of_no_library_is_told_to_tune_or_replace_its_own_kernel(name, chain, own, said):
    """A GEMM whose names no vendor library claims is the program's own kernel: library tuning (TunableOp, cuBLASLt
    heuristics) and precision flags don't reach it, so its fix is to compare with the library and tune its own
    configuration; a library's GEMM keeps the library's fix."""
    tags, fix = _shown_fix(make_model(kernels=[launch(name, 0, 90 * MS, 4096, 256)], gpus=[H100]), chain)
    assert ("gemm-own" in tags, said in fix) == (own, True), fix


@pytest.mark.parametrize("name", ["tl_mi210_gpu_only.json.gz", "tl_mi300_resnet18_nopool.json.gz"])
def test_amd_kineto_traces_give_launch_fill_their_wavefront_width(name, tmp_path):
    """deviceProperties' warpSize (64 in both: an MI210 and an MI300X, read from the JSON) reaches every launch
    configuration, worded as a wavefront."""
    path = corpus(name.removesuffix(".json.gz"))
    with gzip.open(path) as f:
        widths = {p["warpSize"] for p in json.load(f)["deviceProperties"]}
    fills = opened(path, tmp_path, lambda con: launch_fill.fills(con, triage.resolve_scope(
        con, tk.Params(profile=name), default="capture")))
    assert widths == {64} and fills
    assert {(k.main.warp_size, k.main.warp_word) for k in fills} == {(64, "wavefront")}


@pytest.mark.parametrize("run_ns, share, found", [
    (9_999, 20, False),  # balinski: ~2 us kernels, a fifth of the window, nothing bounded (info): their launches' cost
    (10_000, 20, True),  # a run of TINY_KERNEL_NS is no longer tiny: the statement stays
    (9_999, 60, True),  # tiny but most of the window (launch_bound_graph: graph replays): medium, it stays
])
def test_a_hotspot_of_tiny_kernels_with_nothing_at_stake_is_no_finding(run_ns, share, found):
    """Kernels that run shorter than their launch costs (rules.TINY_KERNEL_NS) hold their time in launches, which
    small-kernel-overhead covers; a kernel-hotspot that bounds nothing on them is left out, one that matters is not."""
    n = share * MS // run_ns
    gap = (share * MS) // n - run_ns if share < 50 else 0  # spread over the share of a 100 ms window
    kernels = [launch("tiny", i * (run_ns + gap), i * (run_ns + gap) + run_ns, 4096, 256) for i in range(n)]
    kernels += [launch("x", 95 * MS, 97 * MS, 4096, 256), launch("y", 97 * MS, 100 * MS, 4096, 256)]
    hot = [f for f in run(make_model(kernels=kernels, gpus=[H100])).findings if f.evidence.get("kernel") == "tiny"]
    assert bool(hot) == found
    if hot:
        assert hot[0].severity == ("medium" if share >= 50 else "info")


@pytest.mark.parametrize("name, cutlass", [
    # cutlass_bench_gemm_pageable: the program instantiates CUTLASS's GEMM template (its name spells the mainloop)
    ("void cutlass::Kernel<cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPipelined<cutlass::gemm::"
     "GemmShape<(int)128, (int)128, (int)32>, float>>>(T1::Params)", True),
    # alloc_churn: a CUTLASS kernel cuBLAS ships, named by its generator: cuBLAS's to tune
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(T1::Params)", False),
])
def test_a_cutlass_template_gemm_is_told_to_tune_its_template(name, cutlass):
    tags = hotspots.fit_tags("gemm-tensor", False, vendor.NVIDIA, "CUTLASS", name)
    assert ("gemm-cutlass" in tags) == cutlass
    fix = book.get_entry("kernel-hotspot").fix_for(("cuda", "generic"), ["gemm-tensor", *tags]).text
    assert fix.startswith("This GEMM is a CUTLASS template") == cutlass
    assert ("cublasLtMatmulAlgoGetHeuristic" in fix) != cutlass
