"""The package as a user gets it: `python -m build` makes the sdist and, from the sdist, the wheel, out of the files a
clone has; the wheel, installed into a fresh virtual environment, runs `stallhound triage` and `stallhound serve`
(through the MCP SDK's stdio client).

Offline and honest about it: the build runs without isolation (this environment's setuptools); pip installs only the
wheel into the fresh environment (--no-index --no-deps), which sees this environment's site-packages for the
dependencies through a .pth file, after its own; `pip check` then confirms the wheel's declared dependencies are met,
and the tests check that stallhound itself is imported from the fresh environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import text_of
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from packaging.requirements import Requirement

from release.meta import NAME, PROJECT, VERSION, mcp_name
from stallhound.model.cache import CACHE_ENV
from stallhound.server.app import build_server
from stallhound.synth import SynthConfig, write_sample

ROOT = Path(__file__).resolve().parents[1]
PLANTED_CAUSE = {  # planted problems of the synthetic sample -> the root cause triage names for each
    "pageable_h2d": "pageable-host-memory", "device_sync": "excessive-synchronization",
    "tiny_kernels": "small-kernel-overhead", "small_d2h": "blocking-d2h-sync",
}


def _clone_files() -> list[str]:
    """What a clone of this checkout would hold: tracked files and new ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    return sorted(name for name in os.fsdecode(listed).split("\0") if name and (ROOT / name).is_file())


def _one(paths) -> Path:
    found = list(paths)
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    clone = tmp_path_factory.mktemp("clone")
    for name in _clone_files():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, clone / name)
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(clone)],
                          capture_output=True, text=True, cwd=clone, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"sdist": _one(dist.glob("*.tar.gz")), "wheel": _one(dist.glob("*.whl"))}


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    own = subprocess.run([env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    here = sysconfig.get_paths()
    Path(own, "dependencies.pth").write_text("\n".join(sorted({here["purelib"], here["platlib"]})) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "--quiet",
                    "--no-index", "--no-deps", str(built["wheel"])], check=True)
    return env


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The user's folder the installed command runs in: profiles in it, the cache folder under it."""
    return tmp_path_factory.mktemp("home")


def _env(venv: Path, home: Path) -> dict[str, str]:
    """A user's environment: nothing of this checkout (no PYTHONPATH), the fresh environment first on PATH."""
    return {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home), CACHE_ENV: str(home / "cache")}


def _run(venv: Path, home: Path, *args) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=home, env=_env(venv, home),
                          timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def triaged(venv, home) -> tuple[Path, list[str], dict]:
    """A sample with planted problems, triaged by the installed command: (path, root causes, truth)."""
    sample = home / "profiles" / "sample.sqlite"
    sample.parent.mkdir()
    truth = write_sample(sample, SynthConfig.demo(devices=1, iterations=4))
    triage = json.loads(_run(venv, home, venv / "bin" / "stallhound", "triage", sample, "--json").stdout)
    return sample, [f["root_cause"] for f in triage["findings"]], truth


def test_packaging_sdist_and_wheel_carry_every_file_of_the_package(built):
    package = {name.removeprefix("src/") for name in _clone_files() if name.startswith("src/stallhound/")}
    assert any(n.endswith(".sql") for n in package) and any(n.endswith(".js") for n in package)
    wheel = zipfile.ZipFile(built["wheel"])
    info = f"{NAME}-{VERSION}.dist-info"
    assert {n for n in wheel.namelist() if not n.startswith(info + "/")} == package
    assert {n.split("/")[0] for n in wheel.namelist()} == {"stallhound", info}  # one namespace, nothing else
    with tarfile.open(built["sdist"]) as sdist:
        top = f"{NAME}-{VERSION}/src/"
        assert {n.removeprefix(top) for n in sdist.getnames() if n.startswith(top) and sdist.getmember(n).isfile()
                and "egg-info" not in n} == package
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in metadata and f"Summary: {PROJECT['description']}\n" in metadata
    required = {str(Requirement(line.removeprefix("Requires-Dist: "))) for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line}
    assert required == {str(Requirement(dep)) for dep in PROJECT["dependencies"]}
    assert f"<!-- mcp-name: {mcp_name()} -->" in metadata  # the registry finds it in the description on PyPI


def test_packaging_installed_wheel_triages_a_sample(venv, home, triaged):
    python = venv / "bin" / "python"
    where = _run(venv, home, python, "-c", "import stallhound; print(stallhound.__file__, stallhound.__version__)")
    path, version = where.stdout.split()
    assert Path(path).is_relative_to(venv) and version == VERSION
    assert _run(venv, home, sys.executable, "-m", "pip", "--python", python, "check").returncode == 0
    _, causes, truth = triaged
    planted = {p["kind"] for p in truth["planted"]} & PLANTED_CAUSE.keys()
    assert planted == PLANTED_CAUSE.keys()
    assert {PLANTED_CAUSE[kind] for kind in planted} <= set(causes), causes


async def _registered_tools(folder: Path) -> set[str]:
    async with Client(build_server([folder])) as client:
        return {t.name for t in (await client.list_tools()).tools}


@pytest.mark.anyio
async def test_packaging_installed_server_answers_a_stdio_client(venv, home, triaged):
    sample, causes, _ = triaged
    params = StdioServerParameters(command=str(venv / "bin" / "stallhound"), env=_env(venv, home),
                                   args=["serve", "--root", str(sample.parent)])
    async with Client(params) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool("triage", {"profile": str(sample)})
    assert listed == await _registered_tools(sample.parent)
    assert not result.is_error, text_of(result)
    assert [f["root_cause"] for f in result.structured_content["findings"]] == causes
