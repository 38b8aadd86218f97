# Two commands on a fresh machine:  make run   and   make test
# Both create .venv and install what is needed (torch CPU build from the local wheel cache
# when available, lark, attrs, click, flashinfer-python, pytest, hypothesis).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.layoutc-installed

.PHONY: setup run test test-slow test-all check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[dev,flashinfer]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/layoutc check specs/*.lyt
	$(VENV)/bin/layoutc demo specs/flashinfer_cutlass_bf16.lyt

# `make test` stays under five minutes on the 2-core machine: tests marked `slow` (mutation
# scores, every spec at every TP rank, probes of every spec, whole-pipeline faults) run in
# `make test-slow`, which CI runs as well (.ci/run).
test: $(STAMP)
	$(PY) -m pytest -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

test-all: $(STAMP)
	$(PY) -m pytest

check: $(STAMP)
	$(VENV)/bin/layoutc check specs/*.lyt

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# README samples and docs/*.png regenerated from the tools (tests/test_docs.py fails when they are stale)
.PHONY: docs
docs: $(STAMP)
	$(PY) tools/make_docs.py
