"""Defects of the GPU and sharded paths (issue 22), each checked on the CPU: `torch.cuda` mocked where a
GPU count or device matters, a tiny model, and two gloo processes where ranks matter
(tests/test_distributed.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl import distributed as dist
from agentrl.config import compose_config

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"

TINY = [
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",
    "algo.group_size=2",
    "algo.groups_per_iteration=1",
    "algo.gradient_accumulation_steps=1",
    "algo.save_final=false",
    "algo.iterations=1",
    "algo.torch_threads=1",
    "eval.episodes=2",
]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_NO_PROGRESS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", dist.LOCKED_RUN_DIR):
        env.pop(key, None)
    return env


def _cfg(*overrides: str) -> Any:
    return compose_config(["task=train", "algo=msgrpo", *TINY, *overrides])


def test_the_eval_before_training_runs_on_the_prepared_model(tmp_path, monkeypatch):
    """A1/B5: the evaluation before training runs after the Trainer's `accelerator.prepare` (ZeRO-3's
    partitions and FSDP's shards exist only then, and mixed precision's autocast wraps `forward` then),
    so the evaluations before and after training see the same model."""
    import accelerate

    import agentrl.evaluation
    from agentrl.trainers.multistep import train_llm

    events: list[str] = []
    prepare_model = accelerate.Accelerator.prepare_model

    def recording_prepare(self, model, *args, **kwargs):
        events.append("prepare")
        return prepare_model(self, model, *args, **kwargs)

    real = agentrl.evaluation.evaluate

    def evaluate(*args: Any, description: str = "", **kwargs: Any):
        events.append(description)
        return real(*args, description=description, **kwargs)

    monkeypatch.setattr(accelerate.Accelerator, "prepare_model", recording_prepare)
    monkeypatch.setattr(agentrl.evaluation, "evaluate", evaluate)
    result = train_llm(_cfg("algo.eval_before=true"), tmp_path)
    assert events.index("prepare") < events.index("eval before training")
    assert events[-1] == "eval after training"
    assert result.extra["before"]["episodes"] == 2
    assert (tmp_path / "eval_before.json").is_file()


def test_the_process_group_gets_the_trainers_timeout(tmp_path):
    """A7: the process group exists before the Trainer's arguments (the model loads onto each process's
    device), so it is created with the timeout the Trainer would have used (`ddp_timeout`), not the
    backend's default (NCCL's 600 s)."""
    out = tmp_path / "timeout.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    subprocess.run(
        [*launch, str(WORKERS / "pg_timeout.py"), str(out), "1234"],
        env=_env(),
        check=True,
        timeout=120,
        cwd=ROOT,
    )
    assert json.loads(out.read_text()) == {"group": 1234.0, "trainer": 1234}


def test_a_single_relaunched_process_borrows_the_parents_run_directory(tmp_path, monkeypatch):
    """A9: `distributed=...` with `num_processes` null on a machine with one GPU relaunches one process
    (WORLD_SIZE=1): it is launched (no second relaunch) and writes into the directory its parent holds."""
    from agentrl import run

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv(dist.LOCKED_RUN_DIR, str(tmp_path))
    monkeypatch.setattr(dist, "ensure_process_group", lambda *a, **k: None)
    assert dist.launched()

    def take():
        raise AssertionError("the parent holds the lock")

    lock = run._claim(take, resume=False)
    assert isinstance(lock, run.BorrowedLock) and lock.path == tmp_path.resolve()
    monkeypatch.delenv(dist.LOCKED_RUN_DIR)
    assert not dist.launched()


def test_candidate_scoring_runs_under_gradient_checkpointing():
    """A3: TWOSOME's training forward (`candidate_logps` under autograd) with
    `algo.gradient_checkpointing=true`: checkpointed layers return no KV cache, so the candidates are
    scored with one plain forward per row instead; the values equal the shared-prefix path's."""
    from agentrl.agents.scoring import candidate_logps
    from agentrl.models import load_model

    model, _ = load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], [1, 2, 3, 4, 5]]
    candidates = [[[50, 51], [60, 61, 62], [70]], [[80]], [[5, 6]]]
    model.eval()
    with torch.no_grad():
        shared, shared_mask = candidate_logps(model, prompts, candidates)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    logps, mask = candidate_logps(model, prompts, candidates)
    assert torch.equal(mask, shared_mask)
    assert torch.allclose(logps, shared, atol=1e-5)
    logps.sum().backward()
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in model.parameters())


def test_one_process_with_several_visible_gpus_trains_on_one(tmp_path, monkeypatch):
    """A2: one process on a node with 4 visible GPUs: TrainingArguments counts them all (`n_gpu`), the
    Trainer would wrap the model in DataParallel and GRPOTrainer raises; the arguments are pinned to
    one device (cuda:0) before the model loads, and another device index is refused with the fix."""
    from accelerate.state import AcceleratorState, PartialState

    from agentrl.config import typed
    from agentrl.errors import ConfigError
    from agentrl.trainers.multistep import grpo_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    # accelerate's process-wide state would keep the mocked CUDA device for later tests
    monkeypatch.setattr(AcceleratorState, "_shared_state", {})
    monkeypatch.setattr(PartialState, "_shared_state", {})
    algo = typed(_cfg().algo)
    args = grpo_config(algo, tmp_path, "cuda", 0)
    assert (str(args.device), args.n_gpu) == ("cuda:0", 1)
    with pytest.raises(ConfigError, match="model.device=cuda:2: .*CUDA_VISIBLE_DEVICES=2"):
        grpo_config(algo, tmp_path, "cuda:2", 0)
