# Every target bootstraps .venv on first use; later runs reuse it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast check bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# torch first, from constraints.txt's pin, so no other requirement can pull a CUDA build.
	@echo "installing torch (CPU build, pinned in constraints.txt) into $(VENV)"
	$(BIN)/python -m pip install --quiet -c constraints.txt torch
	@echo "installing attnkit and its development extras into $(VENV)"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# The practical example of the tutorial: fetch SmolLM2 once (offline afterwards), then show where
# each token of "The cat sat on the mat." attends in the last layer's first head.
demo: $(STAMP)
	$(BIN)/attnkit models fetch smollm2
	$(BIN)/attnkit inspect "The cat sat on the mat."

# The browser and font tests drive Debian packages: tools/system-packages installs them
# (as root or with sudo) or stops with the command that does.
# The whole suite; the 25 slowest tests are listed at the end so that growth is seen.
test: $(STAMP)
	tools/system-packages
	$(BIN)/python -m pytest --durations=25

# The loop to run while developing: every test not marked slow (real models, training,
# several processes, browsers), on FAST_WORKERS processes (pytest-xdist), in about a minute
# and a half on two cores.
FAST_WORKERS ?= 2
test-fast: $(STAMP)
	tools/system-packages
	$(BIN)/python -m pytest -m "not slow" -n $(FAST_WORKERS)

# Lint and format (ruff), types (mypy) and the documentation site with its API reference,
# warnings as errors (site in build/site). CI runs it before the tests.
check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks docs
	$(BIN)/ruff format --check src tests benchmarks docs
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Every benchmark, results in benchmarks/results/ only; the maintainers add --update-docs
# (python benchmarks/run_all.py --update-docs) to rebuild docs/benchmarks.md from them.
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
