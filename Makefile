# Set-up and everyday commands. Everything installs into .venv in the repo root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TARGET ?= qwen2.5-coder-1.5b-instruct
DEMO_PROMPT ?= Write a Python function that returns the n-th Fibonacci number, with a docstring.

.PHONY: venv demo test test-slow lint bench-plain clean

venv: $(STAMP)

# torch first, spelled exactly, so pip takes the CPU build on disk instead of CUDA wheels.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specdec models pull $(TARGET)
	$(VENV)/bin/specdec generate --model $(TARGET) --chat --max-tokens 128 "$(DEMO_PROMPT)"

test: $(STAMP)
	$(VENV)/bin/ruff check specdec tests scripts examples
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check specdec tests scripts examples

bench-plain: $(STAMP)
	$(PY) scripts/bench_plain.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
