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
from helpers import assert_title_clear
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
    from agentrl.runs.launch import run_train

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


# ---------------------------------------------------------------------------------------------
# plots, grouping and status: synthetic training runs
# ---------------------------------------------------------------------------------------------
def _msgrpo_run(
    run_dir: Path,
    seed: int,
    overrides: list[str],
    iterations: int = 20,
    final: float = 0.75,
    status: dict | None = None,
    with_eval: bool = True,
) -> Path:
    curve = []
    for i in range(1, iterations + 1):
        row = {"iteration": i, "time_s": 20.0 * i, "loss": 0.5, "train/success_rate": i / iterations * final}
        row["train/mean_return"] = 2 * row["train/success_rate"] - 1
        if i % 5 == 0 and i < iterations:
            row["eval/success_rate"], row["eval/mean_return"] = i / iterations * final, 0.1 * i
        curve.append(row)
    eval_data = _eval(
        final,
        2 * final - 1,
        iterations=iterations,
        train_time_s=20.0 * iterations,
        before={"success_rate": 0.05, "mean_return": -0.9},
    )
    run = make_run(
        run_dir,
        _config("train", "frozenlake", "llm", seed, algo="msgrpo"),
        ["task=train", "algo=msgrpo", f"seed={seed}", *overrides],
        eval_data if with_eval else None,
        curve,
    )
    if status is not None:
        (run / "status.json").write_text(json.dumps(status))
    return run


def _dqn_run(run_dir: Path, seed: int) -> Path:
    curve = [
        {
            "iteration": s,
            "time_s": s / 1000,
            "loss": 0.1,
            "success_rate": s / 100000,
            "mean_return": s / 50000 - 1,
        }
        for s in range(5000, 100001, 5000)
    ]
    return make_run(
        run_dir,
        _config("train", "frozenlake", "random", seed, algo="dqn"),
        ["task=train", "algo=dqn", f"seed={seed}"],
        _eval(0.9, 0.8, total_timesteps=100000, train_time_s=100.0),
        curve,
    )


def _twelve_groups(root: Path) -> Path:
    """12 runs, each its own group, with long variants and bookkeeping keys."""
    for k in range(12):
        _msgrpo_run(
            root / f"run{k:02d}",
            0,
            [
                f"algo.learning_rate={k + 1}e-6",
                f"algo.group_size={8 * (k % 3 + 1)}",
                "algo.aaw.enabled=false" if k % 2 else "algo.aaw.fraction=0.5",
                "resume=/somewhere/else",
                "hydra.run.dir=/somewhere/else",
            ],
            final=(k + 1) / 12,
        )
    return root


def _load(root: Path) -> list:
    from agentrl.report import load_run

    return [load_run(d) for d in find_runs([root])]


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _visible_texts(fig, renderer) -> list:
    """Every drawn tick label (ticks inside the view only), axis label and title of the figure."""
    texts = []
    for ax in fig.axes:
        for axis, (lo, hi) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
            for tick, loc in zip(axis.get_major_ticks(), axis.get_majorticklocs(), strict=False):
                if tick.label1.get_visible() and tick.label1.get_text() and lo <= loc <= hi:
                    texts.append(tick.label1)
            if axis.label.get_text():
                texts.append(axis.label)
        if ax.title.get_text():
            texts.append(ax.title)
    return texts


def _assert_no_overlap(fig) -> None:
    renderer = _drawn(fig)
    figure_box = fig.bbox
    texts = _visible_texts(fig, renderer)
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i, a in enumerate(boxes):
        assert a.x0 >= figure_box.x0 - 1 and a.x1 <= figure_box.x1 + 1, f"{texts[i].get_text()!r} is cut off"
        assert a.y0 >= figure_box.y0 - 1 and a.y1 <= figure_box.y1 + 1, f"{texts[i].get_text()!r} is cut off"
        for j in range(i + 1, len(boxes)):
            assert not a.overlaps(boxes[j]), f"{texts[i].get_text()!r} overlaps {texts[j].get_text()!r}"


def _assert_legend_outside(fig) -> None:
    renderer = _drawn(fig)
    assert fig.legends, "no figure legend"
    for ax in fig.axes:
        assert not ax.get_legend(), "a legend inside an axes"
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "the legend covers a data area"


def test_twelve_groups_no_label_overlaps_and_legend_outside(tmp_path):
    import matplotlib.pyplot as plt

    from agentrl.report import figure_final_eval, figure_learning_curves, summarise_groups

    runs = _load(_twelve_groups(tmp_path / "runs"))
    groups = summarise_groups(runs)
    assert len(groups) == 12
    bars = figure_final_eval(groups)
    curves = figure_learning_curves(runs, "frozenlake")
    try:
        _assert_no_overlap(bars)
        _assert_no_overlap(curves)
        _assert_legend_outside(bars)
        _assert_legend_outside(curves)
        assert_title_clear(bars)
        assert_title_clear(curves)
        names = [t.get_text() for t in bars.axes[0].get_yticklabels()]
        assert len(names) == 12 and all("(1 seed)" in n for n in names)
        assert "resume" not in " ".join(names) and "hydra" not in " ".join(names)
        # no two legend entries look alike: colour, line style and marker differ somewhere
        handles = [h for h in curves.legends[0].legend_handles if h.get_label().startswith("algo.")]
        looks = {(tuple(h.get_color()), h.get_linestyle(), h.get_marker()) for h in handles}
        assert len(handles) == 12 and len(looks) == 12
    finally:
        plt.close(bars)
        plt.close(curves)


@pytest.mark.parametrize("n_runs", [1, 4])
def test_small_reports_no_label_overlaps(tmp_path, n_runs):
    import matplotlib.pyplot as plt

    from agentrl.report import figure_final_eval, figure_learning_curves, summarise_groups

    for k in range(n_runs):
        _msgrpo_run(tmp_path / f"run{k}", k % 2, [f"algo.learning_rate={k // 2 + 1}e-5"])
    runs = _load(tmp_path)
    for fig in (figure_final_eval(summarise_groups(runs)), figure_learning_curves(runs, "frozenlake")):
        try:
            _assert_no_overlap(fig)
            _assert_legend_outside(fig)
            assert_title_clear(fig)
        finally:
            plt.close(fig)


def test_plot_styles_are_distinct():
    from agentrl.report import plot_style

    styles = [plot_style(i) for i in range(40)]
    assert len({(s.colour, s.linestyle) for s in styles}) == 40
    assert len({(s.colour, s.marker) for s in styles}) == 40
    assert len({(s.colour, s.hatch) for s in styles}) == 40
    assert not {s.marker for s in styles} & {"o", "*"}  # reserved for the before / final evals


def test_dqn_and_llm_curves_are_on_different_axes(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from agentrl.report import _style_keys, figure_learning_curves, style_map

    for seed in (0, 1):
        _dqn_run(tmp_path / f"dqn{seed}", seed)
        _msgrpo_run(tmp_path / f"msgrpo{seed}", seed, [])
    runs = _load(tmp_path)
    styles = style_map(_style_keys(runs))
    colour = {key[0].split(" / ")[0]: to_rgba(style.colour) for key, style in styles.items()}  # algo / model
    fig = figure_learning_curves(runs, "frozenlake", styles)
    try:
        families_per_axes = []
        for ax in fig.axes:
            found = {
                name for name, c in colour.items() for line in ax.lines if to_rgba(line.get_color()) == c
            }
            families_per_axes.append(found)
            assert len(found) <= 1, f"{ax.get_title()} / {ax.get_xlabel()}: {found} share an x-axis"
            xmax = ax.get_xlim()[1]
            if found == {"msgrpo"}:
                assert xmax < 100  # iterations (or minutes), not squashed against 100k env steps
        assert {"dqn"} in families_per_axes and {"msgrpo"} in families_per_axes
        bottom = {ax.get_xlabel() for ax in fig.axes if ax.get_xlabel()}
        assert {"env steps", "iteration"} <= bottom and any("wall-clock" in x for x in bottom)
    finally:
        plt.close(fig)


def test_greedy_eval_curve_marks_before_and_final(tmp_path):
    import matplotlib.pyplot as plt

    from agentrl.report import figure_learning_curves

    _msgrpo_run(tmp_path / "run", 0, [], iterations=20, final=0.75)
    runs = _load(tmp_path)
    fig = figure_learning_curves(runs, "frozenlake")
    try:
        eval_axes = [ax for ax in fig.axes if "greedy eval success" in ax.get_ylabel()]
        assert len(eval_axes) == 1  # the iteration column carries the y label
        ax = eval_axes[0]
        curve = next(line for line in ax.lines if len(line.get_xdata()) > 2)
        # before (x = 0), the periodic eval/ rows at 5, 10, 15, final at the last iteration
        assert list(curve.get_xdata()) == [0, 5, 10, 15, 20]
        assert list(curve.get_ydata()) == pytest.approx([0.05, 0.1875, 0.375, 0.5625, 0.75])
        marks = {line.get_marker(): (line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines}
        assert marks["o"] == (0, 0.05) and marks["*"] == (20, 0.75)
    finally:
        plt.close(fig)


def test_curves_show_invalid_answers_and_mark_whole_iterations(tmp_path):
    """Training and greedy-eval invalid-answer rates get their own rows; the mean over seeds of short runs
    is marked at the iterations the runs logged, and the iteration axis has no fractional ticks."""
    import matplotlib.pyplot as plt

    from agentrl.report import figure_learning_curves

    for seed in (0, 1):
        run = _msgrpo_run(tmp_path / f"run{seed}", seed, [], iterations=2, final=0.5)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row["train/invalid_rate"] = 0.5 / row["iteration"] + 0.1 * seed
        rows[0].update({"eval/success_rate": 0.0, "eval/invalid_rate": 0.25})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig = figure_learning_curves(_load(tmp_path), "frozenlake")
    try:
        labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
        assert any(label.startswith("training invalid-answer rate") for label in labels), labels
        assert any(label.startswith("greedy eval invalid-answer rate") for label in labels), labels
        by_iteration = [ax for ax in fig.axes if ax.get_xlabel() == "iteration"]
        column = [ax for ax in fig.axes if ax.get_subplotspec().colspan.start == 0]
        assert by_iteration and len(column) == 6
        invalid = next(ax for ax in column if ax.get_ylabel().startswith("training invalid"))
        mean = max(invalid.lines, key=lambda line: line.get_linewidth())  # the mean over the 2 seeds
        assert list(mean.get_xdata()) == [1, 2]
        assert list(mean.get_ydata()) == pytest.approx([0.55, 0.3])
        for ax in column:
            marked = [
                x
                for line in ax.lines
                if line.get_marker() not in (None, "None", "")
                for x in line.get_xdata()
            ]
            assert all(float(x).is_integer() for x in marked), (ax.get_ylabel(), marked)
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert all(float(t).is_integer() for t in ticks), ticks
    finally:
        plt.close(fig)


def test_a_seeds_runs_count_by_their_eval_episodes(tmp_path):
    """Two evals of one seed, 100 and 10 episodes: the seed's value weighs each run by its episodes
    (through `agentrl report`)."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    for name, episodes, ret in (("long", 100, 11.25), ("short", 10, 11.617)):
        data = {**_eval(0.5, ret), "episodes": episodes}
        make_run(tmp_path / "runs" / name, _config("eval", "snake", "planner", 0), ["agent=planner"], data)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    (row,) = _csv(tmp_path / "rep" / "report_groups.csv")
    assert (row["seeds"], row["runs"]) == ("1", "2")
    assert float(row["return_mean"]) == pytest.approx((11.25 * 100 + 11.617 * 10) / 110)


def test_variants_ignore_bookkeeping_overrides(tmp_path):
    from agentrl.report import BOOKKEEPING_KEYS, is_bookkeeping

    _msgrpo_run(tmp_path / "a", 0, ["algo.learning_rate=1e-5", "algo.eval_every=5"])
    _msgrpo_run(
        tmp_path / "b",
        1,
        [
            "algo.learning_rate=1e-5",
            "resume=/runs/b",
            "hydra.run.dir=/runs/b",
            "hydra/launcher=joblib",
            "+from_run=/runs/a",
            "algo.time_limit_minutes=30",
            "algo.torch_threads=2",
            "algo.checkpoint_every=10",
        ],
    )
    _msgrpo_run(tmp_path / "c", 2, ["algo.learning_rate=3e-5"])
    report = build_report([tmp_path], out_dir=tmp_path / "rep")
    variants = {g.variant: g for g in report.groups}
    assert set(variants) == {"algo.learning_rate=1e-5", "algo.learning_rate=3e-5"}
    assert variants["algo.learning_rate=1e-5"].seeds == 2
    b = next(r for r in report.runs if r.path.name == "b")
    assert "resume=/runs/b" in b.other_overrides and "hydra/launcher=joblib" in b.other_overrides
    row = next(r for r in _csv(tmp_path / "rep" / "report.csv") if r["run"].endswith("b"))
    assert row["overrides"] == "algo.learning_rate=1e-5" and "resume=/runs/b" in row["other_overrides"]
    assert {
        "resume",
        "from_run",
        "algo.eval_every",
        "algo.torch_threads",
        "algo.stop_at_success",
    } <= BOOKKEEPING_KEYS
    assert not is_bookkeeping("algo.learning_rate=1e-5") and not is_bookkeeping("+experiment=x")


def test_seeds_count_distinct_seeds(tmp_path):
    # seed 0 twice (finals 0.25 and 0.75 -> 0.5 for that seed), seed 1 once (1.0)
    for name, seed, final in (("a", 0, 0.25), ("b", 0, 0.75), ("c", 1, 1.0)):
        _msgrpo_run(tmp_path / name, seed, [], final=final)
    report = build_report([tmp_path], out_dir=tmp_path / "rep")
    (group,) = report.groups
    assert (group.seeds, len(group.runs)) == (2, 3)
    assert group.success == pytest.approx((0.75, 0.25))  # over the 2 seeds, not the 3 runs
    row = _csv(tmp_path / "rep" / "report_groups.csv")[0]
    assert (row["seeds"], row["runs"]) == ("2", "3")
    assert "| 2 (3 runs) | 0.750 ± 0.250 |" in (tmp_path / "rep" / "report.md").read_text()


def test_failed_and_interrupted_runs_are_separated(tmp_path):
    _msgrpo_run(tmp_path / "ok0", 0, [], final=0.5)
    _msgrpo_run(tmp_path / "ok1", 1, [], final=0.7)
    # a failed run that still left an eval.json behind must not enter the mean
    _msgrpo_run(tmp_path / "failed", 2, [], final=0.0, status={"status": "failed", "reason": "CUDA OOM"})
    _msgrpo_run(
        tmp_path / "stopped",
        3,
        [],
        iterations=7,
        final=0.0,
        with_eval=False,
        status={"status": "interrupted", "reason": "SIGTERM at iteration 7"},
    )
    _msgrpo_run(tmp_path / "live", 4, [], with_eval=False, status={"status": "running"})
    _msgrpo_run(tmp_path / "done", 5, [], final=0.9, status={"status": "complete"})
    console = Console(record=True, width=80)
    from agentrl.runs import rundir

    with rundir.claim(tmp_path / "live", resume=True):  # a live process holds the running run's lock
        report = build_report([tmp_path], out_dir=tmp_path / "rep", console=console)

    statuses = {r.path.name: r.status for r in report.runs}
    assert statuses == {
        "ok0": "complete",
        "ok1": "complete",
        "done": "complete",
        "failed": "failed",
        "stopped": "interrupted",
        "live": "running",
    }
    (group,) = report.groups
    assert sorted(r.path.name for r in group.runs) == ["done", "ok0", "ok1"]
    assert group.success[0] == pytest.approx(0.7)

    md = (tmp_path / "rep" / "report.md").read_text()
    assert "6 runs: 3 complete, 1 failed, 1 interrupted, 1 running." in md
    runs_section = md.split("## Runs")[1].split("## Failed and interrupted runs")[0]
    stopped_section = md.split("## Failed and interrupted runs")[1].split("## Running")[0]
    assert "rep" not in runs_section and "/failed" not in runs_section and "/stopped" not in runs_section
    assert "| failed |" in stopped_section and "| CUDA OOM |" in stopped_section
    assert (
        "| interrupted |" in stopped_section
        and "| 7 iterations | – | SIGTERM at iteration 7 |" in stopped_section
    )
    assert (
        "/live" not in stopped_section and "/live" in md.split("## Running, incomplete and corrupt runs")[1]
    )
    printed = console.export_text()
    assert "CUDA OOM" in printed and "interrupted" in printed

    # the learning curves give the interrupted and failed runs their own legend entries
    import matplotlib.pyplot as plt

    from agentrl.report import figure_learning_curves

    fig = figure_learning_curves(report.runs, "frozenlake")
    try:
        labels = [h.get_label() for h in fig.legends[0].legend_handles]
        assert any("[interrupted]" in x for x in labels) and any("[failed]" in x for x in labels)
        assert any("(3 seeds)" in x and "[" not in x for x in labels)
    finally:
        plt.close(fig)


def test_tictactoe_outcome_shares_are_rates_not_losses(tmp_path):
    """A real tic-tac-toe eval: the share of games lost is `loss_rate` in eval.json (as
    `mean_loss_rate`), in the CSV and in report.md; nothing env-specific is called a loss."""
    from agentrl.agents.baselines import RandomAgent
    from agentrl.envs import make_env
    from agentrl.evaluation import evaluate, write_eval
    from agentrl.report import env_metric_name

    run = make_run(tmp_path / "runs" / "ttt", _config("eval", "tictactoe", "random", 0), ["env=tictactoe"])
    metrics, episodes = evaluate(lambda: make_env("tictactoe"), RandomAgent(), list(range(8)))
    write_eval(run, metrics, episodes)
    source = json.loads((run / "eval.json").read_text())
    assert {"mean_win_rate", "mean_draw_rate", "mean_loss_rate", "mean_illegal_move_rate"} <= set(source)
    assert not {"mean_loss", "mean_win"} & set(source)

    report = build_report([tmp_path / "runs"], out_dir=tmp_path / "rep")
    row = _csv(tmp_path / "rep" / "report.csv")[0]
    assert float(row["loss_rate"]) == source["mean_loss_rate"]
    assert float(row["win_rate"]) + float(row["draw_rate"]) + float(row["loss_rate"]) == pytest.approx(1.0)
    assert not [c for c in row if "loss" in c and c != "loss_rate"]
    (group,) = report.groups
    assert group.env_metrics["loss_rate"][0] == pytest.approx(source["mean_loss_rate"])
    assert (
        "| group | draw_rate | illegal_move_rate | loss_rate | win_rate |"
        in (tmp_path / "rep" / "report.md").read_text()
    )
    # eval.json files that name the outcome shares without `_rate` read the same
    assert env_metric_name("mean_loss") == "loss_rate" and env_metric_name("mean_win") == "win_rate"
    assert env_metric_name("mean_regret") == "mean_regret" and env_metric_name("mean_return") is None


def test_printed_tables_fit_an_80_column_terminal(outputs, tmp_path):
    console = Console(record=True, width=80)
    report = build_report([outputs], out_dir=tmp_path / "rep", console=console)
    printed = console.export_text()
    tables, _, wrote = printed.partition("Wrote:\n")
    lines = tables.splitlines()
    assert max(len(line) for line in lines) <= 80
    # the written files: one whole path a line (soft wrap: the terminal wraps, a copy stays one line)
    assert wrote.split() == [str(p) for p in report.files]
    # numbers stay whole, one group per row, and the per-run table stays in report.md
    assert "0.250 ± 0.144" in printed and "0.625 ± 0.125" in printed
    assert any(line.lstrip().startswith("msgrpo / qwen2.5-3b") for line in lines)
    assert "Complete runs" not in printed and "report.md" in printed
    assert "corrupt" in printed and "incomplete" in printed


def test_printed_overrides_keep_their_brackets(tmp_path):
    _msgrpo_run(tmp_path / "runs" / "a", 0, ["algo.net_arch=[32,32]", "+agent.stop=[bold]"])
    console = Console(record=True, width=80)
    build_report([tmp_path / "runs"], out_dir=tmp_path / "rep", console=console)
    printed = console.export_text()
    assert "algo.net_arch=[32,32]" in printed and "+agent.stop=[bold]" in printed
