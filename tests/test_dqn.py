"""DQN trainer: a short run writes eval/checkpoints and resumes; DQN beats random on a tiny deterministic
env; `agentrl eval agent=dqn` replays a saved model; the legal-action fallback of DQNAgent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import logged_iterations
from typer.testing import CliRunner

from agentrl.agents.baselines import RandomAgent
from agentrl.agents.dqn import DQNAgent, dqn_model_path, load_dqn_agent
from agentrl.cli import app
from agentrl.config import compose_config
from agentrl.envs import env_factory, make_env
from agentrl.errors import ConfigError, RunDirError
from agentrl.evaluation import eval_seeds, evaluate
from agentrl.runs.runlog import checkpoint_problem, list_checkpoints
from agentrl.trainers.dqn import train_dqn
from agentrl.types import StepContext

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


def test_short_run_writes_eval_checkpoints_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_config([*FAST, "algo.total_timesteps=2000"])
    from agentrl.runs.launch import run_train

    run_train(cfg, run_dir)  # train_dqn, then the runner writes eval.json from its result
    saved = json.loads((run_dir / "eval.json").read_text())
    result = train_dqn(compose_config([*FAST, "algo.total_timesteps=2000"]), tmp_path / "again", env_factory)
    metrics = result.metrics
    assert not (tmp_path / "again" / "eval.json").exists()  # the runner is its only writer
    assert saved["total_timesteps"] == 2000 and saved["algo"] == "dqn" and saved["env"] == "frozenlake"
    assert saved["episodes"] == 10 and saved["success_rate"] == metrics["success_rate"]
    assert (
        set(result.extra) == {"total_timesteps", "train_time_s", "before"}
        and result.extra["total_timesteps"] == 2000
    )
    assert len(result.episodes) == 10
    assert not list(run_dir.glob(".tmp-*"))  # every atomic write was renamed into place
    assert len((run_dir / "episodes.jsonl").read_text().splitlines()) == 10
    assert [s for s, _ in list_checkpoints(run_dir)] == [1000, 2000]
    assert all(checkpoint_problem(path) is None for _, path in list_checkpoints(run_dir))  # manifests
    assert (run_dir / "checkpoint-2000.replay.pkl").is_file()
    assert not (run_dir / "checkpoint-1000.replay.pkl").exists()  # only the newest buffer is kept
    assert (run_dir / "final" / "model.zip").is_file()
    assert (run_dir / "sb3" / "progress.csv").is_file() and any((run_dir / "tb").iterdir())
    assert logged_iterations(run_dir) == [500, 1000, 1500, 2000]
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"mean_return", "success_rate", "loss", "exploration_rate"} <= set(first)

    # A killed run leaves a half-written temp file: it is not a checkpoint.
    (run_dir / ".tmp-1234-checkpoint-3000.zip").write_bytes(b"partial")
    resumed = compose_config([*FAST, "algo.total_timesteps=3000", f"resume={run_dir}"])
    run_train(resumed, run_dir)
    saved = json.loads((run_dir / "eval.json").read_text())
    assert saved["total_timesteps"] == 3000  # continued from 2000, not restarted
    assert saved["train_time_s"] >= first["train_time_s"]
    assert logged_iterations(run_dir) == [500, 1000, 1500, 2000, 2500, 3000]  # no step logged twice
    assert [s for s, _ in list_checkpoints(run_dir)] == [1000, 2000, 3000]
    assert (run_dir / "sb3" / "resume-2000" / "progress.csv").is_file()
    assert json.loads((run_dir / "final" / "dqn.json").read_text())["steps"] == 3000


@pytest.mark.slow
def test_dqn_beats_random_on_fixed_frozenlake(tmp_path):
    """A learning check (6000 steps); the fast suite's DQN tests train, checkpoint, resume and reproduce an
    eval through `agent=dqn` (test_eval_agent_dqn_reproduces_the_runs_own_eval)."""
    cfg = compose_config([*FAST, "algo.total_timesteps=6000", "algo.checkpoint_every=0"])
    metrics = train_dqn(cfg, tmp_path / "run", env_factory).metrics
    random_metrics, _ = evaluate(env_factory(cfg.env), RandomAgent(), eval_seeds(cfg))
    assert metrics["success_rate"] == 1.0  # the map is fixed and deterministic: the greedy path is solved
    assert metrics["mean_length"] == 6.0  # the shortest path
    assert random_metrics["success_rate"] < 0.5
    # the saved model reproduces the eval through load_dqn_agent
    agent = load_dqn_agent(tmp_path / "run" / "final" / "model.zip")
    again, _ = evaluate(env_factory(cfg.env), agent, eval_seeds(cfg))
    assert again["success_rate"] == metrics["success_rate"]


runner = CliRunner()

# Snake with its default board and opponent; a few thousand steps are enough to check plumbing.
SNAKE_TINY = [
    "env=snake",
    "algo=dqn",
    "algo.total_timesteps=3000",
    "algo.learning_starts=500",
    "algo.buffer_size=5000",
    "algo.checkpoint_every=2000",
    "algo.log_every=1000",
    "algo.save_replay_buffer=false",
    "eval.episodes=6",
    "seed=1",
]


def _eval_json(run: Path) -> dict:
    return json.loads((run / "eval.json").read_text())


def _episodes(run: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    return [(r["seed"], r["return"], r["actions"]) for r in rows]


def test_eval_agent_dqn_reproduces_the_runs_own_eval(tmp_path):
    run = tmp_path / "train"
    result = runner.invoke(app, ["train", *SNAKE_TINY, f"hydra.run.dir={run}"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    trained = _eval_json(run)
    assert trained["algo"] == "dqn" and trained["total_timesteps"] == 3000 and "observation" not in trained

    evaluated = tmp_path / "eval"
    args = ["eval", "env=snake", "agent=dqn", f"agent.path={run}", "eval.episodes=6", "seed=1"]
    result = runner.invoke(app, [*args, f"hydra.run.dir={evaluated}"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    again = _eval_json(evaluated)
    assert again["agent"] == "dqn" and again["episodes"] == 6
    assert again["mean_return"] == trained["mean_return"]
    assert _episodes(evaluated) == _episodes(run)  # same seeds, same moves

    # A checkpoint zip works too, and a run directory without a final model falls back to its newest.
    assert dqn_model_path(run) == run / "final" / "model.zip"
    checkpoint = run / "checkpoint-2000.zip"
    result = runner.invoke(
        app, [*args[:3], f"agent.path={checkpoint}", *args[4:], f"hydra.run.dir={tmp_path / 'ckpt'}"]
    )
    assert result.exit_code == 0, result.output
    (run / "final" / "model.zip").unlink()
    assert dqn_model_path(run) == checkpoint  # the newest (2000 of 3000 steps)


def test_eval_agent_dqn_bad_paths_are_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    for extra in ([], ["agent.path=null"], [f"agent.path={missing}"]):
        result = runner.invoke(
            app, ["eval", "env=snake", "agent=dqn", *extra, f"hydra.run.dir={tmp_path / 'r'}"]
        )
        assert result.exit_code != 0
        output = " ".join(result.output.split())  # the log handler may wrap a long line
        assert "agent.path is required for agent=dqn" in output, output
        assert "Traceback" not in result.output
        assert not (tmp_path / "r").exists()  # refused before a run directory was made
    with pytest.raises(ConfigError, match="agent.path is required"):
        dqn_model_path(None)
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(RunDirError, match="no DQN model"):
        dqn_model_path(empty)


def test_eval_agent_dqn_rejects_a_model_of_another_env(tmp_path):
    run = tmp_path / "run"
    train_dqn(
        compose_config([*FAST, "algo.total_timesteps=200", "algo.learning_starts=100"]), run, env_factory
    )
    result = runner.invoke(
        app, ["eval", "env=snake", "agent=dqn", f"agent.path={run}", f"hydra.run.dir={tmp_path / 'e'}"]
    )
    assert result.exit_code != 0
    output = " ".join(result.output.split())  # the log handler may wrap a long line
    assert "does not fit env=snake" in output and "trained on env=frozenlake" in output, output
    assert "Traceback" not in result.output


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
def test_dqn_learns_snake(tmp_path):
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
    train_dqn(cfg, tmp_path / "run", env_factory)
    agent = load_dqn_agent(tmp_path / "run")
    _, episodes = evaluate(env_factory(cfg.env), agent, eval_seeds(cfg))
    _, random_episodes = evaluate(env_factory(cfg.env), RandomAgent(), eval_seeds(cfg))
    assert snake_apples(episodes) > 5.0
    assert snake_apples(random_episodes) < 1.0
