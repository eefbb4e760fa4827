"""The root-cause book and question list: every packaged file loads and cross-references resolve."""

from __future__ import annotations

from importlib.resources import files

import pytest

from nsightful.profiles.errors import NsightfulError
from nsightful.resources import book
from nsightful.tools import TOOL_NAMES

SEEDED = (
    "gpu-bubbles", "cpu-bottleneck", "nccl-serialization", "excessive-h2d-transfers", "small-kernel-overhead",
    "kernel-hotspot", "gc-pauses", "compute-communication-imbalance", "module-loading-hot-path",
    "excessive-synchronization",
)
ENTRIES = list(book.load_book().values())
QUESTIONS = book.load_questions()
QUESTION_IDS = {q.id for q in QUESTIONS}


def _by_id(items):
    return pytest.mark.parametrize("item", items, ids=[i.id for i in items])


@_by_id(ENTRIES)
def test_book_entry_fields_are_all_non_empty(item):
    for name, value in item:
        assert value, f"{item.id}: {name} is empty"
    for signal in item.signals:
        assert signal.tool and signal.figure and signal.threshold
    assert all(fix.text.strip() for fix in item.fixes)


@_by_id(ENTRIES)
def test_book_entry_id_equals_file_stem(item):
    assert (files("nsightful.resources") / "book" / f"{item.id}.md").is_file()


def test_book_ids_are_unique_and_cover_the_seeded_entries():
    stems = [p.name.removesuffix(".md") for p in (files("nsightful.resources") / "book").iterdir()
             if p.name.endswith(".md")]
    assert len(stems) == len(set(stems)) == len(ENTRIES)
    assert len(ENTRIES) >= 21
    assert set(SEEDED) <= {e.id for e in ENTRIES}


@_by_id(ENTRIES)
def test_book_signal_tools_are_real_tools(item):
    unknown = [s.tool for s in item.signals if s.tool not in TOOL_NAMES]
    assert not unknown, f"{item.id}: unknown tools {unknown}"


@_by_id(ENTRIES)
def test_book_related_questions_resolve(item):
    missing = [q for q in item.related_questions if q not in QUESTION_IDS]
    assert not missing, f"{item.id}: unknown question ids {missing}"


@_by_id(ENTRIES)
def test_book_render_entry_contains_fixes_and_signals(item):
    text = book.render_entry(item)
    assert text.startswith(f"# {item.title}")
    assert book.entry_uri(item.id) in text
    for fix in item.fixes:
        assert fix.text in text
    for signal in item.signals:
        assert f"`{signal.tool}`" in text


def test_book_render_entry_escapes_pipes_in_the_signals_table():
    entry = book.get_entry("unfused-attention")
    rows = [line for line in book.render_entry(entry).splitlines() if line.startswith("| `")]
    assert rows and all(line.replace("\\|", "").count("|") == 4 for line in rows)


def test_book_render_index_has_one_line_per_entry():
    lines = [line for line in book.render_index().splitlines() if line.startswith("- ")]
    assert len(lines) == len(ENTRIES)
    for entry, line in zip(ENTRIES, lines, strict=True):
        assert book.entry_uri(entry.id) in line and entry.title in line


def test_book_get_entry_returns_the_entry():
    assert book.get_entry("gpu-bubbles").id == "gpu-bubbles"
    assert book.entry_uri("gpu-bubbles") == "nsightful://book/gpu-bubbles"


def test_book_get_entry_unknown_id_names_valid_ids():
    with pytest.raises(book.UnknownEntry) as err:
        book.get_entry("no-such-cause")
    assert isinstance(err.value, NsightfulError)
    assert "no-such-cause" in str(err.value)
    for entry_id in SEEDED:
        assert entry_id in str(err.value)


def test_book_load_book_is_cached_but_returns_a_fresh_dict():
    first = book.load_book()
    first.clear()
    assert len(book.load_book()) == len(ENTRIES)


def test_book_malformed_entry_raises_book_error():
    with pytest.raises(book.BookError, match="front matter"):
        book._parse_entry("broken.md", "no front matter here")
    with pytest.raises(book.BookError, match="id must equal"):
        text = (files("nsightful.resources") / "book" / "gpu-bubbles.md").read_text(encoding="utf-8")
        book._parse_entry("renamed.md", text)


def test_book_question_ids_are_unique():
    assert len(QUESTION_IDS) == len(QUESTIONS)


def test_book_questions_cover_every_phase():
    assert {q.phase for q in QUESTIONS} == set(book.PHASES)
    for phase in book.PHASES:
        assert book.questions_for_phase(phase)


def test_book_question_numbers_are_one_to_thirty_eight():
    numbers = [q.number for q in QUESTIONS if q.number is not None]
    assert sorted(numbers) == list(range(1, 39))


@_by_id(QUESTIONS)
def test_book_question_is_answered_or_explained(item):
    assert all(tool in TOOL_NAMES for tool in item.answered_by), item.answered_by
    if not item.answered_by:
        assert item.cannot_because and item.ask_or_capture
    if item.cannot_because:
        assert item.ask_or_capture


def test_book_questions_for_unknown_phase_names_valid_phases():
    with pytest.raises(book.UnknownPhase) as err:
        book.questions_for_phase("tuning")
    assert isinstance(err.value, NsightfulError)
    assert all(phase in str(err.value) for phase in book.PHASES)
