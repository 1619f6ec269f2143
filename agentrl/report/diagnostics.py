"""The RLFT decision-making diagnostics (eval.json `diagnostics`, agentrl/diagnostics.py) in the report:
regret and coverage over the steps of an episode as one PNG per env, and markdown / terminal tables of
greediness, frequency bias and the knowing-doing gap per group of complete runs.

A group pools the episodes of all its runs (seeds): curves are the mean ± stderr over every episode
that reached step t, recombined exactly from each run's per-step (episodes, mean, stderr); shares are
pooled counts (greedy pulls / judged pulls, ...), so a run with more episodes weighs more.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.report.runs import GroupSummary, md_table

log = logging.getLogger(__name__)


@dataclass
class DecisionSummary:
    """One group's pooled diagnostics."""

    group: GroupSummary
    episodes: int = 0
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    regret: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))  # (mean, stderr) per step
    coverage: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))
    final_regret: tuple[float, float] = (math.nan, math.nan)
    final_coverage: tuple[float, float] = (math.nan, math.nan)
    greedy: tuple[int, int] = (0, 0)  # (greedy pulls, judged pulls)
    frequency: tuple[int, int, float] = (0, 0, 0.0)  # (repeats, cases, summed chance)
    #: label -> (repeats, cases, summed chance share)
    bins: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    knowing: dict[str, int] = field(default_factory=dict)  # summed knowing-doing counts

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.group.head, "-", self.group.variant, "")

    def rate(self, part: str, whole: str) -> float:
        n = self.knowing.get(whole, 0)
        return self.knowing.get(part, 0) / n if n else math.nan


def _pool_curve(parts: list[tuple[list[int], list[float], list[float]]]) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and stderr over the union of episodes from per-run (n, mean, stderr) at each step."""
    horizon = max(len(n) for n, _, _ in parts)
    means, errs = np.full(horizon, np.nan), np.full(horizon, np.nan)
    for t in range(horizon):
        rows = [(n[t], m[t], e[t]) for n, m, e in parts if len(n) > t and n[t] > 0]
        total = sum(n for n, _, _ in rows)
        if not total:
            continue
        mean = sum(n * m for n, m, _ in rows) / total
        # within-run sum of squares from the stderr (s^2 = se^2 n), plus the between-run part
        ss = sum((n - 1) * (e * e * n) + n * (m - mean) ** 2 for n, m, e in rows)
        means[t] = mean
        errs[t] = math.sqrt(ss / (total - 1) / total) if total > 1 else 0.0
    return means, errs


def _num(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def summarise_decisions(groups: Sequence[GroupSummary]) -> list[DecisionSummary]:
    """The pooled diagnostics of every group with at least one run whose eval.json has them."""
    out = []
    for group in groups:
        found = [r.eval["diagnostics"] for r in group.runs if isinstance(r.eval.get("diagnostics"), dict)]
        found = [d for d in found if isinstance(d.get("curves"), dict)]
        if not found:
            continue
        summary = DecisionSummary(group, episodes=sum(int(d.get("episodes", 0)) for d in found))
        curves = [d["curves"] for d in found]
        steps = max((c.get("step", []) for c in curves), key=len)
        summary.steps = np.asarray(steps, dtype=float)
        for name in ("regret", "coverage"):
            parts = [
                (c.get("episodes", []), c.get(f"{name}_mean", []), c.get(f"{name}_stderr", []))
                for c in curves
            ]
            setattr(summary, name, _pool_curve(parts))
        summary.final_regret = _final(found, "final_regret")
        summary.final_coverage = _final(found, "final_coverage")
        summary.greedy = (
            sum(int(d.get("greediness", {}).get("greedy", 0)) for d in found),
            sum(int(d.get("greediness", {}).get("cases", 0)) for d in found),
        )
        freq = [d.get("frequency_bias", {}) for d in found]
        summary.frequency = (
            sum(int(f.get("repeats", 0)) for f in freq),
            sum(int(f.get("cases", 0)) for f in freq),
            sum((_num(f.get("chance_share")) or 0.0) * int(f.get("cases", 0)) for f in freq),
        )
        for f in freq:
            for row in f.get("bins", []):
                repeats, cases, chance = summary.bins.get(str(row.get("bin")), (0, 0, 0.0))
                n = int(row.get("cases", 0))
                summary.bins[str(row.get("bin"))] = (
                    repeats + int(row.get("repeats", 0)),
                    cases + n,
                    chance + (_num(row.get("chance_share")) or 0.0) * n,
                )
        for d in found:
            kd = d.get("knowing_doing")
            if isinstance(kd, dict):
                for key, value in kd.items():
                    if isinstance(value, int) and not isinstance(value, bool):
                        summary.knowing[key] = summary.knowing.get(key, 0) + value
        out.append(summary)
    return out


def _final(found: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """Pooled mean and stderr of a per-run (mean, stderr) over episodes."""
    parts = []
    for d in found:
        block, n = d.get(key), int(d.get("episodes", 0))
        if isinstance(block, dict) and _num(block.get("mean")) is not None and n:
            parts.append(([n], [float(block["mean"])], [_num(block.get("stderr")) or 0.0]))
    if not parts:
        return math.nan, math.nan
    mean, err = _pool_curve(parts)
    return float(mean[0]), float(err[0])


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
def figure_decision_curves(summaries: Sequence[DecisionSummary], env: str, styles: dict | None = None) -> Any:
    """Cumulative regret and action coverage over the steps of an episode, one line per group (mean with
    a ± stderr band over its episodes), for the groups of `env`; None when none has diagnostics."""
    members = [s for s in summaries if s.group.env == env and s.steps.size]
    if not members:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from agentrl.report.plots import _add_legend, _Labeller, style_map

    keys = [s.key for s in members]
    styles = styles if styles is not None else style_map(keys)
    labeller = _Labeller.of(keys)
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6), layout="constrained")
    panels = (
        ("regret", "cumulative expected regret", "Cumulative regret"),
        ("coverage", "action coverage (share of arms tried)", "Action coverage"),
    )
    handles = []
    for i, s in enumerate(members):
        st = styles.get(s.key)
        colour = st.colour if st is not None else f"C{i % 10}"
        linestyle = st.linestyle if st is not None else "-"
        marker = st.marker if st is not None else None
        for ax, (attr, _, _) in zip(axes, panels, strict=True):
            mean, err = getattr(s, attr)
            n = min(len(mean), len(s.steps))
            xs, ys, es = s.steps[:n], mean[:n], np.nan_to_num(err[:n])
            ax.plot(
                xs,
                ys,
                color=colour,
                linestyle=linestyle,
                lw=1.8,
                marker=marker,
                markevery=max(1, n // 8),
                markersize=4,
            )
            ax.fill_between(xs, ys - es, ys + es, color=colour, alpha=0.2, lw=0)
        label = labeller(s.key) + f" ({s.episodes} episodes, {len(s.group.runs)} run"
        label += "s)" if len(s.group.runs) != 1 else ")"
        handles.append(Line2D([], [], color=colour, linestyle=linestyle, marker=marker, lw=1.8, label=label))
    for ax, (attr, ylabel, title) in zip(axes, panels, strict=True):
        ax.set_xlabel("step t (pulls so far)", fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_title(f"{env}: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        ax.set_xlim(left=0)
        if attr == "coverage":
            ax.set_ylim(-0.02, 1.04)
        else:
            ax.set_ylim(bottom=0)
    title = (
        "Decision-making diagnostics on held-out episodes\n(bands: mean ± stderr over episodes, seeds pooled)"
    )
    title += f"; all entries: {textwrap.shorten(labeller.common, 60)}" if labeller.common else ""
    _add_legend(fig, handles, title=title)
    return fig


def plot_decision_curves(
    groups: Sequence[GroupSummary], out_dir: Path, styles: dict | None = None
) -> list[Path]:
    """`decisions_<env>.png` for every env whose runs carry diagnostics (`figure_decision_curves`)."""
    from agentrl.report.plots import _save, _slug

    summaries = summarise_decisions(groups)
    written = []
    for env in sorted({s.group.env for s in summaries}):
        try:
            fig = figure_decision_curves(summaries, env, styles)
        except Exception as exc:  # noqa: BLE001 - one env's figure must not cost the report's other plots
            log.error("report: decision diagnostics plot for %s failed: %s", env, exc)
            continue
        if fig is not None:
            written.append(_save(fig, Path(out_dir) / f"decisions_{_slug(env)}.png"))
    return written


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------
DECISION_HEADERS = [
    "group",
    "episodes",
    "final regret",
    "final coverage",
    "greedy",
    "frequent",
    "frequent (chance)",
    "knowing",
    "doing given knowing",
    "greedy given knowing",
    "rationales judged",
]


def _cell(value: float, digits: int = 3) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _pm(pair: tuple[float, float], digits: int = 3) -> str:
    mean, err = pair
    if math.isnan(mean):
        return "–"
    return _cell(mean, digits) if math.isnan(err) else f"{mean:.{digits}f} ± {err:.{digits}f}"


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def decision_rows(summaries: Sequence[DecisionSummary]) -> list[list[str]]:
    """One row per group: the `DECISION_HEADERS` cells."""
    rows = []
    for s in summaries:
        repeats, cases, chance = s.frequency
        judged = s.knowing.get("judged", 0)
        rows.append(
            [
                s.group.label,
                str(s.episodes),
                _pm(s.final_regret, 2),
                _pm(s.final_coverage),
                _cell(_ratio(*s.greedy)),
                _cell(_ratio(repeats, cases)),
                _cell(_ratio(chance, cases)),
                _cell(s.rate("knowing", "judged")),
                _cell(s.rate("knowing_doing", "knowing")),
                _cell(s.rate("knowing_greedy", "knowing")),
                str(judged) if s.knowing else "–",
            ]
        )
    return rows


def frequency_rows(summaries: Sequence[DecisionSummary]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the frequency-bias table: per count bin, `share repeated / chance (cases)`."""
    labels: list[str] = []
    for s in summaries:
        labels += [b for b in s.bins if b not in labels]
    rows = []
    for s in summaries:
        cells = []
        for b in labels:
            repeats, cases, chance = s.bins.get(b, (0, 0, 0.0))
            share, expected = _cell(_ratio(repeats, cases), 2), _cell(_ratio(chance, cases), 2)
            cells.append(f"{share} / {expected} ({cases})" if cases else "–")
        rows.append([s.group.label, *cells])
    return ["group", *(f"count {b}" for b in labels)], rows


def diagnostics_markdown(groups: Sequence[GroupSummary]) -> list[str]:
    """The report.md section (a list of lines; empty when no run has diagnostics)."""

    summaries = summarise_decisions(groups)
    if not summaries:
        return []
    parts = [
        "## Decision-making diagnostics",
        "",
        "The RLFT paper's diagnostics on the held-out eval episodes of bandit-like envs "
        "(docs/algorithms.md#rlft-diagnostics), episodes of all seeds pooled. final regret / coverage: "
        "cumulative expected regret and share of arms tried at the last step (mean ± stderr over episodes); "
        "greedy: share of pulls 2..T of an empirically best arm; frequent: share of pulls 2..T of a most "
        "frequent arm of the context, beside what a uniformly random choice scores; knowing: share of "
        "judged rationales naming a UCB-optimal arm; doing given knowing: share of those whose action is "
        "UCB-optimal; greedy given knowing: share of those whose action is instead an empirically best arm.",
        "",
    ]
    for env in sorted({s.group.env for s in summaries}):
        members = [s for s in summaries if s.group.env == env]
        headers, rows = frequency_rows(members)
        parts += [
            f"### {env}",
            "",
            md_table(DECISION_HEADERS, decision_rows(members)),
            "",
            "Frequency bias by how often the most frequent arm already appears in the context: share of "
            "pulls that repeat it / share a uniformly random choice would (cases).",
            "",
            md_table(headers, rows),
            "",
        ]
    return parts


def print_diagnostics(groups: Sequence[GroupSummary], console: Any) -> None:
    """The diagnostics table per env on the terminal (nothing when no run has diagnostics); split into
    several tables, each with the group column, where it is wider than the terminal."""
    from agentrl.report.layout import print_fitted

    summaries = summarise_decisions(groups)
    for env in sorted({s.group.env for s in summaries}):
        rows = decision_rows([s for s in summaries if s.group.env == env])
        # columns empty for every group (no rationales: no knowing-doing) only cost width
        shown = [i for i in range(len(DECISION_HEADERS)) if i == 0 or any(r[i] != "–" for r in rows)]
        print_fitted(
            console,
            f"{env}: decision-making diagnostics (episodes pooled over seeds)",
            [DECISION_HEADERS[i] for i in shown],
            [[r[i] for i in shown] for r in rows],
            right=range(1, len(shown)),
        )
