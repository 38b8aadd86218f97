# Two commands on a fresh machine:  make run   and   make test
# `make run` creates .venv with only what the demo needs (a CPU build of torch, then layoutc and its
# dependencies); `make test` adds what the fast tests need (the dev extra); `make test-slow` adds FlashInfer
# (about 1.6 GB with its CUDA packages), whose own Python functions the slow tier calls. Each install set
# has its own stamp, so `make run` after `make test` installs nothing, and `make test` after `make run`
# installs only the extras.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# the CPU wheels of torch (a few hundred MB instead of the CUDA build's gigabytes); the plain index
# is the fallback where this one cannot be reached. One retry and a 15 s timeout for it: where its host
# cannot be resolved (CI here), pip's default five retries per package took 76 s before the local index
# answered, one retry 1 s
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIP   ?= --retries 1 --timeout 15
RUN_STAMP  := $(VENV)/.layoutc-run
TEST_STAMP := $(VENV)/.layoutc-test
SLOW_STAMP := $(VENV)/.layoutc-slow
# pytest workers (pytest-xdist): one per core
JOBS ?= auto

.PHONY: setup run test test-slow test-all check clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q $(TORCH_PIP) torch==2.13.0 --index-url $(TORCH_INDEX) || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[dev]"
	touch $(TEST_STAMP)

$(SLOW_STAMP): $(TEST_STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[dev,flashinfer]"
	touch $(SLOW_STAMP)

setup: $(RUN_STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/layoutc check specs/*.lyt
	$(VENV)/bin/layoutc demo specs/flashinfer_cutlass_bf16.lyt

# `make test` stays under five minutes on the 2-core machine, set-up included: tests marked `slow`
# (mutation scores, every spec at every TP rank, probes of every spec, whole-pipeline faults) and those
# marked `flashinfer` (they call FlashInfer's own functions) run in `make test-slow`, which CI runs as
# well (.ci/run). Both run on every core (pytest-xdist). The fast suite is deterministic (the
# layoutc-fast Hypothesis profile of tests/conftest.py); test-slow runs the property tests again with
# fresh seeds (layoutc-explore).
test: $(TEST_STAMP)
	$(PY) -m pytest -n $(JOBS) -m "not slow and not flashinfer" --hypothesis-profile=layoutc-fast

test-slow: $(SLOW_STAMP)
	$(PY) -m pytest -n $(JOBS) -m "slow or hypothesis or flashinfer" --hypothesis-profile=layoutc-explore

test-all: $(SLOW_STAMP)
	$(PY) -m pytest -n $(JOBS)

check: $(RUN_STAMP)
	$(VENV)/bin/layoutc check specs/*.lyt

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# README samples and docs/*.png regenerated from the tools (tests/test_docs.py fails when they are stale)
.PHONY: docs
docs: $(TEST_STAMP)
	$(PY) tools/make_docs.py
