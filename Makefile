# The two commands: `make demo` and `make test`. Both set everything up on a fresh clone.
# The dev set is pinned in requirements-dev.txt (torch==2.13.0, the CPU build on this disk);
# every pip call below uses it as constraints, so no install can pull another torch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast demo lint typecheck docs bench clean

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c requirements-dev.txt torch==2.13.0
	$(PIP) install -q -c requirements-dev.txt -e '.[dev,docs,wds,plot,hf,lightning,accelerate,transformers,peft,diffusers,ray]'
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(BIN)/ruff check src tests benchmarks examples docs/*.py
	$(BIN)/ruff format --check src tests benchmarks examples docs/*.py

typecheck: setup
	$(BIN)/mypy

# the documentation site into site/ (mkdocs.yml): the generated pages checked against the code
# (docs/gen_reference.py rewrites them), then a strict build: a broken link or reference fails it
docs: setup
	$(BIN)/python docs/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the fast tier, for a developer's loop after every edit: everything not marked slow, in one process
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# the suite in TEST_WORKERS processes (pytest-xdist; a worker that runs out of tests takes some of
# the other's), then the tests that time real steps, alone
TEST_WORKERS ?= 2
# the files that hold the serial tests (collecting only them saves the serial pass 10 s);
# tests/test_readme.py checks the list against every test marked serial
SERIAL_FILES := tests/test_readme.py tests/test_step_time.py

# ruff, the docs build and mypy side by side (mypy alone takes 40 s on a clean clone; run beside the
# suite instead it made the suite 100 s longer), then the suite, then the serial tests alone
test: setup
	$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck docs
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not serial"
	$(BIN)/python -m pytest -q -m serial $(SERIAL_FILES)

demo: setup
	$(BIN)/tokenbucket demo

bench: setup
	$(BIN)/python benchmarks/bench_breakdown.py

clean:
	rm -rf $(VENV) build dist site .pytest_cache .ruff_cache .mypy_cache tokenbucket-demo
