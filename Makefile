# `make demo` and `make test` each bootstrap .venv first (scripts/bootstrap.sh; idempotent). `make help`: targets.
VENV ?= .venv
PY := $(CURDIR)/$(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PYTEST_ARGS ?=
# make test's parallel pytest workers (pytest-xdist): one per core, at most 4 (each test process and the
# commands it starts then use cores/workers threads: tests/conftest.py); 0 runs the suite in one process
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; [ $$n -gt 1 ] && echo $$n || echo 0)

.PHONY: venv help lint test demo study docs bench bench-quick data-full clean-data

## venv         create .venv and install everything (the default target)
venv:
	./scripts/bootstrap.sh

## help         list the targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## lint         ruff with the rules of ruff.toml (run by .ci/run before the tests)
lint: venv
	$(VENV)/bin/ruff check .

# The test command (README, .ci/run). pytest exits 5 when it collected no test: that is a failure too.
## test         the test suite on every core (TEST_WORKERS=0: one process; PYTEST_ARGS=... to pytest; installs CTranslate2)
test:
	BENCH=1 ./scripts/bootstrap.sh
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

## demo         train two tiny models, translate and score with them and with the shipped checkpoints
demo: venv
	./examples/demo.sh

## study        the reproduction study into runs/study (docs/results/README.md; resumable: rerun to go on)
study: venv
	examples/study/run.sh runs/study

# Speed/memory comparisons against each paper's baseline (benchmarks/run_presets.py), into docs/benchmarks/.
# BENCH=1: the bootstrap adds the benchmark-only dependencies (CTranslate2: setup.py's [bench] extra).
## bench        every benchmark preset and the decoding step's profile, into docs/benchmarks/ (installs CTranslate2 first)
bench:
	BENCH=1 ./scripts/bootstrap.sh
	$(PY) benchmarks/run_presets.py
	$(PY) benchmarks/step_profile.py
	$(PY) -m fairseq_ext.tools.docs --write

## docs         regenerate every results/benchmark/flags table of README.md and docs/ from the committed data
docs: venv
	$(PY) -m fairseq_ext.tools.docs --write

## bench-quick  the presets at small sizes, into runs/bench-quick
bench-quick:
	BENCH=1 ./scripts/bootstrap.sh
	$(PY) benchmarks/run_presets.py --quick --out-dir runs/bench-quick

# Rebuild the full EN-DE corpus from Debian packages (network to Debian's archive needed).
## data-full    rebuild the full EN-DE corpus into data/en-de-full (needs Debian's archive)
data-full: venv
	./examples/data/prepare-en-de.sh data/en-de-full

## clean-data   remove data-bin/
clean-data:
	rm -rf data-bin
