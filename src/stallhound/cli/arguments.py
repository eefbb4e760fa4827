"""What the subcommands share: the subparsers they register on, the profile cache options, -p KEY=VALUE, and
printing a result within the budget."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from stallhound.model.errors import BadParam
from stallhound.server import budget
from stallhound.server.validation import explain, unknown_arguments


class Subcommands(Protocol):
    """argparse's subparsers, where each subcommand module's `register` adds its parser."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_profile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", type=Path, help="where built models are kept (default: $STALLHOUND_CACHE_DIR "
                                                  "or $XDG_CACHE_HOME/stallhound)")
    p.add_argument("--no-cache", action="store_true", help="build the model in a temporary folder, keep nothing")


def add_range_name(p: argparse.ArgumentParser) -> None:
    p.add_argument("--range-name", metavar="NAME", help="the NVTX or record_function range that marks one step, e.g. "
                                                        "train_step (letters compared, case and numbers ignored); "
                                                        "default: the steps found automatically")


def range_name_pairs(args: argparse.Namespace) -> list[str]:
    """--range-name as the KEY=VALUE pairs parse_params reads."""
    return [] if args.range_name is None else [f"range_name={args.range_name}"]


def parse_params(module: ModuleType, profile: str, pairs: list[str], as_field: str = "profile",
                 **fixed: str) -> BaseModel:
    """The tool's Params from -p KEY=VALUE strings, parsed as the types say ("0" is device 0, "true" a bool);
    the profile goes in as `as_field`, with `fixed` values beside it (diff's `after`)."""
    values: dict[str, str] = {as_field: profile, **fixed}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise BadParam(f"--param {pair!r} is not KEY=VALUE; e.g. -p device=0")
        values[key] = value
    valid = [k for k in module.Params.model_fields if k != as_field and k not in fixed]
    unknown = [k for k in values if k not in module.Params.model_fields]
    if unknown:
        raise BadParam(unknown_arguments(unknown, valid))
    try:
        return module.Params.model_validate_strings(values)
    except ValidationError as exc:
        raise BadParam(explain(exc, module.Params.model_json_schema())) from exc


def print_fitted(result: BaseModel, module: ModuleType, params: BaseModel, form: str = "text") -> BaseModel:
    """Print a tool's result, cut to STALLHOUND_MAX_RESULT_CHARS only when that is set (see server.budget), as
    `form`: "json" (the structured result), "markdown" (the module's render_markdown) or "text" (its render).
    Returns the result as printed."""
    text, fitted = budget.fit(result, module, params, budget.configured())
    print({"json": lambda: fitted.model_dump_json(indent=2), "markdown": lambda: module.render_markdown(fitted),
           "text": lambda: text}[form]())
    return fitted
