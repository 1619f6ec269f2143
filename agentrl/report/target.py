"""Time to target: how long each group of training runs takes until its greedy held-out eval first
reaches a target (`agentrl report DIR --target 0.9 --target-metric eval/success_rate`).

The evals of a training run, in order: the before-training eval (eval.json `before`, at iteration 0 and
0 min), every periodic greedy eval in metrics.jsonl (rows holding the metric, written every
`algo.eval_every` iterations; the row's `iteration` and `time_s`) and the final eval (eval.json, at the
run's last iteration and last `time_s`) -- the same points as the greedy-eval curves of the learning
curve plots. Only runs with at least one periodic eval row count (a run without `eval/` rows has no
curve to read a time from).

- **reaches**: the first eval with value >= target;
- **stays**: the first eval from which every later eval, the final one included, is >= target.

Per group (the report's groups: complete runs sharing env, agent/algo, model and variant), minutes
(`time_s` / 60: training wall-clock, the periodic evals' own time included) and iterations are the mean
± standard error over distinct seeds. A run that never reached (never stayed at) the target is
**censored**: counted at its full training time and iterations, so a mean that includes such a run is a
lower bound, written `≥`; `reached` says how many runs reached it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.report.runs import (
    EVAL_RETURN_KEYS,
    EVAL_SUCCESS_KEYS,
    GroupSummary,
    RunRecord,
    _blank,
    _by_seed,
    _number,
    _seed_values,
    md_table,
    mean_stderr,
)

DEFAULT_TARGET = 0.9
DEFAULT_TARGET_METRIC = "eval/success_rate"
#: a value this close below the target counts as reaching it (0.9 written as 0.8999999999)
_TOLERANCE = 1e-9

TARGET_COLUMNS = [
    "env",
    "agent",
    "model",
    "variant",
    "metric",
    "target",
    "seeds",
    "runs",
    "reached",
    "reach_minutes_mean",
    "reach_minutes_stderr",
    "reach_iterations_mean",
    "reach_iterations_stderr",
    "reach_censored",
    "stayed",
    "stay_minutes_mean",
    "stay_minutes_stderr",
    "stay_iterations_mean",
    "stay_iterations_stderr",
    "stay_censored",
]
TARGET_RUN_COLUMNS = [
    "run",
    "env",
    "agent",
    "model",
    "variant",
    "seed",
    "metric",
    "target",
    "evals",
    "reached",
    "reach_minutes",
    "reach_iteration",
    "stayed",
    "stay_minutes",
    "stay_iteration",
    "train_minutes",
    "train_iterations",
]


def metric_keys(metric: str) -> tuple[tuple[str, ...], str]:
    """(metrics.jsonl keys tried in order, eval.json key) of a target metric: `eval/success_rate`,
    `eval/mean_return` (also written without the `eval/` prefix) or any other `eval/<key>` row key."""
    name = metric[len("eval/") :] if metric.startswith("eval/") else metric
    if name == "success_rate":
        return EVAL_SUCCESS_KEYS, name
    if name == "mean_return":
        return EVAL_RETURN_KEYS, name
    return (metric if metric.startswith("eval/") else f"eval/{name}",), name


@dataclass(frozen=True)
class EvalPoint:
    iteration: float
    time_s: float
    value: float
    source: str  # before | periodic | final


def eval_points(run: RunRecord, metric: str = DEFAULT_TARGET_METRIC) -> list[EvalPoint]:
    """A training run's greedy evals of `metric` in training order (see the module doc); empty when
    metrics.jsonl has no periodic eval row for it."""
    row_keys, json_key = metric_keys(metric)
    periodic: list[EvalPoint] = []
    for key in row_keys:
        for row in run.curve:
            it, t, v = (_number(row.get(k)) for k in ("iteration", "time_s", key))
            if it is not None and v is not None:
                periodic.append(EvalPoint(it, t if t is not None else math.nan, v, "periodic"))
        if periodic:
            break
    if not periodic:
        return []
    periodic.sort(key=lambda p: p.iteration)
    points = []
    before = run.before(json_key)
    if before is not None:
        points.append(EvalPoint(0.0, 0.0, before, "before"))
    points += periodic
    final = run.metric(json_key)
    end_it, end_t = _end(run)
    if final is not None and end_it is not None and end_it > periodic[-1].iteration:
        points.append(EvalPoint(end_it, end_t, final, "final"))
    return points


def _end(run: RunRecord) -> tuple[float | None, float]:
    """(iterations, seconds) the run trained: its progress and its last metrics.jsonl `time_s`
    (eval.json `train_time_s` when metrics.jsonl has none)."""
    times = [t for t in (_number(r.get("time_s")) for r in run.curve) if t is not None]
    seconds = max(times) if times else run.metric("train_time_s")
    return run.progress, (seconds if seconds is not None else math.nan)


@dataclass
class RunTarget:
    """One run's evals against the target."""

    run: RunRecord
    points: list[EvalPoint]
    reach: EvalPoint | None  # the first eval >= target
    stay: EvalPoint | None  # the first eval from which every later one is >= target
    end_iteration: float
    end_time_s: float

    def value(self, which: str, unit: str) -> float:
        """Minutes or iterations to reach / stay, censored at the run's end when it never did."""
        point = self.reach if which == "reach" else self.stay
        if unit == "minutes":
            return (point.time_s if point is not None else self.end_time_s) / 60.0
        return point.iteration if point is not None else self.end_iteration

    def row(self, metric: str, target: float) -> dict[str, Any]:
        r = self.run

        def at(point: EvalPoint | None, unit: str) -> Any:
            if point is None:
                return ""
            return _blank(round(point.time_s / 60.0, 4) if unit == "minutes" else _int(point.iteration))

        return {
            "run": str(r.path),
            "env": r.env,
            "agent": r.agent,
            "model": r.model,
            "variant": r.variant,
            "seed": "" if r.seed is None else r.seed,
            "metric": metric,
            "target": target,
            "evals": len(self.points),
            "reached": int(self.reach is not None),
            "reach_minutes": at(self.reach, "minutes"),
            "reach_iteration": at(self.reach, "iterations"),
            "stayed": int(self.stay is not None),
            "stay_minutes": at(self.stay, "minutes"),
            "stay_iteration": at(self.stay, "iterations"),
            "train_minutes": _blank(round(self.end_time_s / 60.0, 4)),
            "train_iterations": _int(self.end_iteration),
        }


def run_target(run: RunRecord, target: float, metric: str = DEFAULT_TARGET_METRIC) -> RunTarget | None:
    """The run's time to `target`, or None when it has no periodic eval of `metric`."""
    points = eval_points(run, metric)
    if not points:
        return None
    ok = [p.value >= target - _TOLERANCE for p in points]
    reach = next((p for p, good in zip(points, ok, strict=True) if good), None)
    stay = None
    for i in range(len(points) - 1, -1, -1):  # walk back while every eval from i on is >= target
        if not ok[i]:
            break
        stay = points[i]
    end_it, end_t = _end(run)
    end_it = end_it if end_it is not None else points[-1].iteration
    end_t = end_t if not math.isnan(end_t) else points[-1].time_s
    return RunTarget(run, points, reach, stay, end_it, end_t)


@dataclass
class TargetSummary:
    """Time to target of one group, mean ± stderr over distinct seeds (censored runs counted at their
    full training time)."""

    group: GroupSummary
    runs: list[RunTarget]
    stats: dict[tuple[str, str], tuple[float, float]]  # (reach|stay, minutes|iterations) -> (mean, stderr)

    @property
    def n_runs(self) -> int:
        return len(self.runs)

    @property
    def seeds(self) -> int:
        return len(_by_seed([t.run for t in self.runs]))

    def count(self, which: str) -> int:
        return sum((t.reach if which == "reach" else t.stay) is not None for t in self.runs)

    def censored(self, which: str) -> int:
        return self.n_runs - self.count(which)

    def cell(self, which: str, unit: str) -> str:
        """`12.3 ± 1.2`, or `≥ 22.7 ± 4.1` when a run never got there (a lower bound)."""
        mean, err = self.stats[(which, unit)]
        if math.isnan(mean):
            return "–"
        digits = 1 if unit == "minutes" or mean < 1000 else 0
        text = f"{mean:.{digits}f}" + ("" if math.isnan(err) else f" ± {err:.{digits}f}")
        return ("≥ " if self.censored(which) else "") + text

    def reached_text(self, which: str = "reach") -> str:
        return f"{self.count(which)}/{self.n_runs}"

    def row(self, metric: str, target: float) -> dict[str, Any]:
        g = self.group
        row: dict[str, Any] = {
            "env": g.env,
            "agent": g.agent,
            "model": g.model,
            "variant": g.variant,
            "metric": metric,
            "target": target,
            "seeds": self.seeds,
            "runs": self.n_runs,
        }
        for which, done in (("reach", "reached"), ("stay", "stayed")):
            row[done] = self.count(which)
            for unit in ("minutes", "iterations"):
                mean, err = self.stats[(which, unit)]
                row[f"{which}_{unit}_mean"], row[f"{which}_{unit}_stderr"] = _blank(mean), _blank(err)
            row[f"{which}_censored"] = self.censored(which)
        return row


@dataclass
class TargetTable:
    metric: str
    target: float
    summaries: list[TargetSummary]

    @property
    def title(self) -> str:
        return f"`{self.metric}` ≥ {self.target:g}"


def time_to_target(
    groups: Sequence[GroupSummary], target: float = DEFAULT_TARGET, metric: str = DEFAULT_TARGET_METRIC
) -> TargetTable:
    """Time to `target` for every group of training runs with periodic evals of `metric`."""
    summaries = []
    for group in groups:
        runs = [t for t in (run_target(r, target, metric) for r in group.runs if r.is_training) if t]
        if not runs:
            continue
        summaries.append(TargetSummary(group, runs, _stats(runs)))
    return TargetTable(metric, target, summaries)


def _stats(runs: Sequence[RunTarget]) -> dict[tuple[str, str], tuple[float, float]]:
    """Mean ± stderr over distinct seeds (runs repeating a seed averaged first) of each run's censored
    minutes and iterations to reach and to stay."""
    by_run = {id(t.run): t for t in runs}
    records = [t.run for t in runs]
    return {
        (which, unit): mean_stderr(
            _seed_values(records, lambda r, w=which, u=unit: by_run[id(r)].value(w, u))
        )
        for which in ("reach", "stay")
        for unit in ("minutes", "iterations")
    }


def _int(value: float | None) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return int(value) if float(value).is_integer() else value


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------
TARGET_HEADERS = [
    "env",
    "agent/algo",
    "model",
    "variant",
    "seeds",
    "reached",
    "minutes to reach",
    "iterations to reach",
    "stays",
    "minutes to stay",
    "iterations to stay",
]


def target_caption(table: TargetTable) -> str:
    return (
        f"Time until the greedy held-out eval first reaches {table.title} (reached) and until it stays "
        "there (the first eval from which every later eval, the final one included, is at or above the "
        "target). Evals: before training (iteration 0, 0 min), the periodic evals in metrics.jsonl (every "
        "`algo.eval_every` iterations), the final eval; runs without periodic evals are left out. Minutes: "
        "metrics.jsonl `time_s` (training wall-clock, periodic evals included). Mean ± stderr over seeds; "
        "**a run that never reached (stayed at) the target is censored: counted at its full training time "
        "and iterations**, so a mean marked ≥ includes such runs and is a lower bound. "
        "reached / stays: runs that did / runs."
    )


def target_rows(table: TargetTable) -> list[list[str]]:
    return [
        [
            s.group.env,
            s.group.agent,
            s.group.model,
            s.group.variant,
            str(s.seeds) if s.seeds == s.n_runs else f"{s.seeds} ({s.n_runs} runs)",
            s.reached_text("reach"),
            s.cell("reach", "minutes"),
            s.cell("reach", "iterations"),
            s.reached_text("stay"),
            s.cell("stay", "minutes"),
            s.cell("stay", "iterations"),
        ]
        for s in table.summaries
    ]


def target_markdown(table: TargetTable | None) -> list[str]:
    if table is None or not table.summaries:
        return []
    return [
        f"## Time to target: {table.title}",
        "",
        target_caption(table),
        "",
        md_table(TARGET_HEADERS, target_rows(table)),
        "",
    ]


def print_target(table: TargetTable | None, console: Any) -> None:
    """One compact table per env (fits 80 columns: rows named by what differs between the groups, the
    shared part said once; the minutes and iterations to stay only on a wide console; all of it in
    report.md and report_target.csv)."""
    if table is None or not table.summaries:
        return
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from agentrl.report.plots import _Labeller

    wide = console.width >= 140
    for env in sorted({s.group.env for s in table.summaries}):
        members = [s for s in table.summaries if s.group.env == env]
        keys = [(s.group.head, "-", s.group.variant, "") for s in members]
        labeller = _Labeller.of(keys)
        out = Table(
            title=escape(f"{env}: time to {table.metric} ≥ {table.target:g}, mean ± stderr over seeds"),
            caption=escape(
                (f"all rows: {labeller.common}. " if labeller.common else "")
                + "≥: a lower bound, runs that never got there counted at their full training time."
            ),
            title_justify="left",
            caption_justify="left",
            box=box.SIMPLE,
            pad_edge=False,
        )
        out.add_column("group", overflow="fold", ratio=1, min_width=12)
        headers = ["reached", "minutes", "iterations", "stays"]
        headers += ["min to stay", "iter. to stay"] if wide else []
        for h in headers:
            out.add_column(h, justify="right", no_wrap=True)
        for s, key in zip(members, keys, strict=True):
            cells = [
                escape(labeller(key, width=60, max_lines=6)),
                s.reached_text("reach"),
                s.cell("reach", "minutes"),
                s.cell("reach", "iterations"),
                s.reached_text("stay"),
            ]
            cells += [s.cell("stay", "minutes"), s.cell("stay", "iterations")] if wide else []
            out.add_row(*cells)
        console.print(out)


def write_target_csvs(table: TargetTable, out_dir: Path) -> list[Path]:
    """`report_target.csv` (one row per group) and `report_target_runs.csv` (one row per run)."""
    from agentrl.report.runs import write_csv

    if not table.summaries:
        return []
    groups_path, runs_path = out_dir / "report_target.csv", out_dir / "report_target_runs.csv"
    write_csv(groups_path, TARGET_COLUMNS, (s.row(table.metric, table.target) for s in table.summaries))
    write_csv(
        runs_path,
        TARGET_RUN_COLUMNS,
        (t.row(table.metric, table.target) for s in table.summaries for t in s.runs),
    )
    return [groups_path, runs_path]


# ---------------------------------------------------------------------------------------------
# plot
# ---------------------------------------------------------------------------------------------
def figure_time_to_target(table: TargetTable, env: str, styles: dict[Any, Any] | None = None) -> Any:
    """The greedy eval of `table.metric` against training minutes (left) and iterations (right), one
    entry per group: thin lines per seed, the mean ± stderr band over seeds, the target dashed, and each
    group's mean time to reach it (± stderr) as a triangle on the target line (hollow: a lower bound,
    some runs never reached it). None when the env has no group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    from agentrl.report.plots import _add_legend, _draw_group, _Labeller, _PlotGroup, plot_style

    summaries = [s for s in table.summaries if s.group.env == env]
    if not summaries:
        return None
    keys = [(s.group.head, "-", s.group.variant, "") for s in summaries]
    styles = styles or {}
    labeller = _Labeller.of(keys)
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6), sharey=True, layout="constrained")
    success = table.metric.endswith("success_rate")
    handles = []
    for i, (s, key) in enumerate(zip(summaries, keys, strict=True)):
        style = styles.get(key) or plot_style(i)
        label = labeller(key) + f" ({s.seeds} seed{'s' if s.seeds != 1 else ''})"
        label += f"\nreached {s.reached_text()}: {s.cell('reach', 'minutes')} min"
        group = _PlotGroup(key, [t.run for t in s.runs], style, label)
        for ax, unit, scale in ((axes[0], "minutes", 60.0), (axes[1], "iterations", 1.0)):
            curves = [
                (
                    np.asarray([p.time_s if unit == "minutes" else p.iteration for p in t.points]),
                    np.asarray([p.value for p in t.points]),
                )
                for t in s.runs
            ]
            curves = [(xs, ys) for xs, ys in curves if not np.isnan(xs).any()]
            _draw_group(ax, group, curves, scale)
            mean, err = s.stats[("reach", unit)]
            if not math.isnan(mean):
                ax.errorbar(
                    [mean],
                    [table.target],
                    xerr=None if math.isnan(err) else [[err], [err]],
                    fmt="v",
                    markersize=9,
                    color=style.colour,
                    markerfacecolor="white" if s.censored("reach") else style.colour,
                    markeredgewidth=1.6,
                    capsize=4,
                    zorder=6,
                )
        handles.append(
            Line2D([], [], color=style.colour, linestyle=style.linestyle, marker=style.marker, label=label)
        )
    handles.append(Line2D([], [], color="black", linestyle="--", lw=1.2, label=f"target {table.target:g}"))
    handles.append(
        Line2D(
            [],
            [],
            color="0.3",
            marker="v",
            linestyle="none",
            markersize=8,
            label="mean time to reach ± stderr",
        )
    )
    handles.append(
        Line2D(
            [],
            [],
            color="0.3",
            marker="v",
            markerfacecolor="white",
            markeredgewidth=1.6,
            linestyle="none",
            markersize=8,
            label="hollow: lower bound (runs that\nnever reached it counted at\ntheir full training time)",
        )
    )
    name = table.metric
    for ax, xlabel in ((axes[0], "training wall-clock (minutes)"), (axes[1], "training iteration")):
        ax.axhline(table.target, color="black", linestyle="--", lw=1.2, zorder=4)
        ax.set_xlabel(xlabel, fontsize=10)
        ax.set_xlim(left=0)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, min_n_ticks=3, integer=ax is axes[1]))
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=9)
        if success:
            ax.set_ylim(-0.04, 1.04)
    axes[0].set_ylabel(
        f"greedy eval {name.removeprefix('eval/').replace('_', ' ')}\n(held-out seeds)", fontsize=10
    )
    axes[0].set_title("by wall-clock", fontsize=10)
    axes[1].set_title("by iteration", fontsize=10)
    title = f"Time to target: {env}, {name} ≥ {table.target:g}\nthin lines: seeds; thick: mean, band: ± stderr over seeds"
    title += f"\nall entries: {textwrap.shorten(labeller.common, 90)}" if labeller.common else ""
    _add_legend(fig, handles, fontsize=9, title=title)
    return fig


def plot_time_to_target(
    table: TargetTable, out_dir: Path, styles: dict[Any, Any] | None = None
) -> list[Path]:
    """`target_<env>.png` per env with a time-to-target table (see `figure_time_to_target`)."""
    from agentrl.report.plots import _save, _slug

    written = []
    for env in sorted({s.group.env for s in table.summaries}):
        fig = figure_time_to_target(table, env, styles)
        if fig is not None:
            written.append(_save(fig, out_dir / f"target_{_slug(env)}.png"))
    return written
