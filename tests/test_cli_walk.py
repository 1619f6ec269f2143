"""A newcomer's walk through the CLI, round 2: sweeps over paths and their summary, an algo key alone in a
sweep, `+key` typos, an unreachable endpoint, DataSciCoding's reasons, output width, and the smaller
items (a comma list outside `sweep`, quoted paths in suggested commands, an eval stopped before its
first episode, a dry run without torch)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import pythonpath_with_root
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.console import console
from agentrl.errors import ConfigError
from agentrl.kernels.precision import cpu_flags, fp32_without_timing
from agentrl.runs.checks import GPU_DEVICE_NODES

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def agentrl(*args: str, columns: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, stdout to a pipe (the console's width is fixed at its start)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "AGENTRL_NO_PROGRESS")}
    env.update(PYTHONPATH=pythonpath_with_root(), OMP_NUM_THREADS="1", AGENTRL_NO_PROGRESS="1")
    if columns:
        env["COLUMNS"] = columns
    return subprocess.run(
        [sys.executable, "-m", "agentrl", *args], env=env, capture_output=True, text=True, timeout=300
    )


def failing_run_eval(monkeypatch, fails, reason: str) -> None:
    """Make the eval of every job whose config `fails(cfg)` raise, at run time, with `reason`."""
    import agentrl.runs.launch

    real = agentrl.runs.launch.run_eval

    def run_eval(cfg, run_dir):
        if fails(cfg):
            raise ConfigError(reason)
        return real(cfg, run_dir)

    monkeypatch.setattr(agentrl.runs.launch, "run_eval", run_eval)


# ---- 1: a sweep over values with a `/` ---------------------------------------------------------------
def test_a_sweep_over_paths_keeps_one_directory_per_job_and_counts_its_failure(tmp_path, monkeypatch):
    failing_run_eval(monkeypatch, lambda cfg: str(cfg.model.cache_dir).endswith("c2"), "breaks at run time")
    sweep = tmp_path / "sweep"
    paths = f"{tmp_path}/cache/c1,{tmp_path}/cache/c2"
    result = invoke(
        "sweep", "agent=random", "eval.episodes=2", f"model.cache_dir={paths}", f"hydra.sweep.dir={sweep}"
    )
    assert result.exit_code == 1, result.output  # one job failed
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2 and all((job / ".hydra").is_dir() for job in jobs), jobs  # not nested
    assert (jobs[0] / "eval.json").is_file() and not (jobs[1] / "eval.json").exists()
    flat = " ".join(result.output.split())
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    job_column = "".join(row.split("│")[1].strip() for row in rows)  # each job labelled by its path
    assert f"1 model.cache_dir={tmp_path}/cache/c2" in job_column, result.output
    assert any("frozenlake" in row and "failed" in row for row in rows), result.output
    assert "job 1 failed: ConfigError: breaks at run time" in flat
    assert "1 sweep job(s) failed" in flat


# ---- 2: a failed job's long reason --------------------------------------------------------------------
def test_a_long_failure_reason_goes_below_the_table_and_squeezes_no_column(tmp_path, monkeypatch):
    reason = "the server said: " + "a very long explanation " * 16
    failing_run_eval(monkeypatch, lambda cfg: cfg.env.name == "snake", reason.strip())
    monkeypatch.setattr(console, "width", 80)
    sweep = tmp_path / "sweep"
    result = invoke(
        "sweep", "env=frozenlake,snake", "agent=random", "eval.episodes=2", f"hydra.sweep.dir={sweep}"
    )
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    start = max(k for k, line in enumerate(lines) if line.startswith("┏"))  # the last table: the sweep's
    table = [line for line in lines[start:] if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80, "\n".join(table)
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table if line.startswith("│")]
    cells = [row for row in cells if row[0]]  # a row's first line (the return column may wrap)
    assert ["0", "frozenlake", "random", "0", "0.00"] == cells[0][:5], table  # every column readable
    assert cells[1][1:5] == ["snake", "random", "0", "failed"], table
    assert " ".join(reason.split()) in " ".join(result.output.split())  # the reason whole, below


# ---- 3: an algo.* key alone makes a training sweep of the default algorithm ---------------------------
def test_a_sweep_of_an_algo_key_alone_trains_msgrpo(tmp_path):
    result = invoke(
        "sweep",
        "model=tiny-random",
        "algo.iterations=2",
        "seed=0,1",
        f"hydra.sweep.dir={tmp_path}",
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    assert "2 train jobs" in result.output and "error" not in result.output


# ---- 4: a `+key` that no code reads ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["eval", "agent=random", "+eval.episode=5"],
            "+eval.episode=5: eval has no key 'episode' and no code",
        ),
        (["eval", "agent=random", "+eval.episode=5"], "did you mean eval.episodes=5?"),
        (["train", "model=tiny-random", "+algo.iteration=3"], "did you mean algo.iterations=3?"),
        (["eval", "agent=random", "++eval.episode=5"], "did you mean eval.episodes=5?"),
        (["eval", "agent=random", "+agent.history=2"], "agent has no key 'history'"),  # random's agent
        (["eval", "+agent.history=2"], "agent.history exists already; set it without the +: agent.history=2"),
        (["eval", "agent=random", "eval.episode=5"], "unknown config key 'eval.episode'; did you mean"),
    ],
)
def test_a_key_no_code_reads_is_refused_naming_the_closest(tmp_path, args, expected):
    for extra in ([], ["--dry-run"]):
        result = invoke(*args, f"hydra.run.dir={tmp_path / 'never'}", *extra)
        assert result.exit_code == 2, result.output
        assert expected in one_error_line(result)
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    "added", ["+env.render_mode=ansi", "+model.vllm.enforce_eager=true", "+experiment=frozenlake_learn"]
)
def test_a_key_code_reads_can_still_be_added(added):
    result = invoke("eval", "agent=random", added, "--dry-run")
    assert result.exit_code == 0, result.output


# ---- 8: an OpenAI-compatible endpoint is checked before the run directory exists ----------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelList:
    """A server whose GET /v1/models lists `served`."""

    def __init__(self, served: list[str]):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = json.dumps({"object": "list", "data": [{"id": s} for s in served]}).encode()
                self.send_response(200 if self.path == "/v1/models" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_unreachable_endpoint_fails_before_a_run_directory_and_in_the_dry_run(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    args = ["eval", "model=openai", f"model.base_url={url}", "eval.episodes=1"]
    result = invoke(*args, f"hydra.run.dir={tmp_path / 'never'}")
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert f"model.base_url={url}: the endpoint cannot be reached" in line and "refused" in line.lower()
    assert not (tmp_path / "never").exists() and not (tmp_path / "outputs").exists()
    dry = invoke(*args, "--dry-run")
    assert dry.exit_code == 2 and "dry run: agentrl eval" in dry.output
    assert "error: model.base_url=" in dry.output and "cannot be reached" in dry.output


def test_an_endpoint_that_serves_another_model_is_refused_naming_what_it_serves(tmp_path):
    server = ModelList(["served/model"])
    try:
        base = ["eval", "model=openai", f"model.base_url={server.url}", "--dry-run"]
        wrong = invoke(*base, "model.name=other/model")
        assert wrong.exit_code == 2
        assert (
            f"model.name=other/model: {server.url} does not serve it; it serves served/model" in wrong.output
        )
        assert invoke(*base, "model.name=served/model").exit_code == 0
    finally:
        server.close()


# ---- 9: DataSciCoding says why it scored -1, and the prompt states the -2 -----------------------------
def test_datascicoding_reasons_reach_the_files_and_the_console_and_the_prompt_states_minus_2(tmp_path):
    from agentrl.sandbox import sandbox_problem

    run = tmp_path / "run"
    result = invoke(
        "eval",
        "env=datascicoding",
        f"env.sandbox={'bwrap' if sandbox_problem() is None else 'unsafe-local'}",
        "env.dataset=iris",
        "env.splits=1",
        "model=tiny-random",
        "agent.sampling.max_new_tokens=1",  # no room for code: the answer is invalid
        "eval.episodes=2",
        f"hydra.run.dir={run}",
    )
    assert result.exit_code == 0, result.output
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert [e["reasons"] for e in episodes] == [["no code was submitted"]] * 2
    transcripts = [json.loads(line) for line in (run / "transcripts.jsonl").read_text().splitlines()]
    assert all(t["reason"] == "no code was submitted" and t["reward"] == -2.0 for t in transcripts)
    assert (
        "An answer without it scores -2: -1 for no code, -1 for the invalid answer."
        in transcripts[0]["prompt"]
    )
    assert "2 steps, reward -2: no code was submitted" in result.output


# ---- 12: output width -------------------------------------------------------------------------------------
def test_output_honours_columns_and_is_100_wide_when_piped():
    described = agentrl("config", "algo=msgrpo", "--describe", columns="80")
    assert described.returncode == 0, described.stderr
    assert max(map(len, described.stdout.splitlines())) <= 80
    envs = agentrl("envs")
    assert envs.returncode == 0, envs.stderr
    assert 80 < max(map(len, envs.stdout.splitlines())) <= 100, envs.stdout
    prompt = agentrl("config", "model=tiny-random", "--show-prompt")
    assert prompt.returncode == 0, prompt.stderr
    rules = [line for line in prompt.stdout.splitlines() if line.startswith("───")]
    assert len(rules) == 2 and {len(rule) for rule in rules} == {100}, rules  # the prompt itself is exact


# ---- 15: the smaller items -------------------------------------------------------------------------------
def test_a_comma_list_outside_sweep_gives_the_sweep_command(tmp_path):
    result = invoke("eval", "env=frozenlake,snake", "agent=random", f"hydra.run.dir={tmp_path / 'never'}")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith("error: env=frozenlake,snake: several values make one job each")
    command = line.split("run them all with: ")[1]
    assert shlex.split(command)[:4] == ["agentrl", "sweep", "env=frozenlake,snake", "agent=random"]
    assert not (tmp_path / "never").exists()
    shown = invoke("config", "env=frozenlake,snake")  # any command but sweep: one line that says so
    assert shown.exit_code == 2 and "several values make one job each" in one_error_line(shown)


def test_a_suggested_command_quotes_a_path_with_spaces(tmp_path):
    taken = tmp_path / "my runs" / "a,b"
    taken.mkdir(parents=True)
    (taken / "status.json").write_text(json.dumps({"status": "complete"}))
    result = invoke("eval", "agent=random", f"hydra.run.dir='{taken}'")
    assert result.exit_code == 2, result.output
    command = one_error_line(result).split("continues with: ")[1]
    words = shlex.split(command)
    assert words[:2] == ["agentrl", "train"] and len(words) == 3, command
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert OverridesParser.create().parse_override(words[2]).value() == str(taken)


def test_an_eval_stopped_before_its_first_episode_writes_null_rates(tmp_path, monkeypatch):
    import agentrl.evaluation

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C before any episode ended

    monkeypatch.setattr(agentrl.evaluation, "rollout", interrupted)
    run = tmp_path / "run"
    result = invoke("eval", "agent=random", f"hydra.run.dir={run}")
    assert result.exit_code == 130, result.output
    written = json.loads((run / "eval.json").read_text())
    assert written["interrupted"] and written["episodes"] == 0
    assert written["success_rate"] is None and written["mean_return"] is None


def test_a_training_dry_run_imports_neither_torch_nor_transformers():
    """What made `agentrl train model=tiny-random --dry-run` take seconds: torch's and transformers'
    imports (and building the tiny model) for a plan that needs none of them."""
    code = (
        "import sys; from agentrl.cli import app; sys.argv = ['agentrl', *sys.argv[1:]]\n"
        "try:\n    app()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": pythonpath_with_root(), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, "train", "model=tiny-random", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # fp32 on every CPU: no bf16 matrix instructions (or AGENTRL_CPU_FEATURES=plain), else hidden size 64
    reason = fp32_without_timing(cpu_flags(), (64, 256))
    assert reason and f"precision auto = fp32 ({reason})" in done.stdout, done.stdout
    assert "dry run: agentrl train" in done.stdout
    imported = done.stdout.strip().splitlines()[-1]
    # where a GPU's device node exists, torch must be asked whether CUDA works
    assert imported == ("['torch']" if any(map(os.path.exists, GPU_DEVICE_NODES)) else "[]"), done.stdout
