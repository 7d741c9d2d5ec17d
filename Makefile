# spec-complete: `make run` serves the embedded default model, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# On a machine without CUDA, pin the CPU build of torch (a bare `torch` pulls a multi-GB CUDA build).
TORCH ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: install run test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[dev,eval]'
	touch $(STAMP)

run: install
	$(BIN)/spec-complete complete examples/sample.py --line 12 --col 0 --open examples/shapes.py

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
