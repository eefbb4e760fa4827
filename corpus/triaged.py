"""Triage of one corpus file, in-process: the result (every finding, not just the first ten), the texts a user reads,
and the capture's span. `python -m corpus.triaged FILE` prints it as JSON, so review.py can run each profile in its
own process (a crash or a hang costs one row, not the review)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import stallhound.tools.triage as triage
from stallhound import tools
from stallhound.analysis.contracts import run_skill
from stallhound.formats import open_profile
from stallhound.model.duck import one_row


@dataclass
class Triaged:
    result: triage.Result
    capture_ns: int | None  # the capture's span: the warmup findings may count time outside triage's window
    seconds: float

    @property
    def text(self) -> str:
        """What a user reads: the plain and the markdown rendering."""
        return triage.render(self.result) + "\n" + triage.render_markdown(self.result)

    @property
    def warmup_tool(self) -> str:
        """The detector whose findings are about the warmup triage's window leaves out."""
        return tools.detectors("warmup")[0][0]

    def to_json(self) -> str:
        return json.dumps({"result": json.loads(self.result.model_dump_json()), "capture_ns": self.capture_ns,
                           "seconds": self.seconds})

    @classmethod
    def from_json(cls, text: str) -> Triaged:
        data = json.loads(text)
        return cls(result=triage.Result.model_validate(data["result"]), capture_ns=data["capture_ns"],
                   seconds=data["seconds"])


def triage_file(path: Path, cache_dir: Path) -> Triaged:
    """Triage every finding of the profile at path (built into cache_dir)."""
    started = time.perf_counter()
    profile = open_profile(path, cache_dir=cache_dir)
    try:
        params = triage.Params(profile=str(path), limit=triage.MAX_FINDINGS)
        result = run_skill(profile.con, triage, params)
        assert isinstance(result, triage.Result), "triage.run returns its Result"
        span = one_row(profile.con.execute("SELECT duration_ns FROM meta"))[0]
    finally:
        profile.close()
    return Triaged(result=result, capture_ns=span, seconds=time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corpus.triaged", description=__doc__)
    parser.add_argument("profile", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="corpus-triage-") as cache:
        print(triage_file(args.profile, Path(cache)).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
