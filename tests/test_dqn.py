"""DQN trainer: a short run writes eval/checkpoints and resumes; DQN beats random on a tiny deterministic
env; the Snake features and the legal-action fallback of DQNAgent are what they claim."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.agents.baselines import RandomAgent
from agentrl.config import compose_config
from agentrl.envs import make_env
from agentrl.errors import ConfigError
from agentrl.evaluation import env_factory, eval_seeds, evaluate
from agentrl.types import StepContext
from agentrl.trainers.dqn import (
    DQNAgent,
    list_checkpoints,
    load_dqn_agent,
    resolve_observation,
    snake_features,
    train_dqn,
)

# FrozenLake fixed 4x4, not slippery; 16 moves so random exploration reaches the goal now and then
# (about 1% of random episodes; with 8 moves it is 0.3%). Small, fast DQN settings.
FAST = [
    "task=train",
    "algo=dqn",
    "agent=random",
    "env=frozenlake",
    "env.map=4x4",
    "env.slippery=false",
    "env.max_steps=16",
    "eval.episodes=10",
    "algo.net_arch=[64,64]",
    "algo.learning_starts=1000",
    "algo.learning_rate=0.001",
    "algo.gamma=0.9",
    "algo.target_update_interval=250",
    "algo.exploration_fraction=0.5",
    "algo.exploration_final_eps=0.1",
    "algo.log_every=500",
    "algo.checkpoint_every=1000",
]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("AGENTRL_NO_PROGRESS", "1")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _iterations(run_dir: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_short_run_writes_eval_checkpoints_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_config([*FAST, "algo.total_timesteps=2000"])
    metrics = train_dqn(cfg, run_dir)

    saved = json.loads((run_dir / "eval.json").read_text())
    assert saved["total_timesteps"] == 2000 and saved["algo"] == "dqn" and saved["env"] == "frozenlake"
    assert saved["episodes"] == 10 and saved["success_rate"] == metrics["success_rate"]
    assert len((run_dir / "episodes.jsonl").read_text().splitlines()) == 10
    assert [s for s, _ in list_checkpoints(run_dir)] == [1000, 2000]
    assert (run_dir / "checkpoint-2000.replay.pkl").is_file()
    assert not (run_dir / "checkpoint-1000.replay.pkl").exists()  # only the newest buffer is kept
    assert (run_dir / "final" / "model.zip").is_file()
    assert (run_dir / "sb3" / "progress.csv").is_file() and any((run_dir / "tb").iterdir())
    assert _iterations(run_dir) == [500, 1000, 1500, 2000]
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"mean_return", "success_rate", "loss", "exploration_rate"} <= set(first)

    # A killed run leaves a half-written temp file: it is not a checkpoint.
    (run_dir / ".checkpoint-3000.zip.tmp").write_bytes(b"partial")
    resumed = compose_config([*FAST, "algo.total_timesteps=3000"])
    train_dqn(resumed, run_dir, resume=True)

    saved = json.loads((run_dir / "eval.json").read_text())
    assert saved["total_timesteps"] == 3000  # continued from 2000, not restarted
    assert saved["train_time_s"] >= first["train_time_s"]
    assert _iterations(run_dir) == [500, 1000, 1500, 2000, 2500, 3000]  # no step logged twice
    assert [s for s, _ in list_checkpoints(run_dir)] == [1000, 2000, 3000]
    assert (run_dir / "sb3" / "resume-2000" / "progress.csv").is_file()
    assert json.loads((run_dir / "final" / "dqn.json").read_text())["steps"] == 3000


def test_dqn_beats_random_on_fixed_frozenlake(tmp_path):
    cfg = compose_config([*FAST, "algo.total_timesteps=6000", "algo.checkpoint_every=0"])
    metrics = train_dqn(cfg, tmp_path / "run")
    random_metrics, _ = evaluate(env_factory(cfg.env), RandomAgent(), eval_seeds(cfg))
    assert metrics["success_rate"] == 1.0  # the map is fixed and deterministic: the greedy path is solved
    assert metrics["mean_length"] == 6.0  # the shortest path
    assert random_metrics["success_rate"] < 0.5
    # the saved model reproduces the eval through load_dqn_agent
    agent = load_dqn_agent(tmp_path / "run" / "final" / "model.zip", "frozenlake")
    again, _ = evaluate(env_factory(cfg.env), agent, eval_seeds(cfg))
    assert again["success_rate"] == metrics["success_rate"]


def test_observation_choice():
    assert resolve_observation("auto", "snake") == "features"
    assert resolve_observation("auto", "snake_poison") == "features"
    assert resolve_observation("auto", "frozenlake") == "planes"
    assert resolve_observation("planes", "snake") == "planes"
    with pytest.raises(ConfigError):
        resolve_observation("features", "frozenlake")
    with pytest.raises(ConfigError):
        resolve_observation("pixels", "snake")


def test_snake_features_on_a_placed_board():
    env = make_env("snake", size=6, poison_apples=1)
    # Head (2,2) heading right, body (2,1),(2,0); enemy head (0,2); apple (4,5); poison right below the head.
    env.reset(
        seed=0,
        options={
            "snake": [[2, 2], [2, 1], [2, 0]],
            "direction": "right",
            "opponent": [[0, 2]],
            "apples": [[4, 5]],
            "poison": [[3, 2]],
        },
    )
    f = snake_features(env)
    up, down, left, right = range(4)
    assert f.shape == (26,) and f.dtype == np.float32
    assert f[left] == 1.0  # the neck
    assert f[up] == 0.0 and f[down] == 0.0 and f[right] == 0.0
    assert f[4 + up] == 1.0  # (1,2) is next to the enemy head (0,2)
    assert f[4 + down] == 0.0
    assert f[8 + down] == 1.0  # poison below
    assert list(f[12:16]) == [0.0, 1.0, 0.0, 1.0]  # apple is down and right
    assert f[16 + left] == 0.0 and f[16 + right] > 0.5  # no room into the neck, most of the board right
    assert f[20 + right] == 1.0 and f[20:24].sum() == 1.0  # heading
    assert f[24] == pytest.approx(3 / 36)
    assert f[25] == pytest.approx((2 + 3) / 12)
    # at a wall
    env.reset(seed=0, options={"snake": [[0, 0]], "direction": "up", "opponent": None, "apples": [[5, 5]]})
    f = snake_features(env)
    assert f[up] == 1.0 and f[left] == 1.0 and f[down] == 0.0 and f[right] == 0.0


class _FixedQ:
    """A stand-in SB3 model whose Q-values are fixed: argmax is action 0."""

    def __init__(self, q: list[float]):
        self.q = torch.tensor([q])
        self.policy = self

    def set_training_mode(self, mode: bool) -> None:
        pass

    def obs_to_tensor(self, obs):
        return torch.as_tensor(obs), True

    def q_net(self, obs):
        return self.q.repeat(obs.shape[0], 1)

    def predict(self, obs, deterministic=True):
        return np.int64(int(self.q.argmax())), None


def test_dqn_agent_replaces_an_illegal_argmax_by_the_best_legal_action():
    env = make_env("tictactoe")
    obs, info = env.reset(seed=0)
    q = [9.0, 1.0, 5.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    agent = DQNAgent(_FixedQ(q))
    ctx = StepContext(env, obs, info, [], np.random.default_rng(0), 0)
    assert agent.choose(ctx) == 0  # legal argmax is kept
    env.board[0] = env.agent_mark  # cell 1 taken (index 0): the best legal one is index 2
    info = {**info, "valid_actions": env.valid_actions()}
    ctx = StepContext(env, obs, info, [], np.random.default_rng(0), 0)
    assert env.action_names[0] not in info["valid_actions"]
    assert agent.choose(ctx) == 2
    assert [d.action for d in agent.act([ctx, ctx])] == [2, 2]


@pytest.mark.slow
def test_dqn_learns_snake_with_features(tmp_path):
    """Snake 10x10 with the random opponent: 30k steps (about 20 s on one core) reach several apples
    per episode where random gets about 0.1 (benchmarks/dqn_snake.py has the full comparison)."""
    from agentrl.trainers.dqn import snake_apples

    cfg = compose_config(
        [
            "task=train",
            "algo=dqn",
            "agent=random",
            "env=snake",
            "eval.episodes=30",
            "algo.total_timesteps=30000",
        ]
    )
    train_dqn(cfg, tmp_path / "run")
    agent = load_dqn_agent(tmp_path / "run" / "final" / "model.zip", "snake")
    _, episodes = evaluate(env_factory(cfg.env), agent, eval_seeds(cfg))
    _, random_episodes = evaluate(env_factory(cfg.env), RandomAgent(), eval_seeds(cfg))
    assert snake_apples(episodes) > 5.0
    assert snake_apples(random_episodes) < 1.0
