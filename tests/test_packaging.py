"""The package as a user gets it: `python -m build` makes the sdist and, from the sdist, the wheel, out of the files a
clone has; the wheel, installed into a fresh virtual environment, runs `stallhound triage` and `stallhound serve`
(through the MCP SDK's stdio client), and packs into the Claude Desktop bundle, which the official packer validates.

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
import tomllib
import zipfile
from pathlib import Path

import jsonschema
import pytest
from conftest import text_of
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from packaging.requirements import Requirement

from release import bundle
from release.meta import NAME, PROJECT, VERSION, mcp_name
from stallhound.model.cache import CACHE_ENV
from stallhound.server.app import build_server
from stallhound.synth import SynthConfig, write_sample

ROOT = Path(__file__).resolve().parents[1]
MCPB_PACKAGE = ROOT / ".tools/mcpb/node_modules/@anthropic-ai/mcpb"
MCPB = ROOT / ".tools/mcpb/node_modules/.bin/mcpb"
PLANTED_CAUSE = {  # planted problems of the synthetic sample -> the root cause triage names for each (its cheap
    # device syncs cost their own time, under the reporting threshold: test_triage's
    # test_triage_does_not_inflate_the_demos_cheap_device_syncs)
    "pageable_h2d": "pageable-host-memory", "tiny_kernels": "small-kernel-overhead", "small_d2h": "blocking-d2h-sync",
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
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a checkout on it counts as installed
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "--quiet",
                    "--no-index", "--no-deps", str(built["wheel"])], check=True, env=alone)
    here = sysconfig.get_paths()  # after the install: pip would take this environment's stallhound as installed
    Path(own, "dependencies.pth").write_text("\n".join(sorted({here["purelib"], here["platlib"]})) + "\n")
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


def test_packaging_bundle_manifest_is_valid_and_the_packer_packs_the_bundle(built, tmp_path):
    if not MCPB.exists():
        pytest.fail("the bundle packer is not installed: run `make test` (it installs it with npm)")
    staged = bundle.stage(built["wheel"], tmp_path / "bundle")
    manifest = json.loads((staged / "manifest.json").read_text())
    schema = json.loads((MCPB_PACKAGE / "dist" / f"mcpb-manifest-v{manifest['manifest_version']}.schema.json")
                        .read_text())
    jsonschema.validate(manifest, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema does hold a manifest to its fields
        jsonschema.validate({**manifest, "user_config": {"cache_folder": {"type": "directory"}}}, schema)
    packed = tmp_path / "stallhound.mcpb"
    done = subprocess.run([str(MCPB), "pack", str(staged), str(packed)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "validation passes" in done.stdout, done.stdout + done.stderr
    wheel = f"wheels/{built['wheel'].name}"
    archive = zipfile.ZipFile(packed)
    assert sorted(archive.namelist()) == sorted(["manifest.json", "pyproject.toml", bundle.ENTRY, wheel])
    assert archive.read(wheel) == built["wheel"].read_bytes()
    assert json.loads(archive.read("manifest.json")) == manifest and manifest["version"] == VERSION
    project = tomllib.loads(archive.read("pyproject.toml").decode())
    assert project["project"]["dependencies"] == [f"{NAME}=={VERSION}"]
    assert project["tool"]["uv"]["sources"][NAME] == {"path": wheel}


def _as_the_host_runs_it(manifest: dict, folder: Path, profiles: list[Path], cache: Path) -> tuple[list[str], dict]:
    """The bundle's command line with the manifest's variables filled in as the host does (a folder list expands
    to one argument each), less `uv run --directory`: the entry point then runs on the installed wheel."""
    config = manifest["server"]["mcp_config"]
    assert config["command"] == "uv" and config["args"][:4] == ["run", "--directory", "${__dirname}", bundle.ENTRY]
    args: list[str] = []
    for arg in config["args"][3:]:
        args += [str(p) for p in profiles] if arg == "${user_config.profile_folders}" else [
            arg.replace("${__dirname}", str(folder))]
    env = {k: v.replace("${user_config.cache_folder}", str(cache)) for k, v in config["env"].items()}
    return [str(folder / args[0]), *args[1:]], env


@pytest.mark.anyio
async def test_packaging_bundle_entry_point_serves_the_folders_the_user_chose(built, venv, home, triaged, tmp_path):
    sample = triaged[0]
    staged = bundle.stage(built["wheel"], tmp_path / "bundle")
    manifest = json.loads((staged / "manifest.json").read_text())
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copyfile(sample, outside / "copy.sqlite")
    args, env = _as_the_host_runs_it(manifest, staged, [tmp_path / "bundle", sample.parent], home / "bundle-cache")
    params = StdioServerParameters(command=str(venv / "bin" / "python"), args=args, env={**_env(venv, home), **env})
    async with Client(params) as client:
        loaded = await client.call_tool("load_profile", {"path": str(sample)})  # in the second folder chosen
        refused = await client.call_tool("load_profile", {"path": str(outside / "copy.sqlite")})
    assert not loaded.is_error and loaded.structured_content["path"] == str(sample)
    assert refused.is_error and "outside" in text_of(refused), text_of(refused)
    assert list((home / "bundle-cache").iterdir())  # the model went to the cache folder the user chose
