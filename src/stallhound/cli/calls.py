"""Calling a tool from the command line: its Params from -p KEY=VALUE strings, and its result printed within the
budget."""

from __future__ import annotations

from types import ModuleType

from pydantic import BaseModel, ValidationError

from stallhound.model.errors import BadParam
from stallhound.server import budget
from stallhound.server.validation import explain, out_of_range, unknown_arguments


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
        params = module.Params.model_validate_strings(values)
    except ValidationError as exc:
        raise BadParam(explain(exc, module.Params.model_json_schema())) from exc
    if (beyond := out_of_range(dict(params), module.Params.model_json_schema())) is not None:
        raise BadParam(beyond)
    return params


def print_fitted(result: BaseModel, module: ModuleType, params: BaseModel, form: str = "text") -> BaseModel:
    """Print a tool's result, cut to STALLHOUND_MAX_RESULT_CHARS only when that is set (see server.budget), as
    `form`: "json" (the structured result), "markdown" (the module's render_markdown) or "text" (its render).
    Returns the result as printed."""
    text, fitted = budget.fit(result, module, params, budget.configured())
    print({"json": lambda: fitted.model_dump_json(indent=2), "markdown": lambda: module.render_markdown(fitted),
           "text": lambda: text}[form]())
    return fitted
