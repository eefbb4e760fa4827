"""The `stallhound` command: serve over MCP, run any tool from the shell, triage, make samples. Each subcommand
module adds its parser and handler (`register(subparsers)`, which sets `run`); main lists them in SUBCOMMANDS, in
the order `--help` shows them, runs the one asked for and words its StallhoundError as one line.

Parsing is kept cheap, so that `--version`, `--help` and a mistyped option answer at once: a subcommand module
imports at its top only what its parser needs (cli/arguments.py names what the help texts quote from below), and
each handler imports what it runs (the MCP SDK, DuckDB, numpy, the tools) when it runs. tests/test_cli_start.py
fails when parsing imports any of them."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from typing import Any

import stallhound
from stallhound.cli import diff, job, report, serve, synth, tool
from stallhound.cli.arguments import WRITERS
from stallhound.model import allocator
from stallhound.model.errors import StallhoundError, said

EXIT_USAGE = 2
EXIT_DEFECT = 70  # sysexits' EX_SOFTWARE: an error of ours, not of the input
DEBUG_ENV = "STALLHOUND_DEBUG"  # set to print an unforeseen error's traceback below its sentence
GC_YOUNG_OBJECTS = 50_000  # new container objects between two runs of the cyclic garbage collector (CPython: 700)
SUBCOMMANDS = (serve, tool, diff, job, report, synth)


class Version(argparse.Action):
    """--version, as argparse's own, with the version read only when asked (stallhound.__version__ says why)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"stallhound {stallhound.__version__}")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="stallhound", description=f"Read GPU profiles ({WRITERS}), for people and "
                                                               "AI assistants (MCP).")
    ap.add_argument("--version", action=Version)
    sub = ap.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.register(sub)
    return ap


def without_pandas() -> None:
    """Mark pandas absent for the rest of this process unless it is already imported. DuckDB's Python binding tries
    `import pandas` for every bound query parameter (to recognise pandas.NA): where pandas is not installed, each try
    searches sys.path again (about 0.1 s of a cached triage's ~120 queries); where it is, the first try imports all
    of it (about 0.5 s). A command hands DuckDB no DataFrame, so neither is of use to it."""
    sys.modules.setdefault("pandas", None)  # type: ignore[arg-type]  # None in sys.modules: "not importable"


def single_threaded_blas() -> None:
    """One OpenBLAS thread unless the environment says otherwise. numpy's OpenBLAS starts a thread per core when numpy
    is imported (CPU time every command pays, more with more cores), and nothing stallhound runs calls BLAS (no
    matrix products: numpy is used for element-wise passes over arrays)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def fewer_collections() -> None:
    """Run the cyclic garbage collector every GC_YOUNG_OBJECTS new container objects. A triage on a cached model made
    ~115 collections (importing DuckDB, numpy, pydantic and the tools, and building the tools' pydantic models): about
    0.03 s of CPU that freed ~1,600 objects, as reference counting frees what a command makes. Cyclic garbage still
    goes, a few collections later. Not for `serve`: a server lives on, and a collection of 50,000 young objects at
    once would land on one call's round trip."""
    gc.set_threshold(GC_YOUNG_OBJECTS, *gc.get_threshold()[1:])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command != "serve":
        fewer_collections()
    allocator.tune()
    without_pandas()
    single_threaded_blas()
    try:
        return args.run(args)
    except StallhoundError as exc:
        print(f"stallhound: error: {said(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stallhound: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `stallhound ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # noqa: BLE001 - a defect of ours: one line, the traceback on request
        print(f"stallhound: error: {args.command} failed with an error stallhound did not foresee "
              f"({type(exc).__name__}); check the input, and report it with the traceback that {DEBUG_ENV}=1 prints",
              file=sys.stderr)
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        return EXIT_DEFECT


if __name__ == "__main__":
    sys.exit(main())
