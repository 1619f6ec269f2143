"""report: finds runs (single, sweep, DQN), tables equal the source files, plots are valid PNGs,
incomplete and corrupt runs are listed, never fatal."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf
from PIL import Image
from rich.console import Console

from agentrl.errors import RunDirError
from agentrl.report import build_report, find_runs, mean_stderr


def _config(task: str, env: str, agent: str, seed: int, algo: str | None = None, model: str = "smollm2-135m"):
    cfg = {
        "task": task,
        "seed": seed,
        "name": "${task}_${env.name}",  # Hydra saves config.yaml unresolved
        "env": {"name": env},
        "agent": {"name": agent},
        "model": {"name": model},
        "eval": {"episodes": 4, "seed_offset": 1000000},
    }
    if algo:
        cfg["algo"] = {"name": algo}
    return cfg


def make_run(
    run_dir: Path,
    cfg: dict,
    overrides: list[str],
    eval_data: dict | None = None,
    metrics: list[dict] | None = None,
) -> Path:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if eval_data is not None:
        (run_dir / "eval.json").write_text(json.dumps(eval_data))
    if metrics is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run_dir


def _eval(
    success: float, ret: float, stderr: float = 0.1, length: float = 6.0, invalid: float = 0.0, **extra
):
    return {
        "episodes": 4,
        "success_rate": success,
        "mean_return": ret,
        "return_stderr": stderr,
        "mean_length": length,
        "invalid_rate": invalid,
        **extra,
    }


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """A small outputs/ tree: a 3-seed sweep, a single eval, two LLM training runs (2 seeds) with
    learning curves, an incomplete run and two corrupt ones."""
    out = tmp_path / "outputs"
    sweep = out / "multirun" / "2025-01-01" / "12-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for k, (s, r) in enumerate([(0.25, 0.25), (0.5, 0.5), (0.0, 0.0)]):
        make_run(
            sweep / f"{k}_agent=random,seed={k}",
            _config("eval", "frozenlake", "random", k),
            ["task=eval", "agent=random", f"seed={k}"],
            _eval(s, r, stderr=0.2 + k / 10, length=3.5 + k),
        )
    make_run(
        out / "2025-01-02" / "10-00-00_eval_frozenlake",
        _config("eval", "frozenlake", "planner", 0),
        ["task=eval", "agent=planner"],
        _eval(1.0, 1.0, stderr=0.0, length=6.0),
    )
    for seed, (final, slope) in enumerate([(0.75, 0.1), (0.5, 0.05)]):
        curve = [
            {
                "iteration": i,
                "time_s": 30.0 * i,
                "success_rate": min(1.0, slope * i),
                "mean_return": slope * i - 0.1,
            }
            for i in range(1, 9)
        ]
        make_run(
            out / "2025-01-02" / f"11-00-0{seed}_train_frozenlake",
            _config("train", "frozenlake", "llm", seed, algo="msgrpo", model="qwen2.5-3b"),
            ["task=train", "algo=msgrpo", "model=qwen2.5-3b", f"seed={seed}", "algo.learning_rate=1e-6"],
            _eval(
                final,
                final,
                invalid=0.125,
                train_time_s=3600.0 + seed,
                before={"success_rate": 0.25, "mean_return": 0.25},
            ),
            curve,
        )
    incomplete = make_run(
        out / "2025-01-03" / "09-00-00_train_snake",
        _config("train", "snake", "llm", 0, algo="msgrpo"),
        ["task=train", "env=snake"],
        metrics=[{"iteration": 1, "time_s": 5.0, "mean_return": -1.0}],
    )
    with (incomplete / "metrics.jsonl").open("a") as fh:
        fh.write('{"iteration": 2, "time_')  # killed mid-write
    corrupt = make_run(
        out / "2025-01-03" / "09-30-00_eval_snake", _config("eval", "snake", "planner", 0), ["task=eval"]
    )
    (corrupt / "eval.json").write_text('{"success_rate": 0.5, ')
    bad_cfg = out / "2025-01-03" / "10-00-00_broken"
    (bad_cfg / ".hydra").mkdir(parents=True)
    (bad_cfg / ".hydra" / "config.yaml").write_text("env: [unclosed\n  - : :\n")
    return out


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_report_tables_equal_the_source_files(outputs, tmp_path):
    console = Console(record=True, width=250)
    report = build_report([outputs], out_dir=tmp_path / "rep", console=console)

    statuses = {r.path.name: r.status for r in report.runs}
    assert len(report.runs) == 9
    assert statuses["09-00-00_train_snake"] == "incomplete"
    assert statuses["09-30-00_eval_snake"] == "corrupt"
    assert statuses["10-00-00_broken"] == "corrupt"
    assert sum(s == "complete" for s in statuses.values()) == 6

    rows = {Path(r["run"]).name: r for r in _csv(tmp_path / "rep" / "report.csv")}
    assert len(rows) == 9
    for run in report.runs:
        if run.status != "complete":
            continue
        source = json.loads((run.path / "eval.json").read_text())
        row = rows[run.path.name]
        for key in (
            "success_rate",
            "mean_return",
            "return_stderr",
            "mean_length",
            "invalid_rate",
            "episodes",
        ):
            assert float(row[key]) == source[key], (run.path, key)
    train = rows["11-00-00_train_frozenlake"]
    assert (train["agent"], train["model"], train["seed"]) == ("msgrpo", "qwen2.5-3b", "0")
    assert float(train["train_time_s"]) == 3600.0 and float(train["before_success_rate"]) == 0.25
    assert train["overrides"] == "algo.learning_rate=1e-6"
    sweep_row = rows["1_agent=random,seed=1"]
    assert (sweep_row["env"], sweep_row["agent"], sweep_row["model"], sweep_row["seed"]) == (
        "frozenlake",
        "random",
        "-",
        "1",
    )
    assert (
        "incomplete" == rows["09-00-00_train_snake"]["status"]
        and "1 unreadable" in rows["09-00-00_train_snake"]["error"]
    )

    # aggregates over seeds equal mean ± stderr of the source numbers
    groups = {(g.env, g.agent): g for g in report.groups}
    random_group = groups[("frozenlake", "random")]
    assert len(random_group.runs) == 3
    values = np.array([0.25, 0.5, 0.0])
    assert random_group.success[0] == pytest.approx(values.mean())
    assert random_group.success[1] == pytest.approx(values.std(ddof=1) / math.sqrt(3))
    assert random_group.length == pytest.approx(np.mean([3.5, 4.5, 5.5]))
    msgrpo = groups[("frozenlake", "msgrpo")]
    assert msgrpo.model == "qwen2.5-3b" and msgrpo.variant == "algo.learning_rate=1e-6"
    assert msgrpo.episode_return == pytest.approx((0.625, 0.125))
    group_rows = _csv(tmp_path / "rep" / "report_groups.csv")
    random_row = next(r for r in group_rows if r["agent"] == "random")
    assert float(random_row["success_mean"]) == pytest.approx(0.25) and random_row["runs"] == "3"
    planner_row = next(r for r in group_rows if r["agent"] == "planner")
    assert planner_row["success_stderr"] == ""  # one seed: no stderr claimed

    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| frozenlake | random | - |  | 3 | 0.250 ± 0.144 |" in md, md
    assert "9 runs: 6 complete, 1 incomplete, 2 corrupt" in md
    assert "![final_eval](final_eval.png)" in md
    printed = console.export_text()
    assert "0.250 ± 0.144" in printed and "corrupt" in printed and "incomplete" in printed


def test_report_plots_are_valid_pngs(outputs, tmp_path):
    report = build_report([outputs], out_dir=tmp_path / "rep")
    names = {p.name for p in report.plots}
    # learning curves for the envs with metrics.jsonl (frozenlake training, the incomplete snake run)
    assert names == {"curves_frozenlake.png", "curves_snake.png", "final_eval.png"}
    for path in report.plots:
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            assert img.format == "PNG" and img.size[0] > 400 and img.size[1] > 200


def test_default_out_dir_and_errors(outputs, tmp_path):
    sweep = outputs / "multirun"
    report = build_report([sweep])
    assert (sweep / "report.md").is_file() and (sweep / "report.csv").is_file()
    assert len(report.runs) == 3 and report.groups[0].runs[0].seed in {0, 1, 2}
    # the same run reached through two paths is reported once
    assert len(find_runs([sweep, sweep / "2025-01-01"])) == 3
    with pytest.raises(RunDirError):
        build_report([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError):
        build_report([tmp_path / "empty"])


def test_mean_stderr():
    assert mean_stderr([1.0, 3.0]) == (2.0, 1.0)
    mean, err = mean_stderr([2.0])
    assert mean == 2.0 and math.isnan(err)
    assert all(math.isnan(x) for x in mean_stderr([]))


def test_report_on_a_real_dqn_run(tmp_path, monkeypatch):
    """A real (short) DQN run, with the .hydra files Hydra would write, reads back exactly."""
    from agentrl.config import compose_config
    from agentrl.run import run_train

    monkeypatch.setenv("AGENTRL_NO_PROGRESS", "1")
    overrides = [
        "task=train",
        "algo=dqn",
        "agent=random",
        "env=frozenlake",
        "eval.episodes=5",
        "algo.total_timesteps=600",
        "algo.learning_starts=200",
        "algo.net_arch=[32]",
        "algo.log_every=200",
        "algo.checkpoint_every=0",
    ]
    cfg = compose_config(overrides)
    run_dir = tmp_path / "outputs" / "dqn_run"
    threads = torch.get_num_threads()
    try:
        run_train(cfg, run_dir)
    finally:
        torch.set_num_threads(threads)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))

    report = build_report([tmp_path / "outputs"])
    (run,) = report.runs
    source = json.loads((run_dir / "eval.json").read_text())
    assert (run.status, run.env, run.agent, run.model) == ("complete", "frozenlake", "dqn", "-")
    assert run.metric("mean_return") == source["mean_return"]
    assert run.metric("train_time_s") == source["train_time_s"]
    assert [row["iteration"] for row in run.curve] == [200, 400, 600]
    assert "algo.total_timesteps=600" in run.overrides
    assert {p.name for p in report.plots} == {"curves_frozenlake.png", "final_eval.png"}
