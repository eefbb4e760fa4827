"""A device that runs dry inside a synchronize call idles because of the sync, however late its host resumes;
garbage-collection pauses are only the periodic gaps that recur less often than every step (book gc-pauses).
Figures are checked against the planted ground truth and the raw export's CUDA calls, read with sqlite3."""

from __future__ import annotations

import pytest
from conftest import blocked_share, planted

from stallhound import synth
from stallhound.analysis import idle_causes
from stallhound.analysis.attribution import CauseTime, DeviceIdle
from stallhound.analysis.contracts import run_skill
from stallhound.analysis.program import FIX_CHAINS, Program
from stallhound.formats import open_profile
from stallhound.tools import gpu_idle_gaps, triage

MS = 1_000_000
SAMPLES = {"syncs": {"device_syncs_per_iteration": 2}, "gc": {"gc_pause_period": 3}}


@pytest.fixture(scope="module")
def sample(tmp_path_factory, cache_root):
    """sample(name) -> (Profile, truth, path) of SynthConfig.clean(devices=2, iterations=10, **SAMPLES[name])."""
    made = {}

    def _make(name: str):
        if name not in made:
            path = tmp_path_factory.mktemp(f"sync-or-gc-{name}") / f"{name}.sqlite"
            truth = synth.write_sample(path, synth.SynthConfig.clean(devices=2, iterations=10, **SAMPLES[name]))
            made[name] = (open_profile(path, cache_dir=cache_root), truth, path)
        return made[name]

    yield _make
    for profile, _, _ in made.values():
        profile.close()


def sync_share(path, truth: dict, device: int, lo: int, hi: int) -> tuple[int, int]:
    [rank] = [r for r in truth["ranks"] if r["device"] == device]
    return blocked_share(path, device, rank["global_tid"], "cudaDeviceSynchronize%", lo, hi)


def test_triage_device_syncs_are_excessive_synchronization_not_gc_pauses(sample):
    """Two cudaDeviceSynchronize calls per step: the host resumes ~1.4 ms after the first returns (later than
    SYNC_RESUME_MAX_NS), in every step at the same place. The sync is the cause, not a collection pause."""
    profile, truth, path = sample("syncs")
    result = triage.run(profile.con, triage.Params(profile="syncs", limit=100))
    assert "gc-pauses" not in {f.root_cause for f in result.findings}
    w = result.window
    for device in (0, 1):
        [top, *_] = [f for f in result.findings if f.device == device]
        gaps, ns = sync_share(path, truth, device, w.start_ns, w.end_ns)
        assert gaps >= 10 and top.root_cause == "excessive-synchronization" and "device-sync" in top.tags
        assert top.time_at_stake_ns == ns and top.evidence["gaps"] == gaps


def test_gpu_idle_gaps_says_which_part_of_a_gap_was_the_sync_and_which_the_late_resume(sample):
    profile, truth, path = sample("syncs")
    result = run_skill(profile.con, gpu_idle_gaps, gpu_idle_gaps.Params(profile="syncs", device=0, limit=100))
    s = result.scope
    gaps, ns = sync_share(path, truth, 0, s.start_ns, s.end_ns)
    synced = [g for g in result.gaps if g.blocked_in and g.blocked_in.startswith("cudaDeviceSynchronize")]
    assert len(synced) == gaps and all(g.cause == "sync" and g.late_cause == "host_untraced" for g in synced)
    assert sum(g.duration_ns - g.late_ns for g in synced) == ns
    assert all(0 < g.late_ns < g.duration_ns for g in synced)
    assert "late resume (host_untraced)" in gpu_idle_gaps.render(result)


def test_triage_planted_gc_pauses_are_gc_pauses(sample):
    """A 15 ms pause every third step, nothing traced on the host: gc-pauses, each device its planted idle."""
    profile, truth, _ = sample("gc")
    result = triage.run(profile.con, triage.Params(profile="gc", limit=100))
    w = result.window
    for device in (0, 1):
        pauses = [p for p in planted(truth, "gc_pause") if p["device"] == device
                  and w.start_ns <= p["gpu_idle_start_ns"] and p["gpu_idle_end_ns"] <= w.end_ns]
        [top, *_] = [f for f in result.findings if f.device == device]
        assert len(pauses) == 3 and top.root_cause == "gc-pauses"
        assert top.time_at_stake_ns == sum(p["gpu_idle_end_ns"] - p["gpu_idle_start_ns"] for p in pauses)


PAUSES = CauseTime(30 * MS, 10, long_ns=30 * MS, periodic_ns=24 * MS, periodic_gaps=8, period_ns=10 * MS)


@pytest.mark.parametrize("step_ns, expected", [
    (None, ["gc-pauses", "gpu-bubbles"]),  # no loop known: periodic host gaps are all the evidence there is
    (10 * MS, ["gpu-bubbles"]),  # one gap per step, at a fixed place in it: the step's own work
    (20 * MS, ["gpu-bubbles"]),  # two per step
    (5 * MS, ["gc-pauses", "gpu-bubbles"]),  # every other step: as often as an older-generation collection comes
])
def test_idle_causes_gc_pauses_do_not_claim_gaps_recurring_every_step(step_ns, expected):
    python = Program(kind="python", fix_chain=list(FIX_CHAINS["python"]), frameworks=[], process="p", evidence=[],
                     decided_by="test")
    d = DeviceIdle(device=0, window_ns=100 * MS, idle_ns=50 * MS, causes={"host_untraced": PAUSES})
    assert [f.root_cause for f in idle_causes.findings({0: d}, python, step_ns=step_ns)] == expected
