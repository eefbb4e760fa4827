"""Nsight Systems reports (.nsys-rep, .qdrep): converted by `nsys export` into an SQLite export in the cache."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from stallhound.model.cache import fingerprint
from stallhound.model.errors import ConversionFailed, ConversionNeeded

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
NSYS_EXPORT_TIMEOUT_S = 1800  # a multi-GB report converts in minutes, not hours


def convert_report(report: Path, cache_dir: Path) -> Path:
    """Run `nsys export` on a .nsys-rep into the cache (never beside the report)."""
    nsys = shutil.which("nsys")
    out = cache_dir / "exports" / f"{fingerprint(report)}.sqlite"
    if out.exists():
        return out
    if nsys is None:
        raise ConversionNeeded(
            f"{report} is an Nsight Systems report and `nsys` is not on PATH to convert it; run "
            f"`nsys export --type sqlite --output {report.with_suffix('.sqlite')} {report}` and pass the .sqlite")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConversionFailed(f"the converted export of {report} cannot be written to {out.parent} "
                               f"({exc.strerror}); set STALLHOUND_CACHE_DIR (or --cache-dir) to a writable folder, "
                               "or convert it yourself with `nsys export --type sqlite` and pass the .sqlite") from exc
    tmp = out.with_suffix(".partial.sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(tmp), str(report)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=NSYS_EXPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ConversionFailed(f"`nsys export` on {report} took over {NSYS_EXPORT_TIMEOUT_S} s; "
                               "export it yourself and pass the .sqlite") from exc
    if done.returncode != 0 or not tmp.exists():
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionFailed(f"`nsys export` failed on {report} ({last[0]}); "
                               "check the report opens in the Nsight Systems GUI")
    tmp.replace(out)
    return out
