"""One character budget for every tool result: its text and its structured content each stay within it.

`fit` takes a skill's result; when its JSON or its rendered text is over the budget it cuts the largest row lists
first (top-level lists of objects or rows; findings last; each down to one row), then, if needed, long text values,
re-rendering after each change so both forms are measured. A cut result says so: `truncated`, `cut_by`
('limit' when the tool's own row limit left rows out, 'characters' when the budget did) and `cut_note` (what was
cut and which parameter to change), and its text ends with that note. The budget is MAX_RESULT_CHARS, or
STALLHOUND_MAX_RESULT_CHARS (`stallhound serve --max-result-chars` sets it). The CLI applies a budget only when that
variable is set: a person at a terminal who asks for limit=500 reads 500 rows; an assistant's context cannot.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Protocol, cast

from pydantic import BaseModel

from stallhound.analysis.common import Paged
from stallhound.model.errors import BudgetSettingInvalid, ResultTooLarge

MAX_RESULT_CHARS = 20_000  # characters, text and JSON each: about 5,000 tokens, a fair share of a model's context
MIN_RESULT_CHARS = 4_000  # characters: below this some results (scope, figures, one row) fit on no fixture
ENV = "STALLHOUND_MAX_RESULT_CHARS"
NOTE_CHARS = 400  # characters kept free in each form for the cut note
NOTE_PREFIX = "\ncut: "  # the text's last line: the cut note
MIN_VALUE_CHARS = 40  # characters a cut text value keeps: fewer would not name anything
KEPT_LAST = ("findings",)  # the conclusions: cut only after every other row list
NARROWING = ("device", "start_ns", "end_ns", "pattern", "table", "phase")  # parameters that ask for less


def configured() -> int | None:
    """The budget STALLHOUND_MAX_RESULT_CHARS sets, or None when it is unset."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < MIN_RESULT_CHARS:
        raise BudgetSettingInvalid(f"{ENV}={raw!r} is not a number of characters of at least {MIN_RESULT_CHARS:,}; "
                                   f"set it to {MIN_RESULT_CHARS:,} or more (default {MAX_RESULT_CHARS:,}) or unset it")
    return int(raw)


def server_budget() -> int:
    return configured() or MAX_RESULT_CHARS


def fit(result: BaseModel, module: ModuleType, params: BaseModel, max_chars: int | None) -> tuple[str, BaseModel]:
    """(text, result) for `module`'s result, both forms within `max_chars` (None: no budget, only the limit note)."""
    data = result.model_dump(mode="json")
    if data.get("truncated"):
        data |= {"cut_by": "limit", "cut_note": _limit_note(module, params)}
        model, text = _rendered(module, data)
    else:  # nothing to add: the result as it is (no round trip through validation on every call)
        model, text = result, module.render(result)
    if max_chars is None or _size(data, text) <= max_chars:
        return text, model
    room = max_chars - NOTE_CHARS
    limit_cut = data.get("truncated")
    data |= {"cut_by": "characters", "cut_note": None} | ({"truncated": True} if "truncated" in data else {})
    paged = module.Result.page_field if issubclass(module.Result, Paged) else None
    page_rows = len(data.get(paged) or []) if paged else 0
    kept = _cut_rows(module, data, room)
    if paged and len(data.get(paged) or []) < page_rows:
        data["next_offset"] = data.get("offset", 0) + len(data[paged])  # the next page starts after the rows kept
    if not kept and "truncated" in data:  # only text values were cut: every row is still there
        data["truncated"] = limit_cut
    values = _cut_values(module, data, room)
    if values is None:
        raise ResultTooLarge(f"this result does not fit in {max_chars:,} characters even cut to one row of "
                             f"{MIN_VALUE_CHARS}-character values; {_asking_less(module, params)}, or raise {ENV}")
    cap, count = values
    parts = ([f"kept {', '.join(kept)}"] if kept else []) + (
        [f"cut {count:,} long text value{'s' if count > 1 else ''} to {cap:,} characters"] if count else []) + (
        ["`limit` left more rows out"] if limit_cut and not kept else [])
    note = f"cut to fit the {max_chars:,}-character result budget ({'; '.join(parts)}); {_asking_less(module, params)}"
    data["cut_note"] = note[:NOTE_CHARS - len(NOTE_PREFIX)]
    model, text = _rendered(module, data)
    return f"{text}{NOTE_PREFIX}{data['cut_note']}", model


def _rendered(module: ModuleType, data: dict[str, Any]) -> tuple[BaseModel, str]:
    model = module.Result.model_validate(data)
    return model, module.render(model)


def _size(data: dict[str, Any], text: str) -> int:
    return max(len(json.dumps(data)), len(text))


def _fits(module: ModuleType, data: dict[str, Any], room: int) -> bool:
    return _size(data, _rendered(module, data)[1]) <= room


def _largest(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The largest n in lo..hi with ok(n), for ok true up to some n and false after; None when ok(lo) is false."""
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _cut_rows(module: ModuleType, data: dict[str, Any], room: int) -> list[str]:
    """Shorten the row lists in `data`, largest first and findings last, until it fits; 'n of m name' per cut."""
    lists = [k for k, v in data.items() if isinstance(v, list) and len(v) > 1 and isinstance(v[0], dict | list)]
    kept = []
    for key in sorted(lists, key=lambda k: (k in KEPT_LAST, -len(json.dumps(data[k])))):
        if _fits(module, data, room):
            break
        full = data[key]
        def fits(n: int, key: str = key, full: list = full) -> bool:
            return _fits(module, {**data, key: full[:n]}, room)
        n = _largest(fits, 1, len(full)) or 1
        data[key] = full[:n]
        kept.append(f"{n:,} of {len(full):,} {key}")
    return kept


def _cut_values(module: ModuleType, data: dict[str, Any], room: int) -> tuple[int, int] | None:
    """Cut the text values in `data` longer than the longest cap that fits: (cap, values cut), (0, 0) when none
    needed cutting, None when even MIN_VALUE_CHARS does not fit."""
    if _fits(module, data, room):
        return 0, 0
    lengths = list(_lengths(data))
    cap = _largest(lambda c: _fits(module, _capped(data, c), room), MIN_VALUE_CHARS, max(lengths, default=0))
    if cap is None:
        return None
    data.update(_capped(data, cap))
    return cap, sum(n > cap for n in lengths)


def _lengths(value: Any) -> Iterator[int]:
    if isinstance(value, str):
        yield len(value)
    elif isinstance(value, list | dict):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _lengths(v)


def _capped(value: Any, cap: int) -> Any:
    if isinstance(value, str) and len(value) > cap:
        return f"{value[:cap]}... [{len(value) - cap:,} more characters]"
    if isinstance(value, list):
        return [_capped(v, cap) for v in value]
    if isinstance(value, dict):
        return {k: _capped(v, cap) for k, v in value.items()}
    return value


class _Limited(Protocol):
    limit: int
    offset: int  # only where the Params has the field


def _limit_note(module: ModuleType, params: BaseModel) -> str:
    info = type(params).model_fields.get("limit")
    if info is None:
        return f"more rows exist than were returned; {_asking_less(module, params)}"
    asked = cast(_Limited, params)  # its model has the field `limit`, and `offset` where page is worded
    top = min(m.le for m in info.metadata if getattr(m, "le", None) is not None)
    page = (f"; ask again with `offset`={asked.offset + asked.limit:,} for the next page"
            if "offset" in type(params).model_fields else "")
    if asked.limit < top:
        return (f"more rows exist than `limit`={asked.limit:,} returned; raise `limit` (up to {top:,}) to see "
                f"more{page}")
    return (f"more rows exist than the largest `limit` ({top:,}) returns; "
            f"{_asking_less(module, params, lower=False)}{page}")


def _asking_less(module: ModuleType, params: BaseModel, lower: bool = True) -> str:
    """How to ask this tool for a smaller answer: its own hint (CUT_HINT) or the parameters that narrow it."""
    fields = type(params).model_fields
    narrowing = [f"`{f}`" for f in NARROWING if f in fields]
    ways = (["lower `limit`"] if lower and "limit" in fields else []) + (
        [f"narrow {', '.join(narrowing)}"] if narrowing else []) + [getattr(module, "CUT_HINT", "")]
    return " or ".join(w for w in ways if w) or "ask for less"
