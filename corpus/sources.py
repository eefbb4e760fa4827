"""Every profile of the corpus: the [[profile]] tables of corpus/sources/*.toml, checked, and where each one's file is.

Three origins, told apart by the key that names the file:
  fixture = "nsys/x.sqlite"       a shared fixture, read in place from ../shared/fixtures (FIXTURES_ROOT);
  repo/commit/path                a file someone published: never committed here, restored by restore.py into the
                                  corpus cache ($STALLHOUND_CORPUS, default ~/.cache/stallhound-corpus) as
                                  <name><suffix of path>;
  capture = "captures/x.sqlite.gz" our own capture, committed under corpus/captures with the program that made it.
Every profile carries the sha256 and size of that file; a file whose hash differs is an error, never used.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import re
import shutil
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath

CORPUS = Path(__file__).resolve().parent
ROOT = CORPUS.parent
SOURCES = CORPUS / "sources"
FIXTURES_ROOT = ROOT.parent / "shared" / "fixtures"
CACHE_ENV = "STALLHOUND_CORPUS"
DEFAULT_CACHE = "~/.cache/stallhound-corpus"
RESTORE_HINT = "run `make corpus-restore`"

FORMAT_SUFFIXES = {"nsys": (".sqlite", ".sqlite.gz"), "kineto": (".json", ".json.gz")}
# The license a published profile comes under, as an SPDX id: a permissive one, a GNU one, LicenseRef-<name> for
# terms of its own, "other" with license_text (the terms, quoted), or "none" for a file published without a license
# (listed and restored for local review, never committed)
LICENSES = frozenset({"MIT", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "MPL-2.0", "ISC", "Unlicense", "CC0-1.0",
                      "CC-BY-4.0", "other", "none"})
OTHER_LICENSE = re.compile(r"^((A|L)?GPL-[23]\.[01](-only|-or-later)?|LicenseRef-[A-Za-z0-9.-]+)$")
MAX_CAPTURE_BYTES = 3 * 1024 * 1024  # a committed capture stays small (gzipped where that keeps it under)
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
SHORT_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")  # a fixture's source, as its README recorded it

COMMON = ("name", "format", "kind", "version", "what", "license", "sha256", "bytes")
REQUIRED = {"fixture": (*COMMON, "fixture"), "public": (*COMMON, "repo", "commit", "path"),
            "capture": (*COMMON, "capture", "program")}
OPTIONAL = {"fixture": ("repo", "commit", "path", "license_text"), "public": ("license_text",),
            "capture": ("license_text",)}


class CorpusError(Exception):
    """The corpus's sources are wrong, or a profile's file is not the one they name."""


@dataclass(frozen=True)
class Profile:
    """One [[profile]] of a sources file (see the module docstring for the three origins)."""
    name: str
    origin: str  # fixture, public or capture
    format: str
    kind: str  # the program kind as a person reads it (pytorch-ddp, cuda-c++, mpi+cuda, ...)
    version: str  # of the profiler that wrote it: "nsys 2023.3.1", "torch 2.1"
    what: str
    license: str
    sha256: str
    bytes: int
    sources_file: str
    fixture: str = ""
    capture: str = ""
    program: str = ""
    repo: str = ""
    commit: str = ""
    path: str = ""
    license_text: str = ""

    @property
    def stored_name(self) -> str:
        """The file's name in the corpus cache: the profile's name and the suffix of its format."""
        source = PurePosixPath(self.fixture or self.capture or self.path).name
        suffix = next(s for s in sorted(FORMAT_SUFFIXES[self.format], key=len, reverse=True) if source.endswith(s))
        return self.name + suffix

    @property
    def source(self) -> str:
        """Where it came from, as the manifest cites it: owner/repo@commit:path, or the committed file."""
        if self.origin == "capture":
            return f"corpus/{self.capture} (made by corpus/{self.program})"
        if not self.repo:
            return f"shared fixture {self.fixture}"
        return f"{self.repo}@{self.commit[:12]}:{self.path}" if self.commit else f"{self.repo}:{self.path}"


def cache_dir() -> Path:
    """The folder restored public profiles live in ($STALLHOUND_CORPUS, else ~/.cache/stallhound-corpus)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def load(folder: Path = SOURCES) -> list[Profile]:
    """Every profile of folder/*.toml, in file then table order; CorpusError lists every problem found."""
    profiles: list[Profile] = []
    problems: list[str] = []
    for toml in sorted(folder.glob("*.toml")):
        try:
            tables = tomllib.loads(toml.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"{toml.name}: not TOML: {exc}")
            continue
        problems += [f"{toml.name}: unknown top-level key {k!r} (only [[profile]] tables)" for k in tables
                     if k != "profile"]
        for i, table in enumerate(tables.get("profile", []), start=1):
            where = f"{toml.name} profile {i} ({table.get('name', '?')})"
            found = _checked(table, where)
            problems += found
            if not found:
                profiles.append(_profile(table, toml.name))
    seen: set[str] = set()
    for p in profiles:
        if p.name in seen:
            problems.append(f"{p.sources_file}: name {p.name!r} is used twice: names are unique in the corpus")
        seen.add(p.name)
    if problems:
        raise CorpusError("corpus/sources:\n  " + "\n  ".join(problems))
    return profiles


def origin_of(table: dict) -> str:
    return "fixture" if "fixture" in table else "capture" if "capture" in table else "public"


def _profile(table: dict, sources_file: str) -> Profile:
    known = {f.name for f in fields(Profile)}
    return Profile(origin=origin_of(table), sources_file=sources_file,
                   **{k: v for k, v in table.items() if k in known})


def _checked(table: dict, where: str) -> list[str]:
    """The problems of one [[profile]] table, each a line naming it."""
    origin = origin_of(table)
    allowed = set(REQUIRED[origin]) | set(OPTIONAL[origin])
    problems = [f"{where}: missing {k}" for k in REQUIRED[origin] if k not in table]
    problems += [f"{where}: unknown key {k!r} for a {origin} profile" for k in table if k not in allowed]
    problems += [f"{where}: {k} must be a non-empty one-line string" for k in allowed - {"bytes"}
                 if k in table and not (isinstance(table[k], str) and table[k].strip() and "\n" not in table[k])]
    if problems:
        return problems
    return [f"{where}: {p}" for p in _field_problems(table, origin)]


def _field_problems(t: dict, origin: str) -> list[str]:
    problems = []
    if not NAME.match(t["name"]):
        problems.append(f"name {t['name']!r} is not a lower-case file stem ({NAME.pattern})")
    if t["format"] not in FORMAT_SUFFIXES:
        return problems + [f"format {t['format']!r} is not one of {sorted(FORMAT_SUFFIXES)}"]
    file = t.get("fixture") or t.get("capture") or t["path"]
    if not file.endswith(FORMAT_SUFFIXES[t["format"]]):
        problems.append(f"{file!r} does not end like a {t['format']} file {FORMAT_SUFFIXES[t['format']]}")
    if file.startswith("/") or ".." in PurePosixPath(file).parts:
        problems.append(f"{file!r} must be a relative path inside its folder")
    if not SHA256.match(t["sha256"]):
        problems.append("sha256 must be 64 lower-case hex digits")
    if not isinstance(t["bytes"], int) or isinstance(t["bytes"], bool) or t["bytes"] <= 0:
        problems.append("bytes must be the file's size, a positive integer")
    if t["license"] not in LICENSES and not OTHER_LICENSE.match(t["license"]):
        problems.append(f"license {t['license']!r} is not one of {sorted(LICENSES)}, a GNU license or LicenseRef-...")
    if (t["license"] == "other") != ("license_text" in t):
        problems.append("license = 'other' goes with license_text (the terms, quoted), and only it")
    if "repo" in t and not REPO.match(t["repo"]):
        problems.append(f"repo {t['repo']!r} is not owner/name")
    if "commit" in t and not (COMMIT if origin == "public" else SHORT_COMMIT).match(t["commit"]):
        problems.append("commit must be the full 40-hex-digit commit" if origin == "public" else "commit is hex")
    if origin == "capture":
        problems += _capture_problems(t)
    return problems


def _capture_problems(t: dict) -> list[str]:
    problems = []
    if not t["capture"].startswith("captures/"):
        problems.append("a capture lives under corpus/captures/")
    if not (CORPUS / t["program"]).is_file():
        problems.append(f"program {t['program']!r} (the code that made the capture) is not in corpus/")
    if t["bytes"] > MAX_CAPTURE_BYTES:
        problems.append(f"a committed capture is at most {MAX_CAPTURE_BYTES} bytes: gzip it or capture less")
    return problems


def stored(profile: Profile, cache: Path | None = None) -> Path:
    """Where the profile's file is (or, for a public one, goes once restored)."""
    if profile.origin == "fixture":
        return FIXTURES_ROOT / profile.fixture
    if profile.origin == "capture":
        return CORPUS / profile.capture
    return (cache or cache_dir()) / profile.stored_name


@functools.cache
def _sha256_of(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    """The file's sha256, computed once per process for a given size and modification time."""
    stat = path.stat()
    return _sha256_of(path, stat.st_size, stat.st_mtime_ns)


def verify(profile: Profile, path: Path) -> str | None:
    """Why the file at path is not the profile's (size or sha256 differ), or None when it is."""
    size = path.stat().st_size
    if size != profile.bytes:
        return f"{path} has {size} bytes, the sources say {profile.bytes}"
    if sha256(path) != profile.sha256:
        return f"{path}'s sha256 is not the {profile.sha256[:12]}... the sources name"
    return None


def resolve(profile: Profile, cache: Path | None = None) -> Path | None:
    """A path stallhound can open for the profile, or None when its file is not here (not restored, no fixtures).
    A file that is here but not the one the sources name raises CorpusError; a gzipped export is unpacked into the
    cache once."""
    path = stored(profile, cache)
    if not path.is_file():
        return None
    wrong = verify(profile, path)
    if wrong:
        raise CorpusError(f"{profile.name}: {wrong}: {RESTORE_HINT} (or fix its [[profile]] in "
                          f"corpus/sources/{profile.sources_file})")
    if path.name.endswith(".sqlite.gz"):
        return _unpacked(profile, path, cache or cache_dir())
    return path


def _unpacked(profile: Profile, packed: Path, cache: Path) -> Path:
    target = cache / "unpacked" / f"{profile.name}-{profile.sha256[:12]}.sqlite"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        with gzip.open(packed, "rb") as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        partial.replace(target)
    return target
