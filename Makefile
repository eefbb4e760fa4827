# stallhound: `make demo` shows it on a sample profile, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSPECTOR_VERSION := 2.12.0
INSPECTOR := .tools/inspector/node_modules/.bin/mcp-inspector
# @anthropic-ai/mcpb, the official packer of Claude Desktop bundles (make bundle, tests/test_packaging.py)
MCPB_VERSION := 2.1.2
MCPB := .tools/mcpb/node_modules/.bin/mcpb
DEMO := out/demo.sqlite

.PHONY: demo test test-heavy redteam lint docs bench bench-job loadtest clean install dev inspector mcpb chromium \
	corpus-restore corpus-review corpus-manifest dist bundle

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "stallhound needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	@touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[dev,distributed]'
	@touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev

$(INSPECTOR):
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm) \
		|| (echo "npm is needed for the MCP Inspector tests: install Node.js" && exit 1)
	npm install --silent --no-audit --no-fund --prefix .tools/inspector @modelcontextprotocol/inspector@$(INSPECTOR_VERSION)

inspector: $(INSPECTOR)

$(MCPB):
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm) \
		|| (echo "npm is needed for the bundle and its tests: install Node.js" && exit 1)
	npm install --silent --no-audit --no-fund --prefix .tools/mcpb @anthropic-ai/mcpb@$(MCPB_VERSION)

mcpb: $(MCPB)

chromium:  # headless browser for the report tests (tests/browser.py)
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) \
		|| (echo "chromium is needed for the report tests: install Debian's chromium package" && exit 1)

demo: $(VENV)/.installed
	@mkdir -p out
	$(BIN)/stallhound synth $(DEMO) --preset demo --force
	$(BIN)/stallhound triage $(DEMO)

test: $(VENV)/.dev $(INSPECTOR) $(MCPB) chromium
	$(BIN)/ruff check src tests bench corpus release
	$(BIN)/mypy
	$(BIN)/python -m pytest

test-heavy: $(VENV)/.dev  # the slower variants make test leaves out (pytest -m heavy), minutes
	$(BIN)/python -m pytest -m heavy

REDTEAM_SCALE ?= full  # full: issue 30's input sizes; ci: the heavy inputs scaled down (bench/redteam.py)

redteam: $(VENV)/.dev  # the heavy attack variants make test leaves out (tests/security, pytest -m redteam), then
	@mkdir -p out  # the table of every attack (out/redteam.md), even when a test failed; minutes
	$(BIN)/python -m pytest -m redteam tests/security; status=$$?; \
		$(BIN)/python bench/redteam.py --scale $(REDTEAM_SCALE) -o out/redteam.md && exit $$status

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests bench corpus release
	$(BIN)/mypy

docs: $(VENV)/.installed  # the README's tool table, from the tools the server registers
	$(BIN)/python -m stallhound.cli.docs README.md

bench: $(VENV)/.installed loadtest
	$(BIN)/python bench/run.py
	$(BIN)/python bench/kineto.py
	$(BIN)/python bench/startup.py

bench-job: $(VENV)/.dev  # minutes: 8 ranks of ~250 MB built serial and in parallel (psutil comes with distributed)
	$(BIN)/python bench/job.py

# The corpus of real profiles (corpus/MANIFEST.md). MIRROR=DIR restores from bare git mirrors DIR/<owner>+<name>/;
# the public profiles go to $STALLHOUND_CORPUS (default ~/.cache/stallhound-corpus).
corpus-restore: $(VENV)/.installed
	$(BIN)/python -m corpus.restore $(if $(MIRROR),--mirror-root $(MIRROR))

corpus-review: $(VENV)/.installed  # triage every corpus profile that is here: out/corpus-review.md
	$(BIN)/python -m corpus.review $(if $(MIRROR),--mirror-root $(MIRROR))

corpus-manifest: $(VENV)/.installed  # corpus/MANIFEST.md from corpus/sources and corpus/expect
	$(BIN)/python -m corpus.manifest

loadtest: $(VENV)/.installed
	$(BIN)/python bench/load.py

# A release: the sdist, the wheel and server.json for the MCP registry in dist/ (publish: twine upload
# dist/*.tar.gz dist/*.whl, then mcp-publisher publish dist/server.json); the Claude Desktop bundle dist/*.mcpb.
dist: $(VENV)/.dev
	rm -rf dist
	$(BIN)/python -m build --outdir dist
	$(BIN)/python -m release.server_json dist/server.json

bundle: dist $(MCPB)
	$(BIN)/python -m release.bundle dist/stallhound-*.whl out/bundle
	$(MCPB) pack out/bundle "dist/$$(basename dist/stallhound-*.whl -py3-none-any.whl).mcpb"

clean:
	rm -rf $(VENV) .tools out .pytest_cache dist
