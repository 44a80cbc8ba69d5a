# One command for the demo, one for the tests (the linter, then pytest); each sets everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned to the CPU wheel, so that nothing pulls the CUDA builds
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test,test-extra]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/exhume demo -o runs/demo $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_iteration.py
	$(BIN)/python benchmarks/bench_quality.py

clean:
	rm -rf $(VENV) runs .pytest_cache
