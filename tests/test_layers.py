"""The architecture is the folders: each package of src/stallhound imports only from the packages below it, so data
flows one way (a file's format -> the model -> analysis -> tools -> server, CLI and report) and a module can be read
knowing only what lies under it. The layers, lowest first, and what each may import besides itself:"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "stallhound"

# package -> the packages it may import from (its own is always allowed); `stallhound` alone is the version.
MAY_IMPORT = {
    "model": set(),  # the schema, errors, limits, cache: knows no format and no analysis
    "book": {"model"},  # root causes and questions
    "formats": {"model"},  # each input format builds the model; the registry picks one
    "synth": {"model", "formats"},  # sample nsys exports with planted problems
    "jobs": {"model", "formats"},  # every rank of a run: ranks, Parquet, Dask
    "analysis": {"model", "formats", "jobs", "book"},  # engines shared by tools
    "tools": {"model", "formats", "jobs", "analysis", "book"},  # one module per MCP tool
    "report": {"model", "formats", "jobs", "analysis", "book", "tools"},  # the HTML report and the timeline view
    "server": {"model", "formats", "jobs", "analysis", "book", "tools", "report"},  # MCP wiring and transports
    "cli": {"model", "formats", "jobs", "analysis", "book", "tools", "report", "server", "synth"},  # the command
}


def _imports(path: Path) -> set[str]:
    """The stallhound modules a source file imports (absolute and relative imports, at any depth in the file)."""
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("stallhound")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("stallhound"):
                target = node.module
            else:
                continue
            # `from stallhound import tools` names the package in the imported names, not in the module
            packages = [a.name for a in node.names if target == "stallhound" and a.name in MAY_IMPORT]
            found |= {f"{target}.{name}" for name in packages} if packages else {target}
    return found


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def violations() -> list[str]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        here = _package(".".join(path.relative_to(SRC.parent).with_suffix("").parts))
        if here not in MAY_IMPORT:
            continue  # stallhound/__init__.py (the version) and __main__.py (the command)
        for target in sorted(_imports(path)):
            there = _package(target)
            if there is not None and there != here and there not in MAY_IMPORT[here]:
                out.append(f"{path.relative_to(SRC)} imports {target}")
    return out


def format_crossings() -> list[str]:
    """Imports from one format's folder into another's: each format stands alone, so adding or removing one touches
    its folder and the registry only."""
    formats = SRC / "formats"
    folders = {p.name for p in formats.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    out = []
    for folder in sorted(folders):
        for path in sorted((formats / folder).rglob("*.py")):
            for target in sorted(_imports(path)):
                parts = target.split(".")
                if len(parts) > 2 and parts[1] == "formats" and parts[2] in folders - {folder}:
                    out.append(f"{path.relative_to(SRC)} imports {target}")
    return out


def test_layers_every_package_is_listed():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(MAY_IMPORT)


def test_layers_nothing_imports_upward():
    assert violations() == []


def test_layers_no_format_imports_another():
    assert format_crossings() == []


def test_layers_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The check itself: an analysis module importing a tool is caught, in each form an import can take."""
    root = tmp_path / "stallhound"
    (root / "analysis").mkdir(parents=True)
    (root / "tools").mkdir()
    for package in ("", "analysis", "tools"):
        (root / package / "__init__.py").write_text("")
    (root / "analysis" / "engine.py").write_text("from stallhound.tools import triage\nfrom . import sibling\n")
    (root / "analysis" / "by_name.py").write_text("from stallhound import __version__, tools\n")
    (root / "analysis" / "relative.py").write_text("from .. import tools\n")
    (root / "analysis" / "plain.py").write_text("import stallhound.tools.triage\n")
    (root / "tools" / "tool.py").write_text("from ..analysis import engine\nfrom stallhound import analysis\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", root)
    assert violations() == ["analysis/by_name.py imports stallhound.tools",
                            "analysis/engine.py imports stallhound.tools",
                            "analysis/plain.py imports stallhound.tools.triage",
                            "analysis/relative.py imports stallhound.tools"]


def test_layers_the_check_sees_one_format_importing_another(tmp_path, monkeypatch):
    formats = tmp_path / "stallhound" / "formats"
    for folder in ("", "one", "two"):
        (formats / folder).mkdir(parents=True, exist_ok=True)
        (formats / folder / "__init__.py").write_text("")
    (formats / "one" / "build.py").write_text("from stallhound.formats.two import read\nfrom . import meta\n")
    (formats / "two" / "read.py").write_text("from stallhound.formats import derive\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", formats.parent)
    assert format_crossings() == ["formats/one/build.py imports stallhound.formats.two"]
