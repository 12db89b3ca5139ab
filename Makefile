# Every target bootstraps .venv on first use; later runs reuse it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned, so no other requirement can pull a CUDA build.
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# The notes' practical example: fetch SmolLM2 once (offline afterwards), then show where
# each token of "The cat sat on the mat." attends in the last layer's first head.
demo: $(STAMP)
	$(BIN)/attnkit models fetch smollm2
	$(BIN)/attnkit inspect "The cat sat on the mat."

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
