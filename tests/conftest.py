"""Shared fixtures: real exports from ../shared/fixtures/nsys (used in place) and synthetic samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsightful.profiles import Profile, open_profile

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "nsys"
FIXTURE_FILES = sorted(FIXTURES.glob("*.sqlite"))
FIXTURE_IDS = [p.stem for p in FIXTURE_FILES]


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nsightful-cache")


@pytest.fixture(scope="session")
def open_fixture(cache_root):
    """open_fixture('nsysai_mock') -> Profile of a real export, built once per test session."""
    opened: dict[str, Profile] = {}

    def _open(stem: str) -> Profile:
        if stem not in opened:
            opened[stem] = open_profile(FIXTURES / f"{stem}.sqlite", cache_dir=cache_root)
        return opened[stem]

    yield _open
    for profile in opened.values():
        profile.close()


def _sample(tmp_path_factory, cache_root, preset: str) -> tuple[Profile, dict]:
    from nsightful.profiles import synth
    path = tmp_path_factory.mktemp(f"synth-{preset}") / f"{preset}.sqlite"
    truth = synth.write_sample(path, getattr(synth, preset)())
    return open_profile(path, cache_dir=cache_root), truth


@pytest.fixture(scope="session")
def demo(tmp_path_factory, cache_root):
    """(Profile, ground truth dict) of the synthetic sample with every problem planted."""
    profile, truth = _sample(tmp_path_factory, cache_root, "demo")
    yield profile, truth
    profile.close()


@pytest.fixture(scope="session")
def clean(tmp_path_factory, cache_root):
    """(Profile, ground truth dict) of the synthetic sample with nothing planted."""
    profile, truth = _sample(tmp_path_factory, cache_root, "clean")
    yield profile, truth
    profile.close()


def planted(truth: dict, kind: str) -> list[dict]:
    return [p for p in truth["planted"] if p["kind"] == kind]


def dump(model) -> dict:
    """A pydantic result as plain JSON data (for snapshots)."""
    return json.loads(model.model_dump_json())


def kernels_in_export(path: Path) -> int:
    """Kernel launches in a raw export, by plain SQLite: the independent figure to check tools against."""
    import sqlite3
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
