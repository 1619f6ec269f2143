"""Never losing work: stop signals save a checkpoint in both trainers (then resume continues without a gap
or a duplicate metrics row), a damaged newest checkpoint falls back to an older intact one, and a
checkpoint without optimizer state resumes with a fresh optimizer."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import interrupt_rollout, logged_iterations
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.runs.runlog import checkpoint_problem, list_checkpoints, manifest_path, newest_valid_checkpoint
from agentrl.trainers.signals import StopSignals, TrainingInterrupted

TINY = [
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",  # invalid answers -> random legal moves: returns vary, updates happen
    "algo.group_size=2",
    "algo.groups_per_iteration=1",
    "algo.gradient_accumulation_steps=1",
    "algo.periodic_eval_episodes=1",
    "algo.eval_before=false",
    "eval.episodes=2",
]
DQN = [
    "algo=dqn",
    "env=frozenlake",
    "env.map=4x4",
    "env.slippery=false",
    "env.max_steps=16",
    "eval.episodes=4",
    "algo.net_arch=[32,32]",
    "algo.learning_starts=500",
    "algo.target_update_interval=250",
    "algo.log_every=500",
]


def _train_until_signal(run: Path, overrides: list[str], signum: int, rows: int) -> tuple[int, str]:
    """`agentrl train` in a child process; once metrics.jsonl has `rows` rows, send `signum`. Returns the
    exit code and the output."""
    cmd = [sys.executable, "-m", "agentrl.cli", "train", *overrides, f"hydra.run.dir={run}"]
    env = {**os.environ, "AGENTRL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "300"}
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # a child of a background job inherits an ignored SIGINT; a terminal's Ctrl-C is what is tested
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 240
        metrics = run / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= rows:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
        proc.send_signal(signum)
        output = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, output


# ---- the signal guard ------------------------------------------------------------------------------------
def _deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.5)  # the handler runs at the next bytecode; the sleep is only a bound


def test_a_stop_signal_raises_with_its_exit_code_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as caught, StopSignals():
        _deliver(signal.SIGTERM)
    assert caught.value.exit_code == 143 and "SIGTERM" in str(caught.value)
    assert signal.getsignal(signal.SIGTERM) is before
    assert pickle.loads(pickle.dumps(caught.value)).exit_code == 143  # multirun launchers pickle it


@pytest.fixture
def terminal_sigint():
    """SIGINT as in a terminal (Python's KeyboardInterrupt handler): a test process started in the
    background, or a pytest-xdist worker, may inherit it ignored, and an ignored SIGINT stays ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_held_signal_waits_for_release_and_repeats_are_handled(terminal_sigint):
    with StopSignals() as stop:
        stop.hold()
        _deliver(signal.SIGUSR1)  # SLURM's --signal=USR1@60
        assert stop.stopping
        with pytest.raises(TrainingInterrupted) as caught:
            stop.release()
        assert caught.value.exit_code == 128 + signal.SIGUSR1
        _deliver(signal.SIGTERM)  # while the checkpoint is written: ignored
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C quits at once
            _deliver(signal.SIGINT)


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            _deliver(signal.SIGINT)
            assert not stop.stopping
    finally:
        signal.signal(signal.SIGINT, previous)


# ---- MS-GRPO -------------------------------------------------------------------------------------------
def test_sigterm_during_msgrpo_saves_the_last_iteration_then_resume_continues(tmp_path):
    run = tmp_path / "run"
    overrides = [*TINY, "algo.iterations=40", "algo.checkpoint_every=0", "algo.eval_every=0"]
    code, output = _train_until_signal(run, overrides, signal.SIGTERM, rows=1)
    assert code == 143, output[-3000:]
    assert "stopped by SIGTERM after iteration" in output
    done = logged_iterations(run)
    assert done == list(range(1, len(done) + 1))
    # at most the iteration in progress is lost: the checkpoint holds every logged iteration
    assert newest_valid_checkpoint(run) == run / f"checkpoint-{done[-1]}"
    assert manifest_path(run / f"checkpoint-{done[-1]}").is_file()
    assert not (run / "eval.json").exists()

    total = done[-1] + 2
    result = CliRunner().invoke(app, ["train", f"resume={run}", f"algo.iterations={total}"])
    assert result.exit_code == 0, result.output
    assert logged_iterations(run) == list(range(1, total + 1))  # continuous, no duplicate


def _msgrpo_cfg(*overrides: str) -> Any:
    return compose_config(["task=train", "algo=msgrpo", *TINY, "algo.save_final=false", *overrides])


def test_a_signal_during_the_periodic_eval_waits_for_the_iterations_row(tmp_path, monkeypatch):
    """Between the optimizer step and the metrics row the signal is held: the row is written, then the
    checkpoint of that iteration, so the resumed run has no gap."""
    import agentrl.evaluation
    from agentrl.trainers.multistep import train_llm

    real = agentrl.evaluation.evaluate

    def evaluate(*args: Any, description: str = "", **kwargs: Any):
        if description == "eval @ 2":
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, description=description, **kwargs)

    monkeypatch.setattr(agentrl.evaluation, "evaluate", evaluate)
    cfg = _msgrpo_cfg("algo.iterations=5", "algo.eval_every=1", "algo.checkpoint_every=0")
    with pytest.raises(TrainingInterrupted) as caught:
        train_llm(cfg, tmp_path, env_factory)
    assert caught.value.exit_code == 143
    assert logged_iterations(tmp_path) == [1, 2]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "eval/success_rate" in rows[1]  # the eval that was running finished into its row
    assert newest_valid_checkpoint(tmp_path) == tmp_path / "checkpoint-2"


def test_damaged_newest_msgrpo_checkpoint_falls_back_to_the_older_one(tmp_path, caplog):
    from agentrl.trainers.multistep import train_llm

    overrides = ["algo.iterations=3", "algo.checkpoint_every=1", "algo.eval_every=0"]
    train_llm(_msgrpo_cfg(*overrides), tmp_path, env_factory)
    assert [n for n, _ in list_checkpoints(tmp_path)] == [2, 3]  # the last iteration's too
    weights = tmp_path / "checkpoint-3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    with caplog.at_level(logging.INFO):
        train_llm(_msgrpo_cfg(*overrides), tmp_path, env_factory, resume=True)
    assert "Skipping checkpoint-3: model.safetensors has" in caplog.text
    assert f"Resuming from {tmp_path / 'checkpoint-2'}" in caplog.text
    assert logged_iterations(tmp_path) == [1, 2, 3]
    assert checkpoint_problem(tmp_path / "checkpoint-3") is None  # written again by the resumed run


def test_model_only_checkpoint_resumes_with_a_fresh_optimizer(tmp_path, monkeypatch, caplog):
    from agentrl.trainers.multistep import train_llm

    real_rollout = interrupt_rollout(monkeypatch, 3)  # during the third iteration's rollout
    overrides = [
        "algo.save_optimizer=false",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.lr_scheduler=linear",
        "algo.learning_rate=1e-3",
    ]
    with pytest.raises(TrainingInterrupted) as caught:
        train_llm(_msgrpo_cfg("algo.iterations=3", *overrides), tmp_path, env_factory)
    assert caught.value.exit_code == 130
    saved = tmp_path / "checkpoint-2"
    assert (saved / "model.safetensors").is_file() and (saved / "trainer_state.json").is_file()
    assert not (saved / "optimizer.pt").exists() and not (saved / "scheduler.pt").exists()
    assert json.loads(manifest_path(saved).read_text())["optimizer"] is False

    monkeypatch.setattr("agentrl.rollout.rollout", real_rollout)
    with caplog.at_level(logging.INFO):
        train_llm(_msgrpo_cfg("algo.iterations=3", *overrides), tmp_path, env_factory, resume=True)
    assert "checkpoint-2 has no optimizer state" in caplog.text
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    # the linear schedule continues from iteration 2 (a fresh scheduler would be back at 1e-3)
    assert rows[2]["learning_rate"] == pytest.approx(1e-3 / 3)


# ---- DQN -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_dqn_saves_a_checkpoint_then_resume_continues(tmp_path, signum):
    run = tmp_path / "run"
    overrides = [*DQN, "algo.total_timesteps=1000000", "algo.checkpoint_every=0"]
    code, output = _train_until_signal(run, overrides, signum, rows=2)
    assert code == 128 + signum, output[-3000:]
    assert f"stopped by {signal.Signals(signum).name} at step" in output
    (steps, path), *others = reversed(list_checkpoints(run))
    assert not others and checkpoint_problem(path) is None  # the one checkpoint: the signal's
    assert steps % 4 == 0  # at the end of a train_freq chunk: SB3's cadence carries on after resume
    done = logged_iterations(run)
    assert done == list(range(500, steps + 1, 500))  # every row up to the step it stopped at

    total = (steps // 500 + 2) * 500
    result = CliRunner().invoke(app, ["train", f"resume={run}", f"algo.total_timesteps={total}"])
    assert result.exit_code == 0, result.output
    assert logged_iterations(run) == list(range(500, total + 1, 500))
    assert json.loads((run / "eval.json").read_text())["total_timesteps"] == total


def test_damaged_newest_dqn_checkpoint_falls_back_to_the_older_one(tmp_path, caplog):
    from agentrl.trainers.dqn import train_dqn

    overrides = ["task=train", "agent=random", *DQN, "algo.checkpoint_every=1000"]
    train_dqn(compose_config([*overrides, "algo.total_timesteps=2000"]), tmp_path, env_factory)
    newest = tmp_path / "checkpoint-2000.zip"
    newest.write_bytes(newest.read_bytes()[:-100])
    shutil.rmtree(tmp_path / "final")  # as a run killed after its last checkpoint: no final model

    with caplog.at_level(logging.INFO):
        result = train_dqn(
            compose_config([*overrides, "algo.total_timesteps=3000"]), tmp_path, env_factory, resume=True
        )
    assert "Skipping checkpoint-2000.zip: checkpoint-2000.zip has" in caplog.text
    assert "from step 1000 of 3000" in caplog.text
    assert result.extra["total_timesteps"] == 3000
    assert logged_iterations(tmp_path) == [500, 1000, 1500, 2000, 2500, 3000]
    assert checkpoint_problem(newest) is None  # written again by the resumed run
