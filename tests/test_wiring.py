"""The wiring is one path each: every CLI subcommand module registers itself and main lists them all; every tool
(one profile, two profiles, a job) is made by the one wrapper, and every tool, resource and prompt handler turns our
errors into MCP errors in the one place (server/errors.py)."""

from __future__ import annotations

import argparse
import pkgutil
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from conftest import text_of
from mcp.client import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from stallhound import cli, tools
from stallhound.cli import main
from stallhound.model.errors import StallhoundError
from stallhound.server import errors
from stallhound.server.app import build_server

SENTENCE = "nothing here by that name; load it first"


def _subcommand_modules() -> set[str]:
    names = [info.name for info in pkgutil.iter_modules(cli.__path__)]
    return {name for name in names if hasattr(import_module(f"stallhound.cli.{name}"), "register")}


def test_wiring_every_cli_subcommand_module_is_listed_in_main():
    assert _subcommand_modules() == {module.__name__.rsplit(".", 1)[-1] for module in main.SUBCOMMANDS}
    assert {"serve", "tool", "diff", "job", "report", "synth"} <= _subcommand_modules()


class _Recorder:
    """Subparsers that keep what each module adds."""

    def __init__(self) -> None:
        self.parsers: dict[str, argparse.ArgumentParser] = {}

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        self.parsers[name] = argparse.ArgumentParser(prog=name, description=kwargs.get("help"))
        return self.parsers[name]


def test_wiring_every_cli_subcommand_sets_its_handler():
    recorded = _Recorder()
    for module in main.SUBCOMMANDS:
        module.register(recorded)
    commands = ["serve", "tool", "tools", "triage", "diff", "verify-fix", "build",
                *map(cli.job.command_of, tools.job_tools()), "report", "synth"]
    assert list(recorded.parsers) == commands
    assert all(callable(p.get_default("run")) for p in recorded.parsers.values())


def test_wiring_every_cli_subcommand_prints_its_help(capsys):
    """`stallhound X --help` for every subcommand (argparse formats each help text only then: a bare % broke diff's)."""
    recorded = _Recorder()
    for module in main.SUBCOMMANDS:
        module.register(recorded)
    for name in recorded.parsers:
        with pytest.raises(SystemExit) as done:
            main.main([name, "--help"])
        assert done.value.code == 0, name
        assert capsys.readouterr().out.startswith(f"usage: stallhound {name}"), name


def test_wiring_main_runs_the_registered_handler_and_words_its_error(monkeypatch, capsys):
    def fail(args):
        raise StallhoundError(f"{args.what} is {SENTENCE}")

    def register(sub):
        sub.add_parser("hello").set_defaults(run=lambda args: 7)
        sub.add_parser("fail").add_argument("what")
        sub.choices["fail"].set_defaults(run=fail)

    monkeypatch.setattr(main, "SUBCOMMANDS", (SimpleNamespace(register=register),))
    assert main.main(["hello"]) == 7
    assert main.main(["fail", "it"]) == main.EXIT_USAGE
    assert capsys.readouterr().err == f"stallhound: error: it is {SENTENCE}\n"


def test_wiring_every_tool_kind_goes_through_the_one_wrapper(tmp_path):
    server = build_server([tmp_path])
    kinds: dict[str, set[str]] = {}
    for (what, name), handler in server.handlers.items():
        if what == "tool":
            kinds.setdefault(getattr(handler, "kind", "lifecycle"), set()).add(name)
    assert kinds == {"single": set(tools.skills()), "pair": set(tools.pair_tools()), "job": set(tools.job_tools()),
                     "lifecycle": {"load_profile", "list_profiles", "close_profile", "load_job", "list_jobs",
                                   "close_job", "cancel_load"}}


def test_wiring_every_handler_converts_our_errors_in_the_one_place(tmp_path):
    server = build_server([tmp_path])
    expected = {"tool": errors.AS_TOOL_ERROR, "resource": errors.AS_RESOURCE_ERROR, "prompt": errors.AS_PROMPT_ERROR}
    assert {key: getattr(h, "converts_to", None) for key, h in server.handlers.items()} == {
        key: expected[key[0]] for key in server.handlers}
    listed = {("tool", t.name) for t in anyio.run(server.list_tools)}
    listed |= {("resource", str(r.uri)) for r in anyio.run(server.list_resources) if not str(r.uri).startswith("ui://")}
    listed |= {("resource", t.uri_template) for t in anyio.run(server.list_resource_templates)}
    listed |= {("prompt", p.name) for p in anyio.run(server.list_prompts)}
    assert listed == set(server.handlers)  # nothing registered around StallhoundMCP


@pytest.mark.anyio
async def test_wiring_each_tool_kind_answers_an_unknown_reference_in_one_sentence(tmp_path):
    missing = tmp_path / "nope.sqlite"
    async with Client(build_server([tmp_path])) as client:
        answers = [await client.call_tool("top_kernels", {"profile": str(missing)}),
                   await client.call_tool("diff_profiles", {"before": str(missing), "after": str(missing)}),
                   await client.call_tool("rank_imbalance", {"job": "job-nope"})]
    assert all(a.is_error and "\n" not in text_of(a) for a in answers)
    for answer, tool in zip(answers[:2], ("top_kernels", "diff_profiles"), strict=True):
        assert text_of(answer).startswith(f"Error executing tool {tool}: {missing} does not exist; pass ")
    assert text_of(answers[2]) == (
        "Error executing tool rank_imbalance: no job is loaded with id 'job-nope' in this session (loaded: none yet); "
        "call load_job with the ranks' profiles (paths, their folder or a glob)")


@pytest.mark.anyio
async def test_wiring_a_new_handler_gets_the_conversion_by_being_registered():
    server = errors.StallhoundMCP(name="t")

    def fail() -> str:
        raise StallhoundError(SENTENCE)

    async def fail_async(x: int) -> str:
        raise StallhoundError(SENTENCE)

    server.add_tool(fail, name="sync_tool")
    server.tool()(fail_async)
    server.resource("t://thing/{x}")(fail_async)
    server.prompt()(fail_async)
    async with Client(server) as client:
        for name, args in (("sync_tool", {}), ("fail_async", {"x": 1})):
            answer = await client.call_tool(name, args)
            assert answer.is_error and text_of(answer) == f"Error executing tool {name}: {SENTENCE}"
        with pytest.raises(MCPError) as read:
            await client.read_resource("t://thing/1")
        assert read.value.message == SENTENCE
        with pytest.raises(MCPError) as prompt:
            await client.get_prompt("fail_async", {"x": "1"})
        assert (prompt.value.code, prompt.value.message) == (INVALID_PARAMS, SENTENCE)


def test_wiring_no_module_imports_an_underscore_name_of_another():
    import ast
    src = Path(cli.__file__).resolve().parents[1]
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stallhound"):
                found += [f"{path.relative_to(src)}: {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
