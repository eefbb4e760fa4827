"""`make corpus-restore`: every public profile of corpus/sources into the corpus cache ($STALLHOUND_CORPUS, default
~/.cache/stallhound-corpus), each checked against its sha256. From local bare git mirrors when --mirror-root is
given (DIR/<owner>+<name>/.../HEAD and objects; `git cat-file blob COMMIT:PATH`), else (or when the mirror lacks it,
unless --offline) from raw.githubusercontent.com at the recorded commit. Says per file: restored, already there or
failed and why; exits 1 when any failed. Developer tooling: the product itself never reads the network."""

from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from corpus import sources
from corpus.sources import Profile

RAW_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
NETWORK_TIMEOUT_S = 60  # one file; a stalled connection fails the file, not the run
GIT_TIMEOUT_S = 120
MIRROR_DEPTH = 3  # DIR/<owner>+<name>/<at most this many folders>/HEAD


class Unavailable(Exception):
    """One source cannot give the file; the message says why."""


def git_dir(mirror_root: Path, repo: str) -> Path:
    """The bare git directory of repo's mirror under mirror_root (the first folder holding HEAD and objects/)."""
    top = mirror_root / repo.replace("/", "+")
    if not top.is_dir():
        raise Unavailable(f"no mirror of {repo} in {mirror_root}")
    for depth in range(MIRROR_DEPTH + 1):
        for head in sorted(top.glob("/".join(["*"] * depth + ["HEAD"]))):
            if (head.parent / "objects").is_dir():
                return head.parent
    raise Unavailable(f"{top} holds no git directory (HEAD and objects/)")


def from_mirror(profile: Profile, mirror_root: Path) -> bytes:
    where = git_dir(mirror_root, profile.repo)
    done = subprocess.run(["git", f"--git-dir={where}", "cat-file", "blob", f"{profile.commit}:{profile.path}"],
                          capture_output=True, timeout=GIT_TIMEOUT_S)
    if done.returncode != 0:
        raise Unavailable(f"mirror {where}: {done.stderr.decode(errors='replace').strip() or 'git failed'}")
    return done.stdout


def from_github(profile: Profile) -> bytes:
    url = RAW_URL.format(repo=profile.repo, commit=profile.commit, path=urllib.parse.quote(profile.path))
    try:
        with urllib.request.urlopen(url, timeout=NETWORK_TIMEOUT_S) as response:
            return response.read()
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise Unavailable(f"{url}: {getattr(exc, 'reason', exc)}") from exc


def _fetched(profile: Profile, mirror_root: Path | None, offline: bool) -> tuple[bytes, str]:
    """The file's bytes and where they came from; Unavailable says why no source gave them."""
    why = []
    if mirror_root is not None:
        try:
            return from_mirror(profile, mirror_root), "mirror"
        except Unavailable as exc:
            why.append(str(exc))
    if not offline:
        try:
            return from_github(profile), "github"
        except Unavailable as exc:
            why.append(str(exc))
    raise Unavailable("; ".join(why) or "no source: --offline without --mirror-root")


def restore(profile: Profile, cache: Path, mirror_root: Path | None, offline: bool) -> tuple[bool, str]:
    """(ok, one line saying what happened) for one public profile."""
    target = sources.stored(profile, cache)
    if target.is_file() and sources.verify(profile, target) is None:
        return True, f"already there  {profile.name}"
    try:
        data, origin = _fetched(profile, mirror_root, offline)
    except Unavailable as exc:
        return False, f"failed         {profile.name}: {exc}"
    partial = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(data)
    wrong = sources.verify(profile, partial)
    if wrong:
        partial.unlink()
        return False, f"failed         {profile.name}: {wrong} (from {origin}: an LFS pointer, or the wrong file?)"
    replaced = " (replaced a file that was not this one)" if target.exists() else ""
    partial.replace(target)
    return True, f"restored       {profile.name} from {origin}, {len(data):,} bytes{replaced}"


def restore_all(names: list[str], mirror_root: Path | None, offline: bool, quiet: bool = False) -> int:
    """Restore the named public profiles (all when none is named); the number that failed."""
    public = [p for p in sources.load() if p.origin == "public" and (not names or p.name in names)]
    unknown = sorted(set(names) - {p.name for p in public})
    if unknown:
        raise SystemExit(f"not public profiles of corpus/sources: {', '.join(unknown)}")
    cache = sources.cache_dir()
    failed = 0
    for profile in public:
        ok, line = restore(profile, cache, mirror_root, offline)
        failed += not ok
        if not quiet:
            print(line, flush=True)
    if not quiet:
        print(f"{len(public) - failed} of {len(public)} public profiles in {cache}"
              + (f"; {failed} failed" if failed else ""))
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corpus.restore", description=__doc__)
    parser.add_argument("names", nargs="*", help="profiles to restore (default: every public one)")
    parser.add_argument("--mirror-root", type=Path, help="folder of bare git mirrors, <owner>+<name>/...")
    parser.add_argument("--offline", action="store_true", help="never fetch from GitHub")
    args = parser.parse_args(argv)
    return 1 if restore_all(args.names, args.mirror_root, args.offline) else 0


if __name__ == "__main__":
    sys.exit(main())
