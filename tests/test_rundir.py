"""Run directories: unique names, one process per directory, resume rules, status.json, and
`agentrl eval from_run=` reproducing a training run's own final evaluation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.errors import RunDirError
from agentrl.runs import rundir

runner = CliRunner()
ENV = {**os.environ, "AGENTRL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}

# MS-GRPO on the tiny random model with a prefilled answer and one-token answers: an evaluation that
# forgets the prefill or the answer length plays differently
MSGRPO = [
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=1",
    "agent.invalid_rule=random",  # invalid answers -> random legal moves: episodes differ by seed
    "algo.group_size=2",
    "algo.groups_per_iteration=2",
    "algo.gradient_accumulation_steps=1",
    "algo.eval_every=0",
    "algo.checkpoint_every=1",
    "eval.episodes=3",
    "algo.iterations=2",
]
DQN = [
    "algo=dqn",
    "env=frozenlake",
    "env.map=random",  # a map per seed: the held-out episodes differ
    "env.max_steps=16",
    "algo.total_timesteps=3000",
    "algo.learning_starts=500",
    "algo.checkpoint_every=1000",
    "algo.log_every=500",
    "algo.buffer_size=5000",
    "eval.episodes=5",
]
# eval.json fields that name the moment or the process, not the result
VOLATILE = {"created", "wall_time_s", "train_time_s", "iterations", "total_timesteps", "before", "start"}


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def results(run: Path) -> dict:
    data = json.loads((run / "eval.json").read_text())
    return {k: v for k, v in data.items() if k not in VOLATILE | {"from_run", "checkpoint"}}


def mtimes(run: Path) -> dict[str, int]:
    return {str(p.relative_to(run)): p.stat().st_mtime_ns for p in sorted(run.rglob("*")) if p.is_file()}


def iterations(run: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def msgrpo_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("msgrpo") / "run"
    result = invoke("train", *MSGRPO, f"hydra.run.dir={run}")
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("dqn") / "run"
    result = invoke("train", *DQN, f"hydra.run.dir={run}")
    assert result.exit_code == 0, result.output
    return run


def copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


# ---------------------------------------------------------------------------------------------------
# unique names and the collision check
# ---------------------------------------------------------------------------------------------------
def test_two_evals_started_together_get_two_directories(tmp_path):
    cmd = [sys.executable, "-m", "agentrl.cli", "eval", "agent=random", "eval.episodes=2"]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    runs = sorted(p.parent for p in (tmp_path / "outputs").glob("*/*/eval.json"))
    assert len(runs) == 2, outputs
    assert all(rundir.read_status(r)["status"] == "complete" for r in runs)
    # HH-MM-SS.mmm-<id>_<name>
    assert all(r.name.endswith("_eval_frozenlake") and r.name[8] == "." for r in runs), runs


def test_a_taken_name_is_drawn_again_never_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "_now", lambda: datetime(2026, 1, 2, 3, 4, 5, 678000))
    monkeypatch.setattr(rundir, "new_run_id", lambda: "aaaa")
    assert invoke("eval", "agent=random", "eval.episodes=2").exit_code == 0
    (first,) = (tmp_path / "outputs").glob("*/*")
    assert first.name == "03-04-05.678-aaaa_eval_frozenlake"
    before = mtimes(first)

    drawn = iter(["aaaa", "aaaa", "bbbb"])  # the same instant and id again, then a fresh id
    monkeypatch.setattr(rundir, "new_run_id", lambda: next(drawn, "cccc"))
    assert invoke("eval", "agent=random", "eval.episodes=2", "seed=1").exit_code == 0
    second = first.with_name("03-04-05.678-bbbb_eval_frozenlake")
    assert json.loads((second / "eval.json").read_text())["seed"] == 1
    assert mtimes(first) == before  # the first run is untouched


def test_a_named_directory_that_holds_a_run_is_refused(tmp_path):
    run = tmp_path / "run"
    assert invoke("eval", "agent=random", "eval.episodes=2", f"hydra.run.dir={run}").exit_code == 0
    before = mtimes(run)
    result = runner.invoke(app, ["eval", "agent=planner", "eval.episodes=2", f"hydra.run.dir={run}"])
    assert result.exit_code == 2
    assert "already holds a run" in result.output and "Traceback" not in result.output
    assert mtimes(run) == before
    assert json.loads((run / "eval.json").read_text())["agent"] == "random"


def test_a_second_train_into_a_locked_directory_refuses(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from agentrl.runs.rundir import claim; claim(sys.argv[1]); print('locked', flush=True);"
            " sys.stdin.read()",
            str(run),
        ],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().decode().strip() == "locked"
        result = runner.invoke(app, ["train", "algo=dqn", "algo.total_timesteps=100", f"hydra.run.dir={run}"])
        assert result.exit_code == 2, result.output
        assert f"is in use by pid {holder.pid}" in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert not (run / ".hydra").exists() and not (run / "status.json").exists()
        holder.kill()  # a crash: the kernel drops the lock, the stale lock file blocks nobody
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert (run / rundir.LOCK_FILE).exists()
    with rundir.claim(run) as lock:
        assert lock.held and rundir.lock_holder(run)["pid"] == os.getpid()
    assert not (run / rundir.LOCK_FILE).exists()


def test_lock_is_exclusive_within_one_process_too(tmp_path):
    with rundir.RunLock(tmp_path / "run").acquire():
        with pytest.raises(RunDirError, match="in use by pid"):
            rundir.RunLock(tmp_path / "run").acquire()
    rundir.RunLock(tmp_path / "run").acquire().release()


def test_merge_overrides_replaces_in_place_and_drops_an_old_options_keys():
    previous = ["task=train", "env=frozenlake", "env.map=random", "algo.iterations=2", "seed=1"]
    extra = ["algo.iterations=5", "env=snake", "+x=1"]
    merged = rundir.merge_overrides(previous, extra, ("env", "algo"))
    assert merged == ["task=train", "env=snake", "algo.iterations=5", "seed=1", "+x=1"]


# ---------------------------------------------------------------------------------------------------
# status.json
# ---------------------------------------------------------------------------------------------------
def test_status_complete_and_failed(tmp_path, monkeypatch):
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    assert invoke("eval", "agent=random", "eval.episodes=2", f"hydra.run.dir={ok}").exit_code == 0
    status = rundir.read_status(ok)
    assert status["status"] == "complete" and status["task"] == "eval" and status["parts"] == 1
    assert status["pid"] == os.getpid() and "reason" not in status and "ended" in status

    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"not a zip")
    # a failure the checks before launch miss (they load the model too): the job fails, status.json says so
    monkeypatch.setattr("agentrl.agents.check_dqn_fits", lambda cfg: None)
    result = runner.invoke(app, ["eval", "agent=dqn", f"agent.path={broken}", f"hydra.run.dir={bad}"])
    assert result.exit_code == 2
    status = rundir.read_status(bad)
    assert status["status"] == "failed"
    assert status["reason"].startswith("RunDirError: cannot load a DQN model")
    assert "\n" not in status["reason"]
    assert rundir.effective_status(bad) == "failed"


def test_status_interrupted_and_unexpected_errors(tmp_path, monkeypatch):
    from agentrl.runs import launch as run_module

    def interrupted(cfg, run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "run_eval", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_module.launch("eval", ["agent=random", f"hydra.run.dir={tmp_path / 'a'}"])
    assert rundir.read_status(tmp_path / "a")["status"] == "interrupted"
    assert rundir.read_status(tmp_path / "a")["reason"] == "KeyboardInterrupt"
    assert not (tmp_path / "a" / rundir.LOCK_FILE).exists()  # released on the way out

    def broken(cfg, run_dir):
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(run_module, "run_eval", broken)
    with pytest.raises((SystemExit, ValueError)):
        run_module.launch("eval", ["agent=random", f"hydra.run.dir={tmp_path / 'b'}"])
    status = rundir.read_status(tmp_path / "b")
    assert status["status"] == "failed" and status["reason"] == "ValueError: boom second line"


def test_a_running_status_of_a_dead_process_reads_killed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    rundir.write_status(tmp_path, "running", task="train")
    (tmp_path / rundir.LOCK_FILE).write_text(f"{dead.pid} {rundir.host_name()} 2026-01-01T00:00:00\n")
    assert rundir.effective_status(tmp_path) == "killed"
    with rundir.claim(tmp_path, resume=True):
        assert rundir.effective_status(tmp_path) == "running"  # the holder is alive: this process


def test_a_lock_file_nobody_holds_reads_killed_even_when_its_pid_is_reused(tmp_path):
    rundir.write_status(tmp_path, "running", task="eval")
    # SIGKILL left the file; its pid now belongs to a live process (here: this one) that holds no lock
    (tmp_path / rundir.LOCK_FILE).write_text(f"{os.getpid()} {rundir.host_name()} 2026-01-01T00:00:00\n")
    assert rundir.effective_status(tmp_path) == "killed"


# ---------------------------------------------------------------------------------------------------
# resume rules
# ---------------------------------------------------------------------------------------------------
def test_resume_of_an_eval_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    assert invoke("eval", "agent=random", "eval.episodes=2", f"hydra.run.dir={run}").exit_code == 0
    before = mtimes(run)
    result = runner.invoke(app, ["train", f"resume={run}"])
    assert result.exit_code == 2
    assert "it is an eval run (task=eval)" in result.output and "Traceback" not in result.output
    assert mtimes(run) == before


def test_eval_takes_no_algo(tmp_path):
    result = runner.invoke(app, ["eval", "algo=msgrpo", f"hydra.run.dir={tmp_path / 'never'}"])
    assert result.exit_code == 2
    assert "eval takes no algo; to evaluate a trained run use from_run=<run dir>" in result.output
    assert not (tmp_path / "never").exists()


def test_resuming_a_complete_run_changes_nothing(msgrpo_run, tmp_path):
    run = copy_run(msgrpo_run, tmp_path / "run")
    before = mtimes(run)
    for args in ([f"resume={run}"], ["--resume", str(run), "algo.iterations=2", "eval.episodes=5"]):
        result = invoke("train", *args)
        assert result.exit_code == 0, result.output
        assert "is complete (algo.iterations=2); nothing changed" in result.output
        assert mtimes(run) == before  # final/, eval.json, status.json, .hydra/ all as they were


def test_resume_with_more_iterations_continues_time_adds_up_overrides_stay_clean(msgrpo_run, tmp_path):
    run = copy_run(msgrpo_run, tmp_path / "run")
    original = (run / ".hydra" / "overrides.yaml").read_text().splitlines()
    # make the first part look long: an eval.json of the resumed run must count it
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first_part = 1000.0 + rows[-1]["time_s"]
    for row in rows:
        row["time_s"] += 1000.0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    result = invoke("train", f"resume={run}", "algo.iterations=3")
    assert result.exit_code == 0, result.output
    assert iterations(run) == [1, 2, 3]
    saved = json.loads((run / "eval.json").read_text())
    assert saved["iterations"] == 3 and saved["train_time_s"] >= first_part
    status = rundir.read_status(run)
    assert status["status"] == "complete" and status["parts"] == 2
    assert status["train_time_s"] == saved["train_time_s"]

    result = invoke("train", "--resume", str(run), "algo.iterations=4")
    assert result.exit_code == 0, result.output
    assert iterations(run) == [1, 2, 3, 4]
    assert rundir.read_status(run)["parts"] == 3
    overrides = (run / ".hydra" / "overrides.yaml").read_text().splitlines()
    # the original overrides in their places, only algo.iterations changed; nothing piled up
    assert overrides == [o.replace("algo.iterations=2", "algo.iterations=4") for o in original]
    assert sum("task=" in o for o in overrides) == 1
    assert not [o for o in overrides if "resume" in o or "hydra." in o]


def test_extending_a_complete_run_continues_from_its_last_iteration(msgrpo_run, tmp_path):
    """The last iteration is checkpointed: `resume=<complete run> algo.iterations=<more>` continues from
    the trained weights (final/'s, with their optimizer), exactly as a run that trains that far at once."""
    run = copy_run(msgrpo_run, tmp_path / "run")
    last, final = (load_file(run / name / "model.safetensors") for name in ("checkpoint-2", "final"))
    assert last.keys() == final.keys() and all(torch.equal(last[k], final[k]) for k in last)

    result = invoke("train", f"resume={run}", "algo.iterations=3")
    assert result.exit_code == 0, result.output
    assert f"Resuming from {run / 'checkpoint-2'}" in result.output
    assert iterations(run) == [1, 2, 3]

    at_once = tmp_path / "at_once"
    args = [o for o in MSGRPO if not o.startswith("algo.iterations=")]
    result = invoke("train", *args, "algo.iterations=3", f"hydra.run.dir={at_once}")
    assert result.exit_code == 0, result.output
    extended, straight = (load_file(r / "final" / "model.safetensors") for r in (run, at_once))
    assert all(torch.equal(extended[k], straight[k]) for k in straight)  # bit for bit


def test_resuming_does_not_call_the_tied_lm_head_missing(msgrpo_run, tmp_path):
    """A tied LM head is saved once, as the embedding: loading a checkpoint restores it without the
    Trainer's "missing keys in the checkpoint model loaded: ['lm_head.weight']"."""
    import logging

    run = copy_run(msgrpo_run, tmp_path / "run")
    shutil.rmtree(run / "checkpoint-2", ignore_errors=True)  # resume from checkpoint-1
    warnings: list[str] = []
    collect = logging.Handler(logging.WARNING)
    collect.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    transformers = logging.getLogger("transformers")  # its records do not reach the root logger
    transformers.addHandler(collect)
    try:
        result = invoke("train", f"resume={run}", "algo.iterations=3")
    finally:
        transformers.removeHandler(collect)
    assert result.exit_code == 0, result.output
    assert f"Resuming from {run / 'checkpoint-1'}" in result.output
    assert not [w for w in warnings if "missing keys" in w], warnings


# ---------------------------------------------------------------------------------------------------
# eval from_run=
# ---------------------------------------------------------------------------------------------------
def test_from_run_reproduces_an_msgrpo_runs_final_eval(msgrpo_run, tmp_path):
    out = tmp_path / "eval"
    result = invoke("eval", f"from_run={msgrpo_run}", f"hydra.run.dir={out}")
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "eval.json").read_text())
    assert saved["agent"] == "msgrpo" and saved["algo"] == "msgrpo" and saved["model"] == "tiny-random"
    assert saved["from_run"] == str(msgrpo_run.resolve()) and saved["checkpoint"] == "final"
    assert results(out) == results(msgrpo_run)
    # the same episodes, prompts (with the prefill) and one-token answers
    assert (out / "episodes.jsonl").read_text() == (msgrpo_run / "episodes.jsonl").read_text()
    assert (out / "transcripts.jsonl").read_text() == (msgrpo_run / "transcripts.jsonl").read_text()

    out = tmp_path / "checkpoint"
    result = invoke(
        "eval", f"from_run={msgrpo_run / 'checkpoint-1'}", "eval.episodes=2", f"hydra.run.dir={out}"
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "eval.json").read_text())
    assert saved["checkpoint"] == "checkpoint-1" and saved["episodes"] == 2  # the command line wins


def test_from_run_reproduces_a_dqn_runs_final_eval(dqn_run, tmp_path):
    out = tmp_path / "eval"
    result = invoke("eval", f"from_run={dqn_run}", f"hydra.run.dir={out}")
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "eval.json").read_text())
    assert saved["agent"] == "dqn" and saved["checkpoint"] == "final/model.zip"
    assert results(out) == results(dqn_run)
    assert (out / "episodes.jsonl").read_text() == (dqn_run / "episodes.jsonl").read_text()

    out = tmp_path / "checkpoint"
    result = invoke("eval", f"from_run={dqn_run / 'checkpoint-2000.zip'}", f"hydra.run.dir={out}")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "eval.json").read_text())["checkpoint"] == "checkpoint-2000.zip"


def test_from_run_refuses_what_is_not_a_training_run(tmp_path):
    run = tmp_path / "run"
    assert invoke("eval", "agent=random", "eval.episodes=2", f"hydra.run.dir={run}").exit_code == 0
    for target in (run, tmp_path / "missing"):
        result = runner.invoke(app, ["eval", f"from_run={target}", f"hydra.run.dir={tmp_path / 'never'}"])
        assert result.exit_code == 2 and "cannot evaluate from_run" in result.output
    assert not (tmp_path / "never").exists()
