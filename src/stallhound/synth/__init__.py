"""Synthetic Nsight Systems exports with planted performance problems of known size.

`write_sample(path, config)` writes a SQLite file laid out like `nsys export --type sqlite` of Nsight
Systems 2025.1.1 (export schema 3.17.1): the table and column names, types, enum codes and id encodings
of a real export, exported lazily (tables without rows are left out). The workload is a data-parallel,
PyTorch-like training loop: one rank process per GPU with one main thread, `iterations` steps wrapped in
NVTX push/pop ranges (`iteration <k>` holding `dataloader`, `forward`, `backward`, `optimizer`),
cuBLAS/FlashAttention/Triton/ATen kernels on stream 7 and NCCL all-reduce kernels on a stream of their
own, two gradient buckets per step. Problems are planted at exactly known places and sizes, and the
ground truth goes beside the export as `<path>.truth.json`, so tests can check that a detector finds
what was planted. `SynthConfig.demo()` plants everything; `SynthConfig.clean()` plants nothing and
keeps every GPU busy (no idle gap of 1 ms or more between a device's first and last kernel).

What every file guarantees:
- each kernel/memcpy/memset/synchronization row joins exactly one CUPTI_ACTIVITY_KIND_RUNTIME row on
  (process, correlationId); a launch call ends before its kernel starts;
- operations of one stream never overlap; unplanted kernels last >= 12 us, planted tiny kernels < 10 us;
- times are integer ns on the export's clock; globalPid = 2**48 + (pid << 24), globalTid = globalPid + tid,
  and a rank's main thread has tid == pid.

Modules: schema (the export's tables, enum codes and ids), kernels (the kernel catalogue), config
(SynthConfig and its presets), rank and simulate (the ranks' host and GPU timelines, in lockstep at
each collective), truth (the ground truth JSON, format in its docstring), writer (the SQLite file), cli.
"""

from __future__ import annotations

from .cli import run_cli
from .config import PRESETS, HostActivity, IdleGap, SynthConfig, clean, demo
from .schema import NSYS_VERSION, SCHEMA_VERSION, SYNTH_HOST
from .truth import GENERATOR, TRUTH_VERSION
from .writer import truth_path, write_sample

__all__ = [
    "GENERATOR", "NSYS_VERSION", "PRESETS", "SCHEMA_VERSION", "SYNTH_HOST", "TRUTH_VERSION", "HostActivity", "IdleGap",
    "SynthConfig", "clean", "demo", "run_cli", "truth_path", "write_sample",
]
