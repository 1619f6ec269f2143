"""What a run prints when stdout is not a terminal (a log file, a pipe): plain full-width lines written as
they happen, one per training iteration, evaluation progress every 10% / 30 s, no third-party tqdm bars;
and the CPU thread default."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import pythonpath_with_root
from rich.console import Console

from agentrl import console as console_module
from agentrl.runs.runlog import _PlainProgress

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _plain(total: int, every_advance: bool, clock: FakeClock) -> tuple[_PlainProgress, io.StringIO]:
    out = io.StringIO()
    bar = _PlainProgress("eval frozenlake", total, every_advance, clock=clock)
    bar._console = Console(file=out, width=80, soft_wrap=True)  # 80 columns: long lines must stay whole
    return bar, out


def test_plain_training_progress_is_one_whole_line_per_iteration_with_eta():
    clock = FakeClock()
    bar, out = _plain(4, True, clock)
    bar.advance(n=2)  # a resumed run's earlier iterations: counted, but not part of the speed
    metrics = "success 0.50 return 0.25 invalid 0.00 zero-var 0/2 kept 4 loss 0.1234 iteration 10.0s" * 2
    clock.now += 10
    bar.advance(metrics)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and len(lines[0]) > 160  # not cut, not wrapped at 80 columns
    assert lines[0].startswith("eval frozenlake 3/4 (75%) elapsed 0:10 eta 0:10 | success 0.50")
    assert lines[0].endswith("iteration 10.0s")
    clock.now += 10
    bar.advance(metrics)
    bar.close()
    assert len(out.getvalue().splitlines()) == 2
    assert out.getvalue().splitlines()[1].startswith("eval frozenlake 4/4 (100%) elapsed 0:20 eta 0:00 |")


def test_a_count_known_only_after_the_start_gives_the_line_its_total_and_eta():
    """SFT's bar starts before the trainer has sized its epochs; the count arrives at train begin."""
    from types import SimpleNamespace

    from agentrl.trainers.sft import _metrics_rows

    clock = FakeClock()
    bar, out = _plain(None, True, clock)
    logged = []
    callback = _metrics_rows(SimpleNamespace(log=lambda step, row: logged.append(step)), bar)
    callback.on_train_begin(None, SimpleNamespace(max_steps=15), None)
    clock.now += 20
    callback.on_log(None, SimpleNamespace(global_step=1), None, logs={"loss": 0.5})
    assert logged == [1]
    assert out.getvalue().startswith("eval frozenlake 1/15 (7%) elapsed 0:20 eta 4:40 | loss 0.5000")


def test_a_time_limited_run_shows_the_time_left_as_its_eta(monkeypatch):
    """`algo.iterations` is a cap far above what a time-limited run reaches: the ETA comes from the time
    limit (time left plus the iteration that crosses it), not from the iteration count."""
    from agentrl.trainers import callbacks

    clock = FakeClock()
    bar, out = _plain(10_000, True, clock)
    now = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    limit = callbacks.TimeLimit(3600)
    limit.on_train_begin(None, None, None)

    class Log:
        def log(self, step, row, time_s=None):
            pass

    class State:
        global_step = 1

    writer = callbacks.MetricsWriter(Log(), bar, {}, time_left=limit.seconds_left)
    now[0], clock.now = 120.0, 1120.0  # one 120-s iteration of the hour
    writer.on_log(None, State(), None, logs={"iteration_s": 120.0, "train/mean_return": 0.5})
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("eval frozenlake 1/10000 (0%) elapsed 2:00 eta <=1:00:00 |"), line
    assert limit.seconds_left() == 3480.0
    assert callbacks.TimeLimit(None).seconds_left() is None


def test_plain_eval_progress_every_tenth_at_most_each_second_heartbeat_and_last_line():
    clock = FakeClock()
    bar, out = _plain(20, False, clock)
    clock.now += 31
    bar.update("episodes 0 steps 40 steps/s 1.3", eta_s=60)  # nothing done for 30 s: a heartbeat
    clock.now += 5
    bar.update("episodes 0 steps 50 steps/s 1.4", eta_s=50)  # too soon for another
    for _ in range(2):  # 10%
        clock.now += 2
        bar.advance("episodes", eta_s=40)
    for _ in range(6):  # three more 10% marks, but all within one second: one line
        clock.now += 0.1
        bar.advance("episodes", eta_s=40)
    clock.now += 2
    bar.advance("episodes", eta_s=30)  # 9/20: past the mark with a second's gap
    for _ in range(11):  # the lockstep episodes that end together: the last line at close
        bar.advance("episodes")
    bar.close()
    lines = out.getvalue().splitlines()
    counts = [re.match(r"eval frozenlake (\d+)/20", line).group(1) for line in lines]
    assert counts == ["0", "2", "9", "20"], lines
    assert "eta <=1:00 | episodes 0 steps 40 steps/s 1.3" in lines[0]  # the step-cap bound, marked <=
    assert lines[-1].startswith("eval frozenlake 20/20 (100%)") and "eta 0:00" in lines[-1]


def test_log_lines_are_plain_and_whole_when_not_a_terminal():
    handler = console_module.LogHandler()
    message = " ".join(["word"] * 80)  # 399 characters: wider than any console
    with console_module.console.capture() as captured:
        handler.emit(logging.LogRecord("agentrl.x", logging.INFO, __file__, 1, message, None, None))
    lines = captured.get().splitlines()
    assert len(lines) == 1 and lines[0].endswith(" INFO agentrl.x: " + message)


def test_library_progress_bars_are_turned_off(monkeypatch):
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)  # restored (absent) after the test
    transformers_logging.enable_progress_bar()
    enable_progress_bars()
    try:
        console_module.quiet_library_progress()
        assert not transformers_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
    finally:
        transformers_logging.enable_progress_bar()
        enable_progress_bars()


# ---- torch threads ---------------------------------------------------------------------------------
def test_free_cpu_threads_subtracts_the_load(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.6, 0.0, 0.0))
    assert console_module.free_cpu_threads() == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.0, 0.0))
    assert console_module.free_cpu_threads() == 4
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 0.0, 0.0))
    assert console_module.free_cpu_threads() == 1  # never below one


def test_torch_threads_explicit_setting_wins(monkeypatch):
    monkeypatch.setattr(console_module, "free_cpu_threads", lambda: 3)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert console_module.torch_threads(None) == 3
    assert console_module.torch_threads(5) == 5  # algo.torch_threads
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert console_module.torch_threads(None) is None  # the user's OMP_NUM_THREADS: torch keeps it
    assert console_module.torch_threads(2) == 2


def test_set_torch_threads_applies_the_choice(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(console_module, "free_cpu_threads", lambda: 1)
    try:
        assert console_module.set_torch_threads(None) == 1
        assert console_module.set_torch_threads(2) == 2
    finally:
        torch.set_num_threads(before)


# ---- whole commands, stdout to a pipe ----------------------------------------------------------------
def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTRL_NO_PROGRESS", "COLUMNS")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=pythonpath_with_root())
    return env


def test_train_to_a_pipe_prints_one_whole_line_per_iteration(tmp_path):
    args = [
        "train",
        "model=tiny-random",
        "algo.iterations=2",
        "algo.group_size=2",
        "algo.groups_per_iteration=1",
        "algo.gradient_accumulation_steps=1",
        "algo.eval_before=false",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.save_final=false",
        "eval.episodes=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    output = result.stdout
    assert result.returncode == 0, output
    iterations = [line for line in output.splitlines() if re.match(r"msgrpo \d+/2 ", line)]
    assert [line.split()[1] for line in iterations] == ["1/2", "2/2"], output
    for line in iterations:  # whole lines: the count, the ETA and every metric up to the last
        assert len(line) > 80 and " eta " in line and " loss " in line and line.endswith("s"), line
    assert "Loading weights" not in output and "\r" not in output  # no tqdm bars
    assert "LLM interface: prefill 'Move:', one-token answers" in output


def test_eval_progress_lines_arrive_while_the_eval_runs(tmp_path):
    """Each episode is a 10% step (and the one-second gap is lifted), so every episode prints a line;
    they must reach the pipe as they happen, not all at exit."""
    code = (
        "import sys; import agentrl.runs.runlog as r; r._PlainProgress.MIN_GAP_S = 0.0; "
        "from agentrl.cli import app; sys.argv = ['agentrl', *sys.argv[1:]]; app()"
    )
    args = [
        "eval",
        "model=tiny-random",
        "agent.prefill=''",
        "agent.sampling.max_new_tokens=8",
        "eval.episodes=4",
        "eval.lockstep=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    arrivals = []
    assert proc.stdout is not None
    for line in proc.stdout:
        arrivals.append((time.monotonic(), line.rstrip("\n")))
    assert proc.wait(timeout=600) == 0, "\n".join(line for _, line in arrivals)
    progress = [(t, line) for t, line in arrivals if line.startswith("eval frozenlake ")]
    assert [line.split()[2] for _, line in progress] == ["1/4", "2/4", "3/4", "4/4"], arrivals
    assert all("steps/s" in line and " eta " in line for _, line in progress)
    assert progress[-1][0] - progress[0][0] > 0.05  # written as episodes finished, not at exit


@pytest.mark.parametrize("columns", [None, "100"])
def test_console_width_off_a_terminal_comes_from_columns_or_a_large_default(columns):
    env = _env()
    if columns:
        env["COLUMNS"] = columns
    code = "from agentrl.console import console; print(console.width)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, check=True
    ).stdout
    assert int(out) == (int(columns) if columns else console_module.PLAIN_WIDTH)
