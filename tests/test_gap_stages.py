"""gap_stages: each stage of gpu_idle_gaps on its own (find -> group -> longest -> enrich), on tiny timelines
whose gaps, periods and neighbours are known by construction."""

from __future__ import annotations

from modeldb import make_model

from stallhound.analysis import attribution, common, gap_stages

MS = 1_000_000


def k(s: int, e: int, name: str, device: int = 0) -> dict:
    return {"device_id": device, "stream_id": 7, "pid": 1, "tid": 7, "start_ns": s, "end_ns": e, "short_name": name,
            "name": name}


def timeline():
    """Device 0: 8 ms kernels k0..k4 in 10 ms slots (2 ms gaps at 8, 18, 28 ms), then k5 at 45 ms (a 7 ms gap);
    a 0.5 ms gap between k5 and k6. Device 1: one 3 ms gap. NVTX 'step' (0-60 ms) and 'load' (17-21 ms)."""
    kernels = [k(s * MS, (s + 8) * MS, f"k{i}") for i, s in enumerate((0, 10, 20, 30))]
    kernels += [k(45 * MS, 50 * MS, "k5"), k(50_500_000, 52 * MS, "k6"),
                k(0, 40 * MS, "z0", device=1), k(43 * MS, 52 * MS, "z1", device=1)]
    nvtx = [{"pid": 1, "tid": 7, "text": t, "start_ns": s, "end_ns": e, "kind": "push_pop", "depth": d}
            for t, s, e, d in (("step", 0, 60 * MS, 0), ("load", 17 * MS, 21 * MS, 1))]
    con = make_model(kernels=kernels, nvtx=nvtx)
    return con, common.resolve_scope(con, common.ScopedParams(profile="t"), default="gpu_active")


def spans(gaps) -> list[tuple[int, int, int]]:
    return [(g.device, g.start_ns, g.end_ns) for g in gaps]


def test_gap_stages_find_takes_the_attributions_long_gaps_or_labels_shorter_ones():
    con, scope = timeline()
    long = [(0, 8 * MS, 10 * MS), (0, 18 * MS, 20 * MS), (0, 28 * MS, 30 * MS), (0, 38 * MS, 45 * MS),
            (1, 40 * MS, 43 * MS)]
    assert spans(gap_stages.find(con, scope, MS)) == long
    assert spans(gap_stages.find(con, scope, 3 * MS)) == [(0, 38 * MS, 45 * MS), (1, 40 * MS, 43 * MS)]
    shorter = gap_stages.find(con, scope, 400_000)  # below the attribution's long gaps: labelled again
    assert spans(shorter) == sorted([*long, (0, 50 * MS, 50_500_000)])
    # the same gap ids and causes as the attribution's for the long ones
    assert {(g.gap_id, g.cause) for g in shorter if g.end_ns - g.start_ns >= MS} == {
        (g.gap_id, g.cause) for g in gap_stages.find(con, scope, MS)}
    assert all(isinstance(g, attribution.Gap) for g in shorter)


def test_gap_stages_group_finds_the_steady_period():
    con, scope = timeline()
    found = gap_stages.find(con, scope, MS)
    [group] = gap_stages.group(con, found)
    ids = [g.gap_id for g in found if g.device == 0 and g.end_ns - g.start_ns == 2 * MS]
    assert group == {"device": 0, "count": 3, "mean_duration_ns": 2 * MS, "period_ns": 10 * MS, "total_ns": 6 * MS,
                     "first_start_ns": 8 * MS, "gap_ids": ids}
    assert gap_stages.group(con, found[:2]) == []  # two gaps show no period


def test_gap_stages_longest_orders_by_length_then_device_then_start():
    con, scope = timeline()
    found = gap_stages.find(con, scope, MS)
    assert spans(gap_stages.longest(found, 3)) == [(0, 38 * MS, 45 * MS), (1, 40 * MS, 43 * MS), (0, 8 * MS, 10 * MS)]


def test_gap_stages_enrich_names_the_kernels_around_and_the_ranges_covering_half():
    con, scope = timeline()
    found = gap_stages.find(con, scope, MS)
    around = gap_stages.enrich(con, found)
    assert [(around[g.gap_id]["kernel_before"], around[g.gap_id]["kernel_after"], around[g.gap_id]["nvtx"])
            for g in found] == [("k0", "k1", ["step"]), ("k1", "k2", ["load", "step"]), ("k2", "k3", ["step"]),
                                ("k3", "k5", ["step"]), ("z0", "z1", ["step"])]
    assert gap_stages.enrich(con, []) == {}
