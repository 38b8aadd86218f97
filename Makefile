# Two commands on a fresh machine:  make run   and   make test
# Both create .venv and install what is needed (torch CPU build from the local wheel cache
# when available, lark, attrs, click, flashinfer-python, pytest, hypothesis).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.layoutc-installed

.PHONY: setup run test check clean

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

test: $(STAMP)
	$(PY) -m pytest

check: $(STAMP)
	$(VENV)/bin/layoutc check specs/*.lyt

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# README samples and docs/*.png regenerated from the tools (tests/test_docs.py fails when they are stale)
.PHONY: docs
docs: $(STAMP)
	$(PY) tools/make_docs.py
