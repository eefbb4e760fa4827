"""Issue 30's attack catalogue (bench/redteam.py) as tests, run by `make redteam` (pytest -m redteam): each attack on
a fresh server must fail safely: the server up, the other client answered promptly, memory within its limit,
nothing written outside the cache, one sentence back, and no harm its own check finds (a leak, a refused statement
answered). Inputs are at the `ci` scale unless STALLHOUND_REDTEAM_SCALE names another (`full`: the issue's sizes)."""

from __future__ import annotations

import os
import re

import pytest

from bench.redteam import MOCK, SCALES, catalogue
from tests.security.harness import Attack, Limits, run_attack

SCALE = SCALES[os.environ.get("STALLHOUND_REDTEAM_SCALE", "ci")]
LIMITS = Limits()
ATTACKS = catalogue(SCALE)


def _id(attack: Attack) -> str:
    return f"{attack.klass}-" + re.sub(r"[^a-z0-9]+", "-", attack.name.lower()).strip("-")[:48]


@pytest.mark.redteam
@pytest.mark.parametrize("attack", ATTACKS, ids=[_id(a) for a in ATTACKS])
def test_redteam_attack_fails_safely(attack):
    out = run_attack(attack, MOCK, "http", LIMITS)
    problems = out.problems(LIMITS)
    assert problems == [], f"{attack.name}: {'; '.join(problems)}; it said: {out.sentence[:300]!r}"


@pytest.mark.redteam
def test_redteam_catalogue_covers_every_class_of_issue_30():
    assert {a.klass for a in ATTACKS} == set(range(1, 11))
