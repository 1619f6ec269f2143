"""The paper table (`agentrl report DIR --table paper`): what a paper on LLM agents in text games
reports, from the runs found under the directories.

- **Main table**: env × method, success rate, mean return and the untagged share (eval.json
  `untagged_rate`, `–` where not recorded) on the held-out eval as mean ± standard error over seeds
  (one value per seed: that run's eval.json metric), n seeds shown. A method is a
  training algorithm with its model and variant (e.g. `msgrpo / qwen2.5-3b algo.aaw.enabled=false`), or
  an evaluated agent (e.g. `llm / Qwen/Qwen2.5-72B-Instruct`, `planner`).
- **Zero-shot vs trained**: each training run's eval.json `before` block (the base policy, evaluated
  before the first update) against its final eval.
- **Transfer**: evaluations of a trained run (`agentrl eval from_run=<dir>`) on an env other than the
  one it trained on (eval.json `trained_env`, written when `from_run_env` or the command changed the
  env), next to the method's score on its own env.

Files written into the output directory: `paper.md`, `paper.csv` (one row per table cell group, a
`section` column), `paper_curves.png` (greedy eval success and training return by iteration, mean ±
stderr bands over seeds) and `paper_bars.png` (final success and return by env and method, stderr error
bars, a grid of small panels, up to 4 per row). Only complete runs count; the others are counted in a note.
"""

from __future__ import annotations

import csv
import functools
import logging
import math
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import RunDirError
from agentrl.report.runs import (
    COMPLETE,
    EVAL_SUCCESS_KEYS,
    TRAIN_RETURN_KEYS,
    RunRecord,
    _natural,
    _seed_values,
    find_runs,
    load_run,
    mean_stderr,
)
from agentrl.runs.rundir import override_key

log = logging.getLogger(__name__)

MAIN, ZERO_SHOT, TRANSFER = "main", "zero_shot_vs_trained", "transfer"
#: the main table's columns per env
MAIN_PER_ENV = ("success", "return", "untagged")
#: variant keys that say where a model is served or stored, not what the method is
NOT_METHOD_KEYS = frozenset({"model.base_url", "model.name_or_path", "from_run_env"})
CSV_COLUMNS = [
    "section",
    "env",
    "trained_env",
    "method",
    "seeds",
    "success_mean",
    "success_stderr",
    "return_mean",
    "return_stderr",
    "untagged_rate_mean",
    "untagged_rate_stderr",
    "before_success_mean",
    "before_success_stderr",
    "before_return_mean",
    "before_return_stderr",
    "trained_env_success_mean",
]


@dataclass
class PaperRun:
    """A complete run as the paper table sees it: its method, the env it was evaluated on and the env
    its model was trained on (None for an agent that was not trained)."""

    record: RunRecord
    head: str  # algorithm or agent, and model
    items: tuple[str, ...]  # the variant's overrides that define the method
    env: str
    trained_env: str | None
    reeval: bool = False  # an `eval from_run=` of a trained run on its own env
    method: str = ""


@dataclass
class Row:
    """One aggregated cell group: mean ± stderr over seeds of a method on an env."""

    section: str
    env: str
    method: str
    runs: list[RunRecord]
    success: tuple[float, float]
    episode_return: tuple[float, float]
    seeds: int
    trained_env: str | None = None
    before_success: tuple[float, float] = (math.nan, math.nan)
    before_return: tuple[float, float] = (math.nan, math.nan)
    trained_env_success: float = math.nan
    untagged: tuple[float, float] = (math.nan, math.nan)  # eval.json untagged_rate; nan: not recorded

    def csv_row(self) -> dict[str, Any]:
        def num(x: float) -> Any:
            return "" if math.isnan(x) else x

        return {
            "section": self.section,
            "env": self.env,
            "trained_env": self.trained_env or "",
            "method": self.method,
            "seeds": self.seeds,
            "success_mean": num(self.success[0]),
            "success_stderr": num(self.success[1]),
            "return_mean": num(self.episode_return[0]),
            "return_stderr": num(self.episode_return[1]),
            "untagged_rate_mean": num(self.untagged[0]),
            "untagged_rate_stderr": num(self.untagged[1]),
            "before_success_mean": num(self.before_success[0]),
            "before_success_stderr": num(self.before_success[1]),
            "before_return_mean": num(self.before_return[0]),
            "before_return_stderr": num(self.before_return[1]),
            "trained_env_success_mean": num(self.trained_env_success),
        }


@dataclass
class PaperReport:
    rows: list[Row]
    runs: list[PaperRun]
    skipped: int  # runs found that are not complete
    common: str  # the variant items every method shares (said once, not in each name)
    out_dir: Path
    files: list[Path] = field(default_factory=list)

    def section(self, name: str) -> list[Row]:
        return [r for r in self.rows if r.section == name]


# ---------------------------------------------------------------------------------------------
# runs -> methods
# ---------------------------------------------------------------------------------------------
def _head(agent: str, model: str) -> str:
    return " / ".join(p for p in (agent, model) if p and p != "-")


def _method_items(record: RunRecord) -> tuple[str, ...]:
    return tuple(o for o in record.overrides if override_key(o) not in NOT_METHOD_KEYS)


def paper_run(record: RunRecord) -> PaperRun:
    """Method and envs of one complete run. An `eval from_run=` takes the method of the training run it
    evaluated (read from that run's directory when it still exists, else from eval.json)."""
    if record.is_training:
        return PaperRun(
            record, _head(record.agent, record.model), _method_items(record), record.env, record.env
        )
    if record.marker:  # load_run named it by the trained run it evaluated
        trained_env = record.trained_env or record.env
        head, items = _head(record.agent, record.model), _method_items(record)
        return PaperRun(record, head, items, record.env, trained_env, reeval=trained_env == record.env)
    return PaperRun(record, _head(record.agent, record.model), _method_items(record), record.env, None)


def _name_methods(runs: Sequence[PaperRun]) -> str:
    """Give each run its method name: head plus the variant items not every run shares; returns the
    shared items."""
    item_sets = [set(r.items) for r in runs]
    common = set.intersection(*item_sets) if len(item_sets) > 1 else set()
    for r in runs:
        items = [i for i in r.items if i not in common]
        # a re-evaluation carries the runs report's marker right after the head, as its label there does
        marker = f" [{r.record.marker}]" if r.reeval and r.record.marker else ""
        r.method = " ".join([r.head + marker, *items])
    return " ".join(sorted(common, key=_natural))


# ---------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------
def _stat(runs: Sequence[RunRecord], get: Callable[[RunRecord], float | None]) -> tuple[float, float]:
    """Mean ± stderr over seeds of an eval number (a seed's runs weighted by their eval episodes)."""
    return mean_stderr(_seed_values(runs, get, per_episode=True))


def _row(section: str, env: str, method: str, members: list[PaperRun], trained_env: str | None) -> Row:
    records = [m.record for m in members]
    success = _stat(records, lambda r: r.metric("success_rate"))
    return Row(
        section=section,
        env=env,
        method=method,
        runs=records,
        success=success,
        episode_return=_stat(records, lambda r: r.metric("mean_return")),
        seeds=len(_seed_values(records, lambda r: r.metric("success_rate"))),
        trained_env=trained_env,
        before_success=_stat(records, lambda r: r.before("success_rate")),
        before_return=_stat(records, lambda r: r.before("mean_return")),
        untagged=_stat(records, lambda r: r.metric("untagged_rate")),
    )


def paper_rows(runs: Sequence[PaperRun]) -> list[Row]:
    """The three sections' rows, each in natural order of (env, method)."""
    rows: list[Row] = []

    def grouped(items: Sequence[PaperRun], key: Callable[[PaperRun], tuple[str, ...]]) -> list[Any]:
        out: dict[tuple[str, ...], list[PaperRun]] = {}
        for r in items:
            out.setdefault(key(r), []).append(r)
        return sorted(out.items(), key=lambda kv: [_natural(k) for k in kv[0]])

    home = [r for r in runs if r.trained_env in (None, r.env)]
    for (env, method), members in grouped(home, lambda r: (r.env, r.method)):
        rows.append(_row(MAIN, env, method, members, members[0].trained_env))
    trained = [r for r in runs if r.record.is_training and r.record.before("success_rate") is not None]
    for (env, method), members in grouped(trained, lambda r: (r.env, r.method)):
        rows.append(_row(ZERO_SHOT, env, method, members, env))
    moved = [r for r in runs if r.trained_env is not None and r.trained_env != r.env]
    main = {(r.env, r.method): r for r in rows if r.section == MAIN}
    for (trained_env, env, method), members in grouped(
        moved, lambda r: (str(r.trained_env), r.env, r.method)
    ):
        row = _row(TRANSFER, env, method, members, trained_env)
        own = main.get((trained_env, method))
        row.trained_env_success = own.success[0] if own is not None else math.nan
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------------------------
def _pm(stat: tuple[float, float], digits: int = 3) -> str:
    mean, err = stat
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" if math.isnan(err) else f"{mean:.{digits}f} ± {err:.{digits}f}"


def _md(headers: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def main_table(rows: Sequence[Row], compact: bool = False) -> tuple[list[str], list[list[str]]]:
    """Methods down, envs across: `success` and `return` per env, each `mean ± stderr (n=seeds)`, and
    the share of untagged answers (`–` where the runs did not record it). `compact` (the terminal):
    n seeds in the success cell only."""
    envs = sorted({r.env for r in rows}, key=_natural)
    methods = sorted({r.method for r in rows}, key=_natural)
    cells = {(r.env, r.method): r for r in rows}
    headers = ["method", *(f"{env} {what}" for env in envs for what in MAIN_PER_ENV)]
    table = []
    for method in methods:
        line = [method]
        for env in envs:
            row = cells.get((env, method))
            if row is None:
                line += [""] * len(MAIN_PER_ENV)
            else:
                n = f" (n={row.seeds})"
                line += [
                    _pm(row.success) + n,
                    _pm(row.episode_return) + ("" if compact else n),
                    _pm(row.untagged),
                ]
        table.append(line)
    return headers, table


def zero_shot_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    headers = [
        "env",
        "method",
        "seeds",
        "success before",
        "success after",
        "return before",
        "return after",
        "untagged after",
    ]
    return headers, [
        [
            r.env,
            r.method,
            str(r.seeds),
            _pm(r.before_success),
            _pm(r.success),
            _pm(r.before_return),
            _pm(r.episode_return),
            _pm(r.untagged),
        ]
        for r in rows
    ]


def transfer_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    headers = [
        "trained on",
        "evaluated on",
        "method",
        "seeds",
        "success",
        "return",
        "untagged",
        "success on trained env",
    ]
    return headers, [
        [
            str(r.trained_env),
            r.env,
            r.method,
            str(r.seeds),
            _pm(r.success),
            _pm(r.episode_return),
            _pm(r.untagged),
            "–" if math.isnan(r.trained_env_success) else f"{r.trained_env_success:.3f}",
        ]
        for r in rows
    ]


def render_paper_markdown(report: PaperReport) -> str:
    parts = [
        "# Paper table",
        "",
        "Held-out eval of complete runs: mean ± standard error over seeds (one value per seed: the "
        "run's eval.json metric; n = seeds). Success is the share of eval episodes solved, return the "
        "mean episode return.",
    ]
    if report.common:
        parts += ["", f"All methods share: `{report.common}`."]
    if report.skipped:
        parts += ["", f"{report.skipped} run(s) not complete were left out (`agentrl report` lists them)."]
    sections = (
        (MAIN, "Results by env and method", main_table, ""),
        (
            ZERO_SHOT,
            "Zero-shot vs trained",
            zero_shot_table,
            "The same runs before the first update (eval.json `before`) and after training.",
        ),
        (
            TRANSFER,
            "Transfer",
            transfer_table,
            "Trained runs evaluated zero-shot on another env (`agentrl eval from_run=<dir> "
            "from_run_env=<env>` or a transfer preset).",
        ),
    )
    for name, title, table, note in sections:
        rows = report.section(name)
        parts += ["", f"## {title}", ""]
        if note:
            parts += [note, ""]
        parts.append(_md(*table(rows)) if rows else "_none_")
    plots = [p for p in report.files if p.suffix == ".png"]
    if plots:
        parts += ["", "## Plots", "", *(f"![{p.stem}]({p.name})" for p in plots)]
    return "\n".join(parts) + "\n"


def print_paper_report(report: PaperReport, console: Any) -> None:
    """The three tables on the terminal. A table wider than the terminal is split into several, each
    with the identifying columns (method; env and method; trained on, evaluated on and method): the
    main table into tables of a few envs each."""
    from rich.markup import escape

    from agentrl.report.layout import print_fitted, print_paths

    titles = {MAIN: "Results by env and method", ZERO_SHOT: "Zero-shot vs trained", TRANSFER: "Transfer"}
    builders = {MAIN: functools.partial(main_table, compact=True), ZERO_SHOT: zero_shot_table}
    builders[TRANSFER] = transfer_table
    keys = {MAIN: 1, ZERO_SHOT: 2, TRANSFER: 3}
    for name in (MAIN, ZERO_SHOT, TRANSFER):
        rows = report.section(name)
        if not rows:
            continue
        headers, body = builders[name](rows)
        per_env = len(MAIN_PER_ENV)
        together = [range(i, i + per_env) for i in range(1, len(headers), per_env)] if name == MAIN else ()
        print_fitted(
            console,
            f"{titles[name]} (mean ± stderr over seeds)",
            headers,
            body,
            keys=keys[name],
            together=together,
        )
    if report.common:
        console.print(escape(f"All methods share: {report.common}"))
    if report.files:
        print_paths(console, "Wrote:", report.files)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
def _styles(methods: Sequence[str]) -> dict[str, Any]:
    from agentrl.report.plots import plot_style

    return {m: plot_style(i) for i, m in enumerate(sorted(set(methods), key=_natural))}


def _wrapped(text: str, width: int = 34) -> str:
    return "\n".join(textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False)) or text


def figure_paper_curves(runs: Sequence[PaperRun], styles: dict[str, Any]) -> Any:
    """Learning curves of the training runs: per env (and x-axis: iterations, or env steps for DQN) a
    column; rows: the greedy held-out eval success (before, periodic and final evals) and the sampled
    policy's training return. One line per method: its mean over seeds with a ± stderr band (each seed
    thin), as `agentrl report`'s curves draw them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    from agentrl.report.plots import _add_legend, _draw_group, _eval_points, _PlotGroup, _series

    trained = [r for r in runs if r.record.is_training and r.record.curve]
    if not trained:
        return None
    columns = sorted({(r.env, r.record.family) for r in trained}, key=lambda c: [_natural(p) for p in c])
    rows = (
        ("eval", "greedy eval success rate\n(held-out seeds)"),
        ("train", "training mean return\n(sampled policy)"),
    )
    fig, axes = plt.subplots(
        len(rows), len(columns), figsize=(4.2 * len(columns) + 3.4, 6.4), squeeze=False, layout="constrained"
    )
    shown: dict[str, Any] = {}
    for c, (env, family) in enumerate(columns):
        members = [r for r in trained if r.env == env and r.record.family == family]
        methods = sorted({r.method for r in members}, key=_natural)
        for r_i, (kind, ylabel) in enumerate(rows):
            ax = axes[r_i][c]
            for method in methods:
                records = [r.record for r in members if r.method == method]
                group = _PlotGroup(("", "", method, ""), records, styles[method], method)
                if kind == "eval":
                    points = [_eval_points(m, "success_rate", "iteration") for m in records]
                    curves = [p["series"] for p in points if p["series"] is not None]
                    if not curves:  # no before/final evals: the periodic eval rows alone
                        curves = [
                            s
                            for s in (_series(m, EVAL_SUCCESS_KEYS, "iteration") for m in records)
                            if s is not None
                        ]
                else:
                    curves = [
                        s
                        for s in (_series(m, TRAIN_RETURN_KEYS, "iteration") for m in records)
                        if s is not None
                    ]
                if curves:
                    _draw_group(ax, group, curves, 1.0)
                    shown[method] = len({m.seed for m in records})
            if kind == "eval":
                ax.set_ylim(-0.04, 1.04)
            ax.grid(alpha=0.3)
            ax.set_ylabel(ylabel, fontsize=9)
            ax.set_xlabel("env steps" if family == "dqn" else "iteration", fontsize=9)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))  # no iteration 0.5
            ax.tick_params(labelsize=8)
            if r_i == 0:
                ax.set_title(env, fontsize=10)
    handles = [
        Line2D(
            [],
            [],
            color=styles[m].colour,
            linestyle=styles[m].linestyle,
            marker=styles[m].marker,
            lw=1.8,
            label=_wrapped(f"{m} ({n} seed{'s' if n != 1 else ''})"),
        )
        for m, n in sorted(shown.items(), key=lambda kv: _natural(kv[0]))
    ]
    _add_legend(fig, handles, title="Learning curves (line: mean over seeds; band: ± stderr)")
    return fig


#: panels per row of `paper_bars.png`
BAR_COLUMNS = 4


def _bar_names(rows: Sequence[Row]) -> dict[str, str]:
    """Each method's name under its bar: without the agent / model head when every method shares it."""
    heads = {r.method: _head(r.runs[0].agent, r.runs[0].model) for r in rows if r.runs}
    shared = next(iter(heads.values())) if len(set(heads.values())) == 1 else None
    names = {}
    for method in {r.method for r in rows}:
        rest = method.removeprefix(shared).strip() if shared and method.startswith(shared) else ""
        names[method] = rest or method
    return names


def _tick_label(name: str, width: int, max_lines: int = 4) -> str:
    """`name` on lines of about `width` characters, broken after a space, `=`, `.` or `/` (never inside
    a word: `algo.aaw.enabled=` / `false`)."""
    lines: list[str] = []
    for token in re.split(r"(?<=[ =./])", name):
        if lines and len(lines[-1]) + len(token.rstrip()) <= width:
            lines[-1] += token
        else:
            lines.append(token)
    lines = [line.strip() for line in lines if line.strip()]
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], lines[max_lines - 1] + "…"]
    return "\n".join(lines)


def figure_paper_bars(rows: Sequence[Row], styles: dict[str, Any]) -> Any:
    """The main table as bars: a grid of small panels, one per env and metric (success rate, then mean
    return), up to `BAR_COLUMNS` per row; one bar per method, named under it with its n seeds, with a
    ± stderr error bar and its value written at its end (so a zero bar is seen)."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from agentrl.report.plots import _add_legend

    envs = sorted({r.env for r in rows}, key=_natural)
    methods = sorted({r.method for r in rows}, key=_natural)
    cells = {(r.env, r.method): r for r in rows}
    names = _bar_names(rows)
    ncols = min(BAR_COLUMNS, len(envs))
    env_rows = math.ceil(len(envs) / ncols)
    metrics = (("success", "success rate"), ("episode_return", "mean return"))
    fig, axes = plt.subplots(
        env_rows * len(metrics),
        ncols,
        figsize=(2.9 * ncols + 3.4, 2.9 * env_rows * len(metrics) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    for m_i, (attr, ylabel) in enumerate(metrics):
        for e_i in range(env_rows * ncols):
            ax = axes[m_i * env_rows + e_i // ncols][e_i % ncols]
            if e_i >= len(envs):
                ax.set_visible(False)
                continue
            env = envs[e_i]
            present = [m for m in methods if (env, m) in cells]
            ends = []
            for x, method in enumerate(present):
                row = cells[(env, method)]
                mean, err = getattr(row, attr)
                err = 0.0 if math.isnan(err) else err
                style = styles[method]
                ax.bar(
                    x,
                    0.0 if math.isnan(mean) else mean,
                    width=0.8,
                    yerr=err,
                    capsize=3,
                    color=style.colour,
                    hatch=style.hatch,
                    edgecolor="black",
                    linewidth=0.5,
                )
                if not math.isnan(mean):
                    # the value past the error bar's end, above a bar that rises and below one that falls
                    end = mean + err if mean >= 0 else mean - err
                    ends.append(end)
                    ax.annotate(
                        f"{mean:.2f}",
                        (x, end),
                        xytext=(0, 2 if mean >= 0 else -2),
                        textcoords="offset points",
                        ha="center",
                        va="bottom" if mean >= 0 else "top",
                        fontsize=7,
                    )
            rotate = len(present) > 4
            width = 26 if rotate else max(8, 40 // max(len(present), 1))
            ax.set_xticks(range(len(present)))
            ax.set_xticklabels(
                [f"{_tick_label(names[m], width)}\nn={cells[(env, m)].seeds}" for m in present],
                fontsize=7,
                rotation=90 if rotate else 0,
            )
            ax.set_xlim(-0.6, max(len(present), 1) - 0.4)
            ax.axhline(0, color="black", lw=0.6)
            ax.grid(axis="y", alpha=0.3)
            ax.tick_params(axis="y", labelsize=7)
            if attr == "success":
                ax.set_ylim(0, 1.12)  # room for a value written above a full bar
            else:
                lo, hi = min([0.0, *ends]), max([0.0, *ends])
                pad = 0.15 * (hi - lo or 1.0)
                ax.set_ylim(lo - (pad if lo < 0 else 0), hi + (pad if hi > 0 else 0))
            ax.set_title(f"{env}: {ylabel}", fontsize=9)
            if e_i % ncols == 0:
                ax.set_ylabel(ylabel, fontsize=8)
    handles = [
        Patch(facecolor=styles[m].colour, hatch=styles[m].hatch, edgecolor="black", label=_wrapped(m))
        for m in methods
    ]
    _add_legend(
        fig,
        handles,
        title="Final held-out eval by method (error bars: ± stderr over seeds; n seeds under each bar)",
        title_size=10,
    )
    return fig


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
def build_paper_report(
    paths: Sequence[Path], out_dir: Path | None = None, console: Any = None
) -> PaperReport:
    """Find the runs under `paths`, write paper.md, paper.csv, paper_curves.png and paper_bars.png into
    `out_dir` (default: the first path) and print the tables to `console` when given. Raises
    RunDirError when a path is missing or no complete run is found."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise RunDirError("report: give at least one directory")
    records = [load_run(d) for d in find_runs(paths)]
    complete = [r for r in records if r.status == COMPLETE]
    if not complete:
        where = ", ".join(map(str, paths))
        raise RunDirError(f"report --table paper: no complete runs (with eval.json) under {where}")
    runs = [paper_run(r) for r in complete]
    common = _name_methods(runs)
    out_dir = Path(out_dir) if out_dir is not None else paths[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    report = PaperReport(paper_rows(runs), runs, len(records) - len(complete), common, out_dir)

    csv_path = out_dir / "paper.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(r.csv_row() for r in report.rows)
    from agentrl.report.plots import _save

    plots: list[Path] = []
    try:
        styles = _styles([r.method for r in runs])
        for name, fig in (
            ("paper_curves.png", figure_paper_curves(runs, styles)),
            ("paper_bars.png", figure_paper_bars(report.section(MAIN), styles)),
        ):
            if fig is not None:
                plots.append(_save(fig, out_dir / name, dpi=120))
    except Exception as exc:  # noqa: BLE001 - plots must never cost the tables
        log.error("report: plotting failed: %s", exc)
    report.files = [out_dir / "paper.md", csv_path, *plots]
    (out_dir / "paper.md").write_text(render_paper_markdown(report))
    if console is not None:
        print_paper_report(report, console)
    return report


__all__ = ["PaperReport", "PaperRun", "Row", "build_paper_report", "paper_rows", "paper_run"]
