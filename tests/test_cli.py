"""The CLI through Typer's runner: commands, run directories, bad-input errors."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from agentrl.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_envs_lists_every_env():
    result = invoke("envs")
    assert result.exit_code == 0, result.output
    for name in ("frozenlake", "snake", "snake_poison", "bandit", "tictactoe"):
        assert name in result.output
    assert "agentrl/FrozenLake-v0" in result.output


def test_eval_planner_writes_run_dir(run_dir):
    result = invoke("eval", "env=frozenlake", "agent=planner", "eval.episodes=5", f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    metrics = json.loads((run_dir / "eval.json").read_text())
    for key in (
        "success_rate",
        "mean_return",
        "return_stderr",
        "mean_length",
        "invalid_rate",
        "episodes",
        "seed",
    ):
        assert key in metrics
    assert metrics["episodes"] == 5 and metrics["success_rate"] == 1.0 and metrics["agent"] == "planner"
    lines = (run_dir / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 5
    first = json.loads(lines[0])
    assert {"seed", "return", "length", "success", "actions"} <= set(first)
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert "run directory" in result.output


def test_eval_default_run_dir_name(tmp_path):
    result = invoke("eval", "env=snake", "agent=random", "eval.episodes=3", "seed=3")
    assert result.exit_code == 0, result.output
    (found,) = list((tmp_path / "outputs").glob("*/*_eval_snake"))
    assert json.loads((found / "eval.json").read_text())["seed"] == 3
    # <HH-MM-SS.mmm>-<random id>_<task>_<env>: two commands in one second get two directories
    assert re.fullmatch(r"\d\d-\d\d-\d\d\.\d{3}-[0-9a-f]{4}_eval_snake", found.name), found.name
    assert json.loads((found / "status.json").read_text())["status"] == "complete"


def test_eval_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert (
            invoke("eval", "env=snake", "agent=random", "eval.episodes=4", f"hydra.run.dir={d}").exit_code
            == 0
        )

    def strip(p):
        return {
            k: v
            for k, v in json.loads((p / "eval.json").read_text()).items()
            if k not in ("created", "wall_time_s")
        }  # noqa: E731

    assert strip(a) == strip(b)
    assert (a / "episodes.jsonl").read_text() == (b / "episodes.jsonl").read_text()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["env=nosuchenv"],
            "valid choices: bandit, contextual_bandit, datascicoding, frozenlake, kitchen, openenv, snake, snake_poison, "
            "tictactoe",
        ),
        (["agent=nosuchagent"], "valid choices:"),
        (["eval.nosuchkey=1"], "valid keys under 'eval': episodes, lockstep, seed_offset, transcripts"),
        (["nosuchkey=1"], "unknown config key 'nosuchkey'"),
        (["env.map=bogus"], "frozenlake"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(tmp_path, args, expected):
    run = tmp_path / "never"
    result = runner.invoke(app, ["eval", "agent=random", *args, f"hydra.run.dir={run}"])
    assert result.exit_code != 0
    assert expected in result.output
    assert "Traceback" not in result.output
    assert not run.exists(), "a rejected command must not leave a run directory"


def test_config_prints_composed_config():
    result = invoke("config", "env=bandit", "agent=random", "env.arms=10")
    assert result.exit_code == 0, result.output
    assert "arms: 10" in result.output and "name: bandit" in result.output


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_sweep_runs_every_job(tmp_path, launcher):
    sweep_dir = tmp_path / "sweep"
    args = [
        "sweep",
        "env=frozenlake,tictactoe",
        "agent=random,planner",
        "eval.episodes=2",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    if launcher == "joblib":
        args += ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    evals = sorted(sweep_dir.glob("*/eval.json"))
    assert len(evals) == 4
    combos = {(json.loads(p.read_text())["env"], json.loads(p.read_text())["agent"]) for p in evals}
    assert combos == {(e, a) for e in ("frozenlake", "tictactoe") for a in ("random", "planner")}
    assert (sweep_dir / "multirun.yaml").is_file()
    assert "sweep" in result.output and "planner" in result.output


def test_sweep_rejects_a_bad_job_before_running_any(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = runner.invoke(
        app, ["sweep", "env=frozenlake,nosuch", "agent=random", f"hydra.sweep.dir={sweep_dir}"]
    )
    assert result.exit_code != 0 and "valid choices" in result.output
    assert not list(sweep_dir.glob("*/eval.json"))


def test_slurm_launcher_config_composes():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from agentrl.config import CONF_DIR, compose_config

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == 1
    assert compose_config(["agent=random"]).agent.name == "random"


def test_play_reprompts_on_illegal_move(monkeypatch):
    # tic-tac-toe vs a random opponent: '0' and 'x' are illegal, then legal cells until the game ends
    monkeypatch.setattr("agentrl.agents.baselines.stdin_is_interactive", lambda: True)
    moves = "0\nx\n" + "\n".join(str(c) for c in range(1, 10)) * 2 + "\n"
    result = runner.invoke(app, ["play", "env=tictactoe", "seed=1"], input=moves)
    assert result.exit_code == 0, result.output
    assert "Illegal move '0'" in result.output and "Illegal move 'x'" in result.output
    assert "Episode over" in result.output


def test_train_dqn_resume_and_report(tmp_path):
    run = tmp_path / "dqn"
    common = [
        "env=frozenlake",
        "env.max_steps=16",
        "algo.total_timesteps=3000",
        "algo.learning_starts=500",
        "algo.checkpoint_every=1000",
        "algo.log_every=500",
        "algo.buffer_size=5000",
        "eval.episodes=3",
    ]
    result = invoke("train", "algo=dqn", *common, f"hydra.run.dir={run}")
    assert result.exit_code == 0, result.output
    first = json.loads((run / "eval.json").read_text())
    assert first["algo"] == "dqn"
    assert (run / "checkpoint-3000.zip").is_file()
    # resume a finished run with a larger budget: it continues from the newest checkpoint
    result = invoke("train", f"resume={run}", "algo.total_timesteps=4000")
    assert result.exit_code == 0, result.output
    steps = [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 4000
    resumed = json.loads((run / "eval.json").read_text())
    assert resumed["total_timesteps"] == 4000 and resumed["train_time_s"] >= first["train_time_s"]
    result = invoke("report", str(run), "--out", str(tmp_path / "rep"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rep" / "report.md").is_file() and "dqn" in result.output


def test_train_and_report_bad_input(tmp_path):
    result = runner.invoke(app, ["train", "algo=nosuch"])
    assert result.exit_code != 0 and "valid choices: dqn, msgrpo" in result.output
    result = runner.invoke(app, ["train", f"resume={tmp_path / 'missing'}"])
    assert result.exit_code != 0 and "cannot resume" in result.output
    result = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code != 0 and "no such directory" in result.output


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.decision=score", "agent.decision=score: algo=msgrpo trains generated answers"),
        ("agent.explore.epsilon=0.1", "agent.explore applies to evaluation"),
    ],
)
def test_train_refuses_agent_settings_it_cannot_train_with(tmp_path, override, message):
    run = tmp_path / "run"
    args = ["train", "model=tiny-random", override, f"hydra.run.dir={run}"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 2 and message in result.output
    assert not run.exists()  # refused before a run directory exists
