"""`agentrl report` through the CLI on faked run directories: every printed table fits 80 columns and
keeps its identifying column, evals of trained models are named by the run they evaluated, and plots
stay readable with many envs or few metric rows."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.console import console

ENVS8 = (
    "bandit",
    "contextual_bandit",
    "datascicoding",
    "frozenlake",
    "kitchen",
    "snake",
    "snake_poison",
    "tictactoe",
)


def write_run(
    path: Path,
    config: dict,
    overrides: list[str],
    ev: dict | None = None,
    curve: list[dict] | None = None,
) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if ev is not None:
        (path / "eval.json").write_text(json.dumps(ev))
    if curve is not None:
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    return path


def config(
    task: str, env: str, agent: str = "llm", algo: str | None = None, seed: int = 0, **extra: dict
) -> dict:
    """A run's config.yaml; `agent_cfg`, `model_cfg` and `algo_cfg` dicts add keys to those groups."""
    cfg = {
        "task": task,
        "seed": seed,
        "env": {"name": env},
        "agent": {"name": agent, **extra.pop("agent_cfg", {})},
        "model": {"name": "smollm2-135m", **extra.pop("model_cfg", {})},
        "eval": {"episodes": 4},
    }
    if algo:
        cfg["algo"] = {"name": algo, **extra.pop("algo_cfg", {})}
    return cfg


def metrics(success: float, ret: float, **extra) -> dict:
    return {"episodes": 4, "success_rate": success, "mean_return": ret, "return_stderr": 0.1, **extra}


def report(*args: str, width: int = 80, monkeypatch: pytest.MonkeyPatch | None = None):
    if monkeypatch is not None:
        monkeypatch.setattr(console, "width", width)
    result = CliRunner().invoke(app, ["report", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def tables_part(output: str) -> str:
    """The printed tables: everything before the list of written files."""
    return output.partition("Wrote:\n")[0]


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------------------------------------
# item 6: tables fit 80 columns and keep their identifying column
# ---------------------------------------------------------------------------------------------
def _diagnostics(regret: float, coverage: float) -> dict:
    return {
        "episodes": 3,
        "curves": {
            "step": [1, 2, 3],
            "episodes": [3, 3, 3],
            "regret_mean": [0.5, 1.0, regret],
            "regret_stderr": [0.1, 0.2, 0.3],
            "coverage_mean": [0.2, 0.4, coverage],
            "coverage_stderr": [0.0, 0.1, 0.1],
        },
        "final_regret": {"mean": regret, "stderr": 2.28},
        "final_coverage": {"mean": coverage, "stderr": 0.0},
        "greediness": {"greedy": 57, "cases": 135},
        "frequency_bias": {"repeats": 48, "cases": 135, "chance_share": 0.299, "bins": []},
        "knowing_doing": {"judged": 40, "knowing": 20, "knowing_doing": 15, "knowing_greedy": 3},
    }


def test_bandit_diagnostics_keep_the_group_column_at_80_columns(tmp_path, monkeypatch):
    for agent in ("planner", "random"):
        write_run(
            tmp_path / "runs" / agent,
            config("eval", "bandit", agent),
            ["env=bandit", f"agent={agent}"],
            {**metrics(0.33, 30.0), "diagnostics": _diagnostics(10.3 if agent == "planner" else 16.2, 1.0)},
        )
    out = report(str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), monkeypatch=monkeypatch)
    printed = tables_part(out)
    assert max(map(len, printed.splitlines())) <= 80
    diagnostics = printed[printed.index("decision-making diagnostics") :]
    # every part of the split table names its rows: planner and random never become indistinguishable
    parts = diagnostics.split("decision-making diagnostics")[1:]
    for part in parts:
        rows = [line.split()[0] for line in part.splitlines() if line.strip()[:1].isalpha()]
        assert {"planner", "random"} <= set(rows), part
    assert "10.30 ± 2.28" in diagnostics and "16.20 ± 2.28" in diagnostics  # numbers whole


def _paper_runs(root: Path) -> Path:
    for env in ENVS8:
        for k, algo in enumerate(("msgrpo", "poad")):
            for seed in (0, 1):
                write_run(
                    root / f"{env}_{algo}_{seed}",
                    config("train", env, algo=algo, seed=seed, model_cfg={"name": "tiny-random"}),
                    [f"env={env}", f"algo={algo}", "model=tiny-random", f"seed={seed}"],
                    metrics(0.25 * k * (seed + 1), -1.0 + seed, untagged_rate=0.05 * seed),
                )
    return root


@pytest.mark.parametrize("width", [80, 200])
def test_paper_table_over_8_envs_keeps_the_method_column(tmp_path, monkeypatch, width):
    root = _paper_runs(tmp_path / "runs")
    out = report(
        str(root), "--table", "paper", "--out", str(tmp_path / "rep"), width=width, monkeypatch=monkeypatch
    )
    printed = tables_part(out)
    assert max(map(len, printed.splitlines())) <= width
    main = printed.split("Zero-shot vs trained")[0]
    parts = main.split("Results by env and method")[1:]
    assert len(parts) > 1  # 8 envs x 3 columns do not fit one table even at 200 columns
    shown_envs = set()
    for part in parts:
        lines = part.splitlines()
        assert any(line.split()[:1] == ["method"] for line in lines), part
        assert (
            sum(line.lstrip().startswith(("msgrpo / tiny-random", "poad / tiny-random")) for line in lines)
            == 2
        )
        shown_envs |= {env for env in ENVS8 if f" {env}" in part or f"\n{env}" in part}
    assert shown_envs == set(ENVS8)
    assert "0.375 ± 0.125 (n=2)" in main  # poad: seeds 0.25 and 0.5, whole


def test_envs_shows_whole_gymnasium_ids_at_80_columns(monkeypatch):
    from agentrl.envs import ENV_SPECS

    monkeypatch.setattr(console, "width", 80)
    result = CliRunner().invoke(app, ["envs"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines()[:-1])) <= 80
    for name, spec in ENV_SPECS.items():
        assert spec.gym_id in result.output and name in result.output


def test_wrote_lists_every_file_whole(tmp_path, monkeypatch):
    deep = tmp_path / ("a_rather_long_directory_name_" * 3) / "report"
    write_run(
        tmp_path / "runs" / "r", config("eval", "frozenlake", "planner"), ["agent=planner"], metrics(1.0, 1.0)
    )
    out = report(str(tmp_path / "runs"), "--out", str(deep), monkeypatch=monkeypatch)
    wrote = out.partition("Wrote:\n")[2].split()
    assert str(deep / "report.md") in wrote and str(deep / "report.csv") in wrote
    assert all(Path(p).is_file() for p in wrote)


# ---------------------------------------------------------------------------------------------
# item 7: labels name what played
# ---------------------------------------------------------------------------------------------
def _dqn_training_run(root: Path) -> Path:
    run = write_run(
        root / "2026-12-01" / "10-00-00.000-abcd_train_snake",
        config("train", "snake", "llm", algo="dqn", algo_cfg={"total_timesteps": 3000}),
        ["env=snake", "algo=dqn", "algo.total_timesteps=3000"],
        metrics(0.8, 7.5, train_time_s=11.0),
        [{"iteration": 2000, "time_s": 7.6, "mean_return": -0.33, "success_rate": 0.125}],
    )
    (run / "final").mkdir()
    (run / "final" / "model.zip").write_bytes(b"PK")
    return run


def test_one_dqn_model_evaluated_two_ways_is_one_group_without_an_llm_model(tmp_path, monkeypatch):
    runs = tmp_path / "outputs"
    trained = _dqn_training_run(runs)
    zip_path = trained / "final" / "model.zip"
    ev = metrics(1.0, 8.3, untagged_rate=0.0)
    write_run(  # agentrl eval from_run=<run>
        runs / "e1",
        config("eval", "snake", "dqn", agent_cfg={"path": str(zip_path)}),
        ["env=snake", "seed=0", "agent=dqn", f"agent.path='{zip_path}'", f"from_run={trained}"],
        {**ev, "agent": "dqn", "algo": "dqn", "from_run": str(trained), "checkpoint": "final/model.zip"},
    )
    write_run(  # agentrl eval env=snake agent=dqn agent.path=<run dir>
        runs / "e2",
        config("eval", "snake", "dqn", agent_cfg={"path": str(trained)}),
        ["env=snake", "agent=dqn", f"agent.path={trained}", "++eval.episodes=3"],
        {**ev, "agent": "dqn"},
    )
    write_run(  # ... agent.path=<run dir>/final/model.zip, another transcripts setting and name
        runs / "e3",
        config("eval", "snake", "dqn", agent_cfg={"path": str(zip_path)}),
        ["env=snake", "agent=dqn", f"agent.path={zip_path}", "eval.transcripts=false", "name=again"],
        {**ev, "agent": "dqn"},
    )
    write_run(  # a plain DQN eval of a zip outside any run: a DQN, still no LLM model
        runs / "e4",
        config("eval", "snake", "dqn", agent_cfg={"path": "/elsewhere/model.zip"}),
        ["env=snake", "agent=dqn", "agent.path=/elsewhere/model.zip"],
        {**ev, "agent": "dqn"},
    )
    out = report(str(runs), "--out", str(tmp_path / "rep"), monkeypatch=monkeypatch)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "smollm2" not in md and "smollm2" not in out
    groups = [g for g in csv_rows(tmp_path / "rep" / "report_groups.csv") if g["agent"] == "dqn"]
    evals = [g for g in groups if g["label"].startswith("dqn [from_run eval]")]
    assert len(evals) == 1, groups
    assert evals[0]["runs"] == "3" and evals[0]["model"] == "-"
    assert evals[0]["variant"] == "algo.total_timesteps=3000"  # the trained run's variant, no path
    assert all(g["model"] == "-" for g in groups)
    runs_csv = csv_rows(tmp_path / "rep" / "report.csv")
    assert {r["from_run"] for r in runs_csv if r["run"].endswith(("e1", "e2", "e3"))} == {
        f"{trained.resolve()}:final/model.zip"
    }


def _msgrpo_training_run(root: Path) -> Path:
    return write_run(
        root / "train_frozenlake",
        config(
            "train",
            "frozenlake",
            algo="msgrpo",
            model_cfg={"name": "tiny-random"},
            algo_cfg={"eval_temperature": 0.5, "max_new_tokens": 1},
        ),
        ["algo=msgrpo", "model=tiny-random", "algo.aaw.enabled=false"],
        metrics(0.5, 0.5, before={"success_rate": 0.0, "mean_return": 0.0}, train_time_s=60.0),
        [{"iteration": i, "time_s": 5.0 * i, "eval/success_rate": 0.1 * i} for i in range(1, 4)],
    )


def test_a_from_run_eval_has_one_label_everywhere(tmp_path, monkeypatch):
    runs = tmp_path / "outputs"
    trained = _msgrpo_training_run(runs)
    final = trained / "final"
    write_run(
        runs / "reeval",
        config("eval", "frozenlake", model_cfg={"name": "tiny-random", "name_or_path": str(final)}),
        [
            "model=tiny-random",
            "algo.aaw.enabled=false",
            f"model.name_or_path='{final}'",
            "agent.sampling.temperature=0.5",
            "agent.sampling.max_new_tokens=1",
            f"from_run={trained}",
            "++eval.episodes=3",
            "hydra.run.dir=x",
        ],
        {
            **metrics(0.75, 0.75),
            "agent": "msgrpo",
            "algo": "msgrpo",
            "from_run": str(trained),
            "checkpoint": "final",
        },
    )
    out = report(str(runs), "--out", str(tmp_path / "rep"), monkeypatch=monkeypatch)
    label = "msgrpo / tiny-random [from_run eval]"
    (group,) = [g for g in csv_rows(tmp_path / "rep" / "report_groups.csv") if "from_run" in g["label"]]
    assert group["label"] == f"{label} / algo.aaw.enabled=false"  # no path, no eval.episodes, no sampling
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "llm / tiny-random" not in md and "llm" not in group["label"]
    assert "| msgrpo [from_run eval] | tiny-random | algo.aaw.enabled=false |" in md
    assert label in out
    paper = report(str(runs), "--table", "paper", "--out", str(tmp_path / "paper"), monkeypatch=monkeypatch)
    methods = {r["method"] for r in csv_rows(tmp_path / "paper" / "paper.csv")}
    assert label in methods and label in paper  # algo.aaw.enabled=false: shared by all, said once
    assert str(final) not in md and str(final) not in (tmp_path / "paper" / "paper.md").read_text()


def test_plot_legends_hold_no_paths(tmp_path):
    import matplotlib.pyplot as plt

    from agentrl.report import build_report, figure_final_eval

    runs = tmp_path / "outputs"
    trained = _msgrpo_training_run(runs)
    (trained / "final").mkdir()
    for seed, path in enumerate((trained / "final", tmp_path / "somewhere" / "else" / "model")):
        write_run(  # a trained model named by path without its run's settings (no from_run)
            runs / f"named_{seed}",
            config(
                "eval", "frozenlake", seed=seed, model_cfg={"name": "tiny-random", "name_or_path": str(path)}
            ),
            ["model=tiny-random", f"model.name_or_path={path}", f"seed={seed}"],
            metrics(0.25, 0.25),
        )
    rep = build_report([runs], out_dir=tmp_path / "rep")
    fig = figure_final_eval(rep.groups)
    try:
        labels = [t.get_text().replace("\n", "") for ax in fig.axes for t in ax.get_yticklabels()]
        assert labels and not any(str(tmp_path) in text for text in labels)
        assert any("train_frozenlake/final" in text for text in labels)  # the run's name, not its path
        assert any("…/else/model" in text for text in labels)  # another path: its tail
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# item 8: plots stay readable
# ---------------------------------------------------------------------------------------------
def test_paper_bars_over_8_envs_is_a_grid_with_visible_zero_bars(tmp_path):
    from agentrl.report.paper import MAIN, _styles, build_paper_report, figure_paper_bars

    root = _paper_runs(tmp_path / "runs")
    rep = build_paper_report([root], tmp_path / "rep")
    fig = figure_paper_bars(rep.section(MAIN), _styles([r.method for r in rep.runs]))
    try:
        width, height = fig.get_size_inches() * 120
        assert width <= 2400 and height >= 400 and width / height < 3
        axes = [ax for ax in fig.axes if ax.has_data()]
        assert len(axes) >= 8  # one small panel per env (and metric)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in axes:
            labels = [t for t in ax.get_xticklabels() if "n=" in t.get_text()]  # method, then n seeds
            assert labels
            boxes = [t.get_window_extent(renderer) for t in labels]
            for i, a in enumerate(boxes):
                for b in boxes[i + 1 :]:
                    assert not a.overlaps(b), [t.get_text() for t in labels]
        # msgrpo's success is 0 on every env: each of those bars has its value written at 0
        zero_values = [t for ax in axes for t in ax.texts if t.get_text() == "0.00" and t.xy[1] == 0.0]
        assert len(zero_values) >= len(ENVS8)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_short_dqn_curves_are_drawn_with_markers(tmp_path):
    import matplotlib.pyplot as plt

    from agentrl.report import build_report, figure_learning_curves

    for seed in (0, 1):  # one metrics row each (DQN logs one row per 2000 env steps)
        _dqn_training_run(tmp_path / "outputs" / f"seed{seed}")
    rep = build_report([tmp_path / "outputs"], out_dir=tmp_path / "rep")
    fig = figure_learning_curves(rep.runs, "snake")
    try:
        train_ax = fig.axes[0]
        points = [line for line in train_ax.lines if len(line.get_xdata()) == 1]
        assert len(points) == 2 and all(line.get_marker() not in (None, "None", "") for line in points)
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# issue 24: untagged_rate is a column of the report and paper tables
# ---------------------------------------------------------------------------------------------
def test_untagged_rate_is_a_column_of_every_table(tmp_path, monkeypatch):
    runs = tmp_path / "outputs"
    for seed, untagged in enumerate((0.25, 0.75)):
        write_run(
            runs / f"rlft_{seed}",
            config("train", "tictactoe", algo="rlft", seed=seed),
            ["env=tictactoe", "algo=rlft", f"seed={seed}"],
            metrics(0.5, 0.0, untagged_rate=untagged, invalid_rate=0.0),
        )
    write_run(  # an old run without untagged_rate
        runs / "planner",
        config("eval", "tictactoe", "planner"),
        ["agent=planner"],
        metrics(1.0, 1.0, invalid_rate=0.0),
    )
    out = report(str(runs), "--out", str(tmp_path / "rep"), monkeypatch=monkeypatch)
    assert "untagged" in out and "0.500" in out
    by_run = {Path(r["run"]).name: r for r in csv_rows(tmp_path / "rep" / "report.csv")}
    assert by_run["rlft_1"]["untagged_rate"] == "0.75" and by_run["planner"]["untagged_rate"] == ""
    groups = {g["agent"]: g for g in csv_rows(tmp_path / "rep" / "report_groups.csv")}
    assert (
        float(groups["rlft"]["untagged_rate_mean"]) == 0.5 and groups["planner"]["untagged_rate_mean"] == ""
    )
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| invalid | untagged | train time |" in md
    assert "| 0.000 | – | – |" in md  # the planner: invalid 0, untagged not recorded, no training time

    paper = report(str(runs), "--table", "paper", "--out", str(tmp_path / "paper"), monkeypatch=monkeypatch)
    assert "untagged" in paper and "0.500 ± 0.250" in paper
    rows = {r["method"]: r for r in csv_rows(tmp_path / "paper" / "paper.csv") if r["section"] == "main"}
    assert float(rows["rlft / smollm2-135m"]["untagged_rate_mean"]) == 0.5
    assert rows["planner"]["untagged_rate_mean"] == ""
    assert "| tictactoe untagged |" in (tmp_path / "paper" / "paper.md").read_text()


def test_a_run_killed_outright_reads_killed_not_running(tmp_path, monkeypatch):
    from agentrl.runs import rundir

    run = write_run(tmp_path / "runs" / "a", config("eval", "frozenlake", agent="random"), ["agent=random"])
    rundir.write_status(run, "running", task="eval")
    # SIGKILL leaves status.json at running and a lock file that no process holds
    (run / rundir.LOCK_FILE).write_text(f"{os.getpid()} {rundir.host_name()} 2026-01-01T00:00:00\n")
    output = report(
        str(tmp_path / "runs"), "--out", str(tmp_path / "out"), width=200, monkeypatch=monkeypatch
    )
    rows = csv_rows(tmp_path / "out" / "report.csv")
    assert [r["status"] for r in rows] == ["killed"]
    assert "killed" in output and "running" not in tables_part(output).replace("says running", "")
    with rundir.claim(run, resume=True):  # a live holder: the run is really running
        report(str(tmp_path / "runs"), "--out", str(tmp_path / "out2"), width=200, monkeypatch=monkeypatch)
    assert [r["status"] for r in csv_rows(tmp_path / "out2" / "report.csv")] == ["running"]
