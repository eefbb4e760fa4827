"""Runs a program's step under torch.profiler and writes its Kineto trace: shared by the capture programs here.

Each program defines `step(i)` and calls `capture(step, out, ...)`; the schedule is torch.profiler's own, so the
trace carries the `ProfilerStep#N` ranges a user's capture would.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile, schedule

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu only to try a program without a GPU


def args(*flags: str) -> argparse.Namespace:
    """The trace's path, then the program's own on/off flags."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    for flag in flags:
        parser.add_argument(flag, action="store_true")
    return parser.parse_args()


def capture(step, out: str, *, wait: int = 1, warmup: int = 1, active: int = 3, with_stack: bool = False) -> None:
    """Runs wait + warmup + active steps, profiling the active ones, and writes the trace to `out`.

    Under nsys (CAPTURE_WITH=nsys) torch.profiler stays off, as a user profiling with nsys would leave it, and each
    step is an NVTX range "train_step" instead; no trace is written.
    """
    if os.environ.get("CAPTURE_WITH") == "nsys":
        for i in range(wait + warmup + active):
            with torch.cuda.nvtx.range("train_step"):
                step(i)
        torch.cuda.synchronize()
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                 record_shapes=True, with_stack=with_stack,
                 on_trace_ready=lambda prof: prof.export_chrome_trace(out)) as prof:
        for i in range(wait + warmup + active):
            step(i)
            prof.step()
    if DEV == "cuda":
        torch.cuda.synchronize()
