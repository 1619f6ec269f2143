"""Shared test fixtures: keep every run directory inside pytest's tmp_path and progress bars quiet."""

from __future__ import annotations

import gc
import os

import pytest

# The suite hides the GPUs unless AGENTRL_TEST_CUDA=1: `make test` then tests the CPU on any machine, and
# the GPU path is checked by benchmarks/gpu_check.py (docs/gpu.md). With AGENTRL_TEST_CUDA=1 the GPUs stay
# visible: models load where `model.device=auto` puts them, a test takes its device from its model or
# the `device` fixture, and a test of the CPU by nature (its kernels, gloo processes) is marked
# `cpu_only` with the reason, which its skip gives.
CUDA_TESTS = os.environ.get("AGENTRL_TEST_CUDA") == "1"
if not CUDA_TESTS:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("AGENTRL_NO_PROGRESS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["COLUMNS"] = "220"  # rich tables unwrapped, so tests can find cell text


def pytest_collection_finish(session):
    """What importing the test modules made (torch's, transformers' and TRL's modules and registries: about
    half a million objects, none of which is ever freed) is moved out of the garbage collector's reach.
    Every full collection walked it all again (0.26 s each on a 2-core Xeon), and one runs at every
    training run (transformers' Trainer.train calls accelerate's free_memory, which calls gc.collect):
    a quarter of test_multistep's time. Objects the tests make are collected as before."""
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """With the GPUs visible, a `cpu_only(reason)` test is skipped, saying why it tests the CPU only."""
    if not CUDA_TESTS:
        return
    import torch

    if not torch.cuda.is_available():
        return
    for item in items:
        marker = item.get_closest_marker("cpu_only")
        if marker is not None:
            reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"CPU only: {reason}"))


@pytest.fixture(scope="session")
def device() -> str:
    """Where a test's model and tensors go: the GPU with AGENTRL_TEST_CUDA=1 on a machine that has one,
    else the CPU."""
    import torch

    return "cuda" if CUDA_TESTS and torch.cuda.is_available() else "cpu"


@pytest.fixture
def run_dir(tmp_path):
    """A fresh directory for one run (passed as hydra.run.dir=...)."""
    return tmp_path / "run"


@pytest.fixture(autouse=True)
def _isolate_cwd(tmp_path, monkeypatch):
    """Runs that forget hydra.run.dir land in tmp_path/outputs, never in the repository."""
    monkeypatch.chdir(tmp_path)
