# The two commands of the README. Both set up everything they need on a fresh machine.
#   make serve   install, then run the default model (until the service lands: evaluate it on CoNLL-2003 test)
#   make test    install (with dev tools), then lint, type-check and run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?= ../shared/data
MODEL  ?= span-conll03

.PHONY: install serve test lint

# torch is installed first and pinned: the CPU wheel on disk; nothing later may replace it.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[cpu,dev]"
	touch $@

install: $(VENV)/.installed

serve: install
	$(BIN)/nerserve eval $(MODEL) --data $(DATA)/conll03 --split test

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy ner service export loadtest

test: lint
	$(BIN)/python -m pytest -q
