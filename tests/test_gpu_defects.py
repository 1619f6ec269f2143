"""Defects of the GPU and sharded paths (issue 22), each checked on the CPU: `torch.cuda` mocked where a
GPU count or device matters, a tiny model, and two gloo processes where ranks matter
(tests/test_distributed.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentrl.config import compose_config

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
