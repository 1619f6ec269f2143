"""Shared test fixtures: keep every run directory inside pytest's tmp_path and progress bars quiet."""

from __future__ import annotations

import gc
import os

import pytest

# The suite is written for the CPU (trainers built for "cpu", gloo process groups, CPU numerics): on a
# machine with a GPU it still tests that, and the GPU path is checked by benchmarks/gpu_check.py
# (docs/gpu.md). AGENTRL_TEST_CUDA=1 leaves the GPUs visible.
if os.environ.get("AGENTRL_TEST_CUDA") != "1":
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


@pytest.fixture
def run_dir(tmp_path):
    """A fresh directory for one run (passed as hydra.run.dir=...)."""
    return tmp_path / "run"


@pytest.fixture(autouse=True)
def _isolate_cwd(tmp_path, monkeypatch):
    """Runs that forget hydra.run.dir land in tmp_path/outputs, never in the repository."""
    monkeypatch.chdir(tmp_path)
