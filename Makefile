# Relevo: `make demo` and `make test` set up .venv/ themselves on first run.
# The first Python 3.11+ on PATH (pyenv shims may exist for versions that are not installed).
PYTHON ?= $(shell for p in python3 python3.12 python3.11 python3.13; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && command -v $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.relevo-installed
LOCK := requirements/dev.lock
UV_VERSION := 0.13.9

.PHONY: demo test lint bench local-up lock clean

$(STAMP): $(LOCK) layers/core/pyproject.toml agent/pyproject.toml cli/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"
	# Precompiled bytecode: with PYTHONDONTWRITEBYTECODE set, every process would compile its imports.
	$(BIN)/uv pip sync --quiet --compile-bytecode --python $(BIN)/python $(LOCK)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e layers/core -e agent -e cli
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m relevo_cli.demo

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/cfn-lint --append-rules cfn_lint_serverless.rules -- template.yaml
	$(BIN)/statelint statemachines/*.asl.json
	$(BIN)/checkov --quiet --compact --framework cloudformation -f template.yaml
	$(BIN)/python -m relevo_cli.iam_lint template.yaml

bench: $(STAMP)
	@# Every bench runs; a missed target (exit 1) or a broken bench (exit 2) fails the target at the end.
	@rc=0; for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || rc=1; done; exit $$rc

local-up: $(STAMP)
	$(BIN)/relevo local up

lock:
	$(BIN)/uv pip compile --quiet requirements/dev.in --python-version 3.11 -o $(LOCK)

clean:
	rm -rf $(VENV) .relevo .pytest_cache
