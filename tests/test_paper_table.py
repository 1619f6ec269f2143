"""`agentrl report DIR --table paper`: the env x method table's numbers are the mean and standard error
over seeds of the runs' eval.json values; zero-shot vs trained and transfer sections; files and plots."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
from helpers import assert_title_clear
from omegaconf import OmegaConf
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.report.paper import MAIN, TRANSFER, ZERO_SHOT, build_paper_report

ENVS = ("frozenlake", "snake")
METHODS = {"aaw": "algo.aaw.enabled=true", "uniform": "algo.aaw.enabled=false"}
SEEDS = (0, 1, 2)


def _success(env: str, method: str, seed: int) -> float:
    """Distinct, known numbers per run (seed-dependent so the stderr is not zero)."""
    return round(0.1 + 0.2 * ENVS.index(env) + 0.3 * list(METHODS).index(method) + 0.07 * seed**2, 4)


def _return(env: str, method: str, seed: int) -> float:
    return round(-1.0 + ENVS.index(env) + 0.5 * list(METHODS).index(method) + 0.11 * seed, 4)


def _write_run(
    path: Path, config: dict, overrides: list[str], ev: dict, curve: list[dict] | None = None
) -> Path:
    (path / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), path / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), path / ".hydra" / "overrides.yaml")
    (path / "eval.json").write_text(json.dumps(ev))
    if curve:
        (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in curve))
    return path


def _train_run(root: Path, env: str, method: str, seed: int) -> Path:
    config = {
        "task": "train",
        "seed": seed,
        "env": {"name": env},
        "agent": {"name": "llm"},
        "model": {"name": "tiny-random"},
        "algo": {"name": "msgrpo"},
    }
    success, ret = _success(env, method, seed), _return(env, method, seed)
    ev = {
        "env": env,
        "agent": "msgrpo",
        "seed": seed,
        "success_rate": success,
        "mean_return": ret,
        "return_stderr": 0.01,
        "episodes": 20,
        "before": {"success_rate": 0.05 * seed, "mean_return": -2.0 + 0.1 * seed},
    }
    curve = [
        {
            "iteration": i,
            "time_s": 2.0 * i,
            "train/mean_return": ret * i / 10,
            "eval/success_rate": success * i / 10,
        }
        for i in range(1, 11)
    ]
    overrides = ["algo=msgrpo", "experiment=frozenlake_learn", METHODS[method], f"seed={seed}"]
    return _write_run(root / f"train_{env}_{method}_{seed}", config, overrides, ev, curve)


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "sweep"
    for env in ENVS:
        for method in METHODS:
            for seed in SEEDS:
                _train_run(root, env, method, seed)
    # zero-shot transfer: the snake-trained AAW runs of seeds 0 and 1 evaluated on frozenlake
    for seed, value in ((0, 0.25), (1, 0.45)):
        trained = root / f"train_snake_aaw_{seed}"
        config = {
            "task": "eval",
            "seed": seed,
            "env": {"name": "frozenlake"},
            "agent": {"name": "llm"},
            "model": {"name": "tiny-random"},
            "from_run": str(trained),
        }
        ev = {
            "env": "frozenlake",
            "agent": "msgrpo",
            "algo": "msgrpo",
            "seed": seed,
            "from_run": str(trained),
            "checkpoint": "final",
            "trained_env": "snake",
            "success_rate": value,
            "mean_return": value - 1,
        }
        overrides = [f"from_run={trained}", "experiment=transfer_snake_to_frozenlake", f"seed={seed}"]
        _write_run(root / f"transfer_{seed}", config, overrides, ev)
    # a run that did not finish: never averaged in
    bad = root / "train_frozenlake_aaw_9"
    (bad / ".hydra").mkdir(parents=True)
    OmegaConf.save(
        OmegaConf.create({"task": "train", "seed": 9, "env": {"name": "frozenlake"}}),
        bad / ".hydra/config.yaml",
    )
    (bad / "status.json").write_text(json.dumps({"status": "failed", "reason": "boom"}))
    return root


def _expected(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) / math.sqrt(len(values))


def test_main_table_is_mean_and_stderr_over_seeds(runs, tmp_path):
    out = tmp_path / "report"
    report = build_paper_report([runs], out)
    main = {(r.env, r.method): r for r in report.section(MAIN)}
    assert report.common == "experiment=frozenlake_learn"
    assert set(main) == {(env, f"msgrpo / tiny-random {METHODS[m]}") for env in ENVS for m in METHODS}
    for env in ENVS:
        for method, item in METHODS.items():
            row = main[(env, f"msgrpo / tiny-random {item}")]
            assert row.seeds == 3
            assert row.success == pytest.approx(_expected([_success(env, method, s) for s in SEEDS]))
            assert row.episode_return == pytest.approx(_expected([_return(env, method, s) for s in SEEDS]))
    assert report.skipped == 1

    with (out / "paper.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    main_rows = [r for r in rows if r["section"] == MAIN]
    assert len(main_rows) == 4
    first = next(r for r in main_rows if r["env"] == "snake" and r["method"].endswith("false"))
    mean, err = _expected([_success("snake", "uniform", s) for s in SEEDS])
    assert float(first["success_mean"]) == pytest.approx(mean) and float(
        first["success_stderr"]
    ) == pytest.approx(err)
    assert first["seeds"] == "3"

    text = (out / "paper.md").read_text()
    mean, err = _expected([_success("frozenlake", "aaw", s) for s in SEEDS])
    assert f"{mean:.3f} ± {err:.3f} (n=3)" in text
    for name in ("paper.md", "paper.csv", "paper_curves.png", "paper_bars.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name


def test_zero_shot_and_transfer_sections(runs, tmp_path):
    report = build_paper_report([runs], tmp_path / "report")
    zero = {(r.env, r.method): r for r in report.section(ZERO_SHOT)}
    row = zero[("snake", "msgrpo / tiny-random algo.aaw.enabled=true")]
    assert row.before_success == pytest.approx(_expected([0.05 * s for s in SEEDS]))
    assert row.success == pytest.approx(_expected([_success("snake", "aaw", s) for s in SEEDS]))

    (transfer,) = report.section(TRANSFER)
    assert (transfer.trained_env, transfer.env, transfer.seeds) == ("snake", "frozenlake", 2)
    assert transfer.method == "msgrpo / tiny-random algo.aaw.enabled=true"  # the trained run's method
    assert transfer.success == pytest.approx(_expected([0.25, 0.45]))
    own = next(r for r in report.section(MAIN) if r.env == "snake" and r.method == transfer.method)
    assert transfer.trained_env_success == pytest.approx(own.success[0])
    # transfer evals never enter the main table's frozenlake cells
    assert all(r.seeds == 3 for r in report.section(MAIN))


def test_paper_plots_name_methods_show_zero_bars_and_keep_titles_clear(runs, tmp_path):
    """paper_bars.png names each method under its bar (with its seeds) and writes every bar's value, so a
    zero bar is seen; neither figure's title runs into its legend."""
    import matplotlib.pyplot as plt

    from agentrl.report.paper import _styles, figure_paper_bars, figure_paper_curves

    for seed in SEEDS:  # the frozenlake AAW runs end at success 0
        path = runs / f"train_frozenlake_aaw_{seed}" / "eval.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "success_rate": 0.0}))
    report = build_paper_report([runs], tmp_path / "report")
    styles = _styles([r.method for r in report.runs])
    bars = figure_paper_bars(report.section(MAIN), styles)
    curves = figure_paper_curves(report.runs, styles)
    try:
        assert_title_clear(bars)
        assert_title_clear(curves)
        panel = next(ax for ax in bars.axes if ax.get_title() == "frozenlake: success rate")
        ticks = [t.get_text().split("\n") for t in panel.get_xticklabels()]
        assert ticks == [["algo.aaw.enabled=", "false", "n=3"], ["algo.aaw.enabled=", "true", "n=3"]]
        values = [t.get_text() for t in panel.texts]
        assert (
            "0.00" in values
            and f"{_expected([_success('frozenlake', 'uniform', s) for s in SEEDS])[0]:.2f}" in values
        )
    finally:
        plt.close(bars)
        plt.close(curves)


def test_cli_table_paper(runs, tmp_path):
    out = tmp_path / "cli_report"
    result = CliRunner().invoke(app, ["report", str(runs), "--table", "paper", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Results by env and method" in result.output and "Transfer" in result.output
    assert (out / "paper.md").is_file() and not (out / "report.md").exists()
    bad = CliRunner().invoke(app, ["report", str(runs), "--table", "nope"])
    assert bad.exit_code == 2 and "valid choices: runs, paper" in bad.output
