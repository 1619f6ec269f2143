"""POAD and NTPO: the token-level GAE on hand-made arrays, the critic, and the engine's PPO epochs, KL gate,
value loss, checkpoints and resume on the tiny random model."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from helpers import interrupt_rollout

from agentrl.algos import poad
from agentrl.config import compose_config, typed
from agentrl.envs import env_factory
from agentrl.runs.runlog import checkpoint_problem, newest_checkpoint
from agentrl.trainers.actor_critic import ActorCritic
from agentrl.trainers.critic import VALUE_HEAD_FILE, Critic, ValueHead, clipped_value_loss
from agentrl.trainers.grpo_trainer import MultiStepTrainer
from agentrl.trainers.multistep import train_llm
from agentrl.trainers.settings import grpo_config
from agentrl.trainers.signals import TrainingInterrupted
from agentrl.types import Episode, Generation, Step

GAMMA, LAM = 0.9, 0.8


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


# ---- token GAE on hand-made arrays ---------------------------------------------------------------------
def test_bad_gae_matches_hand_computed_numbers():
    # two steps: a 2-token action (reward 1), then a 1-token action (reward 2) that ends the episode
    values = [[0.5, 0.7], [0.4]]
    adv, ret = poad.token_gae([1.0, 2.0], values, gamma=GAMMA, lam=LAM, decompose=True)
    # step 1, last token: delta = 2 - 0.4 (the episode ends: no bootstrap)
    a10 = 2 - 0.4
    # step 0, last token: delta = 1 + 0.9 * 0.4 - 0.7; gae = delta + 0.9 * 0.8 * a10
    a01 = (1 + GAMMA * 0.4 - 0.7) + GAMMA * LAM * a10
    # step 0, inside the action: delta = 0.7 - 0.5 (no discount); gae = delta + 0.8 * a01
    a00 = (0.7 - 0.5) + LAM * a01
    assert flat(adv) == pytest.approx([a00, a01, a10])
    assert flat(ret) == pytest.approx([a00 + 0.5, a01 + 0.7, a10 + 0.4])


def test_ntpo_discounts_between_the_tokens_of_an_action():
    values = [[0.5, 0.7], [0.4]]
    adv, _ = poad.token_gae([1.0, 2.0], values, gamma=GAMMA, lam=LAM, decompose=False)
    a10 = 2 - 0.4
    a01 = (1 + GAMMA * 0.4 - 0.7) + GAMMA * LAM * a10
    a00 = (GAMMA * 0.7 - 0.5) + GAMMA * LAM * a01
    assert flat(adv) == pytest.approx([a00, a01, a10])


@pytest.mark.parametrize("decompose", [True, False])
def test_with_zero_values_and_lambda_one_the_return_is_the_discounted_sum(decompose):
    rewards = [0.5, -1.0, 2.0]
    values = [[0.0] * 3, [0.0], [0.0] * 2]
    _, ret = poad.token_gae(rewards, values, gamma=GAMMA, lam=1.0, decompose=decompose)
    if decompose:  # every token of step t backs up the action-level discounted return from t
        expected = [0.5 + GAMMA * -1.0 + GAMMA**2 * 2.0, -1.0 + GAMMA * 2.0, 2.0]
        for t, row in enumerate(ret):
            assert row == pytest.approx([expected[t]] * len(row))
    else:  # NTPO: every token is a discount step; rewards sit at the tokens 2 (0.5), 3 (-1) and 5 (2)
        assert ret[0][0] == pytest.approx(GAMMA**2 * 0.5 + GAMMA**3 * -1.0 + GAMMA**5 * 2.0)


def test_ntpo_bias_grows_with_action_length_while_bad_has_none():
    """One action of L tokens, reward 1, episode ends; the critic is exact for each method's own target
    except that it predicts 0 (lam 1): the first token's return is the credit that token receives. The
    action-level return is 1 whatever the action's length."""
    bias = {True: [], False: []}
    for length in (1, 2, 4, 8, 16):
        for decompose in (True, False):
            _, ret = poad.token_gae([1.0], [[0.0] * length], gamma=GAMMA, lam=1.0, decompose=decompose)
            bias[decompose].append(1.0 - ret[0][0])
    assert bias[True] == pytest.approx([0.0] * 5)
    assert bias[False][0] == pytest.approx(0.0)
    assert all(b2 > b1 for b1, b2 in zip(bias[False], bias[False][1:], strict=False))
    assert bias[False][-1] == pytest.approx(1 - GAMMA**15)


def test_token_gae_rejects_mismatched_inputs():
    with pytest.raises(ValueError):
        poad.token_gae([1.0], [[0.0], [0.0]], gamma=0.9, lam=0.9)
    with pytest.raises(ValueError):
        poad.token_gae([1.0], [[]], gamma=0.9, lam=0.9)


def episode(rewards: list[float], completions: list[list[int]], seed: int = 0) -> Episode:
    steps = [
        Step(
            f"obs {t}",
            0,
            "a",
            True,
            r,
            r,
            Generation("p", "c", [100 + seed, 101, 102 + t], list(c), [-1.0] * len(c)),
        )
        for t, (r, c) in enumerate(zip(rewards, completions, strict=True))
    ]
    return Episode(seed=seed, steps=steps)


def test_assign_credit_gives_per_token_rows_with_normalised_advantages_and_value_targets():
    episodes = [episode([1.0, 0.0], [[5, 6], [7]]), episode([0.0], [[8, 9, 10]], seed=1)]
    values = [[[0.1, 0.2], [0.3]], [[0.0, 0.5, -0.5]]]
    algo = SimpleNamespace(
        gamma=GAMMA, lam=LAM, decompose=True, normalize_advantages=True, advantage_std_floor=0.0
    )
    credit = poad.assign_credit(episodes, algo, np.random.default_rng(0), values=values)
    assert [(s.episode_index, s.step_index) for s in credit.samples] == [(0, 0), (0, 1), (1, 0)]
    assert [len(s.advantage) for s in credit.samples] == [2, 1, 3]
    tokens = np.array([a for s in credit.samples for a in s.advantage])
    assert tokens.mean() == pytest.approx(0.0, abs=1e-9) and tokens.std() == pytest.approx(1.0, abs=1e-6)
    raw0, ret0 = poad.token_gae([1.0, 0.0], values[0], gamma=GAMMA, lam=LAM)
    assert credit.samples[0].returns == pytest.approx(ret0[0])
    assert credit.samples[0].old_values == [0.1, 0.2]
    assert credit.advantages[:2] == pytest.approx(raw0[0])  # the raw ones, for the metrics
    assert credit.kept == [0, 1]


# ---- the critic --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from agentrl.models import load_model

    cfg = compose_config(["task=train", "algo=poad", "model=tiny-random"])
    torch.manual_seed(0)
    return load_model(cfg.model, for_training=True)


def test_critic_features_equal_an_unpadded_forward(tiny):
    model, tokenizer = tiny
    critic = Critic(model)
    # a shared prompt, a distinct one, an empty completion, completions of different lengths
    head = list(range(40, 80))  # a long common head (a system prompt) runs once
    prompts = [head + [5, 6, 7, 8, 9], head + [10, 11], head + [5, 6, 7, 8, 9], head + [5, 6, 7, 8, 9, 3]]
    completions = [[20, 21, 22], [], [23], [24, 25]]
    features = critic.features(prompts, completions, tokenizer.pad_token_id)
    hidden_size = critic.head.net[0].in_features
    assert [tuple(f.shape) for f in features] == [
        (3, hidden_size),
        (1, hidden_size),
        (1, hidden_size),
        (2, hidden_size),
    ]
    # a chunk size of 1 takes the unshared path through prefill_shared; the values agree
    singles = critic.features(prompts, completions, tokenizer.pad_token_id, rows=1)
    for f, g in zip(features, singles, strict=True):
        torch.testing.assert_close(f, g, atol=1e-5, rtol=1e-4)
    for p, c, f in zip(prompts, completions, features, strict=True):
        with torch.no_grad():
            hidden = model.model(input_ids=torch.tensor([p + c], device=model.device)).last_hidden_state[0]
        n = max(len(c), 1)
        torch.testing.assert_close(f, hidden[len(p) - 1 : len(p) - 1 + n].float(), atol=1e-5, rtol=1e-4)


def test_the_critic_trunk_is_a_frozen_copy_under_full_fine_tuning(tiny):
    model, tokenizer = tiny
    critic = Critic(model)
    assert critic.trunk is not model and not any(p.requires_grad for p in critic.trunk.parameters())
    before = critic.features([[5, 6]], [[7]], tokenizer.pad_token_id)[0]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    try:
        after = critic.features([[5, 6]], [[7]], tokenizer.pad_token_id)[0]
        torch.testing.assert_close(before, after)  # the policy moved; the critic's trunk did not
    finally:
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.1)


def test_a_critic_on_the_reference_model_scores_its_log_probs_in_the_same_forward(tiny):
    """With the reference model as its trunk, the critic's values are those of a critic on its own frozen
    copy, and the reference log-probs it gives each row equal a plain forward of the reference model."""
    import copy

    from agentrl.trainers.logps import shared_prefix_logps
    from agentrl.types import StepSample

    model, tokenizer = tiny
    reference = copy.deepcopy(model).eval()
    shared = Critic(model, reference_trunk=True)
    assert shared.trunk is None and not shared.scores_reference
    with pytest.raises(RuntimeError, match="no trunk"):
        shared.features([[5, 6]], [[7]], tokenizer.pad_token_id)
    shared.use_reference(reference, temperature=0.7)
    assert shared.trunk is reference and shared.scores_reference
    own = Critic(model)
    own.head.load_state_dict(shared.head.state_dict())

    def step(prompt: list[int], completion: list[int]) -> Step:
        generation = Generation("p", "c", prompt, completion)
        return Step("o", 0, "a", True, 0.0, 0.0, generation=generation)

    head = list(range(40, 80))
    episodes = [
        Episode(seed=0, steps=[step(head + [5, 6, 7], [20, 21, 22]), step(head + [5, 9], [23])]),
        Episode(seed=0, steps=[step(head + [5, 6, 7], [24, 25]), step(head + [11], [])]),
    ]
    values = shared.evaluate(episodes, tokenizer.pad_token_id)
    torch.testing.assert_close(
        torch.tensor([v for e in values for s in e for v in s]),
        torch.tensor([v for e in own.evaluate(episodes, tokenizer.pad_token_id) for s in e for v in s]),
    )
    assert own.reference_logps([StepSample([1], [2], None, 0.0, 0, 0)], 3).abs().sum() == 0  # it scores none

    rows = [
        StepSample(s.prompt_ids, s.completion_ids, None, 0.0, i, t)
        for i, e in enumerate(episodes)
        for t, s in enumerate(e.steps)
    ]
    rows.append(StepSample([0], [0], None, 0.0, -1, -1))  # a placeholder row: zeros
    got = shared.reference_logps(rows, width=4)
    assert got.shape == (5, 4) and got[-1].abs().sum() == 0
    for r, row in enumerate(rows[:-1]):
        n = len(row.completion_ids)
        assert got[r, n:].abs().sum() == 0
        if n:
            ids = torch.tensor([row.prompt_ids + row.completion_ids], device=reference.device)
            expected = shared_prefix_logps(reference, ids, torch.ones_like(ids), n, temperature=0.7)[0][0]
            torch.testing.assert_close(got[r, :n], expected, atol=1e-5, rtol=1e-4)


def test_the_value_heads_initial_weights_come_from_the_seed(tiny):
    model, _ = tiny

    def head(seed: int) -> torch.Tensor:
        torch.manual_seed(torch.randint(0, 2**31, ()).item() + 1)  # whatever the global generator holds
        critic = Critic(model, reference_trunk=True, seed=seed)  # no trunk copy: only the head matters
        return torch.cat([p.flatten() for p in critic.head.parameters()])

    state = torch.get_rng_state()
    torch.testing.assert_close(head(3), head(3))
    assert not torch.equal(head(3), head(4))
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    Critic(model, reference_trunk=True, seed=5)
    assert torch.equal(torch.rand(1), before)  # the global generator is left as it was
    torch.set_rng_state(state)


def test_value_loss_goes_down_on_a_fixed_batch():
    torch.manual_seed(0)
    head = ValueHead(16)
    features = torch.randn(4, 5, 16)
    returns = torch.randn(4, 5)
    mask = torch.ones(4, 5)
    mask[0, 3:] = 0
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-3, eps=1e-5)
    old = head(features).detach()
    losses = []
    for _ in range(60):
        loss = clipped_value_loss(head(features), old, returns, mask, clip=None) / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_clipped_value_loss_takes_the_larger_error():
    values, old, returns = torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]])
    # clipped value = 0.2: error 1.8 > the unclipped error 1.0
    assert float(clipped_value_loss(values, old, returns, torch.ones(1, 1), clip=0.2)) == pytest.approx(
        1.8**2 / 2
    )
    assert float(clipped_value_loss(values, old, returns, torch.ones(1, 1), clip=None)) == pytest.approx(0.5)


# ---- the engine: PPO epochs, the KL gate, the value loss --------------------------------------------------
def poad_update(tmp_path: Any, *overrides: str) -> tuple[dict, dict, dict, dict, list[dict]]:
    """One POAD iteration on fixed episodes with the tiny model: (policy weights before, after, value head
    before, after, logged rows)."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from agentrl.models import load_model

    cfg = compose_config(
        [
            "task=train",
            "algo=poad",
            "model=tiny-random",
            "algo.iterations=1",
            "algo.learning_rate=1e-3",
            "algo.gradient_accumulation_steps=2",
            "algo.entropy_coef=0",
            *overrides,
        ]
    )
    algo = typed(cfg.algo)
    torch.manual_seed(0)
    # fp32 master weights, as train_llm loads them (model.dtype=auto would be bf16 on a GPU)
    model, tokenizer = load_model(dataclasses.replace(typed(cfg.model), dtype="float32"), for_training=True)
    critic = Critic(model)
    prompt = list(range(100, 130))
    episodes = [
        Episode(
            seed=k,
            steps=[
                Step("o", 0, "a", True, float(r), float(r), Generation("p", "c", prompt + [k, t], comp))
                for t, (r, comp) in enumerate([(1 - k, [11, 12, 13]), (k, [14, 15])])
            ],
        )
        for k in range(2)
    ]
    credit = poad.assign_credit(
        episodes, algo, np.random.default_rng(0), values=critic.evaluate(episodes, tokenizer.pad_token_id)
    )
    logged: list[dict] = []
    args = grpo_config(algo, tmp_path, model.device.type, 0)
    trainer = MultiStepTrainer(
        model=model,
        reward_funcs=[lambda **kw: [0.0]],
        args=args,
        processing_class=tokenizer,
        collect=lambda iteration: (list(credit.samples), {}),
        actor_critic=ActorCritic(critic, algo.critic_learning_rate, algo.value_coef, algo.value_clip),
        ppo_epochs=algo.ppo_epochs,
        target_kl=algo.target_kl,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)

    class Rows(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "train_runtime" not in logs:  # not the end-of-training summary
                logged.append(dict(logs))

    trainer.add_callback(Rows())
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    head_before = {n: p.detach().clone() for n, p in critic.head.named_parameters()}
    trainer.train()
    after = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    head_after = {n: p.detach().clone() for n, p in critic.head.named_parameters()}
    return snapshot, after, head_before, head_after, logged


def distance(a: dict, b: dict) -> float:
    return float(sum((a[n] - b[n]).pow(2).sum() for n in a) ** 0.5)


def test_ppo_epochs_move_further_and_a_triggered_kl_gate_skips_the_actor_steps(tmp_path):
    before, one, head0, head1, _ = poad_update(tmp_path / "a", "algo.ppo_epochs=1")
    _, three, _, head3, rows3 = poad_update(tmp_path / "b", "algo.ppo_epochs=3", "algo.target_kl=null")
    _, gated, _, head_gated, rows_gated = poad_update(
        tmp_path / "c", "algo.ppo_epochs=3", "algo.target_kl=1e-12"
    )
    assert distance(before, one) > 0 and distance(head0, head1) > 0  # the actor and the value head learn
    assert distance(before, three) > 1.5 * distance(before, one)  # three actor steps, not one
    assert rows3[-1]["actor_steps_skipped"] == 0 and rows3[-1]["approx_kl"] > 0
    # the gate: epochs 2 and 3 see a KL above 1e-12 and skip their actor steps; the first epoch's ratio is
    # 1 (old log-probs are this policy's), so the policy ends where the one-epoch run's does
    assert rows_gated[-1]["actor_steps_skipped"] == 2
    for name in one:
        torch.testing.assert_close(gated[name], one[name], atol=1e-6, rtol=0)
    # the value head still takes all three steps
    assert distance(head0, head_gated) > distance(head0, head1)
    assert "value_loss" in rows_gated[-1]


# ---- end to end: train, checkpoint with the value head, resume ----------------------------------------------
POAD_RUN = [
    "task=train",
    "algo=poad",
    "env=kitchen",  # multi-token actions
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",
    "eval.episodes=2",
    "algo.group_size=2",
    "algo.groups_per_iteration=1",
    "algo.gradient_accumulation_steps=1",
    "algo.ppo_epochs=2",
    "algo.eval_every=0",
    "algo.checkpoint_every=0",
    "algo.eval_before=false",
    "algo.save_final=false",
]


def test_train_interrupt_and_resume_with_the_value_head(tmp_path, monkeypatch):
    real_rollout = interrupt_rollout(monkeypatch, 3)  # during the third iteration's rollout
    overrides = POAD_RUN  # NTPO runs the same engine: it differs only in token_gae's switch (tested above)
    with pytest.raises(TrainingInterrupted):
        train_llm(compose_config([*overrides, "algo.iterations=4"]), tmp_path, env_factory)
    checkpoint = newest_checkpoint(tmp_path)
    assert checkpoint.name == "checkpoint-2" and checkpoint_problem(checkpoint) is None
    saved_head = torch.load(checkpoint / VALUE_HEAD_FILE, weights_only=True)
    assert VALUE_HEAD_FILE in json.loads((checkpoint / "manifest.json").read_text())["files"]

    loaded: list[dict] = []
    real_load = Critic.load

    def spy(self: Critic, directory: Any) -> bool:
        ok = real_load(self, directory)
        loaded.append({k: v.clone() for k, v in self.head.state_dict().items()} if ok else {})
        return ok

    monkeypatch.setattr(Critic, "load", spy)
    monkeypatch.setattr("agentrl.rollout.rollout", real_rollout)
    train_llm(compose_config([*overrides, "algo.iterations=3"]), tmp_path, env_factory, resume=True)
    assert len(loaded) == 1 and loaded[0].keys() == saved_head.keys()
    for key, value in saved_head.items():
        torch.testing.assert_close(loaded[0][key].cpu(), value)  # the file's tensors load on the CPU
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert all("value_loss" in r and "approx_kl" in r for r in rows)


def test_a_token_budget_gives_the_same_policy_and_value_head_update(tmp_path):
    before, whole, head0, head_whole, _ = poad_update(
        tmp_path / "a", "algo.ppo_epochs=2", "algo.target_kl=null"
    )
    _, split, _, head_split, _ = poad_update(
        tmp_path / "b", "algo.ppo_epochs=2", "algo.target_kl=null", "algo.max_batch_tokens=40"
    )
    assert distance(before, whole) > 0 and distance(head0, head_whole) > 0
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-5)
    for name in head_whole:
        torch.testing.assert_close(head_split[name], head_whole[name], atol=1e-6, rtol=1e-5)


def test_normalize_tokens_floors_the_std():
    noise = [[0.40, 0.41], [0.39]]
    assert np.std([a for r in poad.normalize_tokens(noise) for a in r]) == pytest.approx(1.0, rel=1e-4)
    floored = poad.normalize_tokens(noise, std_floor=0.5)
    assert [a for r in floored for a in r] == pytest.approx([0.0, 0.02, -0.02])
    spread = [[1.0, -1.0], [0.5]]
    flat = [a for r in poad.normalize_tokens(spread) for a in r]
    assert [a for r in poad.normalize_tokens(spread, std_floor=0.5) for a in r] == pytest.approx(flat)
