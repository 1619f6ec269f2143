"""Contextual bandit env (reward model, determinism, text, views) and its LinUCB planner."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from agentrl.agents.baselines import PlannerAgent, RandomAgent
from agentrl.agents.linucb import linucb_action, linucb_scores
from agentrl.cli import app
from agentrl.config.env import CONTEXTUAL_MAX_FEATURES, ContextualBanditConfig
from agentrl.envs import NumericObservation, make_env
from agentrl.envs.contextual_bandit import FEATURE_NAMES, ContextualBanditEnv, sigmoid
from agentrl.errors import ConfigError
from agentrl.rollout import rollout
from agentrl.types import StepContext


def _ctx(env: ContextualBanditEnv, info: dict) -> StepContext:
    return StepContext(env, env.render_text(), info, [], np.random.default_rng(0), 0)


@pytest.mark.parametrize("reward", ["bernoulli", "gaussian"])
def test_best_arm_is_the_argmax_of_the_generators_means(reward):
    env = ContextualBanditEnv(arms=6, features=4, reward=reward)
    best_arms = set()
    for seed in range(5):
        _, info = env.reset(seed=seed)
        for t in range(20):
            x = np.concatenate([[1.0], info["context"]])
            logits = env.theta @ x
            expected = sigmoid(logits) if reward == "bernoulli" else logits
            np.testing.assert_allclose(info["arm_means"], expected)
            assert info["best_arm"] == int(np.argmax(expected))
            assert info["best_arm_name"] == env.action_names[info["best_arm"]]
            best_arms.add((seed, info["best_arm"]))
            _, _, _, _, info = env.step(t % 6)
    # the best arm depends on the context: episodes see more than one best arm
    assert len(best_arms) > 5


def test_bernoulli_rewards_follow_the_context_means():
    env = ContextualBanditEnv(arms=3, horizon=1200)
    _, info = env.reset(seed=3)
    gaps = []
    for t in range(1200):
        mean = info["arm_means"][t % 3]
        _, reward, _, _, info = env.step(t % 3)
        assert reward in (0.0, 1.0)
        gaps.append(reward - mean)
    assert abs(np.mean(gaps)) < 0.05  # standard error <= 0.5 / sqrt(1200) = 0.0144


def test_context_is_uniform_rounded_and_changes_every_step():
    env = ContextualBanditEnv(features=5, horizon=500)
    _, info = env.reset(seed=0)
    contexts = [info["context"]]
    for _ in range(499):
        contexts.append(env.step(0)[4]["context"])
    values = np.array(contexts)
    assert values.min() >= -1 and values.max() <= 1 and abs(values.mean()) < 0.05
    np.testing.assert_allclose(values, np.round(values, 2))
    assert len({tuple(c) for c in contexts}) == len(contexts)


def test_same_seed_same_episode_other_seed_other_parameters():
    def play(seed: int) -> list:
        env = make_env("contextual_bandit")
        trace = [env.reset(seed=seed)]
        trace += [env.step(a % env.arms) for a in range(30)]
        return [json.dumps(step, sort_keys=True, default=float) for step in trace]

    assert play(4) == play(4)
    assert play(4) != play(5)
    a, b = ContextualBanditEnv(), ContextualBanditEnv()
    a.reset(seed=1), b.reset(seed=2)
    assert not np.allclose(a.theta, b.theta)


def test_regret_and_metrics_accumulate_per_context():
    env = ContextualBanditEnv(arms=4, horizon=40)
    _, info = env.reset(seed=9)
    regret, best = 0.0, 0
    rng = np.random.default_rng(0)
    for _ in range(40):
        action = int(rng.integers(4))
        regret += max(info["arm_means"]) - info["arm_means"][action]
        best += action == info["best_arm"]
        _, _, terminated, truncated, info = env.step(action)
    assert truncated and not terminated
    assert info["regret"] == pytest.approx(regret)
    metrics = info["episode_metrics"]
    assert metrics["regret"] == pytest.approx(regret)
    assert metrics["best_arm_share"] == pytest.approx(best / 40)
    assert metrics["action_coverage"] == 1.0
    assert set(metrics) == {"regret", "action_coverage", "best_arm_share", "greedy_share", "frequency_share"}
    state = info["state"]
    assert len(state["contexts"]) == len(state["actions"]) == len(state["rewards"]) == 40
    assert state["counts"] == [state["actions"].count(a) for a in range(4)]
    assert info["success"] == env.mostly_best()


def test_success_needs_the_best_arm_in_most_late_steps():
    env = ContextualBanditEnv(arms=3, horizon=10)
    _, info = env.reset(seed=0)
    for _ in range(10):
        _, _, _, truncated, info = env.step(info["best_arm"])
    assert truncated and info["success"] and info["episode_metrics"]["best_arm_share"] == 1.0
    _, info = env.reset(seed=0)
    for _ in range(10):
        _, _, _, _, info = env.step((info["best_arm"] + 1) % 3)
    assert not info["success"] and info["episode_metrics"]["best_arm_share"] == 0.0


def test_observation_shows_the_context_and_the_last_presses():
    env = ContextualBanditEnv(arms=3, features=2, history=2)
    obs, info = env.reset(seed=0)
    assert "No button has been pressed yet." in obs
    x = info["context"]
    assert obs.endswith(f"Context now: temperature {x[0]:+.2f}, humidity {x[1]:+.2f}.")
    for a in range(3):
        obs, reward, *_ = env.step(a)
    lines = obs.splitlines()
    assert lines[0] == f"Round 4 of 50. Buttons: {', '.join(env.action_names)}."
    assert "(temperature, humidity)" in lines[1]
    assert lines[-2] == (
        f"{env.contexts[2][0]:+.2f} {env.contexts[2][1]:+.2f} -> {env.action_names[2]}, reward {int(reward)}"
    )
    assert len(lines) == 5  # round, legend, two presses, the current context
    assert "temperature, humidity" in env.instructions and all(
        n in env.instructions for n in env.action_names
    )


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"arms": 10, "features": 12}, {"reward": "gaussian"}, {"history": 0}, {"horizon": 2}],
)
def test_check_env_and_numeric_view(kwargs):
    env = make_env("contextual_bandit", **kwargs)
    check_env(env, skip_render_check=True)
    wrapped = NumericObservation(make_env("contextual_bandit", **kwargs))
    obs, info = wrapped.reset(seed=0)
    assert wrapped.observation_space.contains(obs)
    np.testing.assert_allclose(obs[: len(info["context"])], info["context"], atol=1e-6)
    for _ in range(3):
        obs, *_ = wrapped.step(0)
        assert wrapped.observation_space.contains(obs)


def test_registered_config_and_bad_options():
    env = gym.make("agentrl/ContextualBandit-v0", arms=4)
    _, info = env.reset(seed=0)
    assert len(info["valid_actions"]) == 4 and len(info["context"]) == 3
    assert len(FEATURE_NAMES) == CONTEXTUAL_MAX_FEATURES
    with pytest.raises(ConfigError, match="features"):
        ContextualBanditEnv(features=len(FEATURE_NAMES) + 1)
    with pytest.raises(ConfigError, match="show fewer presses"):
        ContextualBanditEnv(features=12, history=500)
    with pytest.raises(ConfigError, match=r"env\.features=0"):
        ContextualBanditConfig(features=0)


# ---- LinUCB ------------------------------------------------------------------------------------------
def test_linucb_scores_match_the_ridge_formula():
    contexts = [[0.5, -0.2], [0.1, 0.9], [-0.4, 0.3]]
    actions, rewards, now = [0, 0, 1], [1.0, 0.0, 1.0], [0.3, -0.7]
    scores = linucb_scores(contexts, actions, rewards, now, arms=3, alpha=0.5)
    x = np.array([1.0, *now])
    for arm in range(3):
        rows = [np.array([1.0, *c]) for c, a in zip(contexts, actions, strict=True) if a == arm]
        gram = np.eye(3) + sum((np.outer(r, r) for r in rows), np.zeros((3, 3)))
        target = sum(
            (
                rw * np.array([1.0, *c])
                for c, a, rw in zip(contexts, actions, rewards, strict=True)
                if a == arm
            ),
            np.zeros(3),
        )
        inverse = np.linalg.inv(gram)
        assert scores[arm] == pytest.approx(x @ inverse @ target + 0.5 * np.sqrt(x @ inverse @ x))
    assert scores[2] == pytest.approx(0.5 * np.sqrt(x @ x))  # an untried arm: no estimate, the prior width


def test_linucb_is_stateless_and_ignores_foreign_options():
    env = ContextualBanditEnv(arms=4)
    _, info = env.reset(seed=0)
    for t in range(12):
        info = env.step(t % 4)[4]
    ctx = _ctx(env, info)
    first = linucb_action(ctx)
    assert linucb_action(ctx) == first  # nothing kept between calls
    assert PlannerAgent("contextual_bandit", ucb_c=2.0, linucb_alpha=1.0).choose(ctx) == first
    expected = linucb_scores(
        info["state"]["contexts"], info["state"]["actions"], info["state"]["rewards"], info["context"], 4, 0.0
    )
    assert linucb_action(ctx, linucb_alpha=0.0) == int(np.argmax(expected))


def test_linucb_has_much_lower_regret_than_random():
    seeds = range(20)
    regret = {
        agent.name: np.mean(
            [e.final_info["regret"] for e in rollout(lambda: make_env("contextual_bandit"), agent, seeds)]
        )
        for agent in (PlannerAgent("contextual_bandit"), RandomAgent())
    }
    # measured: LinUCB ~9.4, random ~19.5 (bernoulli, 5 arms, 3 features, horizon 50)
    assert regret["planner"] < 0.7 * regret["random"]


def test_cli_eval_with_the_linucb_planner(tmp_path):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["eval", "env=contextual_bandit", "agent=planner", "eval.episodes=4", f"hydra.run.dir={run_dir}"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((run_dir / "eval.json").read_text())
    assert (
        metrics["env"] == "contextual_bandit" and metrics["agent"] == "planner" and metrics["episodes"] == 4
    )
    assert metrics["mean_length"] == 50 and 0 < metrics["mean_regret"] < 20
    assert metrics["mean_action_coverage"] == 1.0
    # the decision diagnostics, on the means of each press's own context
    assert metrics["diagnostics"]["curves"]["regret_mean"][-1] == pytest.approx(
        metrics["mean_regret"], abs=1e-4
    )


def test_evals_get_the_decision_diagnostics_with_per_context_regret():
    from agentrl.agents.baselines import RandomAgent
    from agentrl.diagnostics import diagnostics_section
    from agentrl.rollout import rollout

    episodes = rollout(lambda: ContextualBanditEnv(horizon=15), RandomAgent(), [0, 1, 2])
    section = diagnostics_section(episodes)
    assert section is not None
    # the regret curve is built from the means each press was drawn from: its last point is the env's regret
    final = [e.final_info["regret"] for e in episodes]
    assert section["curves"]["regret_mean"][-1] == pytest.approx(np.mean(final), abs=1e-5)
