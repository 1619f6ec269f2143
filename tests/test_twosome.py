"""TWOSOME (algo=twosome): action-level GAE credit, the action-level PPO loss on the tiny model, and a
training run through the CLI."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from agentrl.agents.scoring import candidate_logps, twosome_log_policy
from agentrl.algos import poad, twosome
from agentrl.cli import app
from agentrl.config import compose_config, typed
from agentrl.errors import ConfigError
from agentrl.trainers.grpo_trainer import MultiStepTrainer
from agentrl.trainers.settings import grpo_config
from agentrl.types import Episode, Generation, Step, StepSample

ALGO = SimpleNamespace(gamma=0.9, lam=0.8, normalize_advantages=False, advantage_std_floor=0.0)
CANDIDATES = [[11, 12], [13], [14, 15, 16]]


def scored_step(reward: float, choice: int, t: int) -> Step:
    generation = Generation(
        "p",
        "c",
        [100, 101, 102 + t],
        CANDIDATES[choice],
        candidates=CANDIDATES,
        normalizers=[2, 1, 3],
        choice=choice,
    )
    return Step("o", choice, "a", True, reward, reward, generation)


def test_credit_is_action_level_gae_on_the_state_values():
    episode = Episode(seed=0, steps=[scored_step(0.5, 0, 0), scored_step(1.0, 2, 1)])
    # the critic gives a value per token of the chosen action; the state's is the first
    values = [[[0.2, 9.0], [0.4, 9.0, 9.0]]]
    credit = twosome.assign_credit([episode], ALGO, np.random.default_rng(0), values=values)
    advantages, returns = poad.token_gae([0.5, 1.0], [[0.2], [0.4]], gamma=0.9, lam=0.8)
    assert [s.advantage for s in credit.samples] == pytest.approx([advantages[0][0], advantages[1][0]])
    assert [s.returns for s in credit.samples] == [returns[0], returns[1]]
    assert [s.old_values for s in credit.samples] == [[0.2], [0.4]]
    assert [s.choice for s in credit.samples] == [0, 2]
    assert credit.samples[0].candidates == CANDIDATES and credit.samples[0].normalizers == [2, 1, 3]


def test_credit_refuses_generated_answers():
    step = Step("o", 0, "a", True, 1.0, 1.0, Generation("p", "c", [1], [2]))
    with pytest.raises(ConfigError, match="agent.decision=score"):
        twosome.assign_credit(
            [Episode(seed=0, steps=[step])], ALGO, np.random.default_rng(0), values=[[[0.0]]]
        )


def chosen_log_prob(model: Any, prompt: list[int], choice: int) -> float:
    with torch.no_grad():
        logps, _ = candidate_logps(model, [prompt], [CANDIDATES])
        return float(twosome_log_policy(logps.sum(-1), [2, 1, 3], 1.0)[choice])


def action_update(tmp_path: Any, advantage: float, *overrides: str) -> tuple[float, float, dict, dict]:
    """One action-level update on a fixed row: log pi(chosen) before and after, and the weights."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from agentrl.models import load_model

    cfg = compose_config(
        [
            "task=train",
            "algo=twosome",
            "model=tiny-random",
            "algo.iterations=1",
            "algo.learning_rate=1e-3",
            "algo.temperature=1.0",
            "algo.gradient_accumulation_steps=1",
            *overrides,
        ]
    )
    algo = typed(cfg.algo)
    torch.manual_seed(0)
    # fp32 master weights, as train_llm loads them (model.dtype=auto would be bf16 on a GPU)
    model, tokenizer = load_model(dataclasses.replace(typed(cfg.model), dtype="float32"), for_training=True)
    prompt = list(range(100, 130))
    row = StepSample(
        prompt, CANDIDATES[1], None, advantage, 0, 0, candidates=CANDIDATES, normalizers=[2, 1, 3], choice=1
    )
    trainer = MultiStepTrainer(
        model=model,
        reward_funcs=[lambda **kw: [0.0]],
        args=grpo_config(algo, tmp_path, model.device.type, 0),
        processing_class=tokenizer,
        collect=lambda iteration: ([row], {}),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    before_w = {n: p.detach().clone() for n, p in model.named_parameters()}
    before = chosen_log_prob(model, prompt, 1)
    trainer.train()
    after_w = {n: p.detach().clone() for n, p in model.named_parameters()}
    return before, chosen_log_prob(model, prompt, 1), before_w, after_w


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_advantage_sign_moves_the_chosen_actions_probability(tmp_path, sign):
    before, after, _, _ = action_update(tmp_path, sign, "algo.entropy_coef=0")
    assert (after - before) * sign > 1e-4


def test_a_zero_advantage_without_entropy_bonus_moves_nothing(tmp_path):
    _, _, before, after = action_update(tmp_path, 0.0, "algo.entropy_coef=0")
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_train_twosome_through_the_cli(tmp_path):
    run = tmp_path / "run"
    args = [
        "train",
        "algo=twosome",
        "env=kitchen",
        "model=tiny-random",
        "algo.iterations=2",
        "algo.group_size=2",
        "algo.groups_per_iteration=1",
        "algo.gradient_accumulation_steps=1",
        "algo.max_steps=4",
        "algo.eval_every=0",
        "algo.eval_before=false",
        "eval.episodes=1",
        f"hydra.run.dir={run}",
    ]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2] and all("value_loss" in r for r in rows)
    transcripts = [json.loads(line) for line in (run / "transcripts.jsonl").read_text().splitlines()]
    assert transcripts and all(
        t["valid"] and "action_probs" in t for t in transcripts
    )  # it never plays invalid
    assert (run / "final" / "value_head.pt").is_file()
    assert json.loads((run / "eval.json").read_text())["algo"] == "twosome"
    # evaluated again from its directory, the policy scores the valid actions as in its run (the saved
    # config holds the agent's own agent.decision=generate, which the trainer overrode at run time)
    out = tmp_path / "eval"
    result = CliRunner().invoke(
        app, ["eval", f"from_run={run}", f"hydra.run.dir={out}"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    again = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert again and all(t["valid"] and "action_probs" in t for t in again)
    assert (out / "episodes.jsonl").read_text() == (run / "episodes.jsonl").read_text()
