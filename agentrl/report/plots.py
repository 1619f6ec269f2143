"""Reports as PNG plots: learning curves per algorithm family and the final-eval bar chart."""

from __future__ import annotations

import logging
import math
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.report.runs import (
    COMPLETE,
    CORRUPT,
    EVAL_CURVE_KEYS,
    EVAL_INVALID_KEYS,
    EVAL_RETURN_KEYS,
    EVAL_SUCCESS_KEYS,
    TRAIN_INVALID_KEYS,
    TRAIN_RETURN_KEYS,
    TRAIN_SUCCESS_KEYS,
    GroupSummary,
    RunRecord,
    _by_seed,
    _natural,
    _number,
    _seed_values,
    family_of,
    mean_stderr,
    seeds_text,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = ("s", "^", "D", "v", "P", "X", "<", ">")  # "o" and "*" mark the before/final evals
_HATCHES = ("", "//", "..", "xx")
#: a path value longer than this is shortened in a plot label
PATH_IN_LABEL = 24
#: a curve with at most this many points has each one marked
FEW_POINTS = 3
_BEFORE = dict(marker="o", markerfacecolor="white", markersize=7, markeredgewidth=1.6, linestyle="none")
_FINAL = dict(marker="*", markersize=12, markeredgecolor="black", markeredgewidth=0.6, linestyle="none")


@dataclass(frozen=True)
class Style:
    colour: Any
    linestyle: str
    marker: str
    hatch: str  # for bars, where the line style does not show


def plot_style(index: int) -> Style:
    """The index-th legend entry's style: colour, line style, marker and bar hatch. (colour, line
    style), (colour, marker) and (colour, hatch) pairs are each distinct for the first 40 entries."""
    import matplotlib

    cycle = (index // 10) % len(_LINESTYLES)
    return Style(
        matplotlib.colormaps["tab10"](index % 10),
        _LINESTYLES[cycle],
        _MARKERS[index % len(_MARKERS)],
        _HATCHES[cycle],
    )


#: (method head `agent / model [marker]`, "-", variant, status; "" for complete runs)
StyleKey = tuple[str, str, str, str]


def style_map(keys: Iterable[StyleKey]) -> dict[StyleKey, Style]:
    """One style per legend entry, in natural order, so an entry looks the same in every figure."""
    ordered = sorted(set(keys), key=lambda k: (bool(k[3]), *(_natural(p) for p in k)))
    return {key: plot_style(i) for i, key in enumerate(ordered)}


def _style_keys(runs: Sequence[RunRecord]) -> list[StyleKey]:
    return [(r.head, "-", r.variant, "" if r.status == COMPLETE else r.status) for r in runs]


@dataclass(frozen=True)
class _Labeller:
    """Legend / tick labels without what every entry shares; the shared part is said once (`common`)."""

    common_head: str
    common_items: tuple[str, ...]

    @classmethod
    def of(cls, keys: Sequence[StyleKey]) -> _Labeller:
        heads = {_head(k[0], k[1]) for k in keys}
        if len(keys) < 2:
            return cls("", ())
        items = [set(k[2].split()) for k in keys]
        common = set.intersection(*items) if items else set()
        return cls(heads.pop() if len(heads) == 1 else "", tuple(sorted(common, key=_natural)))

    @property
    def common(self) -> str:
        return " ".join(p for p in (self.common_head, *self.common_items) if p)

    def __call__(self, key: StyleKey, width: int = 30, max_lines: int = 4) -> str:
        agent, model, variant, _ = key
        items = " ".join(i for i in variant.split() if i not in self.common_items)
        head = "" if self.common_head and items else _head(agent, model)
        return _plot_label(head, items, width, max_lines) or _head(agent, model)


def _head(agent: str, model: str) -> str:
    return " / ".join(p for p in (agent, model if model != "-" else "") if p)


def _wrap(text: str, width: int = 30) -> list[str]:
    """`text` on lines of `width`; a bracketed marker (`[from_run eval]`) stays on one line."""
    kept = re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", "\xa0"), text)
    lines = textwrap.wrap(kept, width, break_long_words=True, break_on_hyphens=False) or [""]
    return [line.replace("\xa0", " ") for line in lines]


def _short_path_item(item: str) -> str:
    """`key=…/<last two parts>` for an override whose value is a long path: a legend names, it does
    not locate (report.md and the CSVs keep the whole path)."""
    key, sep, value = item.partition("=")
    parts = value.strip("'\"").split("/")
    if not sep or len(value) <= PATH_IN_LABEL or len(parts) < 3:
        return item
    return f"{key}=…/{'/'.join(parts[-2:])}"


def _plot_label(head: str, variant: str, width: int = 30, max_lines: int = 4) -> str:
    """A legend / tick label: `head` (agent and model), then the variant's overrides wrapped to `width`,
    long paths shortened (`_short_path_item`)."""
    lines: list[str] = []
    for item in map(_short_path_item, variant.split()):
        if lines and len(lines[-1]) + len(item) + 1 <= width:
            lines[-1] += " " + item
        else:
            lines += _wrap(item, width)
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], f"... (+{len(lines) - max_lines + 1} more lines)"]
    return "\n".join([*(_wrap(head, width) if head else []), *lines])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "env"


def _series(run: RunRecord, keys: Sequence[str], x_key: str) -> tuple[np.ndarray, np.ndarray] | None:
    for key in keys:
        pts = [
            (float(row[x_key]), float(row[key]))
            for row in run.curve
            if _number(row.get(x_key)) is not None and _number(row.get(key)) is not None
        ]
        if pts:
            pts.sort()
            xs, ys = zip(*pts, strict=True)
            return np.asarray(xs), np.asarray(ys)
    return None


def _eval_points(run: RunRecord, metric: str, x_key: str) -> dict[str, Any]:
    """The greedy evals of one training run on one x-axis: `before` (x = 0, eval.json `before`),
    the periodic `eval/` rows, and `final` (eval.json, at the last iteration / env step / time)."""
    periodic = _series(run, EVAL_CURVE_KEYS[metric], x_key)
    xs, ys = ([], []) if periodic is None else (list(periodic[0]), list(periodic[1]))
    before = run.before(metric)
    final = run.metric(metric)
    if x_key == "iteration":
        x_final = run.progress
    else:
        times = [_number(r.get("time_s")) for r in run.curve]
        times = [t for t in times if t is not None]
        x_final = max(times) if times else run.metric("train_time_s")
    points: dict[str, Any] = {"before": None, "final": None}
    if before is not None:
        points["before"] = (0.0, before)
        xs, ys = [0.0, *xs], [before, *ys]
    if final is not None and x_final is not None:
        points["final"] = (x_final, final)
        if not xs or x_final > xs[-1]:
            xs, ys = [*xs, x_final], [*ys, final]
    points["series"] = (np.asarray(xs), np.asarray(ys)) if xs else None
    return points


@dataclass
class _PlotGroup:
    key: tuple[str, str, str, str]  # (agent, model, variant, status suffix)
    runs: list[RunRecord]
    style: Style
    label: str
    baseline: bool = False  # an eval-only group: a horizontal reference line in the eval panels

    @property
    def family(self) -> str:
        return family_of(self.key[0])


def _plot_groups(
    env_runs: Sequence[RunRecord], baselines: Sequence[RunRecord], styles: dict[StyleKey, Style]
) -> tuple[list[_PlotGroup], str]:
    """Legend entries and the text they all share: training runs grouped by (agent, model, variant);
    runs that are not complete form their own entries (never averaged with complete ones); complete
    eval-only runs of the env follow as reference lines."""
    grouped: dict[StyleKey, list[RunRecord]] = {}
    for run, key in zip(env_runs, _style_keys(env_runs), strict=True):
        grouped.setdefault(key, []).append(run)
    refs: dict[StyleKey, list[RunRecord]] = {}
    for run, key in zip(baselines, _style_keys(baselines), strict=True):
        refs.setdefault(key, []).append(run)
    labeller = _Labeller.of([*grouped, *refs])
    out: list[_PlotGroup] = []
    for baseline, source in ((False, grouped), (True, refs)):
        for key in sorted(source, key=lambda k: list(styles).index(k) if k in styles else len(styles)):
            members = source[key]
            seeds = len(_by_seed(members))
            label = labeller(key)
            label += f"\n[{key[3]}]" if key[3] else ""
            label += " (eval only, " if baseline else " ("
            label += (
                f"{seeds} seeds)" if seeds > 1 else f"{len(members)} run{'s' if len(members) > 1 else ''})"
            )
            style = styles.get(key) or plot_style(len(styles) + len(out))
            out.append(_PlotGroup(key, members, style, label, baseline))
    return out, labeller.common


def _time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds < 180:
        return 1.0, "s"
    if max_seconds < 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def _draw_group(
    ax: Any, group: _PlotGroup, curves: list[tuple[np.ndarray, np.ndarray]], scale: float
) -> None:
    """Each run as a line; with several runs (seeds) thin lines plus the mean ± stderr band over their
    common x range (linearly interpolated). A run of few points (a short DQN run logs one row per
    `log_every` env steps) has every point marked, which a line alone would not show."""
    st = group.style
    several = len(curves) >= 2
    for xs, ys in curves:
        few = len(xs) <= FEW_POINTS
        ax.plot(
            xs / scale,
            ys,
            color=st.colour,
            linestyle=st.linestyle,
            lw=0.8 if several else 1.8,
            alpha=0.6 if several and few else 0.4 if several else 1.0,
            marker=st.marker if few or not several else None,
            markevery=1 if few else max(1, len(xs) // 8),
            markersize=6 if few else 4,
        )
    if several:
        lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
        if hi > lo:
            # at the x values the runs logged (iterations stay whole numbers), interpolated in between
            grid = np.unique(np.concatenate([xs[(xs >= lo) & (xs <= hi)] for xs, _ in curves]))
            stack = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
            mean = stack.mean(axis=0)
            err = stack.std(axis=0, ddof=1) / math.sqrt(len(curves))
            ax.plot(
                grid / scale,
                mean,
                color=st.colour,
                linestyle=st.linestyle,
                lw=2,
                marker=st.marker,
                markevery=max(1, len(grid) // 8),
                markersize=5,
            )
            ax.fill_between(grid / scale, mean - err, mean + err, color=st.colour, alpha=0.2, lw=0)


def _mean_point(points: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    found = [p for p in points if p is not None]
    if not found:
        return None
    return float(np.mean([p[0] for p in found])), float(np.mean([p[1] for p in found]))


def _add_legend(
    fig: Any, handles: list[Any], fontsize: float = 8, title: str | None = None, title_size: float = 11
) -> Any:
    """One legend for the whole figure, outside every axes (right of them), in as many columns as the
    figure's height needs; `title`, the figure's title, goes beside it (`_title_beside`)."""
    lines = sum(h.get_label().count("\n") + 1 for h in handles)
    height_pt = fig.get_figheight() * 72
    capacity = max(1, int(height_pt * 0.85 / (fontsize * 1.45)))
    ncols = max(1, math.ceil(lines / capacity))
    legend = fig.legend(
        handles=handles,
        loc="outside right upper",
        fontsize=fontsize,
        ncols=ncols,
        frameon=False,
        handlelength=3.2,
        labelspacing=0.7,
    )
    if title is not None:
        _title_beside(fig, legend, title, title_size)
    return legend


def _title_beside(fig: Any, legend: Any, title: str, size: float) -> Any:
    """The figure's title centred over the part of the figure left of `legend`, its lines wrapped to fit
    there: a legend in the right margin starts at the figure's top edge, where a title centred on the
    whole figure runs into it."""
    fig.draw_without_rendering()  # the layout places the legend
    renderer = fig.canvas.get_renderer()
    room = legend.get_window_extent(renderer).x0 - 12.0  # pixels left of the legend, less a gap
    text = fig.suptitle(title, x=room / 2 / fig.bbox.width, fontsize=size)
    lines = title.split("\n")
    width = max(len(line) for line in lines)
    while text.get_window_extent(renderer).width > room and width > 20:
        width = int(width * 0.9)
        text.set_text("\n".join(part for line in lines for part in textwrap.wrap(line, width) or [""]))
    return text


def _legend_handles(groups: Sequence[_PlotGroup], marked: set[str]) -> list[Any]:
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            color=g.style.colour,
            linestyle=g.style.linestyle,
            marker=None if g.baseline else g.style.marker,
            lw=1.8,
            label=g.label,
        )
        for g in groups
    ]
    if "before" in marked:
        handles.append(
            Line2D([], [], color="0.35", markeredgecolor="0.35", label="before training", **_BEFORE)
        )
    if "final" in marked:
        handles.append(Line2D([], [], color="0.6", label="final eval (eval.json)", **_FINAL))
    return handles


def figure_learning_curves(
    runs: Sequence[RunRecord], env: str | None = None, styles: dict[StyleKey, Style] | None = None
) -> Any:
    """The learning-curve figure of one env's runs, or None without curves.

    Columns: per algorithm family, progress (DQN: env steps; LLM algorithms: iterations) and wall-clock,
    each family on its own x-axes so neither squashes the other. Rows: training success, return and
    invalid-answer rate (the sampled policy), then the greedy held-out eval's, with the before-training
    (hollow circle) and final (star) evals marked (the invalid rows where metrics.jsonl logs them);
    complete eval-only runs of the env appear there as horizontal reference lines. Rows share their
    y-axis, columns their x-axis. One legend, outside the axes; `styles` (default: `style_map` of these
    runs) keeps an entry's look across figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    trained = [r for r in runs if r.status != CORRUPT and r.curve and (env is None or r.env == env)]
    if not trained:
        return None
    env = env or trained[0].env
    baselines = [
        r for r in runs if r.env == env and r.status == COMPLETE and not r.curve and not r.is_training
    ]
    rows = [
        (
            "train",
            "success_rate",
            TRAIN_SUCCESS_KEYS,
            "training success rate\n(sampled policy)",
        ),
        ("train", "mean_return", TRAIN_RETURN_KEYS, "training mean return\n(sampled policy)"),
        ("train", "invalid_rate", TRAIN_INVALID_KEYS, "training invalid-answer rate\n(sampled policy)"),
        ("eval", "success_rate", EVAL_SUCCESS_KEYS, "greedy eval success rate\n(held-out seeds)"),
        ("eval", "mean_return", EVAL_RETURN_KEYS, "greedy eval mean return\n(held-out seeds)"),
        ("eval", "invalid_rate", EVAL_INVALID_KEYS, "greedy eval invalid-answer rate\n(held-out seeds)"),
    ]

    def has_data(kind: str, metric: str, keys: Sequence[str], run: RunRecord) -> bool:
        if _series(run, keys, "iteration") is not None:
            return True
        if metric == "invalid_rate":  # eval.json has one for every agent: a row only where curves log it
            return False
        return kind == "eval" and (run.before(metric) is not None or run.metric(metric) is not None)

    rows = [row for row in rows if any(has_data(*row[:3], r) for r in trained)]
    if not rows:
        return None
    families = [f for f in ("dqn", "llm") if any(r.family == f for r in trained)]
    styles = styles if styles is not None else style_map(_style_keys([*trained, *baselines]))
    groups, common = _plot_groups(trained, baselines, styles)
    columns = [(fam, x) for fam in families for x in ("iteration", "time_s")]
    marked: set[str] = set()  # which of the before / final eval marks were drawn

    fig, axes = plt.subplots(
        len(rows),
        len(columns),
        figsize=(3.5 * len(columns) + 3.8, (2.6 if len(rows) <= 4 else 2.2) * len(rows) + 1.0),
        squeeze=False,
        sharey="row",
        sharex="col",
        layout="constrained",
    )
    for c, (fam, x_key) in enumerate(columns):
        fam_runs = [r for r in trained if r.family == fam]
        algos = ", ".join(sorted({r.agent for r in fam_runs}))
        times = [_number(row.get("time_s")) for r in fam_runs for row in r.curve]
        scale, unit = _time_unit(max([t for t in times if t is not None], default=0.0))
        if x_key == "iteration":
            xlabel = "env steps" if fam == "dqn" else "iteration"
            title = f"{algos}: by {xlabel}"
        else:
            xlabel = f"wall-clock ({unit})"
            title = f"{algos}: by wall-clock"
        for r_i, (kind, metric, keys, ylabel) in enumerate(rows):
            ax = axes[r_i][c]
            for group in (g for g in groups if not g.baseline and g.family == fam):
                if kind == "train":
                    curves = [s for s in (_series(m, keys, x_key) for m in group.runs) if s is not None]
                    _draw_group(ax, group, curves, scale if x_key == "time_s" else 1.0)
                    continue
                points = [_eval_points(m, metric, x_key) for m in group.runs]
                curves = [p["series"] for p in points if p["series"] is not None]
                s = scale if x_key == "time_s" else 1.0
                _draw_group(ax, group, curves, s)
                for which, marks in (("before", _BEFORE), ("final", _FINAL)):
                    point = _mean_point([p[which] for p in points])
                    if point is not None:
                        marked.add(which)
                        kw = dict(marks)
                        if which == "before":
                            kw["markeredgecolor"] = group.style.colour
                        ax.plot([point[0] / s], [point[1]], color=group.style.colour, zorder=5, **kw)
            if kind == "eval":
                for group in (g for g in groups if g.baseline):
                    value = mean_stderr(_seed_values(group.runs, lambda m, k=metric: m.metric(k), True))[0]
                    if not math.isnan(value):
                        ax.axhline(value, color=group.style.colour, linestyle=group.style.linestyle, lw=1.2)
            # iterations and env steps are whole numbers: no tick at iteration 0.5
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, min_n_ticks=3, integer=x_key == "iteration"))
            if x_key == "iteration" and fam == "dqn":
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            if metric in ("success_rate", "invalid_rate"):
                ax.set_ylim(-0.04, 1.04)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel(ylabel, fontsize=9)
            if r_i == len(rows) - 1:
                ax.set_xlabel(xlabel, fontsize=9)
            if r_i == 0:
                ax.set_title(textwrap.fill(title, 40), fontsize=9)
            ax.tick_params(labelsize=8)
    title = f"Learning curves: {env} (bands: mean ± stderr over seeds)"
    title += f"\nall entries: {textwrap.shorten(common, 140)}" if common else ""
    _add_legend(fig, _legend_handles(groups, marked), title=title)
    return fig


def figure_final_eval(groups: Sequence[GroupSummary], styles: dict[StyleKey, Style] | None = None) -> Any:
    """Horizontal bars of the final held-out eval per group of complete runs (success rate and mean
    return, one row of panels per env; error bars: stderr over seeds; hollow circle: before training).
    Each group's name sits on its own row of the y-axis, so names never overlap however many groups."""
    if not groups:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    envs = sorted({g.env for g in groups})
    per_env = {e: [g for g in groups if g.env == e] for e in envs}
    keys = {id(g): (g.head, "-", g.variant, "") for g in groups}
    styles = styles if styles is not None else style_map(keys.values())
    labeller = _Labeller.of(list(keys.values()))
    labels = {id(g): labeller(keys[id(g)], width=34) + f"\n({seeds_text(g)})" for g in groups}
    line_pitch = 0.16  # inches per label line at font size 8
    heights = [
        max(1.6, sum(max(2, labels[id(g)].count("\n") + 1) for g in members) * line_pitch + 0.9)
        for members in per_env.values()
    ]
    has_before = any(not math.isnan(g.before_success) for g in groups)
    fig, axes = plt.subplots(
        len(envs),
        2,
        figsize=(13.5, sum(heights) + 0.8),
        squeeze=False,
        layout="constrained",
        height_ratios=heights,
    )
    for r_i, env in enumerate(envs):
        members = per_env[env]
        spans = [max(2, labels[id(g)].count("\n") + 1) for g in members]
        ys = np.cumsum([0.0, *spans[:-1]]) + np.asarray(spans) / 2  # centres, one slot per label line
        bar_h = np.minimum(1.4, np.asarray(spans) * 0.6)
        colours = [styles[keys[id(g)]].colour for g in members]
        for c_i, (attr, before_attr, xlabel) in enumerate(
            (
                ("success", "before_success", "success rate (share of episodes)"),
                ("episode_return", "before_return", "mean episode return"),
            )
        ):
            ax = axes[r_i][c_i]
            means = np.array([getattr(g, attr)[0] for g in members], dtype=float)
            errs = np.array([getattr(g, attr)[1] for g in members], dtype=float)
            bars = ax.barh(
                ys,
                np.nan_to_num(means),
                height=bar_h,
                xerr=np.where(np.isnan(errs), 0.0, errs),
                capsize=3,
                color=colours,
                edgecolor="black",
                linewidth=0.4,
            )
            for bar, g in zip(bars, members, strict=True):
                bar.set_hatch(styles[keys[id(g)]].hatch)
            before = np.array([getattr(g, before_attr) for g in members], dtype=float)
            ok = ~np.isnan(before)
            if ok.any():
                ax.plot(before[ok], ys[ok], color="black", markeredgecolor="black", zorder=5, **_BEFORE)
            finite = means[~np.isnan(means)]
            lo = min(
                0.0,
                float(finite.min()) if finite.size else 0.0,
                float(np.nanmin(before)) if ok.any() else 0.0,
            )
            hi = max(0.0, float(np.nanmax(means + np.nan_to_num(errs))) if finite.size else 0.0)
            hi = max(hi, float(np.nanmax(before)) if ok.any() else hi)
            if attr == "success":
                lo, hi = 0.0, 1.0
            pad = 0.2 * (hi - lo or 1.0)
            ax.set_xlim(lo - (0.05 * (hi - lo) if lo < 0 else 0), hi + pad)
            for y, m, e in zip(ys, means, errs, strict=True):
                if not math.isnan(m):  # the value past the error bar's end so both stay readable
                    ax.annotate(
                        f"{m:.2f}",
                        (max(m, m + (0 if math.isnan(e) else e), 0.0), y),
                        xytext=(4, 0),
                        textcoords="offset points",
                        fontsize=8,
                        va="center",
                    )
            ax.set_ylim(float(sum(spans)), 0.0)  # first group on top
            ax.set_yticks(ys)
            if c_i == 0:
                ax.set_yticklabels([labels[id(g)] for g in members], fontsize=8)
            else:
                ax.tick_params(labelleft=False)
            ax.set_xlabel(xlabel, fontsize=9)
            ax.set_title(f"{env}: {xlabel.split(' (')[0]}", fontsize=10)
            ax.axvline(0, color="black", lw=0.6)
            ax.grid(axis="x", alpha=0.3)
            ax.tick_params(axis="x", labelsize=8)
    title = "Final eval on held-out episodes, complete runs (error bars: stderr over seeds)"
    title += f"\nall groups: {textwrap.shorten(labeller.common, 140)}" if labeller.common else ""
    if has_before:
        handle = Line2D([], [], color="black", markeredgecolor="black", label="before training", **_BEFORE)
        _add_legend(fig, [handle], title=title)
    else:
        fig.suptitle(title, fontsize=11)
    return fig


def _save(fig: Any, path: Path, dpi: int = 110) -> Path:
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


def plot_learning_curves(
    runs: Sequence[RunRecord], out_dir: Path, styles: dict[StyleKey, Style] | None = None
) -> list[Path]:
    """`curves_<env>.png` per env with curves (see `figure_learning_curves`)."""
    styles = styles if styles is not None else style_map(_style_keys(runs))
    written = []
    for env in sorted({r.env for r in runs if r.curve and r.status != CORRUPT}):
        fig = figure_learning_curves(runs, env, styles)
        if fig is not None:
            written.append(_save(fig, out_dir / f"curves_{_slug(env)}.png"))
    return written


def plot_final_eval(
    groups: Sequence[GroupSummary], out_dir: Path, styles: dict[StyleKey, Style] | None = None
) -> Path | None:
    """`final_eval.png` (see `figure_final_eval`)."""
    fig = figure_final_eval(groups, styles)
    return None if fig is None else _save(fig, out_dir / "final_eval.png")
