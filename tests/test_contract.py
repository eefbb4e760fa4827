"""House rules checked on the code: named errors live in one module; the version is written once."""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import stallhound
from stallhound.model import errors

ROOT = Path(__file__).resolve().parents[1]


def _modules():
    for info in pkgutil.walk_packages(stallhound.__path__, "stallhound."):
        if info.name != "stallhound.__main__":
            yield importlib.import_module(info.name)


def test_errors_every_named_error_lives_in_model_errors():
    elsewhere = sorted(f"{obj.__module__}.{obj.__name__}" for module in _modules() for obj in vars(module).values()
                       if isinstance(obj, type) and issubclass(obj, errors.StallhoundError)
                       and obj.__module__ != errors.__name__)
    assert elsewhere == [], "define these in model/errors.py (import them where they are raised)"
    named = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.StallhoundError)]
    assert len(named) >= 20


def test_version_is_pyprojects_read_from_the_installed_metadata():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert stallhound.__version__ == importlib.metadata.version("stallhound") == declared
    done = subprocess.run([sys.executable, "-m", "stallhound", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == f"stallhound {declared}"


MAX_MODULE_LINES = 400  # a module longer than this holds more than one idea: split it along a seam


def test_no_source_module_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "src").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}, "split these along a seam (CONTRIBUTING.md, Habits)"
