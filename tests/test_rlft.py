"""RLFT: return-to-go and its baselines, the exploration bonus and the GAE mode on hand-made episodes;
training on the bandit with rationales on the tiny random model (checkpoint, resume, the invalid-answer
rule)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import interrupt_rollout
from typer.testing import CliRunner

from agentrl.algos import LLM_ALGORITHMS, poad, rlft
from agentrl.cli import app
from agentrl.config import compose_config, typed
from agentrl.envs import env_factory
from agentrl.errors import ConfigError
from agentrl.runs.runlog import checkpoint_problem, newest_checkpoint
from agentrl.trainers.multistep import train_llm
from agentrl.trainers.signals import TrainingInterrupted
from agentrl.types import Episode, Generation, Step


def step(reward: float, action: int = 0, valid: bool = True, tokens: int = 2) -> Step:
    generation = Generation("p", "c", [1, 2, 3], list(range(10, 10 + tokens)), [-0.5] * tokens)
    return Step("o", action, str(action), valid, reward, reward, generation)


def episode(rewards: list[float], group: int, actions: list[int] | None = None) -> Episode:
    actions = actions or list(range(len(rewards)))
    return Episode(
        seed=group, group_id=group, steps=[step(r, a) for r, a in zip(rewards, actions, strict=True)]
    )


def algo(**overrides: Any) -> SimpleNamespace:
    settings = dict(
        advantage="return_to_go",
        baseline="group_step",
        normalize_advantages=False,
        advantage_std_floor=0.0,
        gamma=0.5,
        lam=0.8,
        exploration_bonus=0.0,
    )
    return SimpleNamespace(**{**settings, **overrides})


def row_advantages(credit: Any) -> dict[tuple[int, int], float]:
    return {(s.episode_index, s.step_index): s.advantage for s in credit.samples}


# Hand-made batch (gamma 0.5): group 0 holds A (rewards 1, 0, 2) and B (0, 1); group 1 holds C (3).
#   G(A) = [1 + 0.5 * (0 + 0.5 * 2), 0 + 0.5 * 2, 2] = [1.5, 1, 2];  G(B) = [0.5, 1];  G(C) = [3]
BATCH = [([1.0, 0.0, 2.0], 0), ([0.0, 1.0], 0), ([3.0], 1)]


def batch() -> list[Episode]:
    return [episode(rewards, group) for rewards, group in BATCH]


def test_return_to_go_is_the_discounted_sum_from_each_step():
    assert rlft.returns_to_go([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0])
    assert rlft.returns_to_go([1.0, 0.0, 2.0], 1.0) == pytest.approx([3.0, 2.0, 2.0])
    assert rlft.returns_to_go([], 0.9) == []


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        # b_t = mean G_t of the group at step t: step 0 (1.5 + 0.5) / 2, step 1 (1 + 1) / 2, step 2 only A;
        # C is alone in its group
        ("group_step", {(0, 0): 0.5, (0, 1): 0.0, (0, 2): 0.0, (1, 0): -0.5, (1, 1): 0.0, (2, 0): 0.0}),
        # b = mean of all six G = 9 / 6 = 1.5
        ("batch", {(0, 0): 0.0, (0, 1): -0.5, (0, 2): 0.5, (1, 0): -1.0, (1, 1): -0.5, (2, 0): 1.5}),
        ("none", {(0, 0): 1.5, (0, 1): 1.0, (0, 2): 2.0, (1, 0): 0.5, (1, 1): 1.0, (2, 0): 3.0}),
    ],
)
def test_each_baseline_on_hand_computed_numbers(baseline, expected):
    credit = rlft.assign_credit(batch(), algo(baseline=baseline), np.random.default_rng(0))
    assert row_advantages(credit) == pytest.approx(expected)
    assert credit.kept == [0, 1, 2]
    # every completion token of a step gets the step's advantage: one float per row, no value targets
    assert all(isinstance(s.advantage, float) and s.returns is None for s in credit.samples)
    assert [len(s.completion_ids) for s in credit.samples] == [2] * 6


def test_normalisation_divides_by_the_batch_std_without_recentring():
    raw = [1.5, 1.0, 2.0, 0.5, 1.0, 3.0]  # baseline none: A = G
    credit = rlft.assign_credit(
        batch(), algo(baseline="none", normalize_advantages=True), np.random.default_rng(0)
    )
    std = float(np.std(raw))
    assert [s.advantage for s in credit.samples] == pytest.approx([a / std for a in raw], rel=1e-6)


def test_unknown_baseline_and_advantage_are_rejected():
    with pytest.raises(ConfigError, match="baseline"):
        rlft.assign_credit(batch(), algo(baseline="mean"), np.random.default_rng(0))
    with pytest.raises(ConfigError, match="advantage"):
        rlft.assign_credit(batch(), algo(advantage="td"), np.random.default_rng(0))
    with pytest.raises(ConfigError, match="baseline"):
        typed(compose_config(["task=train", "algo=rlft", "algo.baseline=mean"]).algo)


def test_steps_without_a_generation_are_not_trained_on_but_count_in_the_return():
    ep = episode([1.0, 2.0], 0)
    ep.steps[1].generation = None  # e.g. a step nobody generated
    credit = rlft.assign_credit([ep], algo(baseline="none"), np.random.default_rng(0))
    assert row_advantages(credit) == pytest.approx({(0, 0): 1.0 + 0.5 * 2.0})


def test_exploration_bonus_rewards_valid_actions_new_to_the_episode():
    actions = [0, 0, 1, 2, 2, 1, 3]
    valid = [True, True, True, False, True, True, True]
    ep = Episode(seed=0, steps=[step(0.0, a, v) for a, v in zip(actions, valid, strict=True)])
    # step 3 is invalid (its action, 2, is the random fallback's): no bonus, but 2 counts as tried, so
    # choosing 2 at step 4 is not new
    assert rlft.new_actions(ep) == [True, False, True, False, False, False, True]
    assert rlft.shaped_rewards(ep, 0.5) == [0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.5]
    assert rlft.shaped_rewards(ep, 0.0) == [0.0] * 7
    credit = rlft.assign_credit(
        [ep], algo(baseline="none", gamma=1.0, exploration_bonus=0.5), np.random.default_rng(0)
    )
    # return-to-go over the shaped rewards: 1.5 from step 0, 1.0 from step 1 and 2, 0.5 from step 3 to 6
    assert [s.advantage for s in credit.samples] == pytest.approx([1.5, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    assert credit.stats["exploration_bonus/steps"] == 3
    assert [s.reward for s in ep.steps] == [0.0] * 7  # the recorded rewards are not changed


@pytest.mark.parametrize("bonus", [0.0, 0.3])
def test_gae_mode_is_poads_token_gae_with_one_value_per_step(bonus):
    rng = np.random.default_rng(3)
    episodes = [episode([1.0, -5.0, 0.0], 0, [0, 1, 1]), episode([0.0, 1.0], 1, [2, 2])]
    # the critic gives a value at every completion token; RLFT reads the state's, values[e][t][0]
    values = [[list(rng.normal(size=2)) for _ in e.steps] for e in episodes]
    config = algo(advantage="gae", gamma=0.9, lam=0.8, exploration_bonus=bonus)
    credit = rlft.assign_credit(episodes, config, np.random.default_rng(0), values=values)
    expected_adv, expected_ret, expected_old = [], [], []
    for e, v in zip(episodes, values, strict=True):
        state = [[x[0]] for x in v]
        adv, ret = poad.token_gae(rlft.shaped_rewards(e, bonus), state, gamma=0.9, lam=0.8, decompose=True)
        expected_adv += [a[0] for a in adv]
        expected_ret += [r[0] for r in ret]
        expected_old += [x[0] for x in state]
    assert [s.advantage for s in credit.samples] == pytest.approx(expected_adv)
    assert [s.returns for s in credit.samples] == [pytest.approx([r]) for r in expected_ret]
    assert [s.old_values for s in credit.samples] == [pytest.approx([v]) for v in expected_old]
    assert "value/explained_variance" in credit.stats
    # normalised: standardised over the batch's rows, as POAD's token advantages
    normed = rlft.assign_credit(
        episodes,
        algo(**{**vars(config), "normalize_advantages": True}),
        np.random.default_rng(0),
        values=values,
    )
    assert [s.advantage for s in normed.samples] == pytest.approx(poad.normalize_tokens([expected_adv])[0])
    with pytest.raises(ValueError, match="critic"):
        rlft.assign_credit(episodes, config, np.random.default_rng(0))


def test_the_std_floor_keeps_a_batch_of_critic_noise_small():
    """Every game lost alike (return -1): the gae advantages are the critic's small errors. Plain
    standardisation scales them to unit spread, full-size updates from noise; the floor keeps them at
    their size relative to the floor, and leaves a batch with real outcome differences as it was."""

    def gae(episodes: list[Episode], values: Any, floor: float = 0.0) -> Any:
        config = algo(
            advantage="gae", gamma=1.0, lam=0.95, normalize_advantages=True, advantage_std_floor=floor
        )
        return rlft.assign_credit(episodes, config, np.random.default_rng(0), values=values)

    lost = [episode([0.0, 0.0, -1.0], g) for g in (0, 1)]
    values = [[[-1.0 + 0.01 * (t - g)] for t in range(3)] for g in (0, 1)]  # a critic about right
    plain, floored = gae(lost, values), gae(lost, values, floor=0.25)
    raw = np.array(plain.advantages)
    assert raw.std() < 0.02  # nothing but the critic's error
    assert np.std([s.advantage for s in plain.samples]) == pytest.approx(1.0, rel=1e-4)
    assert [s.advantage for s in floored.samples] == pytest.approx(list((raw - raw.mean()) / 0.25))
    assert max(abs(s.advantage) for s in floored.samples) < 0.1
    # won and lost games in one batch: the std is above the floor, the advantages are standardised as before
    mixed = [episode([0.0, 1.0], 0), episode([0.0, -1.0], 0)]
    flat = [[[0.0] for _ in range(2)] for _ in range(2)]
    a, b = gae(mixed, flat), gae(mixed, flat, floor=0.25)
    assert [s.advantage for s in a.samples] == pytest.approx([s.advantage for s in b.samples])
    # the return_to_go mode divides by the same floored std
    rtg = rlft.assign_credit(
        [episode([0.0, 0.01], 0), episode([0.0, 0.0], 0)],
        algo(normalize_advantages=True, advantage_std_floor=0.25, gamma=1.0),
        np.random.default_rng(0),
    )
    assert max(abs(s.advantage) for s in rtg.samples) == pytest.approx(0.005 / 0.25)


def test_registry_config_and_presets():
    assert LLM_ALGORITHMS["rlft"].config == "RLFTConfig" and not LLM_ALGORITHMS["rlft"].critic
    node = typed(compose_config(["task=train", "algo=rlft"]).algo)
    assert (node.advantage, node.baseline, node.gamma) == ("return_to_go", "group_step", 1.0)
    assert node.beta > 0  # a KL term to the reference policy
    bandit = compose_config(["task=train", "experiment=rlft_bandit"])
    assert (bandit.algo.name, bandit.env.name, bandit.env.arms) == ("rlft", "bandit", 5)
    assert bandit.agent.cot and bandit.agent.invalid_rule == "random" and bandit.agent.invalid_penalty == -5
    game = compose_config(["task=train", "experiment=rlft_tictactoe"])
    assert (game.algo.advantage, game.env.name, game.env.opponent) == ("gae", "tictactoe", "random")


# ---- end to end on the tiny random model ----------------------------------------------------------------
RUN = [
    "task=train",
    "algo=rlft",
    "env=bandit",
    "env.horizon=3",
    "env.history=3",
    "model=tiny-random",
    "agent.cot=true",
    "agent.invalid_rule=random",
    "agent.invalid_penalty=-5",
    "agent.sampling.max_new_tokens=8",
    "eval.episodes=1",
    "algo.group_size=2",
    "algo.groups_per_iteration=1",
    "algo.gradient_accumulation_steps=1",
    "algo.learning_rate=1e-3",
    "algo.eval_every=0",
    "algo.checkpoint_every=0",
    "algo.eval_before=false",
    "algo.save_final=false",
    "algo.torch_threads=1",
]


def test_train_on_the_bandit_checkpoints_resumes_and_penalises_invalid_answers(tmp_path, monkeypatch):
    import agentrl.rollout

    recorded: list[Episode] = []
    real = agentrl.rollout.rollout

    def recording(*args: Any, **kwargs: Any) -> list[Episode]:
        episodes = real(*args, **kwargs)
        recorded.extend(episodes)
        return episodes

    monkeypatch.setattr(agentrl.rollout, "rollout", recording)
    interrupt_rollout(monkeypatch, 2)  # during the second iteration's rollout
    with pytest.raises(TrainingInterrupted):
        train_llm(compose_config([*RUN, "algo.iterations=2"]), tmp_path, env_factory)
    checkpoint = newest_checkpoint(tmp_path)
    assert checkpoint.name == "checkpoint-1" and checkpoint_problem(checkpoint) is None

    monkeypatch.setattr(agentrl.rollout, "rollout", recording)
    train_llm(compose_config([*RUN, "algo.iterations=2"]), tmp_path, env_factory, resume=True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["samples"] > 0 and "kl" in r for r in rows)  # rows were trained, with the KL term (beta > 0)

    steps = [s for e in recorded for s in e.steps]
    invalid = [s for s in steps if not s.valid]
    assert len(steps) >= 12 and invalid  # two iterations of 2 episodes x 3 presses, at least
    # invalid answers: penalised, and a random button is pressed (not always the default one)
    assert all(s.reward == pytest.approx(s.env_reward - 5.0) for s in invalid)
    assert all(s.reward == s.env_reward for s in steps if s.valid)
    assert len({s.action for s in invalid}) > 1
    # every step generated a rationale and an action: its whole completion is one training row
    assert all(s.generation is not None and s.completion_ids for s in steps)


def test_algo_rlft_brings_the_papers_agent_settings():
    """`algo=rlft` alone thinks first and plays a random action with -5 for an invalid answer, as the
    paper's agent does; the command line still decides, and other algorithms keep the agent's defaults."""

    def agent_line(*overrides: str) -> str:
        result = CliRunner().invoke(app, ["train", *overrides, "--dry-run"])
        assert result.exit_code == 0, result.output
        return next(line for line in result.output.splitlines() if line.strip().startswith("agent"))

    line = agent_line("algo=rlft")
    assert "cot=true" in line and "invalid_rule=random" in line and "invalid_penalty=-5.0" in line
    line = agent_line("algo=rlft", "agent.cot=false", "agent.invalid_penalty=-2")
    assert "cot=false" in line and "invalid_penalty=-2.0" in line
    line = agent_line("algo=msgrpo")
    assert "cot=false" in line and "invalid_rule=penalty_default" in line and "invalid_penalty=-1.0" in line


def test_trl_does_not_warn_that_the_reference_models_settings_are_ignored(tmp_path):
    """With a KL term TRL builds its reference model from `model_init_kwargs`: its warning that they
    "will be ignored" (the policy comes as a model) is wrong and stays out of the output."""
    args = [o for o in RUN if o != "task=train"]
    result = CliRunner().invoke(app, ["train", *args, "algo.iterations=1", f"hydra.run.dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eval.json").read_text())["algo"] == "rlft"
    assert "model_init_kwargs" not in result.output


def test_training_without_rationales_warns(monkeypatch, caplog, tmp_path):
    class Stop(Exception):
        pass

    def stop(*args: Any, **kwargs: Any) -> None:
        raise Stop

    # the check runs before the agent is built: stop there instead of training
    monkeypatch.setattr("agentrl.agents.llm.build_llm_agent", stop)
    with caplog.at_level(logging.WARNING, logger="agentrl.trainers.multistep"), pytest.raises(Stop):
        train_llm(compose_config([*RUN, "agent.cot=false"]), tmp_path, env_factory)
    assert any("agent.cot=true" in r.getMessage() for r in caplog.records)


def test_gae_advantage_trains_a_value_head_on_tictactoe(tmp_path):
    from agentrl.trainers.critic import VALUE_HEAD_FILE

    overrides = [o for o in RUN if not o.startswith(("env", "algo.save_final"))]
    cfg = compose_config([*overrides, "env=tictactoe", "algo.advantage=gae", "algo.iterations=1"])
    train_llm(cfg, tmp_path, env_factory)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["samples"] > 0
    assert "value_loss" in rows[0] and "value/explained_variance" in rows[0]
    assert (tmp_path / "final" / VALUE_HEAD_FILE).is_file()


def test_gae_with_a_kl_term_trains_alike_when_the_critic_shares_the_reference_model(
    tmp_path, monkeypatch, caplog
):
    """GAE with beta > 0: the critic's trunk is TRL's reference model, and the reference log-probs come from
    the critic's forward. Two iterations train as with two separate frozen copies: the same KL (exactly 0
    before the first update), value loss and policy loss."""
    import agentrl.trainers.multistep as multistep

    overrides = [o for o in RUN if not o.startswith(("env", "algo.save_final"))]
    cfg = [*overrides, "env=tictactoe", "algo.advantage=gae", "algo.iterations=2", "algo.save_final=false"]

    def metrics(out: Any) -> list[dict[str, Any]]:
        train_llm(compose_config(cfg), out, env_factory)
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    with caplog.at_level(logging.INFO, logger="agentrl.trainers.multistep"):
        shared = metrics(tmp_path / "shared")
    assert any("trunk is the reference model" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(multistep, "_shares_reference", lambda *args: False)
    apart = metrics(tmp_path / "apart")
    assert shared[0]["kl"] == pytest.approx(0.0, abs=1e-6) and shared[1]["kl"] > 1e-6  # the policy moved
    for a, b in zip(shared, apart, strict=True):
        for key in ("kl", "value_loss", "loss", "samples"):
            # abs: a KL of ~0 from two forwards in another order (1.04e-7 apart under a GPU's bf16)
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["credit_s"] > 0 and a["prepare_s"] >= 0


def test_the_eval_before_training_carries_the_decision_diagnostics(tmp_path):
    """A bandit training run measures coverage and regret before training as well as after."""
    result = train_llm(
        compose_config([*RUN, "algo.iterations=1", "algo.eval_before=true"]), tmp_path, env_factory
    )
    before = json.loads((tmp_path / "eval_before.json").read_text())
    assert {"final_regret", "final_coverage", "greediness", "curves"} <= set(before["diagnostics"])
    assert result.extra["before"]["diagnostics"] == before["diagnostics"]
