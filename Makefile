# trainmedic's front door. Targets create and reuse a virtual environment at .venv/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install system-deps demo up test lint unit integration bench bench-quick format clean

# The venv is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

## install: Debian packages for the Slurm lab (as root) + the venv with dev tools
install: system-deps $(STAMP)

system-deps:
	@bash deploy/lab/install-deps.sh

## demo: the main job on the embedded default (Temporal dev server + Slurm lab)
demo: install
	$(BIN)/trainmedic demo

## up: the long-running controller on the embedded default (Ctrl-C stops it)
up: install
	$(BIN)/trainmedic up

## test: lint, type-check, and the whole suite (unit + integration on real daemons)
test: install lint
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check trainmedic tests bench
	$(BIN)/ruff format --check trainmedic tests bench
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format trainmedic tests bench
	$(BIN)/ruff check --fix trainmedic tests bench

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: install
	$(BIN)/python -m pytest -q -m integration

bench-quick: install
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
