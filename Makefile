# trainmedic's front door. Targets create and reuse a virtual environment at .venv/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install system-deps demo demo-ssh up test lint unit integration bench bench-quick format clean deploy-check test-pyslurm

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
DEMO_ARGS ?=
demo: install
	$(BIN)/trainmedic demo $(DEMO_ARGS)

## demo-ssh: the same story with Slurm reached over SSH (a real sshd on loopback)
demo-ssh: install
	$(BIN)/trainmedic demo --slurm-access ssh $(DEMO_ARGS)

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

## deploy-check: the Helm chart rendered in both modes, linted and schema-checked (Helm's
## own engine, offline), and the systemd units verified; `make test` runs these too
deploy-check: $(STAMP)
	$(BIN)/python -m pytest -q tests/deploy tests/unit/test_deploy_units.py

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: install
	$(BIN)/python -m pytest -q -m integration

bench-quick: install
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

## test-pyslurm: the pyslurm backend (SLURM_ACCESS=pyslurm) on a Slurm 25.11 lab: builds
## what is missing (Slurm 25.11 from ../shared/vendor into the state dir, .venv-pyslurm
## with pyslurm built against it; both cached), then its contract suite and end-to-end
## tests, none allowed to skip. `make test` does not need any of it.
SLURM25_VERSION ?= 25.11.7
SLURM25_PREFIX  ?=
PYSLURM_VERSION ?= 25.11.2
PYSLURM_VENV    ?= .venv-pyslurm
test-pyslurm: system-deps
	@prefix=$$(bash deploy/lab/build-slurm.sh $(SLURM25_VERSION) $(SLURM25_PREFIX)) && \
	PYTHON=$(PYTHON) bash deploy/lab/pyslurm-venv.sh "$$prefix" $(PYSLURM_VENV) $(PYSLURM_VERSION) && \
	TRAINMEDIC_SLURM_PREFIX="$$prefix" TRAINMEDIC_REQUIRE_PYSLURM=1 TRAINMEDIC_REQUIRE_LAB=1 \
	$(PYSLURM_VENV)/bin/python -m pytest -q -k pyslurm tests/unit/test_pyslurm_backend.py \
	tests/integration/test_slurm_backend_contract.py tests/integration/test_pyslurm_recovery.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
