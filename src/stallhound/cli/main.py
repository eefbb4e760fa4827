"""The `stallhound` command: serve over MCP, run any tool from the shell, triage, make samples. Each subcommand
module adds its parser and handler (`register(subparsers)`, which sets `run`); main lists them in SUBCOMMANDS, in
the order `--help` shows them, runs the one asked for and words its StallhoundError as one line."""

from __future__ import annotations

import argparse
import os
import sys

from stallhound import __version__
from stallhound.cli import diff, job, report, serve, synth, tool
from stallhound.model import allocator
from stallhound.model.errors import StallhoundError
from stallhound.server.wording import writers

EXIT_USAGE = 2
SUBCOMMANDS = (serve, tool, diff, job, report, synth)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="stallhound", description=f"Read GPU profiles ({writers()}), for people and "
                                                               "AI assistants (MCP).")
    ap.add_argument("--version", action="version", version=f"stallhound {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    allocator.tune()
    try:
        return args.run(args)
    except StallhoundError as exc:
        print(f"stallhound: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stallhound: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `stallhound ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
