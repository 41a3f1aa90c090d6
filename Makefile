# The two commands of the README. Both set up everything they need on a fresh machine.
#   make serve   install, then serve every model in model_store/ (graphs exported on first start)
#   make test    install (with dev tools), then lint, type-check and run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= ../shared/data
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: install serve test lint

# torch is installed first and pinned: the CPU wheel on disk; nothing later may replace it.
$(VENV)/.installed: pyproject.toml constraints/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints/lock.txt -e ".[cpu,dev]"
	touch $@

install: $(VENV)/.installed

serve: install
	NERSERVE_DATA_ROOT=$(DATA) $(BIN)/nerserve serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy nerserve benchmarks  # the package (ner, service, export, loadtest) and the scripts that measure it
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q
