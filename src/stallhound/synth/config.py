"""SynthConfig: the workload and the problems to plant, checked on construction, and its presets (demo:
everything planted; clean: nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .schema import MIB_BYTES

TINY_KERNEL_MAX_NS = 10_000  # planted tiny kernels are shorter than this
_MIN_IDLE_GAP_NS = 5_000_000  # a planted gap must outlast the host lead to be exact
_MAX_MODULE_LOADS = 16  # distinct kernels launched in a forward+backward pass

HostActivity = Literal["untraced", "poll"]


@dataclass(frozen=True)
class IdleGap:
    """A GPU idle window of exactly `duration_ns` on `device` in `iteration` (>= 1).

    host "untraced": the rank's thread runs untraced code after the forward pass's first layer;
    "poll": it waits for the data loader in an OS-runtime poll() call inside the `dataloader` range.
    """
    device: int
    iteration: int
    duration_ns: int
    host: HostActivity = "untraced"


@dataclass(frozen=True)
class SynthConfig:
    """Workload and planted problems; a zero count (or None) switches a problem off."""
    seed: int = 0
    devices: int = 4
    iterations: int = 12
    layers: int = 4
    preset: str = "custom"
    idle_gaps: tuple[IdleGap, ...] = ()
    first_iteration_extra_ns: int = 0  # iteration 0 spends this long in cuModuleLoadData calls
    module_loads: int = 16  # ... split over this many calls, before first launches
    tiny_kernels_per_iteration: int = 0  # optimizer phase: unfused per-tensor ops instead of fused Adam
    tiny_kernel_ns: int = 3_000
    pageable_h2d_per_iteration: int = 0
    pageable_h2d_bytes: int = 8 * MIB_BYTES
    pin_pageable_h2d: bool = False  # the fix of pageable_h2d: the same copies, from pinned memory (nothing planted)
    device_syncs_per_iteration: int = 0
    small_d2h_per_iteration: int = 0  # .item(): first after the loss, the rest at the end of the step
    small_d2h_bytes: int = 4
    straggler_device: int | None = None
    straggler_delay_ns: int = 4_000_000
    gc_pause_period: int = 0  # every k-th iteration (k, 2k, ...) the host pauses at the forward's start
    gc_pause_ns: int = 15_000_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "idle_gaps", tuple(
            g if isinstance(g, IdleGap) else IdleGap(**g) for g in self.idle_gaps))
        problems = _config_problems(self)
        if problems:
            raise ValueError("invalid synth config: " + "; ".join(problems))

    @classmethod
    def clean(cls, **overrides: Any) -> SynthConfig:
        """No planted problem: every GPU stays busy from its first to its last kernel."""
        return cls(**{"preset": "clean", **overrides})

    @classmethod
    def demo(cls, **overrides: Any) -> SynthConfig:
        """Every problem planted once or more, sized to stand out (fits any devices/iterations)."""
        devices = overrides.get("devices", 4)
        iterations = overrides.get("iterations", 12)
        last = iterations - 1
        gaps = () if iterations < 2 else (
            IdleGap(0, min(5, last), 20_000_000, "untraced"),
            IdleGap(min(1, devices - 1), min(8, last), 12_000_000, "poll"))
        planted = dict(
            preset="demo", idle_gaps=gaps, first_iteration_extra_ns=64_000_000,
            tiny_kernels_per_iteration=300, pageable_h2d_per_iteration=1, device_syncs_per_iteration=1,
            small_d2h_per_iteration=2, gc_pause_period=3,
            straggler_device=min(2, devices - 1) if devices > 1 else None)
        return cls(**{**planted, **overrides})


def _config_problems(cfg: SynthConfig) -> list[str]:
    problems = []
    if not 1 <= cfg.devices <= 64:
        problems.append(f"devices must be 1..64, got {cfg.devices}")
    if not 1 <= cfg.iterations <= 10_000:
        problems.append(f"iterations must be 1..10000, got {cfg.iterations}")
    if cfg.layers < 1:
        problems.append("layers must be at least 1")
    problems += [p for g in cfg.idle_gaps for p in _gap_problems(cfg, g)]
    if len({(g.device, g.iteration, g.host) for g in cfg.idle_gaps}) < len(cfg.idle_gaps):
        problems.append("two idle gaps share device, iteration and host activity")
    if cfg.first_iteration_extra_ns < 0 or not 1 <= cfg.module_loads <= _MAX_MODULE_LOADS:
        problems.append(f"first_iteration_extra_ns must be >= 0 and module_loads 1..{_MAX_MODULE_LOADS}")
    if not 1_000 <= cfg.tiny_kernel_ns < TINY_KERNEL_MAX_NS * 10 // 13:
        problems.append(f"tiny_kernel_ns must be 1000..{TINY_KERNEL_MAX_NS * 10 // 13 - 1}")
    if not 1 <= cfg.small_d2h_bytes <= 64 or cfg.pageable_h2d_bytes < 1:
        problems.append("small_d2h_bytes must be 1..64 and pageable_h2d_bytes positive")
    if cfg.straggler_device is not None and not (cfg.devices > 1 and 0 <= cfg.straggler_device < cfg.devices):
        problems.append("straggler_device must be one of at least two devices")
    counts = (cfg.tiny_kernels_per_iteration, cfg.pageable_h2d_per_iteration, cfg.device_syncs_per_iteration,
              cfg.small_d2h_per_iteration, cfg.gc_pause_period, cfg.gc_pause_ns, cfg.straggler_delay_ns)
    if min(counts) < 0:
        problems.append("counts, periods and durations must not be negative")
    return problems


def _gap_problems(cfg: SynthConfig, gap: IdleGap) -> list[str]:
    problems = []
    if not 0 <= gap.device < cfg.devices:
        problems.append(f"idle gap device {gap.device} is not one of the {cfg.devices} devices")
    if not 1 <= gap.iteration < cfg.iterations:
        problems.append(f"idle gap iteration {gap.iteration} must be 1..{cfg.iterations - 1}")
    if gap.duration_ns < _MIN_IDLE_GAP_NS:
        problems.append(f"idle gap duration_ns must be at least {_MIN_IDLE_GAP_NS}")
    if gap.host not in ("untraced", "poll"):
        problems.append(f"idle gap host must be 'untraced' or 'poll', got {gap.host!r}")
    return problems


demo = SynthConfig.demo  # the presets by name, as `synth.demo()` and `--preset demo` use them
clean = SynthConfig.clean
PRESETS: dict[str, Callable[..., SynthConfig]] = {"demo": demo, "clean": clean}

