"""Bandit env: reward statistics, colour shuffling, history window, regret, horizon, success, views."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.envs import NumericObservation, make_env
from agentrl.envs.bandit import COLOURS, BanditEnv
from agentrl.errors import ConfigError, UnknownChoiceError


def _pull_all(env: BanditEnv, actions: list[int]) -> list[tuple]:
    return [env.step(a) for a in actions]


def test_colour_list_is_long_distinct_and_parseable():
    assert len(COLOURS) >= 20 and len(set(COLOURS)) == len(COLOURS)
    # No name inside another: a parser scanning text for names cannot confuse two buttons.
    assert not [(a, b) for a in COLOURS for b in COLOURS if a != b and a in b]


@pytest.mark.parametrize(
    "kwargs", [{}, {"arms": 10}, {"arms": 20, "reward": "gaussian"}, {"history": 0}, {"horizon": 3}]
)
def test_check_env_passes(kwargs):
    check_env(make_env("bandit", **kwargs), skip_render_check=True)


def test_registered_as_gymnasium_id():
    env = gym.make("agentrl/Bandit-v0", arms=10)
    obs, info = env.reset(seed=0)
    assert len(info["valid_actions"]) == 10 and "Buttons:" in obs


@pytest.mark.parametrize("reward,tolerance", [("bernoulli", 0.08), ("gaussian", 0.15)])
def test_arm_statistics_match_means(reward, tolerance):
    pulls = 800  # standard error <= 0.5/sqrt(800) = 0.018 (Bernoulli), 1/sqrt(800) = 0.035 (Gaussian)
    env = BanditEnv(arms=5, reward=reward, horizon=5 * pulls)
    _, info = env.reset(seed=7)
    rewards: dict[int, list[float]] = {a: [] for a in range(5)}
    for t in range(5 * pulls):
        _, r, _, _, info = env.step(t % 5)
        rewards[t % 5].append(r)
    means = np.array(info["arm_means"])
    empirical = np.array([np.mean(rewards[a]) for a in range(5)])
    assert np.abs(empirical - means).max() < tolerance
    assert info["state"]["counts"] == [pulls] * 5
    np.testing.assert_allclose(info["state"]["sums"], [sum(rewards[a]) for a in range(5)])
    if reward == "bernoulli":
        assert set(np.concatenate(list(rewards.values()))) == {0.0, 1.0}
    else:
        assert abs(np.std(rewards[0]) - 1.0) < 0.1  # gaussian_sd


def test_arm_means_distributions():
    bern = np.concatenate([BanditEnv(arms=20).reset(seed=s)[1]["arm_means"] for s in range(50)])
    assert bern.min() >= 0 and bern.max() <= 1 and abs(bern.mean() - 0.5) < 0.05  # U(0, 1)
    gauss = np.concatenate(
        [BanditEnv(arms=20, reward="gaussian").reset(seed=s)[1]["arm_means"] for s in range(50)]
    )
    assert abs(gauss.mean()) < 0.1 and abs(gauss.std() - 1.0) < 0.1  # N(0, 1)
    # new means per seed
    assert BanditEnv().reset(seed=1)[1]["arm_means"] != BanditEnv().reset(seed=2)[1]["arm_means"]


def test_colour_shuffle_differs_by_seed_and_is_reproducible():
    env = BanditEnv(arms=5)
    names = {seed: tuple(env.reset(seed=seed)[1]["valid_actions"]) for seed in range(10)}
    assert len(set(names.values())) > 1
    for seed, seen in names.items():
        assert tuple(BanditEnv(arms=5).reset(seed=seed)[1]["valid_actions"]) == seen
        assert len(set(seen)) == 5 and set(seen) <= set(COLOURS)
    used = {name for seed in range(40) for name in BanditEnv(arms=5).reset(seed=seed)[1]["valid_actions"]}
    assert used == set(COLOURS)  # names are drawn from the whole list, not just its first K
    env.reset(seed=3)
    assert env.action_names == list(names[3])  # action names follow the shuffle
    assert env.action_index(names[3][2]) == 2
    assert f"labeled {', '.join(names[3])}." in env.instructions
    assert env.action_space.n == 5


def test_same_seed_same_episode():
    def play(seed: int):
        env = BanditEnv(reward="gaussian", history=5)
        out = [env.reset(seed=seed)[0]]
        for t in range(env.horizon):
            obs, r, *_ = env.step((3 * t) % 5)
            out += [obs, r]
        return out

    assert play(11) == play(11)
    assert play(11) != play(12)


def test_history_window_length():
    env = BanditEnv(arms=5, history=3)
    obs, _ = env.reset(seed=0)
    assert "No button has been pressed yet." in obs
    names = env.action_names
    actions = [0, 1, 2, 3, 4, 0, 1]
    results = _pull_all(env, actions)
    obs = results[-1][0]
    lines = [line for line in obs.splitlines() if " button, reward " in line]
    assert len(lines) == 3
    expected = [
        f"{names[a]} button, reward {int(r[1])}" for a, r in zip(actions[-3:], results[-3:], strict=True)
    ]
    assert lines == expected
    assert "Round 8 of 50." in obs

    env = BanditEnv(arms=5, history=0)
    env.reset(seed=0)
    obs = _pull_all(env, actions)[-1][0]
    assert " button, reward " not in obs and "pressed" not in obs

    env = BanditEnv(arms=5, reward="gaussian", history=50)
    env.reset(seed=0)
    obs = _pull_all(env, actions)[-1][0]
    assert len([line for line in obs.splitlines() if " button, reward " in line]) == len(actions)
    assert f"reward {env.last_reward:.2f}" in obs  # Gaussian rewards shown with two decimals


def test_summary_view_shows_each_button_once_with_its_presses_and_mean():
    env = BanditEnv(arms=5, view="summary")
    obs, _ = env.reset(seed=0)
    names = env.action_names
    assert "No button has been pressed yet." in obs
    assert [f"{n} button: not pressed yet" in obs for n in names] == [True] * 5
    actions = [0, 1, 0, 0, 2]
    results = _pull_all(env, actions)
    obs = results[-1][0]
    rewards = [r[1] for r in results]
    lines = [line for line in obs.splitlines() if " button: " in line]
    assert len(lines) == 5  # one per button, in the buttons' order, whatever the horizon
    first = [r for a, r in zip(actions, rewards, strict=True) if a == 0]
    assert lines[0] == f"{names[0]} button: pressed 3 times, average reward {sum(first) / 3:.2f}"
    assert lines[1] == f"{names[1]} button: pressed 1 time, average reward {rewards[1]:.2f}"
    assert lines[3] == f"{names[3]} button: not pressed yet"
    assert "Your 5 presses so far, by button:" in obs
    assert " button, reward " not in obs  # no per-press lines


def test_regret_is_cumulative_expected_regret():
    env = BanditEnv(arms=5)
    _, info = env.reset(seed=4)
    means = np.array(info["arm_means"])
    assert info["regret"] == 0.0 and info["best_arm"] == int(np.argmax(means))
    assert info["best_arm_name"] == env.action_names[info["best_arm"]]
    actions = [0, 1, 2, 3, 4, 4, 2, int(np.argmax(means))]
    expected = 0.0
    for a in actions:
        _, _, _, _, info = env.step(a)
        expected += means.max() - means[a]
        assert info["regret"] == pytest.approx(expected)
        assert info["arm_means"] == list(means)  # present at every step
    # pulling only the best arm accrues no regret
    env.reset(seed=4)
    for _ in range(10):
        _, _, _, _, info = env.step(info["best_arm"])
    assert info["regret"] == 0.0


def test_rlft_diagnostics_in_episode_metrics():
    env = BanditEnv(arms=3, horizon=6)
    env.reset(seed=0)
    env.arm_means = np.array([1.0, 0.0, 0.0])  # deterministic Bernoulli rewards: arm 0 pays 1, others 0
    for a in [1, 2, 1, 0, 0, 0]:
        *_, info = env.step(a)
    # judged pulls 2..6: greedy at pulls 3, 5, 6 (arm with the best empirical mean so far);
    # most-pulled-so-far at pulls 3 and 6
    assert info["episode_metrics"] == pytest.approx(
        {
            "regret": 3.0,
            "action_coverage": 1.0,
            "best_arm_share": 0.5,
            "greedy_share": 0.6,
            "frequency_share": 0.4,
        }
    )
    _, info = env.reset(seed=0)
    assert info["episode_metrics"]["action_coverage"] == 0.0 and info["episode_metrics"]["regret"] == 0.0


def test_horizon_truncates_and_never_terminates():
    env = BanditEnv(horizon=7)
    env.reset(seed=0)
    for t in range(7):
        _, _, terminated, truncated, info = env.step(t % 5)
        assert not terminated
        assert truncated == (t == 6)
    assert info["state"]["t"] == 7 and env.max_steps == 7


def test_success_means_best_arm_pulled_most():
    env = BanditEnv(arms=3, horizon=4)
    _, info = env.reset(seed=0)
    best, other = info["best_arm"], (info["best_arm"] + 1) % 3
    for a in [best, best, other]:
        assert not env.step(a)[4]["success"]  # only judged at the horizon
    assert env.step(other)[4]["success"] is False  # a tie is not success
    env.reset(seed=0)
    infos = [env.step(a)[4] for a in [other, best, best, best]]
    assert infos[-1]["success"] is True


def test_state_and_numeric_view():
    env = BanditEnv(arms=4, horizon=10)
    env.reset(seed=2)
    env.step(1)
    _, reward, _, _, info = env.step(1)
    state = info["state"]
    assert set(state) == {"arms", "names", "counts", "sums", "t", "last_action", "last_reward"}
    assert state["counts"] == [0, 2, 0, 0] and state["t"] == 2
    assert state["last_action"] == 1 and state["last_reward"] == reward
    vec = env.numeric_observation()
    assert vec.dtype == np.float32 and vec.shape == (9,) and env.numeric_space().contains(vec)
    np.testing.assert_allclose(vec[:4], [0, 0.2, 0, 0])
    assert vec[5] == pytest.approx(state["sums"][1] / 2) and vec[-1] == pytest.approx(0.2)

    wrapped = NumericObservation(BanditEnv(arms=10, reward="gaussian"))
    obs, _ = wrapped.reset(seed=0)
    assert wrapped.observation_space.contains(obs)
    obs, *_ = wrapped.step(3)
    assert wrapped.observation_space.contains(obs)


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"arms": 1}, ConfigError),
        ({"arms": len(COLOURS) + 1}, ConfigError),
        ({"reward": "poisson"}, UnknownChoiceError),
        ({"gaussian_sd": 0}, ConfigError),
        ({"horizon": 0}, ConfigError),
        ({"history": -1}, ConfigError),
        ({"view": "table"}, UnknownChoiceError),
    ],
)
def test_bad_config_raises_typed_error(kwargs, error):
    with pytest.raises(error):
        make_env("bandit", **kwargs)


def test_config_file_matches_constructor():
    import inspect
    from pathlib import Path

    import yaml

    import agentrl

    conf = yaml.safe_load((Path(agentrl.__file__).parent / "conf/env/bandit.yaml").read_text())
    assert conf.pop("name") == "bandit"
    conf.pop("defaults", None)  # Hydra's defaults list (the schema), not a constructor argument
    params = inspect.signature(BanditEnv).parameters
    assert conf == {k: p.default for k, p in params.items() if k != "render_mode"}
