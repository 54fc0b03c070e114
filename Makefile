# `make demo` and `make test` each bootstrap .venv first (scripts/bootstrap.sh; idempotent).
VENV ?= .venv
PY := $(CURDIR)/$(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PYTEST_ARGS ?=

.PHONY: venv test demo bench bench-quick data-full clean-data

venv:
	./scripts/bootstrap.sh

# The test command (README, .ci/run). pytest exits 5 when it collected no test: that is a failure too.
test: venv
	$(PY) -m pytest tests $(PYTEST_ARGS)

demo: venv
	./examples/demo.sh

# Speed/memory comparisons against each paper's baseline (benchmarks/run_presets.py), into docs/benchmarks/
bench: venv
	$(PY) benchmarks/run_presets.py

bench-quick: venv
	$(PY) benchmarks/run_presets.py --quick --out-dir runs/bench-quick

# Rebuild the full EN-DE corpus from Debian packages (network to Debian's archive needed).
data-full: venv
	./examples/data/prepare-en-de.sh data/en-de-full

clean-data:
	rm -rf data-bin
