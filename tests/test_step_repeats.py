"""step_repeats: which devices run one kernel sequence in every step, on tiny in-memory data at the rule's edges, and
on the launch_bound capture whose program plants 480 kernels a step."""

from __future__ import annotations

import pytest
from modeldb import make_model

from corpus import sources
from stallhound.analysis import step_repeats
from stallhound.analysis.common import ScopedParams, resolve_scope
from stallhound.analysis.step_repeats import SameSteps
from stallhound.formats import open_profile

STEP = 1_000
STEPS = [(0, STEP), (STEP, 2 * STEP), (2 * STEP, 3 * STEP)]
CAPTURES = {p.name: p for p in sources.load() if p.origin == "capture"}


def kernel(start: int, name: str, stream: int = 7, device: int = 0) -> dict:
    return {"device_id": device, "stream_id": stream, "name": name, "short_name": name, "start_ns": start,
            "end_ns": start + 10, "category": "compute"}


def steps_of(*names_per_step: list[str], offset: int = 100) -> list[dict]:
    """Kernels named per step, 100 ns apart from `offset` into each step."""
    return [kernel(i * STEP + offset + 100 * j, n)
            for i, names in enumerate(names_per_step) for j, n in enumerate(names)]


def repeated(kernels: list[dict], steps: list[tuple[int, int]] = STEPS) -> dict[int, SameSteps]:
    return step_repeats.repeated(make_model(kernels=kernels), steps, [0])


def test_step_repeats_the_same_sequence_every_step():
    assert repeated(steps_of(["gemm", "relu"], ["gemm", "relu"], ["gemm", "relu"])) == {0: SameSteps(3, 2)}


@pytest.mark.parametrize("names", [
    (["gemm", "relu"], ["gemm", "relu"], ["gemm", "relu", "relu"]),  # one more launch in the last step
    (["gemm", "relu"], ["relu", "gemm"], ["gemm", "relu"]),  # the same kernels, another order
    (["gemm", "relu"], ["gemm", "relu"], []),  # a step that ran nothing on the device
])
def test_step_repeats_a_step_that_differs_breaks_the_repeat(names):
    assert repeated(steps_of(*names)) == {}


def test_step_repeats_needs_min_steps():
    kernels = steps_of(["gemm"], ["gemm"])
    assert repeated(kernels, STEPS[:2]) == {}
    assert step_repeats.MIN_STEPS == 3


def test_step_repeats_a_kernel_belongs_to_the_step_it_starts_in():
    """A kernel starting exactly where a step begins is that step's; one on another stream is another sequence."""
    same = steps_of(["gemm"], ["gemm"], ["gemm"], offset=0)
    assert repeated(same) == {0: SameSteps(3, 1)}
    other_stream = [*same[:2], kernel(2 * STEP, "gemm", stream=8)]
    assert repeated(other_stream) == {}


def test_step_repeats_kernels_after_the_last_step_are_not_counted():
    kernels = [*steps_of(["gemm"], ["gemm"], ["gemm"]), kernel(3 * STEP + 5, "tail")]
    assert repeated(kernels) == {0: SameSteps(3, 1)}


@pytest.mark.parametrize("name", ["launch_bound", "launch_bound_graph"])
def test_step_repeats_on_the_launch_bound_captures(cache_root, name):
    """launch_bound.py runs 24 Linear+ReLU layers 10 times a step: 24 x 2 x 10 = 480 kernels, the same every step;
    the trace holds 3 ProfilerSteps. Its --graph twin replays them from a CUDA graph: the same 480 kernels a step."""
    path = sources.resolve(CAPTURES[name], cache_root)
    assert path is not None, "a committed capture is always here"
    profile = open_profile(path, cache_dir=cache_root)
    scope = resolve_scope(profile.con, ScopedParams(profile=name))
    assert step_repeats.same_steps(profile.con, scope) == {0: SameSteps(3, 480)}
