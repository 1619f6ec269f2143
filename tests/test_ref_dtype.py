"""`algo.ref_dtype`: TRL's frozen reference model (beta > 0, full fine-tuning) in bf16 instead of the policy's
fp32 master-weight dtype, half its memory (issue 22 C4)."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.errors import ConfigError


def test_a_bf16_reference_model_takes_half_the_memory(tmp_path, monkeypatch):
    from agentrl.trainers.grpo_trainer import MultiStepTrainer
    from agentrl.trainers.multistep import train_llm

    trainers = []
    real = MultiStepTrainer._pack_micro_batches

    def recording(self, *args, **kwargs):
        trainers.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MultiStepTrainer, "_pack_micro_batches", recording)
    cfg = compose_config(
        [
            "task=train",
            "algo=msgrpo",
            "env=bandit",
            "env.horizon=2",
            "model=tiny-random",
            "agent.invalid_rule=random",
            "algo.beta=0.1",
            "algo.ref_dtype=bfloat16",
            "algo.iterations=1",
            "algo.groups_per_iteration=1",
            "algo.group_size=2",
            "algo.eval_before=false",
            "algo.checkpoint_every=0",
            "algo.save_final=false",
            "algo.torch_threads=1",
            "eval.episodes=1",
        ]
    )
    train_llm(cfg, tmp_path, env_factory)
    trainer = trainers[0]
    ref, policy = trainer.ref_model, trainer.model
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # the trained (master) weights
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    policy_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    ref_bytes = sum(p.numel() * p.element_size() for p in ref.parameters())
    assert ref_bytes == policy_bytes // 2  # TRL's default (the policy's dtype) would equal policy_bytes


def test_ref_dtype_choices_are_checked():
    with pytest.raises(ConfigError, match="ref_dtype"):
        compose_config(["task=train", "algo=msgrpo", "algo.ref_dtype=int8"])
