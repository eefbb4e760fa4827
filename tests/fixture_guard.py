"""Tests that need the real fixtures (../shared/fixtures) skip when it is missing, with one line saying so and how
many; STALLHOUND_REQUIRE_FIXTURES=1 (set by .ci/run) turns that into an error, so CI always runs them.

A test needs the fixtures when its code, a helper or pytest fixture it uses (followed through the module's
functions), or one of its parameters reaches a name bound to the fixtures folder: a path under it, or a module
constant computed from one (`SHARED = sorted(KINETO.glob("*.json.gz"))` is bound even when it comes out empty)."""

from __future__ import annotations

import ast
import functools
import inspect
import os
import sys
import types
from pathlib import Path

import pytest

FIXTURES_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
REQUIRE_ENV = "STALLHOUND_REQUIRE_FIXTURES"
FIXTURE_NAMES = {"FIXTURES", "FIXTURE_FILES", "FIXTURE_IDS", "FIXTURES_ROOT", "open_fixture"}
SKIP_REASON = f"needs the real fixtures in {FIXTURES_ROOT}, which is missing"


def _under_root(value) -> bool:
    if isinstance(value, Path):
        return FIXTURES_ROOT in value.parents or value == FIXTURES_ROOT
    if isinstance(value, list | tuple | set | frozenset):
        return any(_under_root(v) for v in value)
    if isinstance(value, dict):
        return any(_under_root(v) for v in value.values())
    return False


@functools.cache
def _bound_names(module_name: str) -> frozenset[str]:
    """The module's top-level names bound to the fixtures: paths under the folder, and constants computed from them."""
    module = sys.modules.get(module_name)
    if module is None:
        return frozenset(FIXTURE_NAMES)
    bound = set(FIXTURE_NAMES) | {name for name, value in vars(module).items() if _under_root(value)}
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return frozenset(bound)
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            if {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} & bound:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return frozenset(bound)


def _reaches_fixtures(func, seen: set) -> bool:
    """Whether func's code (with its nested functions and the functions of its own module it calls) names them."""
    func = getattr(func, "__wrapped__", func)
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names |= set(c.co_names) | set(c.co_varnames)
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    module_globals = getattr(func, "__globals__", {})
    if names & _bound_names(module_globals.get("__name__", "")):
        return True
    helpers = [module_globals[n] for n in names & module_globals.keys()
               if isinstance(module_globals[n], types.FunctionType) and module_globals[n].__module__ == func.__module__]
    return any(_reaches_fixtures(helper, seen) for helper in helpers)


def needs_fixtures(item: pytest.Item) -> bool:
    seen: set = set()
    own_skip = item.get_closest_marker("skip")
    if own_skip and str(own_skip.kwargs.get("reason", "")).startswith("got empty parameter set"):
        return True  # parametrized over the fixture files, which are missing
    if _reaches_fixtures(getattr(item, "function", None), seen):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec and _under_root(list(callspec.params.values())):
        return True
    defs = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames if defs else ():
        if name in FIXTURE_NAMES:
            return True
        if any(_reaches_fixtures(d.func, seen) for d in defs.name2fixturedefs.get(name, ())):
            return True
    return False


def missing_fixtures_hooks():
    """(pytest_configure, pytest_collection_modifyitems, pytest_terminal_summary) for conftest to bind."""
    skipped: list[str] = []

    def pytest_configure(config):
        if not FIXTURES_ROOT.is_dir() and os.environ.get(REQUIRE_ENV) == "1":
            raise pytest.UsageError(f"{REQUIRE_ENV}=1 but the real fixtures are missing: put them in {FIXTURES_ROOT} "
                                    f"(see the project README) or unset {REQUIRE_ENV} to skip the tests that need them")

    def pytest_collection_modifyitems(config, items):
        if FIXTURES_ROOT.is_dir():
            return
        for item in items:
            if needs_fixtures(item):
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON), append=False)
                skipped.append(item.nodeid)

    def pytest_terminal_summary(terminalreporter):
        if skipped:
            terminalreporter.write_line(f"{len(skipped)} tests skipped: {SKIP_REASON} "
                                        f"({REQUIRE_ENV}=1 makes this an error)", yellow=True)

    return pytest_configure, pytest_collection_modifyitems, pytest_terminal_summary
