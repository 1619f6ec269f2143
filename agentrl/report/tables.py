"""Reports as tables: markdown, CSV and the rich table printed to the terminal."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from agentrl.report.diagnostics import diagnostics_markdown, print_diagnostics
from agentrl.report.layout import print_fitted, print_paths
from agentrl.report.runs import (
    COMPLETE,
    CORRUPT,
    FAILED,
    INCOMPLETE,
    INTERRUPTED,
    KILLED,
    RUNNING,
    STATUSES,
    GroupSummary,
    Report,
    RunRecord,
    md_table,
)
from agentrl.report.target import print_target, target_markdown

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------------------------
def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _pm(mean: float | None, stderr: float | None, digits: int = 3) -> str:
    if mean is None or math.isnan(mean):
        return "–"
    if stderr is None or math.isnan(stderr):
        return _fmt(mean, digits)
    return f"{mean:.{digits}f} ± {stderr:.{digits}f}"


def _duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "–"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _agent_cell(agent: str, marker: str) -> str:
    """The agent/algo column: `dqn [from_run eval]` for an eval of a trained run's model."""
    return f"{agent} [{marker}]" if marker else agent


def _seeds_cell(group: GroupSummary) -> str:
    n_runs = len(group.runs)
    return str(group.seeds) if n_runs == group.seeds else f"{group.seeds} ({n_runs} runs)"


RUN_HEADERS = [
    "run",
    "env",
    "agent/algo",
    "model",
    "seed",
    "overrides",
    "success",
    "return ± stderr",
    "length",
    "invalid",
    "untagged",
    "train time",
]
OTHER_RUN_HEADERS = [
    "run",
    "status",
    "env",
    "agent/algo",
    "model",
    "seed",
    "overrides",
    "reached",
    "success",
    "reason",
]
GROUP_HEADERS = [
    "env",
    "agent/algo",
    "model",
    "variant",
    "seeds",
    "success",
    "return",
    "length",
    "invalid",
    "untagged",
    "train time",
]


def run_table_rows(runs: Sequence[RunRecord]) -> list[list[str]]:
    return [
        [
            r.label,
            r.env,
            _agent_cell(r.agent, r.marker),
            r.model,
            "" if r.seed is None else str(r.seed),
            r.variant,
            _fmt(r.metric("success_rate")),
            _pm(r.metric("mean_return"), r.metric("return_stderr")),
            _fmt(r.metric("mean_length"), 1),
            _fmt(r.metric("invalid_rate")),
            _fmt(r.metric("untagged_rate")),
            _duration(r.metric("train_time_s")),
        ]
        for r in runs
    ]


def _reached(run: RunRecord) -> str:
    """How far a training run got: `12 iterations` or `40k env steps`; empty for eval runs."""
    steps = run.progress if run.is_training else None
    if steps is None:
        return ""
    if run.family == "dqn":
        return f"{steps / 1000:g}k env steps" if steps >= 1000 else f"{steps:g} env steps"
    return f"{steps:g} iterations"


def other_run_rows(runs: Sequence[RunRecord]) -> list[list[str]]:
    return [
        [
            r.label,
            r.status,
            r.env,
            _agent_cell(r.agent, r.marker),
            r.model,
            "" if r.seed is None else str(r.seed),
            r.variant,
            _reached(r),
            _fmt(r.metric("success_rate")),
            r.error if len(r.error) <= 120 else r.error[:119] + "…",
        ]
        for r in runs
    ]


def group_table_rows(groups: Sequence[GroupSummary]) -> list[list[str]]:
    return [
        [
            g.env,
            _agent_cell(g.agent, g.marker),
            g.model,
            g.variant,
            _seeds_cell(g),
            _pm(*g.success),
            _pm(*g.episode_return),
            _fmt(g.length, 1),
            _fmt(g.invalid_rate),
            _fmt(g.untagged_rate),
            _duration(g.train_time_s),
        ]
        for g in groups
    ]


def _counts_line(report: Report) -> str:
    parts = [f"{report.count(COMPLETE)} complete"]
    parts += [f"{report.count(s)} {s}" for s in STATUSES[1:] if report.count(s)]
    noun = "run" if len(report.runs) == 1 else "runs"
    return f"{len(report.runs)} {noun}: " + ", ".join(parts) + "."


def _env_metric_section(groups: Sequence[GroupSummary]) -> list[str]:
    parts: list[str] = []
    for env in sorted({g.env for g in groups}):
        members = [g for g in groups if g.env == env and g.env_metrics]
        names = sorted({n for g in members for n in g.env_metrics})
        if not names:
            continue
        rows = [
            [g.label, *(_pm(*g.env_metrics.get(n, (math.nan, math.nan))) for n in names)] for g in members
        ]
        parts += [f"### {env}", "", md_table(["group", *names], rows), ""]
    if parts:
        parts = [
            "## Env metrics",
            "",
            "The env's own per-episode means on the held-out eval, mean ± stderr over seeds "
            "(`<x>_rate`: share of episodes; tic-tac-toe's `loss_rate` is the share of games lost, not "
            "a training loss).",
            "",
            *parts,
        ]
    return parts


def render_markdown(report: Report) -> str:
    complete = [r for r in report.runs if r.status == COMPLETE]
    stopped = [r for r in report.runs if r.status in (FAILED, INTERRUPTED, KILLED)]
    unfinished = [r for r in report.runs if r.status in (RUNNING, INCOMPLETE, CORRUPT)]
    parts = [
        "# agentrl report",
        "",
        _counts_line(report),
        "",
        "## Aggregates over seeds",
        "",
        "Complete runs only. Mean ± standard error across distinct seeds (runs sharing env, agent/algo, "
        "model and variant; a variant is the overrides that change results, without bookkeeping keys "
        "such as `resume` or `hydra.*`). Success is the share of held-out eval episodes solved; return "
        "is the mean undiscounted episode return; length is in agent moves; invalid is the share of "
        "moves whose answer was invalid; untagged is the share of answers without the asked-for answer "
        "tag that the lenient parser read anyway (– where the run did not record it).",
        "",
        md_table(GROUP_HEADERS, group_table_rows(report.groups)) if report.groups else "_no complete runs_",
        "",
        *target_markdown(report.target),
        *_env_metric_section(report.groups),
        *diagnostics_markdown(report.groups),
        "## Runs",
        "",
        "Complete runs. Return ± standard error over the run's eval episodes.",
        "",
        md_table(RUN_HEADERS, run_table_rows(complete)) if complete else "_none_",
        "",
    ]
    if stopped:
        parts += [
            "## Failed and interrupted runs",
            "",
            "Never averaged with complete runs; numbers are whatever eval the run wrote before it stopped.",
            "",
            md_table(OTHER_RUN_HEADERS, other_run_rows(stopped)),
            "",
        ]
    if unfinished:
        parts += [
            "## Running, incomplete and corrupt runs",
            "",
            md_table(OTHER_RUN_HEADERS, other_run_rows(unfinished)),
            "",
        ]
    plots = report.plots
    if plots:
        parts += ["## Plots", ""]
        parts += [f"![{p.stem}]({p.name})" for p in plots]
        parts.append("")
    return "\n".join(parts)


#: below this console width the printed tables drop the per-run table and the secondary columns
WIDE_CONSOLE = 140


def print_report(report: Report, console: Any) -> None:
    """Print the aggregates, one compact table per env, and the runs that are not complete; a wide
    console also gets the per-run table. Numbers never wrap; the group name column folds."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    wide = console.width >= WIDE_CONSOLE
    console.print(f"[bold]agentrl report[/bold]: {_counts_line(report)}")
    headers = ["agent/algo · model · variant", "seeds", "success", "return", "untagged"]
    headers += ["length", "invalid", "train time"] if wide else []
    for env in sorted({g.env for g in report.groups}):
        rows = []
        for g in (g for g in report.groups if g.env == env):
            cells = ["\n".join(g.head_and_variant), _seeds_cell(g), _pm(*g.success), _pm(*g.episode_return)]
            cells.append(_fmt(g.untagged_rate))
            if wide:
                cells += [_fmt(g.length, 1), _fmt(g.invalid_rate), _duration(g.train_time_s)]
            rows.append(cells)
        print_fitted(
            console,
            f"{env}: held-out eval, mean ± stderr over seeds",
            headers,
            rows,
            right=[1, 4, 5, 6, 7],
            show_lines=True,
        )
    if not report.groups:
        console.print("no complete runs")
    print_target(report.target, console)
    print_diagnostics(report.groups, console)
    others = [r for r in report.runs if r.status != COMPLETE]
    if others:
        table = Table(title="Runs not complete", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("run", overflow="fold", ratio=1, min_width=12)
        table.add_column("status", no_wrap=True)
        table.add_column("reason", overflow="fold", ratio=1, min_width=12)
        styles = {
            FAILED: "red",
            INTERRUPTED: "yellow",
            KILLED: "red",
            RUNNING: "cyan",
            INCOMPLETE: "yellow",
            CORRUPT: "red",
        }
        for r in others:
            table.add_row(escape(r.label), r.status, escape(r.error), style=styles.get(r.status, ""))
        console.print(table)
    complete = [r for r in report.runs if r.status == COMPLETE]
    if wide and complete:
        print_fitted(
            console, "Complete runs", RUN_HEADERS, run_table_rows(complete), right=[4, 8, 9, 10], fold=[5]
        )
    elif complete:
        console.print("Per-run table: report.md and report.csv.")
    if report.files:
        print_paths(console, "Wrote:", report.files)
