"""Invalid arguments as one sentence: the parameter, what was given and what is valid.

Worded from a JSON schema of the parameters (the tool's published input schema, or a Params model's
for the CLI), so a message names exactly what the client was told it may send.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

MAX_SHOWN_CHARS = 60  # of a rejected value echoed back: enough to recognise it, not a pasted query
# Integers a tool passes on to DuckDB (BIGINT) or Python's C code: JSON has no bound, 10**400 parses.
INT64_MAX = 2**63 - 1


def shown(value: Any) -> str:
    """A rejected value as the client wrote it (JSON), strings quoted as in Python."""
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def _bounded(noun: str, spec: dict[str, Any]) -> str:
    low, high = spec.get("minimum"), spec.get("maximum")
    if low is not None and high is not None:
        return f"{noun} from {low} to {high}"
    limits = [f"{word} {spec[key]}" for key, word in (("minimum", "of at least"), ("exclusiveMinimum", "above"),
                                                      ("maximum", "up to"), ("exclusiveMaximum", "below"))
              if key in spec]
    return " ".join([noun, " and ".join(limits)]) if limits else noun


def _string(spec: dict[str, Any]) -> str:
    shortest, longest = spec.get("minLength", 0), spec.get("maxLength")
    if longest is not None:
        return f"a string of {shortest} to {longest} characters"
    return "a non-empty string" if shortest == 1 else "a string"


def _one(spec: dict[str, Any]) -> str:
    if "enum" in spec or "const" in spec:
        return "one of " + ", ".join(shown(v) for v in spec.get("enum", [spec.get("const")]))
    kind = spec.get("type")
    if kind == "integer":
        return _bounded("an integer", spec)
    if kind == "number":
        return _bounded("a number", spec)
    if kind == "boolean":
        return "true or false"
    if kind == "string":
        return _string(spec)
    if kind == "array":
        return f"a list (each item {_one(spec.get('items', {}))})" if spec.get("items") else "a list"
    return f"a JSON {kind}" if kind else "a valid value"


def expected(spec: dict[str, Any]) -> str:
    """What a parameter accepts, from its JSON schema, e.g. 'an integer of at least 0, or null'."""
    arms = spec.get("anyOf", [spec])
    text = " or ".join(_one(arm) for arm in arms if arm.get("type") != "null")
    return f"{text}, or null" if any(arm.get("type") == "null" for arm in arms) else text


def _located(loc: tuple, properties: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The parameter (or list item, as 'devices[2]') an error is about, and its schema."""
    if not loc:
        return "the arguments", {}
    name, spec = str(loc[0]), properties.get(str(loc[0]), {})
    for part in loc[1:]:
        items = next((arm["items"] for arm in spec.get("anyOf", [spec]) if "items" in arm), None)
        if isinstance(part, int) and items is not None:
            name, spec = f"{name}[{part}]", items
    return name, spec


def explain(error: ValidationError, schema: dict[str, Any]) -> str:
    """One line for a failed validation: each bad parameter once (a union reports one error per arm)."""
    properties = schema.get("properties", {})
    parts: dict[str, str] = {}
    for err in error.errors():
        name, spec = _located(err["loc"], properties)
        if name in parts:
            continue
        if err["type"] == "missing":
            parts[name] = f"{name} is required: {spec.get('description') or expected(spec)}"
        else:
            parts[name] = f"{name} must be {expected(spec)} (got {shown(err['input'])})"
    return "; ".join(parts.values())


def _too_big(value: Any) -> bool:
    if isinstance(value, list):
        return any(_too_big(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX


def _capped(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with its integer arms bounded to 64 bits, as the message words what is valid."""
    def cap(arm: dict[str, Any]) -> dict[str, Any]:
        if arm.get("type") != "integer":
            return arm
        return {**arm, "maximum": min(arm.get("maximum", INT64_MAX), INT64_MAX),
                "minimum": max(arm.get("minimum", -INT64_MAX - 1), -INT64_MAX - 1)}
    return {**spec, "anyOf": [cap(a) for a in spec["anyOf"]]} if "anyOf" in spec else cap(spec)


def out_of_range(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """One line naming the first argument holding an integer beyond 64 bits (no profile's figure is), or None."""
    properties = schema.get("properties", {})
    for name, value in arguments.items():
        if _too_big(value):
            return f"{name} must be {expected(_capped(properties.get(name, {})))} (got {shown(value)})"
    return None


def unknown_arguments(given: list[str], valid: list[str], what: str = "this tool") -> str:
    """One line naming arguments that are not parameters, and the ones that are."""
    names = ", ".join(repr(n) for n in given)
    verb = "is not a parameter" if len(given) == 1 else "are not parameters"
    return f"{names} {verb} of {what} (parameters: {', '.join(valid) or 'none'})"
