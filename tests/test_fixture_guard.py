"""The guard that skips tests needing ../shared/fixtures when it is missing: it must tell them from the others."""

from __future__ import annotations

from conftest import FIXTURES
from fixture_guard import needs_fixtures

MOCK = FIXTURES / "nsysai_mock.sqlite"
MOCK_NAMES = [MOCK.name]  # computed from a fixture path: bound to the fixtures too


def _reads_mock() -> int:
    return len(MOCK_NAMES)


def test_fixture_guard_knows_a_test_using_open_fixture(request, open_fixture):
    assert needs_fixtures(request.node)


def test_fixture_guard_follows_helpers_and_module_constants(request):
    assert _reads_mock() == 1
    assert needs_fixtures(request.node)


def test_fixture_guard_lets_a_test_without_fixtures_run(request, tmp_path):
    assert not needs_fixtures(request.node)

