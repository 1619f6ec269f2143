"""The rollout's forward kept for the update (`algo.rollout_graph`, agents/backends/graphs.py): with
one-token answers the update backpropagates through the logits the rollout sampled from, and its gradient
is the one its own forward would give."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from helpers import WeightCasts, fast_paths

import agentrl.trainers.multistep as multistep
from agentrl.agents.backends import HFBackend, SamplingConfig
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.models import load_model
from agentrl.trainers.logps import shared_prefix_logps

# train_llm and the backend run where model.device=auto puts the model: with a GPU visible, on it
pytestmark = pytest.mark.cpu_only("the rollout graph serves one-token answers on a CPU (algo.rollout_graph)")


@pytest.fixture(autouse=True)
def _rollout_graph_on(monkeypatch):
    """These tests are of the rollout graph: on, whatever AGENTRL_CPU_FEATURES the suite runs under
    (`plain` kept); the comparison with its fallback switches it off itself."""
    fast_paths(monkeypatch)


HEAD = list(range(100, 130))  # the shared head (above MIN_SHARED_PREFIX)
TAILS = [[5, 6, 7], [8, 9], [5, 6, 7], [10], [8, 9], [11, 12, 13, 14]]  # repeated prompts, as in a rollout
ONE_TOKEN = SamplingConfig(temperature=1.0, max_new_tokens=1)
TEMPERATURE = 1.0


def _model(autocast: bool = False) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model, tokenizer = load_model(compose_config(["model=tiny-random"]).model)
    if autocast:  # what accelerate's prepare_model does under bf16-mixed (as tests/test_backends.py)
        model._original_forward = model.forward
        model.forward = types.MethodType(
            torch.autocast("cpu", dtype=torch.bfloat16)(model.forward.__func__), model
        )
    model.train()
    return model, tokenizer


def _prompts() -> list[list[int]]:
    return [HEAD + tail for tail in TAILS]


def _distinct(prompts: list[list[int]]) -> list[tuple[int, ...]]:
    return list(dict.fromkeys(tuple(p) for p in prompts))


def _rows(prompts: list[tuple[int, ...]], targets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt + one-token answer, as the trainer packs them."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor(
        [[0] * (width - len(p)) + list(p) + [t] for p, t in zip(prompts, targets, strict=True)]
    )
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + 1) for p in prompts])
    return ids, mask


def _gradient(model: Any, recorded: Any, prompts: list[tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The gradient of a fixed weighted sum of the rows' answer log-probs, through the kernel the update
    runs (with `recorded`: from the rollout's logits)."""
    targets = [3 + 7 * k for k in range(len(prompts))]
    weights = torch.linspace(-1.0, 1.0, len(prompts))
    ids, mask = _rows(prompts, targets)
    model.zero_grad()
    logps, _ = shared_prefix_logps(model, ids, mask, 1, TEMPERATURE, recorded=recorded)
    (logps[:, 0] * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_update_through_the_rollouts_forward_has_the_gradient_of_its_own_forward():
    """fp32: the kept logits give the update's gradient, every weight's, the shared head's included, also
    when an eval ran the same prompts without a graph before (the head and the memo are recomputed)."""
    model, tokenizer = _model()
    backend = HFBackend(model, tokenizer, share_prompts=True)
    prompts = _prompts()
    distinct = _distinct(prompts)
    backend.generate(prompts, SamplingConfig(temperature=0.0, max_new_tokens=1))  # an eval: no graph
    with backend.recording_graphs() as graphs:
        recorded_answers = backend.generate(prompts, ONE_TOKEN, seed=3)
    assert set(graphs.logits) == set(distinct)
    assert model.training  # restored after the rollout's eval-mode forwards

    through_rollout = _gradient(model, backend.recorded_logits, distinct)
    own_forward = _gradient(model, None, distinct)
    assert set(through_rollout) == set(own_forward)
    for name, grad in own_forward.items():
        torch.testing.assert_close(through_rollout[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # the decoder layers and the embeddings (the head's tokens) all get a gradient
    assert all(g.abs().sum() > 0 for n, g in through_rollout.items() if "layers" in n or "embed" in n)
    assert graphs.tokens == len(HEAD) + len(distinct) * max(len(t) for t in TAILS)  # the head once
    # sampling is the same as without recording (the same logits, the same draws)
    plain = HFBackend(model, tokenizer, share_prompts=True)
    assert plain.generate(prompts, ONE_TOKEN, seed=3) == recorded_answers


def test_under_bf16_autocast_each_weight_is_cast_once_and_every_weight_gets_the_gradient():
    """The rollout's casts are made inside recorded forwards, with their graph: the backward reaches every
    2-D weight, close to the update's own bf16 forward (another batching, the same computation)."""
    model, tokenizer = _model(autocast=True)
    backend = HFBackend(model, tokenizer, share_prompts=True)
    prompts = _prompts()
    distinct = _distinct(prompts)
    with WeightCasts(model) as casts, backend.recording_graphs():
        for k in range(0, len(prompts), 2):  # lockstep steps: each call meets new prompts
            backend.generate(prompts[: k + 2], ONE_TOKEN, seed=k)
    assert casts.most() == 1  # once for the whole rollout
    through_rollout = _gradient(model, backend.recorded_logits, distinct)
    own_forward = _gradient(model, None, distinct)
    matrices = [n for n, p in model.named_parameters() if p.dim() == 2]
    assert all(through_rollout[n].abs().sum() > 0 for n in matrices)
    for name in matrices:
        a, b = through_rollout[name].flatten(), own_forward[name].flatten()
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99, name


def test_a_forward_without_a_graph_ends_the_recording():
    """A forward that does not record (here a multi-token answer, no_grad) caches weight casts without a
    graph; a later recorded forward would reuse them and cut the gradient off the weights. So the
    recording ends there, and the update runs its own forward."""
    model, tokenizer = _model(autocast=True)
    backend = HFBackend(model, tokenizer, share_prompts=True)
    prompts = _prompts()
    with backend.recording_graphs() as graphs:
        backend.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=2), seed=0)
        backend.generate(prompts, ONE_TOKEN, seed=0)
    assert not graphs.recording and not graphs.logits and not graphs.overflowed
    assert backend.recorded_logits(_distinct(prompts)) is None


def test_past_the_token_budget_the_rollout_drops_its_graphs_and_samples_the_same():
    model, tokenizer = _model()
    backend = HFBackend(model, tokenizer, share_prompts=True)
    prompts = _prompts()
    with backend.recording_graphs(budget=len(HEAD) + 10) as graphs:
        answers = backend.generate(prompts, ONE_TOKEN, seed=5)
    assert graphs.overflowed and not graphs.logits
    assert backend.recorded_logits(_distinct(prompts)) is None
    assert HFBackend(model, tokenizer, share_prompts=True).generate(prompts, ONE_TOKEN, seed=5) == answers


def test_kept_logits_are_given_out_once_and_never_after_the_weights_change():
    model, tokenizer = _model()
    backend = HFBackend(model, tokenizer, share_prompts=True)
    prompts = _prompts()
    distinct = _distinct(prompts)
    with backend.recording_graphs():
        backend.generate(prompts, ONE_TOKEN, seed=0)
    assert backend.recorded_logits(distinct[:1] + [(1, 2, 3)]) is None  # one prompt never recorded
    assert backend.recorded_logits(distinct) is None  # emptied by the first take

    with backend.recording_graphs():
        backend.generate(prompts, ONE_TOKEN, seed=0)
    backend.weights_changed()  # the optimizer stepped
    assert backend.recorded_logits(distinct) is None

    with backend.recording_graphs():
        backend.generate(prompts, ONE_TOKEN, seed=0)
    with torch.no_grad():
        model.lm_head.weight.add_(0.01)  # an in-place change moves the version counters
    assert backend.recorded_logits(distinct) is None


# ---- in training -------------------------------------------------------------------------------------
BUILD_TRAINER = multistep._build_trainer


def _one_iteration(tmp_path: Any, monkeypatch: Any, *overrides: str) -> tuple[dict, dict]:
    """One MS-GRPO iteration of the tiny model on Frozen Lake with one-token answers: the gradient of its
    update (before the optimizer step) and its metrics row."""
    import json

    from transformers import TrainerCallback

    grads: dict[str, torch.Tensor] = {}

    class Gradient(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            grads.update(
                {n: p.grad.clone() for n, p in kwargs["model"].named_parameters() if p.grad is not None}
            )

    def with_callback(*args: Any, **kwargs: Any) -> Any:
        trainer = BUILD_TRAINER(*args, **kwargs)  # unpatched: a second call must not add a second callback
        trainer.add_callback(Gradient())
        return trainer

    monkeypatch.setattr(multistep, "_build_trainer", with_callback)
    cfg = compose_config(
        [
            "task=train",
            "algo=msgrpo",
            "model=tiny-random",
            "env=frozenlake",
            "agent.prefill='I move'",
            "agent.sampling.max_new_tokens=1",
            "algo.iterations=1",
            "algo.group_size=4",
            "algo.groups_per_iteration=4",
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
    multistep.train_llm(cfg, tmp_path, env_factory)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    return grads, row


@pytest.mark.parametrize("budget", ["auto", "null", "100000"])
def test_the_graphs_are_always_bounded(tmp_path, monkeypatch, caplog, budget):
    """auto: the update's activation budget; a number: that many padded tokens; null (no bound on the
    update) still bounds the rollout, which may run many more prompts than its update keeps."""
    import logging
    import re

    with caplog.at_level(logging.INFO, logger="agentrl.trainers.multistep"):
        _, row = _one_iteration(tmp_path, monkeypatch, f"algo.max_batch_tokens={budget}")
    said = [m for m in caplog.messages if m.startswith("The update backpropagates through the rollout")]
    assert len(said) == 1 and re.search(r"at most (\d+) tokens", said[0])
    if budget == "100000":
        assert "at most 100000 tokens" in said[0]
    assert row["update_reused_rollout"] == 1.0


def test_in_training_the_update_takes_the_rollouts_forward_with_the_same_gradient(tmp_path, monkeypatch):
    """algo.rollout_graph=false; AGENTRL_CPU_FEATURES=no-rollout-graph is compared in test_cpu_features.py."""
    kept, kept_row = _one_iteration(tmp_path / "kept", monkeypatch)
    own, own_row = _one_iteration(tmp_path / "own", monkeypatch, "algo.rollout_graph=false")
    assert kept_row["update_reused_rollout"] == 1.0 and "update_reused_rollout" not in own_row
    assert kept_row["train/mean_return"] == own_row["train/mean_return"]  # the same episodes
    assert kept and set(kept) == set(own)
    assert any(g.abs().sum() > 0 for g in own.values())
    for name, grad in own.items():
        torch.testing.assert_close(kept[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["agent.sampling.max_new_tokens=3"], "answers are not one generated token"),
        (["algo.gradient_accumulation_steps=2"], "the update runs more than one micro-batch or epoch"),
        (["algo.gradient_checkpointing=true"], "algo.gradient_checkpointing=true"),
        (["algo.shared_prefix=false"], "algo.shared_prefix=false"),
    ],
)
def test_where_it_does_not_apply_the_update_runs_its_own_forward(tmp_path, monkeypatch, overrides, reason):
    from agentrl.trainers import multistep

    reasons: list[str | None] = []
    original = multistep.rollout_graph_reason

    def spy(*args: Any) -> str | None:
        reasons.append(original(*args))
        return reasons[-1]

    monkeypatch.setattr(multistep, "rollout_graph_reason", spy)
    _, row = _one_iteration(tmp_path, monkeypatch, *overrides)
    assert reasons == [reason]
    assert "update_reused_rollout" not in row
