"""Aggregate run directories into tables (markdown, CSV, rich) and PNG plots.

A run directory is any directory holding `.hydra/config.yaml` (single runs and the job directories of
a multirun sweep alike). What is read from each run:

- `.hydra/config.yaml` -> env, agent or algo, model, seed; `.hydra/overrides.yaml` -> key overrides;
- `status.json` -> `running` | `complete` | `failed` | `interrupted` and a `reason`;
- `eval.json` -> final metrics (success_rate, mean_return, return_stderr, mean_length, invalid_rate,
  episodes, train_time_s; a `before` sub-dict for LLM training; env-specific `mean_<key>` means);
- `metrics.jsonl` -> learning curves (iteration, time_s, training and periodic greedy-eval metrics).

Other tables: `--table paper` (`paper.py`: env × method, zero-shot vs trained, transfer) and
`--table learning` (`learning.py`: one row per training run, before and after, answer format, command).
An eval of a trained run's model (from_run=, a DQN's agent.path=) is named by that run
(`runs.py:_describe_trained_model`).

Time to target (`target.py`): per group of training runs, the minutes and iterations until the greedy
eval first reaches a target (default `eval/success_rate` >= 0.9) and until it stays there, mean ± stderr
over seeds; runs that never got there are censored at their full training time.

Run status: `complete` (eval.json, and status.json absent or `complete`), `failed` / `interrupted` /
`running` (as status.json says), `incomplete` (no eval.json and no status.json saying otherwise) or
`corrupt` (config or eval file unreadable). Only complete runs are aggregated; every other run is
listed apart with its reason and never stops the report.

Aggregates: complete runs that share (env, agent/algo, model) and the same variant form a group,
reported as mean ± standard error across distinct seeds (runs that repeat a seed are averaged into
that seed first, each weighted by its eval episodes; stderr = sample std / sqrt(n seeds)). A variant
is the run's overrides minus the table columns and the bookkeeping keys (`BOOKKEEPING_KEYS`: how a run
was executed, logged or resumed, not what it computes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import RunDirError
from agentrl.report.diagnostics import plot_decision_curves
from agentrl.report.plots import (
    _style_keys,
    figure_final_eval,
    figure_learning_curves,
    plot_final_eval,
    plot_learning_curves,
    plot_style,
    style_map,
)
from agentrl.report.runs import (
    BOOKKEEPING_KEYS,
    COMPLETE,
    CORRUPT,
    GROUP_COLUMNS,
    RUN_COLUMNS,
    GroupSummary,
    Report,
    RunRecord,
    _short_label,
    env_metric_name,
    find_runs,
    is_bookkeeping,
    load_run,
    mean_stderr,
    summarise_groups,
    write_csv,
)
from agentrl.report.tables import print_report, render_markdown
from agentrl.report.target import (
    DEFAULT_TARGET,
    DEFAULT_TARGET_METRIC,
    TargetTable,
    figure_time_to_target,
    plot_time_to_target,
    time_to_target,
    write_target_csvs,
)

log = logging.getLogger(__name__)


def build_report(
    paths: Sequence[Path],
    out_dir: Path | None = None,
    console: Any = None,
    target: float = DEFAULT_TARGET,
    target_metric: str = DEFAULT_TARGET_METRIC,
) -> Report:
    """Find every run under `paths`, write report.md, report.csv (one row per run),
    report_groups.csv (aggregates), for training runs with periodic evals the time to `target` of
    `target_metric` (report_target.csv per group, report_target_runs.csv per run, target_<env>.png)
    and PNG plots into `out_dir` (default: the first path), and print the tables to `console` (a rich
    Console) when given. Raises RunDirError when a path is missing or no run is found."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise RunDirError("report: give at least one directory")
    run_dirs = find_runs(paths)
    if not run_dirs:
        raise RunDirError(
            f"report: no runs (directories with .hydra/config.yaml) under {', '.join(map(str, paths))}"
        )
    runs = [load_run(d) for d in run_dirs]
    for r in runs:
        r.label = _short_label(r.path, paths)
    for r in runs:
        if r.status != COMPLETE:
            log.warning("run %s is %s: %s", r.path, r.status, r.error)
    out_dir = Path(out_dir) if out_dir is not None else paths[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(runs=runs, groups=summarise_groups(runs), out_dir=out_dir)

    names = sorted({n for r in runs for n in r.env_metrics})
    csv_path = out_dir / "report.csv"
    write_csv(csv_path, RUN_COLUMNS + names, (r.row(names) for r in runs))
    groups_path = out_dir / "report_groups.csv"
    group_columns = GROUP_COLUMNS + [f"{n}_{s}" for n in names for s in ("mean", "stderr")]
    write_csv(groups_path, group_columns, (g.row(names) for g in report.groups))
    report.target = time_to_target(report.groups, target, target_metric)
    if not report.target.summaries and any(r.is_training and r.curve for g in report.groups for r in g.runs):
        log.warning(
            "report: no time-to-target table: no complete training run has periodic %s rows in "
            "metrics.jsonl (algo.eval_every)",
            target_metric,
        )
    target_csvs = write_target_csvs(report.target, out_dir)
    try:
        styles = style_map(_style_keys([r for r in runs if r.status != CORRUPT]))
        plots = plot_learning_curves(runs, out_dir, styles)
        bar = plot_final_eval(report.groups, out_dir, styles)
        plots += [bar] if bar else []
        plots += plot_decision_curves(report.groups, out_dir, styles)
        plots += plot_time_to_target(report.target, out_dir, styles)
    except Exception as exc:  # noqa: BLE001 - plots must never cost the tables
        log.error("report: plotting failed: %s", exc)
        plots = []
    report.files = [out_dir / "report.md", csv_path, groups_path, *target_csvs, *plots]
    (out_dir / "report.md").write_text(render_markdown(report))
    if console is not None:
        print_report(report, console)
    return report


__all__ = [
    "BOOKKEEPING_KEYS",
    "DEFAULT_TARGET",
    "DEFAULT_TARGET_METRIC",
    "TargetTable",
    "GroupSummary",
    "Report",
    "RunRecord",
    "build_report",
    "env_metric_name",
    "figure_final_eval",
    "figure_learning_curves",
    "figure_time_to_target",
    "find_runs",
    "is_bookkeeping",
    "load_run",
    "mean_stderr",
    "plot_final_eval",
    "plot_learning_curves",
    "plot_time_to_target",
    "plot_style",
    "style_map",
    "print_report",
    "render_markdown",
    "summarise_groups",
    "time_to_target",
]
