"""`python -m release.bundle WHEEL FOLDER`: the folder a Claude Desktop bundle is packed from (`mcpb pack FOLDER`,
as `make bundle` does). The bundle's server is of the uv type: the host installs Python and a virtual environment
with the bundle's pyproject.toml, whose one dependency is stallhound from the wheel inside the bundle, so the
compiled dependencies (DuckDB, NumPy) come for the user's platform. The user picks the folders profiles may be read
from and the cache folder when installing it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from release.meta import DESCRIPTION, NAME, PROJECT, PYTHON, VERSION
from stallhound.model.cache import CACHE_ENV

MANIFEST_VERSION = "0.4"  # the first with the uv server type (mcpb's schemas/mcpb-manifest-v0.4.schema.json)
ENTRY = "server/main.py"
LAUNCHER = Path(__file__).with_name("bundle_main.py")
AUTHOR = "the stallhound authors"
USER_CONFIG = {
    "profile_folders": {"type": "directory", "title": "Profile folders", "multiple": True, "required": True,
                        "description": "Folders stallhound may read profiles from: Nsight Systems exports "
                                       "(.sqlite, .nsys-rep) and torch.profiler traces (.json, .json.gz)"},
    "cache_folder": {"type": "directory", "title": "Cache folder", "required": False,
                     "default": "${HOME}/.cache/stallhound",
                     "description": "Where the model of each loaded profile is kept, so a profile loads once"},
}


def manifest() -> dict[str, Any]:
    run = ["run", "--directory", "${__dirname}", ENTRY, "--root", "${user_config.profile_folders}"]
    return {"manifest_version": MANIFEST_VERSION, "name": NAME, "display_name": NAME, "version": VERSION,
            "description": DESCRIPTION, "author": {"name": AUTHOR}, "license": PROJECT["license"],
            "keywords": ["gpu", "profiling", "nsight-systems", "pytorch", "cuda"],
            "server": {"type": "uv", "entry_point": ENTRY,
                       "mcp_config": {"command": "uv", "args": run, "env": {CACHE_ENV: "${user_config.cache_folder}"}}},
            "tools_generated": True, "prompts_generated": True,
            "compatibility": {"platforms": ["darwin", "linux", "win32"], "runtimes": {"python": PYTHON}},
            "user_config": USER_CONFIG}


def uv_project(wheel: str) -> str:
    """The bundle's pyproject.toml: a project that is not itself installed, needing stallhound from the wheel."""
    return (f'[project]\nname = "{NAME}-bundle"\nversion = "{VERSION}"\nrequires-python = "{PYTHON}"\n'
            f'dependencies = ["{NAME}=={VERSION}"]\n\n[tool.uv]\npackage = false\n\n'
            f'[tool.uv.sources]\n{NAME} = {{ path = "wheels/{wheel}" }}\n')


def stage(wheel: Path, folder: Path) -> Path:
    if wheel.name != f"{NAME}-{VERSION}-py3-none-any.whl":
        raise SystemExit(f"{wheel.name} is not the wheel of {NAME} {VERSION} (pyproject.toml): run `make dist`")
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "wheels").mkdir(parents=True)
    (folder / "server").mkdir()
    shutil.copyfile(wheel, folder / "wheels" / wheel.name)
    shutil.copyfile(LAUNCHER, folder / ENTRY)
    (folder / "pyproject.toml").write_text(uv_project(wheel.name), encoding="utf-8")
    (folder / "manifest.json").write_text(json.dumps(manifest(), indent=2) + "\n", encoding="utf-8")
    return folder


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m release.bundle WHEEL FOLDER")
    stage(Path(args[0]), Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
