"""AGENTRL_CPU_FEATURES (agentrl/kernels/features.py): the switch parses, a wrong name fails before launch,
the log line names what was detected and what was forced, and a training iteration with every CPU fast
path switched off samples the same tokens, with the same log-probs and gradients, as with them on."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from helpers import fast_paths

import agentrl.trainers.multistep as multistep
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.errors import ConfigError
from agentrl.kernels import features
from agentrl.kernels.features import FAST_PATHS, CpuFeatures, parse
from agentrl.trainers.iteration import Collector


def test_the_names_parse_and_combine():
    assert parse("") == parse("auto") == CpuFeatures()
    assert parse("plain") == CpuFeatures(plain=True)
    assert parse(" Plain , no-packs") == CpuFeatures(True, frozenset({"packs"}))
    assert parse("none") == CpuFeatures(True, frozenset(FAST_PATHS))
    assert parse("none").forced == "plain," + ",".join(f"no-{p}" for p in FAST_PATHS)
    assert parse("auto").forced is None
    assert not parse("no-rollout-graph").enabled("rollout-graph") and parse("plain").enabled("packs")


def test_a_wrong_name_lists_the_valid_ones(monkeypatch):
    with pytest.raises(
        ConfigError, match=r"AGENTRL_CPU_FEATURES=plian: unknown name 'plian'; valid choices: "
    ):
        parse("plian")
    monkeypatch.setenv(features.ENV, "no-packs,fast")
    with pytest.raises(ConfigError, match="no-packed-attention, no-sparse-embedding, no-rollout-graph"):
        features.fast_path("packs")


def test_a_wrong_name_fails_before_launch_with_exit_2(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agentrl.cli import app

    monkeypatch.setenv(features.ENV, "avx2")
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["train", "env=frozenlake", "algo=msgrpo", "model=tiny-random", f"hydra.run.dir={run}"]
    )
    assert result.exit_code == 2 and "AGENTRL_CPU_FEATURES=avx2: unknown name 'avx2'" in result.output
    assert not run.exists()


# ---- one training iteration, fast paths on and off ---------------------------------------------------
BUILD_TRAINER = multistep._build_trainer
COLLECTOR_ROLLOUT = Collector.rollout


def _iteration(tmp_path, monkeypatch, *overrides: str) -> dict[str, Any]:
    """One MS-GRPO iteration of the tiny model on Frozen Lake: the rollout's sampled tokens and their
    log-probs, the update's gradient, the metrics row and the log."""
    import json

    from transformers import TrainerCallback

    out: dict[str, Any] = {"grads": {}, "tokens": [], "logprobs": []}

    class Gradient(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            model = kwargs["model"]
            out["grads"].update(
                {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            )
            out["sparse"] = model.get_input_embeddings().sparse
            out["attention"] = model.config._attn_implementation

    # the unpatched functions: a second call in one test must not wrap the first call's wrappers
    build, rollout = BUILD_TRAINER, COLLECTOR_ROLLOUT

    def with_callback(*args: Any, **kwargs: Any) -> Any:
        trainer = build(*args, **kwargs)
        trainer.add_callback(Gradient())
        return trainer

    def recorded(self: Any, iteration: int) -> Any:
        episodes, rounds = rollout(self, iteration)
        for step in (s for e in episodes for s in e.steps):
            out["tokens"].append(step.generation.completion_ids)
            out["logprobs"].extend(step.generation.logprobs)
        return episodes, rounds

    monkeypatch.setattr(multistep, "_build_trainer", with_callback)
    monkeypatch.setattr(Collector, "rollout", recorded)
    cfg = compose_config(
        [
            "task=train",
            "algo=msgrpo",
            "model=tiny-random",
            "env=frozenlake",
            "agent.prefill='I move'",
            "algo.iterations=1",
            "algo.group_size=4",
            "algo.groups_per_iteration=3",
            "algo.gradient_accumulation_steps=1",
            "agent.invalid_rule=random",  # an invalid answer moves at random: episodes end apart
            "algo.eval_before=false",
            "algo.save_final=false",
            "algo.checkpoint_every=0",
            "algo.torch_threads=1",
            "eval.episodes=1",
            *overrides,
        ]
    )
    from agentrl.trainers.multistep import train_llm

    train_llm(cfg, tmp_path, env_factory)
    out["row"] = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    return out


@pytest.mark.cpu_only("the fast paths are the CPU's; train_llm puts the model where model.device=auto does")
@pytest.mark.parametrize("answer_tokens", [1, 3])
def test_every_fast_path_off_gives_the_same_iteration(tmp_path, monkeypatch, caplog, answer_tokens):
    """With every fast path switched off (AGENTRL_CPU_FEATURES=none: no packs, transformers' own SDPA,
    dense embedding gradients, the update's own forward) an iteration samples the same tokens for the
    same seed, with the same log-probs, and its update has the same gradient up to fp32 summation order.
    One-token answers take the rollout graph; three-token answers decode on packed weights."""
    overrides = (f"agent.sampling.max_new_tokens={answer_tokens}",)
    fast_paths(monkeypatch)
    fast = _iteration(tmp_path / "fast", monkeypatch, *overrides)
    monkeypatch.setenv(features.ENV, "none")
    with caplog.at_level(logging.INFO):
        plain = _iteration(tmp_path / "plain", monkeypatch, *overrides)
    assert (fast["row"].get("update_reused_rollout") == 1.0) == (answer_tokens == 1)
    assert "update_reused_rollout" not in plain["row"]
    assert fast["sparse"] and not plain["sparse"]
    assert (fast["attention"], plain["attention"]) == ("agentrl_sdpa", "sdpa")
    assert any("forced by AGENTRL_CPU_FEATURES=plain,no-packs" in m for m in caplog.messages)

    assert fast["tokens"] and fast["tokens"] == plain["tokens"]
    torch.testing.assert_close(
        torch.tensor(fast["logprobs"]), torch.tensor(plain["logprobs"]), rtol=1e-4, atol=1e-5
    )
    assert fast["row"]["train/mean_return"] == plain["row"]["train/mean_return"]
    assert set(fast["grads"]) == set(plain["grads"]) and any(
        g.abs().sum() > 0 for g in plain["grads"].values()
    )
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(fast["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
