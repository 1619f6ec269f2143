"""`agentrl report --target`: the time-to-target table of an AAW on/off sweep (3 seeds each) equals
hand-computed means and stderrs over seeds; runs that never reach (or never stay at) the target are
censored at their full training time and marked; the CSVs, the markdown section, the printed table and
the overlay plot are written."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from agentrl.report import build_report, time_to_target
from agentrl.report.target import eval_points

ITERATIONS, EVERY = 40, 5
ON, OFF = "algo.aaw.enabled=true", "algo.aaw.enabled=false"
#: (variant, seed) -> (seconds per iteration, periodic evals at iterations 5, 10, ..., 35, final eval)
RUNS = {
    (ON, 0): (30.0, [0.2, 0.5, 0.9, 0.8, 1.0, 1.0, 1.0], 1.0),  # reaches at 15, dips, stays from 25
    (ON, 1): (24.0, [0.3, 0.95, 1.0, 1.0, 1.0, 1.0, 1.0], 1.0),  # reaches and stays at 10
    (ON, 2): (36.0, [0.1, 0.4, 0.6, 0.9, 0.9, 1.0, 1.0], 1.0),  # reaches and stays at 20
    (OFF, 0): (30.0, [0.0, 0.2, 0.4, 0.6, 0.92, 0.7, 0.95], 0.85),  # reaches at 25, final drops: never stays
    (OFF, 1): (27.0, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 0.5),  # never reaches
    (OFF, 2): (33.0, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9], 1.0),  # reaches and stays at 35
}


def _run(root: Path, variant: str, seed: int, status: dict | None = None, evals: list | None = None) -> Path:
    """A sweep job directory as `agentrl sweep experiment=frozenlake_learn seed=0,1,2
    algo.aaw.enabled=true,false` writes it."""
    per_iteration, default, final = RUNS[(variant, seed)]
    evals = evals or default
    run = root / f"{len(list(root.glob('*')))}_{variant.split('=')[1]}_seed={seed}"
    (run / ".hydra").mkdir(parents=True)
    cfg = {
        "task": "train",
        "seed": seed,
        "env": {"name": "frozenlake"},
        "agent": {"name": "llm"},
        "model": {"name": "smollm2-135m"},
        "algo": {"name": "msgrpo", "eval_every": EVERY, "aaw": {"enabled": variant == ON}},
    }
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    overrides = ["experiment=frozenlake_learn", f"seed={seed}", variant]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    rows = []
    for i in range(1, ITERATIONS + 1):
        row = {"iteration": i, "time_s": per_iteration * i, "loss": 0.1, "train/success_rate": i / ITERATIONS}
        if i % EVERY == 0 and i < ITERATIONS:  # PeriodicEval: every 5 iterations, not the last
            row["eval/success_rate"] = evals[i // EVERY - 1]
            row["eval/mean_return"] = 2 * row["eval/success_rate"] - 1
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    eval_data = {
        "episodes": 4,
        "success_rate": final,
        "mean_return": 2 * final - 1,
        "return_stderr": 0.0,
        "mean_length": 6.0,
        "invalid_rate": 0.0,
        "iterations": ITERATIONS,
        "train_time_s": per_iteration * ITERATIONS + 3.0,  # the final save: not part of the curve
        "before": {"success_rate": 0.0, "mean_return": -1.0},
    }
    (run / "eval.json").write_text(json.dumps(eval_data))
    if status is not None:
        (run / "status.json").write_text(json.dumps(status))
    return run


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "multirun" / "2026-11-30" / "12-00-00"
    root.mkdir(parents=True)
    for variant in (ON, OFF):
        for seed in (0, 1, 2):
            _run(root, variant, seed)
    return root


def _stat(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values)
    return float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(arr.size))


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


#: hand-computed: (minutes, iterations) per seed to reach / to stay; a censored run is at its full
#: training time (iterations x seconds per iteration) and its 40 iterations
EXPECTED = {
    ON: {
        "reach": ([15 * 30 / 60, 10 * 24 / 60, 20 * 36 / 60], [15, 10, 20], 3),
        "stay": ([25 * 30 / 60, 10 * 24 / 60, 20 * 36 / 60], [25, 10, 20], 3),
    },
    OFF: {
        "reach": ([25 * 30 / 60, 40 * 27 / 60, 35 * 33 / 60], [25, 40, 35], 2),
        "stay": ([40 * 30 / 60, 40 * 27 / 60, 35 * 33 / 60], [40, 40, 35], 1),
    },
}


def test_time_to_target_table_equals_hand_computed_values(sweep, tmp_path):
    # a failed run of the AAW-off variant that reached the target at once must not count
    _run(sweep, OFF, 1, status={"status": "failed", "reason": "OOM"}, evals=[1.0] * 7)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    console = Console(record=True, width=80)
    out = tmp_path / "rep"
    report = build_report([sweep], out_dir=out, console=console)

    table = report.target
    assert (table.metric, table.target) == ("eval/success_rate", 0.9)
    by_variant = {s.group.variant.split()[-1]: s for s in table.summaries}
    assert set(by_variant) == {ON, OFF}
    for variant, expected in EXPECTED.items():
        summary = by_variant[variant]
        assert (summary.seeds, summary.n_runs) == (3, 3)
        for which, (minutes, iterations, done) in expected.items():
            assert summary.count(which) == done, (variant, which)
            assert summary.stats[(which, "minutes")] == pytest.approx(_stat(minutes)), (variant, which)
            assert summary.stats[(which, "iterations")] == pytest.approx(_stat(iterations)), (variant, which)

    # the CSV per group holds the same numbers, the censored counts and the target
    rows = {r["variant"].split()[-1]: r for r in _csv(out / "report_target.csv")}
    off = rows[OFF]
    assert (off["metric"], float(off["target"]), off["seeds"], off["runs"]) == (
        "eval/success_rate",
        0.9,
        "3",
        "3",
    )
    assert (off["reached"], off["reach_censored"], off["stayed"], off["stay_censored"]) == (
        "2",
        "1",
        "1",
        "2",
    )
    assert float(off["reach_minutes_mean"]) == pytest.approx(_stat(EXPECTED[OFF]["reach"][0])[0])
    assert float(off["reach_iterations_stderr"]) == pytest.approx(_stat([25, 40, 35])[1])
    assert rows[ON]["reach_censored"] == "0" and float(rows[ON]["reach_iterations_mean"]) == 15.0
    # the CSV per run: the raw eval that reached it, blank where none did
    runs = {(r["variant"].split()[-1], r["seed"]): r for r in _csv(out / "report_target_runs.csv")}
    assert len(runs) == 6
    assert (runs[(ON, "0")]["reach_iteration"], float(runs[(ON, "0")]["reach_minutes"])) == ("15", 7.5)
    assert runs[(ON, "0")]["stay_iteration"] == "25" and runs[(ON, "0")]["evals"] == "9"  # before+7+final
    assert (runs[(OFF, "1")]["reached"], runs[(OFF, "1")]["reach_minutes"]) == ("0", "")
    assert float(runs[(OFF, "1")]["train_minutes"]) == 18.0 and runs[(OFF, "1")]["train_iterations"] == "40"
    assert (runs[(OFF, "0")]["reached"], runs[(OFF, "0")]["stayed"]) == ("1", "0")

    # report.md: the section, its caption and the exact cells (≥: a lower bound with censored runs)
    md = (out / "report.md").read_text()
    section = md.split("## Time to target: `eval/success_rate` ≥ 0.9")[1].split("\n## ")[0]
    assert "censored: counted at its full training time" in section
    on_m, on_i = _stat(EXPECTED[ON]["reach"][0]), _stat(EXPECTED[ON]["reach"][1])
    off_m, off_i = _stat(EXPECTED[OFF]["reach"][0]), _stat(EXPECTED[OFF]["reach"][1])
    on_sm, on_si = _stat(EXPECTED[ON]["stay"][0]), _stat(EXPECTED[ON]["stay"][1])
    off_sm, off_si = _stat(EXPECTED[OFF]["stay"][0]), _stat(EXPECTED[OFF]["stay"][1])
    assert (
        f"| frozenlake | msgrpo | smollm2-135m | experiment=frozenlake_learn {ON} | 3 | 3/3 "
        f"| {on_m[0]:.1f} ± {on_m[1]:.1f} | {on_i[0]:.1f} ± {on_i[1]:.1f} | 3/3 "
        f"| {on_sm[0]:.1f} ± {on_sm[1]:.1f} | {on_si[0]:.1f} ± {on_si[1]:.1f} |"
    ) in section, section
    assert (
        f"| frozenlake | msgrpo | smollm2-135m | experiment=frozenlake_learn {OFF} | 3 | 2/3 "
        f"| ≥ {off_m[0]:.1f} ± {off_m[1]:.1f} | ≥ {off_i[0]:.1f} ± {off_i[1]:.1f} | 1/3 "
        f"| ≥ {off_sm[0]:.1f} ± {off_sm[1]:.1f} | ≥ {off_si[0]:.1f} ± {off_si[1]:.1f} |"
    ) in section, section
    assert "![target_frozenlake](target_frozenlake.png)" in md

    # printed: fits 80 columns, says what ≥ means
    printed = console.export_text()
    tables = printed.partition("Wrote:\n")[0]  # the written paths follow, one whole path a line
    assert max(len(line) for line in tables.splitlines()) <= 80
    assert "time to eval/success_rate ≥ 0.9" in printed and "2/3" in printed
    assert f"≥ {off_m[0]:.1f} ± {off_m[1]:.1f}" in printed

    # the overlay plot
    png = out / "target_frozenlake.png"
    assert png in report.plots and (out / "report_target.csv") in report.files
    with Image.open(png) as img:
        img.verify()
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size[0] > 800 and img.size[1] > 400


def test_eval_points_and_other_targets(sweep):
    from agentrl.report import load_run, summarise_groups

    runs = [load_run(p) for p in sorted(sweep.iterdir())]
    first = next(r for r in runs if r.seed == 0 and r.variant.endswith(ON))
    points = eval_points(first)
    # before (iteration 0, 0 s), the 7 periodic rows, the final eval at the last iteration and time_s
    assert [(p.iteration, p.time_s, p.source) for p in (points[0], points[1], points[-1])] == [
        (0.0, 0.0, "before"),
        (5.0, 150.0, "periodic"),
        (40.0, 1200.0, "final"),
    ]
    assert [p.value for p in points] == [0.0, *RUNS[(ON, 0)][1], 1.0]

    groups = summarise_groups(runs)
    # a lower target: every run reaches it; the 0.5 eval of AAW-on seed 0 at iteration 10 counts
    low = {s.group.variant.split()[-1]: s for s in time_to_target(groups, 0.5).summaries}
    assert low[ON].stats[("reach", "iterations")] == pytest.approx(_stat([10, 10, 15]))
    assert low[OFF].count("reach") == 3 and low[OFF].cell("reach", "iterations") == "25.0 ± 2.9"  # 20, 30, 25
    # the return metric: eval/mean_return >= 0.8 is success >= 0.9 here; the before eval of return -1
    ret = {s.group.variant.split()[-1]: s for s in time_to_target(groups, 0.8, "eval/mean_return").summaries}
    assert ret[ON].stats[("reach", "iterations")] == pytest.approx(_stat([15, 10, 20]))
    assert ret[OFF].count("reach") == 2
    # a target met before training: 0 minutes
    zero = time_to_target(groups, 0.0).summaries[0]
    assert zero.stats[("reach", "minutes")][0] == 0.0 and zero.cell("reach", "minutes") == "0.0 ± 0.0"
    # runs without periodic evals have no time-to-target entry
    assert time_to_target(groups, 0.9, "eval/no_such_metric").summaries == []


def test_cli_target_options(sweep, tmp_path):
    from agentrl.cli import app

    out = tmp_path / "cli"
    result = CliRunner().invoke(
        app,
        ["report", str(sweep), "--out", str(out), "--target", "0.5", "--target-metric", "eval/success_rate"],
    )
    assert result.exit_code == 0, result.output
    row = _csv(out / "report_target.csv")[0]
    assert (float(row["target"]), row["reached"]) == (0.5, "3")
    assert "## Time to target: `eval/success_rate` ≥ 0.5" in (out / "report.md").read_text()
    assert (out / "target_frozenlake.png").is_file()


@pytest.mark.parametrize("metric,target", [("eval/success_rate", 0.9), ("eval/mean_return", 0.8)])
def test_overlay_plot_is_readable(sweep, metric, target):
    """One entry per group plus the target and the time-to-reach marks; labelled axes; the legend and
    the title clear of each other and of the data; no tick or axis label overlaps."""
    import matplotlib.pyplot as plt
    from test_report import _assert_legend_outside, _assert_no_overlap, _drawn

    from agentrl.report import figure_time_to_target, load_run, summarise_groups

    table = time_to_target(summarise_groups([load_run(p) for p in sorted(sweep.iterdir())]), target, metric)
    fig = figure_time_to_target(table, "frozenlake")
    try:
        _assert_no_overlap(fig)
        _assert_legend_outside(fig)
        renderer = _drawn(fig)
        assert not fig._suptitle.get_window_extent(renderer).overlaps(
            fig.legends[0].get_window_extent(renderer)
        )
        labels = [h.get_label() for h in fig.legends[0].legend_handles]
        assert any(x.startswith(OFF) and "reached 2/3: ≥ 16.6" in x for x in labels), labels
        assert any(x.startswith(ON) and "reached 3/3: 7.8 ± 2.3 min" in x for x in labels), labels
        assert f"target {target:g}" in labels
        left, right = fig.axes
        assert (
            left.get_xlabel() == "training wall-clock (minutes)"
            and right.get_xlabel() == "training iteration"
        )
        assert metric.removeprefix("eval/").replace("_", " ") in left.get_ylabel()
        for ax in (left, right):  # the dashed target line
            assert any(
                line.get_linestyle() == "--" and list(line.get_ydata()) == [target, target]
                for line in ax.lines
            )
    finally:
        plt.close(fig)
