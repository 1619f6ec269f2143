"""`agentrl train` with MS-GRPO end to end: the CLI smoke run, and a real kill (SIGKILL) then resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import torch
from helpers import logged_iterations
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.runs import rundir

TINY = [
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",  # invalid answers -> random legal moves: returns vary, updates happen
    "algo.group_size=2",
    "algo.groups_per_iteration=2",
    "algo.gradient_accumulation_steps=1",
    "algo.periodic_eval_episodes=1",
    "eval.episodes=2",
]


def test_train_msgrpo_two_iterations_through_the_cli(tmp_path):
    run = tmp_path / "run"
    args = ["train", *TINY, "algo.iterations=2", "algo.eval_every=1", f"hydra.run.dir={run}"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval.json").read_text())
    assert saved["algo"] == "msgrpo" and saved["model"] == "tiny-random"
    assert {"success_rate", "mean_return", "before", "train_time_s"} <= set(saved)
    assert logged_iterations(run) == [1, 2]
    assert (run / "final" / "config.json").is_file()
    assert (run / ".hydra" / "config.yaml").is_file()
    # the run in one line: greedy success before -> after, and the training minutes
    before, after = saved["before"]["success_rate"], saved["success_rate"]
    line = f"greedy success {before:.2f} -> {after:.2f} in {saved['train_time_s'] / 60:.1f} min"
    assert line in result.output.splitlines()


def test_training_stops_at_the_target_success_and_checkpoints_there(tmp_path, monkeypatch):
    """algo.stop_at_success ends training after the periodic eval that reaches it (the final eval and
    eval.json follow, with the iterations trained), and that last iteration is checkpointed. Fewer
    iterations than asked is then no failure. A resume with the same iterations changes nothing; one
    that asks for more continues from that checkpoint and stops again at the next eval at the target."""
    import agentrl.evaluation

    real = agentrl.evaluation.evaluate
    succeeds = {"eval @ 3"}

    def evaluate(*args, description: str = "", **kwargs):
        metrics, episodes = real(*args, description=description, **kwargs)
        if description in succeeds:  # the tiny random model never succeeds: say it did here
            metrics = {**metrics, "success_rate": 1.0}
        return metrics, episodes

    monkeypatch.setattr(agentrl.evaluation, "evaluate", evaluate)
    run = tmp_path / "run"
    args = [
        "train",
        *TINY,
        "algo.iterations=8",
        "algo.eval_every=1",
        "algo.stop_at_success=0.9",
        "algo.checkpoint_every=5",
        f"hydra.run.dir={run}",
    ]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert logged_iterations(run) == [1, 2, 3]
    saved = json.loads((run / "eval.json").read_text())
    assert saved["iterations"] == 3 and rundir.read_status(run)["status"] == "complete"
    assert (run / "checkpoint-3").is_dir() and (run / "final").is_dir()

    again = CliRunner().invoke(app, ["train", f"resume={run}"], catch_exceptions=False)
    assert again.exit_code == 0 and "is complete" in again.output, again.output
    assert logged_iterations(run) == [1, 2, 3]
    succeeds.add("eval @ 5")
    more = CliRunner().invoke(app, ["train", f"resume={run}", "algo.iterations=10"], catch_exceptions=False)
    assert more.exit_code == 0, more.output
    assert logged_iterations(run) == [1, 2, 3, 4, 5]
    assert json.loads((run / "eval.json").read_text())["iterations"] == 5
    assert rundir.read_status(run)["status"] == "complete"


def kill_in_the_first_final_eval(monkeypatch, success_at: str | None = None) -> list[str]:
    """Makes the first "eval after training" raise KeyboardInterrupt, as a kill once final/ is saved;
    the eval named `success_at` reports success 1.0. Returns the final evals started."""
    import agentrl.evaluation

    real = agentrl.evaluation.evaluate
    finals: list[str] = []

    def evaluate(*args, description: str = "", **kwargs):
        if description == "eval after training":
            finals.append(description)
            if len(finals) == 1:
                raise KeyboardInterrupt
        metrics, episodes = real(*args, description=description, **kwargs)
        if description == success_at:
            metrics = {**metrics, "success_rate": 1.0}
        return metrics, episodes

    monkeypatch.setattr(agentrl.evaluation, "evaluate", evaluate)
    return finals


def assert_final_is(run, checkpoint: str) -> None:
    """final/ holds the weights of `checkpoint`, bit for bit."""
    from safetensors.torch import load_file

    final, saved = (load_file(run / d / "model.safetensors") for d in ("final", checkpoint))
    assert final.keys() == saved.keys() and all(torch.equal(final[k], saved[k]) for k in final)


def test_a_run_killed_after_stopping_at_its_target_resumes_to_its_final_eval(tmp_path, monkeypatch):
    """Killed in the final eval after algo.stop_at_success stopped training, a resume trains no further
    iteration: the checkpoint of the stop becomes final/ and the final eval runs."""
    finals = kill_in_the_first_final_eval(monkeypatch, success_at="eval @ 3")
    run = tmp_path / "run"
    args = [*TINY, "algo.iterations=8", "algo.eval_every=1", "algo.stop_at_success=0.9"]
    args += ["algo.checkpoint_every=5", f"hydra.run.dir={run}"]
    killed = CliRunner().invoke(app, ["train", *args], catch_exceptions=False)
    assert killed.exit_code != 0 and rundir.read_status(run)["status"] == "interrupted"
    assert logged_iterations(run) == [1, 2, 3] and (run / "checkpoint-3").is_dir()

    resumed = CliRunner().invoke(app, ["train", f"resume={run}"], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert "checkpoint-3 is where this run stopped at algo.stop_at_success=0.9" in resumed.output
    assert logged_iterations(run) == [1, 2, 3] and len(finals) == 2
    assert json.loads((run / "eval.json").read_text())["iterations"] == 3
    assert rundir.read_status(run)["status"] == "complete"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-3"]
    assert_final_is(run, "checkpoint-3")


def test_the_time_limit_is_the_whole_runs_a_resume_past_it_trains_nothing(tmp_path, monkeypatch):
    """algo.time_limit_minutes counts the run's training clock over every part: killed in the final eval
    after the limit stopped training, a resume trains no further iteration; extending the complete run
    takes a larger limit, not only more iterations."""
    finals = kill_in_the_first_final_eval(monkeypatch)
    run = tmp_path / "run"
    args = [*TINY, "algo.iterations=8", "algo.time_limit_minutes=1e-6", "algo.checkpoint_every=1"]
    killed = CliRunner().invoke(app, ["train", *args, f"hydra.run.dir={run}"], catch_exceptions=False)
    assert killed.exit_code != 0 and rundir.read_status(run)["status"] == "interrupted"
    assert logged_iterations(run) == [1] and (run / "checkpoint-1").is_dir()

    resumed = CliRunner().invoke(app, ["train", f"resume={run}"], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert "crossed algo.time_limit_minutes=1e-06" in resumed.output, resumed.output
    assert logged_iterations(run) == [1] and len(finals) == 2
    assert json.loads((run / "eval.json").read_text())["iterations"] == 1
    assert rundir.read_status(run)["status"] == "complete"
    assert_final_is(run, "checkpoint-1")

    more = CliRunner().invoke(app, ["train", f"resume={run}", "algo.iterations=9"], catch_exceptions=False)
    assert more.exit_code == 0 and "nothing changed" in more.output
    assert "has reached algo.time_limit_minutes=1e-06" in more.output, more.output
    longer = ["train", "--dry-run", f"resume={run}", "algo.time_limit_minutes=null"]
    planned = CliRunner().invoke(app, longer, catch_exceptions=False)
    assert planned.exit_code == 0 and "would continue in place" in planned.output, planned.output
    assert logged_iterations(run) == [1]


def test_training_that_ends_short_of_its_iterations_fails(tmp_path, monkeypatch):
    """The Trainer returns without error when an epoch of TRL's sampler has no batch (what three or more
    processes had: too few placeholder rows for a chunk), after the eval before training. The run then
    fails with a non-zero exit, saving and evaluating nothing, instead of reporting success."""
    from agentrl.trainers import grpo_trainer

    monkeypatch.setattr(grpo_trainer, "placeholder_rows", lambda args: 1)  # a chunk needs 2 rows below
    run = tmp_path / "run"
    args = ["train", *TINY, "algo.iterations=2", "algo.gradient_accumulation_steps=2", f"hydra.run.dir={run}"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 1, result.output
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed"
    assert "after iteration 0 of algo.iterations=2" in status["reason"]
    assert (run / "eval_before.json").is_file()
    assert not (run / "final").exists() and not (run / "eval.json").exists()


def test_killed_run_resumes_without_duplicatelogged_iterations(tmp_path):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        *TINY,
        "algo.iterations=40",
        "algo.checkpoint_every=1",
        "algo.eval_every=0",
        "algo.eval_before=false",
        "algo.keep_checkpoints=2",
        f"hydra.run.dir={run}",
    ]
    env = {**os.environ, "AGENTRL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (run / "checkpoint-2").is_dir():
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert (run / "checkpoint-2").is_dir(), "no checkpoint within the time limit"
        os.killpg(proc.pid, signal.SIGKILL)  # a hard kill: no chance to save anything
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at = max(logged_iterations(run))
    assert killed_at >= 2
    assert not (run / "eval.json").exists()
    # SIGKILL left status.json at running; its lock names a dead process
    assert rundir.read_status(run)["status"] == "running"
    assert rundir.effective_status(run) == "killed"
    killed_time = rundir.last_metrics_time(run)

    # resume with a smaller total so the test stays short: continue from the newest complete checkpoint
    total = killed_at + 2
    result = CliRunner().invoke(
        app, ["train", f"resume={run}", f"algo.iterations={total}"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    steps = logged_iterations(run)
    assert steps == list(range(1, total + 1)), steps  # parses, continues, no duplicate iteration
    saved = json.loads((run / "eval.json").read_text())
    assert saved["iterations"] == total
    assert saved["train_time_s"] >= killed_time  # the killed part's training counts too
    status = rundir.read_status(run)
    assert status["status"] == "complete" and status["parts"] == 2
    assert (run / ".hydra" / "overrides.yaml").read_text().count("task=train") == 1
