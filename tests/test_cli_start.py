"""The command answers `--version`, `--help` and a subcommand's `--help` without importing what reads a profile
(the MCP SDK and its HTTP stack, DuckDB, numpy, pydantic, the tools): each costs a start-up time the answer does not
need (cli/main.py). The help texts quote a few names from the layers below, written out in cli/arguments.py; each is
checked here against its source."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
from conftest import FIXTURES

from stallhound import synth, tools
from stallhound.cli import arguments, main
from stallhound.jobs import dask
from stallhound.server import http, store, wording
from stallhound.synth import ranks

# Top-level packages parsing must not import, and the stallhound modules it may.
HEAVY = {"mcp", "mcp_types", "starlette", "uvicorn", "sse_starlette", "httpx", "anyio", "duckdb", "numpy", "pydantic",
         "ijson", "msgspec"}
SERVER_ONLY = {"mcp", "mcp_types", "starlette", "uvicorn", "sse_starlette", "httpx"}  # what only `serve` needs
PARSING = {"stallhound", "stallhound.cli", "stallhound.model", "stallhound.model.errors", "stallhound.model.allocator"}

# Runs each argv through main in one fresh interpreter, printing the modules loaded after each.
PROBE = """
import json, sys
from stallhound.cli.main import main
for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
    except SystemExit:
        pass
    print(json.dumps([argv, sorted(sys.modules)]), file=sys.stderr)
"""


def _loaded_after(argvs: list[list[str]]) -> list[tuple[list[str], list[str]]]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [tuple(json.loads(line)) for line in done.stderr.splitlines() if line.startswith("[[")]


def _subcommands() -> list[str]:
    sub = next(a for a in main.parser()._actions if a.dest == "command")
    return list(sub.choices)


def _offending(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY
            or (m.startswith("stallhound") and m not in PARSING and not m.startswith("stallhound.cli."))]


def test_version_and_help_import_nothing_that_reads_a_profile():
    argvs = [["--help"], *([name, "--help"] for name in _subcommands()), ["--version"]]
    loaded = _loaded_after(argvs)
    assert [argv for argv, _ in loaded] == argvs
    assert {" ".join(argv): _offending(modules) for argv, modules in loaded} == {" ".join(a): [] for a in argvs}
    assert "importlib.metadata" not in loaded[-2][1], "--help has no use for the version"


def test_triage_imports_duckdb_and_the_tools_but_no_mcp_server(tmp_path):
    """The same probe after a command that runs (so it sees what a command imports): triage on a real export needs
    DuckDB and the tools, and none of the MCP SDK or its HTTP stack."""
    profile = FIXTURES / "nsysai_mock.sqlite"
    (_, modules), = _loaded_after([["triage", str(profile), "--json", "--cache-dir", str(tmp_path)]])
    assert {"duckdb", "pydantic", "stallhound.tools.triage"} <= set(_offending(modules))
    assert [m for m in modules if m.split(".")[0] in SERVER_ONLY] == []
    # its trace notes are read alone (trace_quality.of_model): the rest of profile_summary costs ~10 queries
    assert "stallhound.tools.profile_summary" not in modules


def test_a_command_collects_cycles_seldom(tmp_path):
    """A command raises the young generation's threshold of the cyclic collector (main.fewer_collections): the
    default (700) made ~115 collections in a triage of a cached model, ~0.03 s of CPU that freed almost nothing."""
    probe = ("import gc, sys; from stallhound.cli.main import main; main(sys.argv[1:]); "
             "print(gc.get_threshold()[0], file=sys.stderr)")
    profile = FIXTURES / "nsysai_mock.sqlite"
    done = subprocess.run([sys.executable, "-c", probe, "tool", "gpu_utilization", str(profile), "--json",
                           "--cache-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stderr.split()[-1]) == main.GC_YOUNG_OBJECTS > 700


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["triage", "--help"]])
def test_version_and_help_still_answer(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main.main(argv)
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("stallhound 0.") if argv == ["--version"] else out.startswith("usage: stallhound")


def test_help_names_every_job_tool_and_format():
    text = main.parser().format_help()
    for name in tools.JOB_TOOL_NAMES:
        assert name.replace("_", "-") in text
    assert wording.writers() in text


def test_the_names_help_quotes_are_their_sources():
    assert arguments.WRITERS == wording.writers()
    assert arguments.PROFILE_FILES == wording.profile_files()
    assert arguments.TOKEN_ENV == http.TOKEN_ENV
    assert arguments.DEFAULT_MEMORY_BUDGET_MB == store.DEFAULT_MEMORY_BUDGET_MB
    assert arguments.DASK_SCHEDULER_ENV == dask.SCHEDULER_ENV
    assert arguments.SYNTH_PRESETS == tuple(sorted(synth.PRESETS))
    assert arguments.RANK_SET_TRUTH == ranks.TRUTH_NAME
    summaries = {name: (module.__doc__ or "").strip().splitlines()[0] for name, module in tools.job_tools().items()}
    assert arguments.JOB_TOOLS == summaries
    assert list(arguments.JOB_TOOLS) == list(tools.JOB_TOOL_NAMES)


# Runs main on argv in a fresh interpreter, counting every search for pandas; prints the count.
PANDAS_PROBE = """
import json, sys
tries = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        tries.extend([name] if name.split(".")[0] == "pandas" else [])
sys.meta_path.insert(0, Spy())
from stallhound.cli.main import main
main(json.loads(sys.argv[1]))
print(len(tries), file=sys.stderr)
"""


def test_triage_never_searches_for_pandas(tmp_path):
    """DuckDB's binding tries `import pandas` for each bound parameter (cli/main.without_pandas): a command marks it
    absent, so a triage of ~120 queries searches for it not once."""
    argv = ["triage", str(FIXTURES / "nsysai_h100_2gpu_1s.sqlite"), "--json", "--cache-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", PANDAS_PROBE, json.dumps(argv)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "0"


def test_without_pandas_keeps_a_pandas_already_imported(monkeypatch):
    imported = types.ModuleType("pandas")
    monkeypatch.setitem(sys.modules, "pandas", imported)
    main.without_pandas()
    assert sys.modules["pandas"] is imported
    monkeypatch.delitem(sys.modules, "pandas")
    main.without_pandas()
    with pytest.raises(ImportError):
        import pandas  # noqa: F401
