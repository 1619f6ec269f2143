"""A new user's first hour (issue 26), through the CLI: every failure the real run would meet is caught
before a run directory exists, --dry-run shows the whole plan and then every failing check, and a sweep
is checked whole."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.errors import ConfigError

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def no_run_dir(tmp_path) -> bool:
    return not (tmp_path / "never").exists() and not (tmp_path / "outputs").exists()


@pytest.fixture
def sandbox_here(monkeypatch):
    """DataSciCoding's constructor refuses on a machine without bubblewrap before the checks these tests
    are about: they see the machine as one that has it (no model code runs in them)."""
    import agentrl.sandbox

    monkeypatch.setattr(agentrl.sandbox, "sandbox_problem", lambda: None)


# ---- item 1: the run's own checks run before its directory exists (and in --dry-run) ------------------
@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["eval", "env=datascicoding", "agent=planner"], "unknown env for agent=planner 'datascicoding'"),
        (["train", "env=datascicoding", "algo=dqn"], "datascicoding has no numeric view"),
    ],
)
def test_checks_of_the_real_run_fail_before_a_run_dir(tmp_path, args, expected, dry, sandbox_here):
    result = invoke(*args, f"hydra.run.dir={tmp_path / 'never'}", *(["--dry-run"] if dry else []))
    assert result.exit_code == 2, result.output
    assert expected in one_error_line(result)
    assert no_run_dir(tmp_path)


def test_zero3_without_cuda_fails_in_one_line_before_a_run_dir(tmp_path, monkeypatch):
    import agentrl.runs.checks

    monkeypatch.setattr(agentrl.runs.checks, "cuda_available", lambda: False)
    monkeypatch.setattr(
        agentrl.runs.checks, "installed", lambda module: True
    )  # DeepSpeed there: CUDA is missing
    args = ["model=tiny-random", "distributed=zero3", "distributed.num_processes=2"]
    result = invoke("train", *args, f"hydra.run.dir={tmp_path / 'never'}")
    assert result.exit_code == 2, result.output
    assert "distributed=zero3 needs CUDA GPUs" in one_error_line(result)
    assert no_run_dir(tmp_path)


def test_a_process_a_launcher_started_is_not_asked_to_launch(monkeypatch):
    """The check that refuses fsdp2 without CUDA is the launching command's: a process torchrun or
    accelerate started (the CPU FSDP2 test's workers) is past it and trains."""
    import agentrl.runs.checks
    from agentrl import distributed as dist
    from agentrl.runs.launch import check_distributed

    monkeypatch.setattr(agentrl.runs.checks, "cuda_available", lambda: False)
    cfg = compose_config(
        ["task=train", "model=tiny-random", "distributed=fsdp2", "distributed.num_processes=2"]
    )
    with pytest.raises(ConfigError, match="distributed=fsdp2 needs CUDA GPUs"):
        check_distributed(cfg)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert dist.launched()
    check_distributed(cfg)


def test_a_dqn_run_on_another_env_is_refused_before_a_run_dir(tmp_path):
    from agentrl.trainers.dqn import train_dqn

    run = tmp_path / "snake_dqn"
    fast = ["task=train", "algo=dqn", "env=snake", "algo.total_timesteps=200", "algo.learning_starts=100"]
    train_dqn(compose_config(fast), run, env_factory)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text(
        __import__("omegaconf").OmegaConf.to_yaml(compose_config(fast))
    )
    (run / ".hydra" / "overrides.yaml").write_text("- algo=dqn\n- env=snake\n")
    args = ["eval", "experiment=transfer_snake_to_frozenlake", f"from_run={run}"]
    result = invoke(*args, f"hydra.run.dir={tmp_path / 'never'}")
    assert result.exit_code == 2, result.output
    assert "does not fit env=frozenlake" in " ".join(result.output.split())
    assert no_run_dir(tmp_path)
    dry = invoke(*args, "--dry-run")
    assert dry.exit_code == 2 and "dry run: agentrl eval" in dry.output and "does not fit" in dry.output


def test_a_sweep_with_failing_jobs_is_refused_whole_naming_each(tmp_path, sandbox_here):
    sweep = tmp_path / "sweep"
    result = invoke(
        "sweep",
        "env=frozenlake,datascicoding,snake",
        "agent=planner",
        "seed=0,-1",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.exit_code == 2, result.output
    line = " ".join(one_error_line(result).split())
    assert line.startswith("error: 4 of 6 sweep jobs fail their checks, so none ran"), line
    assert "env=datascicoding seed=0): unknown env for agent=planner" in line
    assert "(env=snake seed=-1): seed=-1: must be in [0, 4294967295]" in line
    assert not sweep.exists()


def test_a_job_that_fails_at_run_time_does_not_stop_the_sweep(tmp_path, monkeypatch):
    import agentrl.runs.checks

    real = agentrl.runs.launch.run_eval

    def flaky(cfg, run_dir):
        if cfg.env.name == "snake":
            raise ConfigError("this job breaks at run time")
        return real(cfg, run_dir)

    monkeypatch.setattr(agentrl.runs.launch, "run_eval", flaky)
    sweep = tmp_path / "sweep"
    result = invoke(
        "sweep", "env=snake,frozenlake", "agent=random", "eval.episodes=2", f"hydra.sweep.dir={sweep}"
    )
    assert result.exit_code == 1, result.output
    assert len(list(sweep.glob("*/eval.json"))) == 1  # the job after the failing one ran
    output = " ".join(result.output.split())
    assert "failed: ConfigError: this job breaks at run time" in output
    assert "1 sweep job(s) failed" in output
    (failed,) = [p for p in sweep.glob("*env=snake*")]
    assert json.loads((failed / "status.json").read_text())["status"] == "failed"


# ---- item 2: seed ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_bad_seed_is_one_line_at_config_time(tmp_path, seed):
    for extra in ([], ["--dry-run"]):
        result = invoke("eval", "agent=random", f"seed={seed}", f"hydra.run.dir={tmp_path / 'never'}", *extra)
        assert result.exit_code == 2, result.output
        assert f"seed={seed}: must be in [0, 4294967295]" in one_error_line(result)
    assert no_run_dir(tmp_path)


# ---- item 4: a preset with an algo, swept over baseline agents ------------------------------------------
def test_readme_sweep_of_baselines_over_a_training_preset_evaluates_them(tmp_path):
    sweep = tmp_path / "sweep"
    result = invoke(
        "sweep",
        "experiment=rlft_bandit",
        "agent=random,planner",
        "eval.episodes=2",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.exit_code == 0, result.output
    agents = {json.loads(p.read_text())["agent"] for p in sweep.glob("*/eval.json")}
    assert agents == {"random", "planner"}


def test_train_of_a_baseline_says_how_to_evaluate_it(tmp_path):
    result = invoke("train", "experiment=rlft_bandit", "agent=random", "--dry-run")
    assert result.exit_code == 2
    assert "agentrl sweep --task eval" in result.output.strip().splitlines()[-1]


# ---- item 5: --dry-run prints the plan, then every failing check ----------------------------------------
def test_dry_run_prints_the_plan_then_every_failing_check(tmp_path, monkeypatch):
    import agentrl.runs.checks

    monkeypatch.setattr(agentrl.runs.checks, "cuda_available", lambda: False)
    monkeypatch.setattr(agentrl.runs.checks, "installed", lambda module: False)
    args = [
        "train",
        "model=tiny-random",
        "model.backend=vllm",
        "distributed=zero3",
        "distributed.num_processes=2",
    ]
    result = invoke(*args, "--dry-run")
    assert result.exit_code == 2, result.output
    out = result.output
    assert out.index("dry run: agentrl train") < out.index("run dir") < out.index("error: ")
    assert "scale  distributed=zero3, 2 processes, precision auto = fp32 (" in out
    assert "GiB per process" in out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert any("needs CUDA GPUs" in e for e in errors) and any("needs DeepSpeed" in e for e in errors)
    assert any("model.backend=vllm needs the vllm package" in e for e in errors)
    assert no_run_dir(tmp_path)


def test_dry_run_with_every_check_passing_exits_0(tmp_path):
    result = invoke("train", "model=tiny-random", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "scale  distributed=none, 1 process" in result.output and "error" not in result.output


# ---- item 3: extending a complete run continues it, or is refused; never a silent restart ---------------
DQN_FAST = [
    "algo=dqn",
    "env=frozenlake",
    "env.map=4x4",
    "env.slippery=false",
    "eval.episodes=3",
    "algo.net_arch=[16]",
    "algo.learning_starts=100",
    "algo.log_every=300",
]


def test_extending_a_complete_dqn_run_continues_from_its_final_model(tmp_path):
    run = tmp_path / "run"
    first = invoke("train", *DQN_FAST, "algo.total_timesteps=600", f"hydra.run.dir={run}")
    assert first.exit_code == 0, first.output
    assert not list(run.glob("checkpoint-*.zip"))  # checkpoint_every (20000) is beyond the run
    before = json.loads((run / "eval.json").read_text())["before"]  # the untrained network's eval
    assert before["episodes"] == 3 and "success_rate" in before
    more = invoke("train", f"resume={run}", "algo.total_timesteps=900")
    assert more.exit_code == 0, more.output
    rows = [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [300, 600, 900]  # appended, not rewritten from step 0
    saved = json.loads((run / "eval.json").read_text())
    assert saved["total_timesteps"] == 900 and saved["before"] == before
    assert json.loads((run / "final" / "dqn.json").read_text())["steps"] == 900


def test_extending_a_complete_llm_run_without_checkpoints_is_refused(tmp_path):
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    overrides = ["algo=msgrpo", "model=tiny-random", "algo.iterations=2"]
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(compose_config(["task=train", *overrides])))
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in ["task=train", *overrides]))
    (run / "eval.json").write_text('{"success_rate": 0.5}')
    (run / "status.json").write_text('{"status": "complete"}')
    (run / "final").mkdir()
    for extra in ([], ["--dry-run"]):
        result = invoke("train", f"resume={run}", "algo.iterations=4", *extra)
        assert result.exit_code == 2, result.output
        last = result.output.strip().splitlines()[-1]
        assert last.startswith("error: cannot continue") and "kept no checkpoint" in last, result.output
    assert json.loads((run / "eval.json").read_text()) == {"success_rate": 0.5}
    assert not (run / "metrics.jsonl").exists()


# ---- item 9: Ctrl-C during an eval keeps the finished episodes -------------------------------------------
def test_ctrl_c_during_an_eval_writes_the_finished_episodes(tmp_path, monkeypatch):
    import agentrl.agents
    from agentrl.agents.baselines import RandomAgent

    class CtrlCAtFourthEpisode(RandomAgent):
        def act(self, contexts):
            if contexts[0].episode_index == 3:
                raise KeyboardInterrupt
            return super().act(contexts)

    monkeypatch.setattr(agentrl.agents, "build_agent", lambda cfg, **kw: CtrlCAtFourthEpisode())
    run = tmp_path / "run"
    args = ["eval", "agent=random", "eval.episodes=6", "eval.lockstep=false", f"hydra.run.dir={run}"]
    result = invoke(*args)
    assert result.exit_code == 130, result.output
    assert f"run directory: {run}" in " ".join(result.output.split())
    saved = json.loads((run / "eval.json").read_text())
    assert saved["interrupted"] is True and saved["episodes"] == 3 and saved["episodes_planned"] == 6
    assert len((run / "episodes.jsonl").read_text().splitlines()) == 3
    assert json.loads((run / "status.json").read_text())["status"] == "interrupted"


# ---- item 10: help and small things ---------------------------------------------------------------------
def test_flags_show_no_bool_and_a_value_after_a_flag_is_one_line(tmp_path):
    import re

    for command in ("eval", "train", "config", "report"):
        help_text = invoke(command, "--help").output
        assert "<bool>" not in help_text, help_text
        assert re.search(r"--(dry-run|show-prompt|describe|help)\s", help_text)
    result = invoke("eval", "agent=random", "--dry-run", "true")
    assert result.exit_code == 2
    assert "'true' is not an override: --dry-run, --show-prompt and --describe are flags" in one_error_line(
        result
    )


def test_help_examples_use_the_run_directory_format_and_the_root_sweep_names_agents():
    import re

    for command in ("eval", "train", "report"):
        for path in re.findall(r"outputs/\S+", invoke(command, "--help").output):
            assert re.search(r"/\d\d-\d\d-\d\d\.\d{3}-[0-9a-f]{4}", path), path
    root = invoke("--help").output
    (sweep,) = [line.strip() for line in root.splitlines() if line.strip().startswith("agentrl sweep")]
    assert "agent=" in sweep  # an example sweep that does not run the default LLM over and over


def test_show_prompt_of_a_classic_agent_says_it_reads_none():
    result = invoke("config", "agent=planner", "--show-prompt")
    assert result.exit_code == 0
    assert "agent=planner reads no prompt" in result.output and "<|im_start|>" not in result.output


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [
        ("slrum", "unknown hydra/launcher 'slrum'; valid choices: basic, joblib, slurm,"),
        ("slurm", "hydra/launcher=slurm submits jobs with sbatch, which this machine does not have"),
    ],
)
def test_a_launcher_that_cannot_run_is_one_line(tmp_path, monkeypatch, launcher, expected):
    monkeypatch.setattr("shutil.which", lambda name: None)
    result = invoke(
        "sweep", "agent=random", f"hydra/launcher={launcher}", f"hydra.sweep.dir={tmp_path / 'never'}"
    )
    assert result.exit_code == 2
    assert expected in one_error_line(result)
    assert not (tmp_path / "never").exists()


def test_play_refuses_agent_and_says_what_shows_an_agent_playing():
    result = invoke("play", "env=snake", "agent=random")
    assert result.exit_code == 2
    assert "in agentrl play you are the agent; to watch an agent play: agentrl eval agent=random" in (
        one_error_line(result)
    )


def test_a_name_with_a_slash_is_refused(tmp_path):
    result = invoke("eval", "agent=random", "name='a/b'", f"hydra.run.dir={tmp_path / 'never'}")
    assert result.exit_code == 2
    assert "name=a/b: names one directory" in one_error_line(result)


def test_describe_lists_null_once_and_group_help_matches_the_default():
    out = invoke("config", "algo=poad", "--describe").output
    assert "null, bfloat16, float16 or null" not in out
    assert "groups_per_iteration: int  (default: 4)" in out  # POAD's 4 x 8, not MS-GRPO's 2 x 16
    assert "32 episodes per batch = 2 x 16" not in out


def test_sweep_dry_run_lists_the_jobs_and_every_failing_one(tmp_path, sandbox_here):
    sweep = tmp_path / "sweep"
    ok = invoke(
        "sweep", "env=frozenlake,snake", "agent=random,planner", f"hydra.sweep.dir={sweep}", "--dry-run"
    )
    assert ok.exit_code == 0, ok.output
    assert "4 eval jobs" in ok.output and "job 3  env=snake agent=planner" in ok.output
    bad = invoke(
        "sweep", "env=frozenlake,datascicoding", "agent=planner", f"hydra.sweep.dir={sweep}", "--dry-run"
    )
    assert bad.exit_code == 2
    assert "error: job 1: unknown env for agent=planner 'datascicoding'" in bad.output
    assert not sweep.exists() and not (tmp_path / "outputs").exists()


def test_sweep_summary_fits_80_columns_and_labels_jobs_by_what_sets_them_apart(tmp_path):
    import os
    import subprocess
    import sys

    sweep = tmp_path / "sweep"
    args = [
        "sweep",
        "env=frozenlake,tictactoe",
        "agent=random",
        "eval.episodes=2,3",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "COLUMNS": "80", "AGENTRL_NO_PROGRESS": "1"}
    done = subprocess.run([sys.executable, "-m", "agentrl", *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert rows and max(len(line) for line in rows) <= 80, "\n".join(rows)
    job_column = "".join(line.split("│")[1].strip() for line in rows if line.startswith("│"))
    assert "3eval.episodes=3" in job_column, "\n".join(rows)  # job 3, labelled by its swept value
    assert "frozenlake" in done.stdout and "tictactoe" in done.stdout  # identifying columns not cut
