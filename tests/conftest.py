"""Shared test fixtures: keep every run directory inside pytest's tmp_path and progress bars quiet."""

from __future__ import annotations

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


@pytest.fixture
def run_dir(tmp_path):
    """A fresh directory for one run (passed as hydra.run.dir=...)."""
    return tmp_path / "run"


@pytest.fixture(autouse=True)
def _isolate_cwd(tmp_path, monkeypatch):
    """Runs that forget hydra.run.dir land in tmp_path/outputs, never in the repository."""
    monkeypatch.chdir(tmp_path)
