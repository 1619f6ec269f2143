"""Aggregate run directories into tables (markdown, CSV, rich) and PNG plots.

A run directory is any directory holding `.hydra/config.yaml` (single runs and the job directories of
a multirun sweep alike). What is read from each run:

- `.hydra/config.yaml` -> env, agent or algo, model, seed; `.hydra/overrides.yaml` -> key overrides;
- `eval.json` -> final metrics (success_rate, mean_return, return_stderr, mean_length, invalid_rate,
  episodes, train_time_s; a `before` sub-dict for LLM training);
- `metrics.jsonl` -> learning curves (iteration, time_s, success_rate / mean_return, ...).

A run without `eval.json` is *incomplete* (still running or killed); a run whose config or eval file
cannot be parsed is *corrupt*. Both are listed with their status and never stop the report.

Aggregates are over seeds: runs that share (env, agent/algo, model) and the same non-seed overrides
form a group, reported as mean ± standard error across seeds (stderr = sample std / sqrt(n)).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.errors import RunDirError

log = logging.getLogger(__name__)

#: algorithms whose policy is not an LLM (the `model` config group is irrelevant for them)
NON_LLM_ALGOS = frozenset({"dqn"})
#: agents that are not LLMs
NON_LLM_AGENTS = frozenset({"random", "planner", "human"})
#: override keys that are columns already or bookkeeping, so they do not define a variant
_NON_VARIANT_KEYS = frozenset({"env", "agent", "algo", "model", "seed", "task", "name"})
#: metrics.jsonl keys tried in order for each curve
SUCCESS_KEYS = ("success_rate", "train/success_rate", "success", "eval_success_rate", "eval/success_rate")
RETURN_KEYS = (
    "mean_return",
    "train/mean_return",
    "episode_return",
    "return",
    "eval_mean_return",
    "eval/mean_return",
    "ep_rew_mean",
)

RUN_COLUMNS = [
    "run",
    "status",
    "env",
    "agent",
    "model",
    "seed",
    "overrides",
    "success_rate",
    "mean_return",
    "return_stderr",
    "mean_length",
    "invalid_rate",
    "episodes",
    "train_time_s",
    "before_success_rate",
    "before_mean_return",
    "error",
]
GROUP_COLUMNS = [
    "env",
    "agent",
    "model",
    "variant",
    "runs",
    "success_mean",
    "success_stderr",
    "return_mean",
    "return_stderr",
    "length_mean",
    "invalid_rate_mean",
    "train_time_s_mean",
]


@dataclass
class RunRecord:
    """One run directory as the report sees it."""

    path: Path  # as found (root as the user gave it / relative part)
    status: str  # "complete" | "incomplete" | "corrupt"
    env: str = "?"
    agent: str = "?"  # the algorithm for training runs, else the agent
    model: str = "-"
    seed: int | None = None
    overrides: list[str] = field(default_factory=list)  # key overrides (not env/agent/algo/model/seed)
    eval: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl rows
    error: str = ""
    label: str = ""  # short name for tables: the path from the searched directory's name down

    def __post_init__(self) -> None:
        self.label = self.label or str(self.path)

    @property
    def group_key(self) -> tuple[str, str, str, str]:
        return (self.env, self.agent, self.model, self.variant)

    @property
    def variant(self) -> str:
        return ",".join(self.overrides)

    def metric(self, key: str) -> float | None:
        value = self.eval.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def row(self) -> dict[str, Any]:
        """The CSV row: raw numbers exactly as in eval.json."""
        before = self.eval.get("before") if isinstance(self.eval.get("before"), dict) else {}
        return {
            "run": str(self.path),
            "status": self.status,
            "env": self.env,
            "agent": self.agent,
            "model": self.model,
            "seed": "" if self.seed is None else self.seed,
            "overrides": " ".join(self.overrides),
            "success_rate": _blank(self.metric("success_rate")),
            "mean_return": _blank(self.metric("mean_return")),
            "return_stderr": _blank(self.metric("return_stderr")),
            "mean_length": _blank(self.metric("mean_length")),
            "invalid_rate": _blank(self.metric("invalid_rate")),
            "episodes": _blank(self.metric("episodes")),
            "train_time_s": _blank(self.metric("train_time_s")),
            "before_success_rate": _blank(before.get("success_rate")),
            "before_mean_return": _blank(before.get("mean_return")),
            "error": self.error,
        }


@dataclass
class GroupSummary:
    """Mean ± stderr over the seeds of one (env, agent/algo, model, variant)."""

    env: str
    agent: str
    model: str
    variant: str
    runs: list[RunRecord]
    success: tuple[float, float]  # (mean, stderr); stderr is nan for a single run
    episode_return: tuple[float, float]
    length: float
    invalid_rate: float
    train_time_s: float

    @property
    def label(self) -> str:
        parts = (
            [self.agent]
            + ([self.model] if self.model != "-" else [])
            + ([self.variant] if self.variant else [])
        )
        return " / ".join(parts)

    def row(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "agent": self.agent,
            "model": self.model,
            "variant": self.variant,
            "runs": len(self.runs),
            "success_mean": _blank(self.success[0]),
            "success_stderr": _blank(self.success[1]),
            "return_mean": _blank(self.episode_return[0]),
            "return_stderr": _blank(self.episode_return[1]),
            "length_mean": _blank(self.length),
            "invalid_rate_mean": _blank(self.invalid_rate),
            "train_time_s_mean": _blank(self.train_time_s),
        }


@dataclass
class Report:
    runs: list[RunRecord]
    groups: list[GroupSummary]
    out_dir: Path
    files: list[Path] = field(default_factory=list)  # report.md, report.csv, report_groups.csv, PNGs

    @property
    def plots(self) -> list[Path]:
        return [p for p in self.files if p.suffix == ".png"]


# ---------------------------------------------------------------------------------------------
# discovery and loading
# ---------------------------------------------------------------------------------------------
def find_runs(paths: Sequence[Path]) -> list[Path]:
    """Every directory under `paths` (recursively, the paths themselves included) with
    `.hydra/config.yaml`, in sorted order, each once."""
    found: dict[Path, Path] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise RunDirError(f"report: {root} does not exist")
        candidates = [root] if (root / ".hydra" / "config.yaml").is_file() else []
        candidates += sorted(p.parent.parent for p in root.rglob(".hydra/config.yaml"))
        for run in candidates:
            found.setdefault(run.resolve(), run)
    return sorted(found.values(), key=str)


def load_run(run_dir: Path) -> RunRecord:
    """Read one run directory; problems become the record's status, never an exception."""
    try:
        cfg = _load_config(run_dir / ".hydra" / "config.yaml")
    except Exception as exc:  # noqa: BLE001 - any parse failure means a corrupt run
        return RunRecord(path=run_dir, status="corrupt", error=f"config.yaml: {_short(exc)}")
    record = RunRecord(path=run_dir, status="incomplete")
    _describe(record, cfg, _load_overrides(run_dir / ".hydra" / "overrides.yaml"))
    record.curve, bad_lines = _load_metrics(run_dir / "metrics.jsonl")
    eval_path = run_dir / "eval.json"
    if eval_path.is_file():
        try:
            data = json.loads(eval_path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            record.eval, record.status = data, "complete"
        except (ValueError, OSError) as exc:
            record.status, record.error = "corrupt", f"eval.json: {_short(exc)}"
    else:
        record.error = "no eval.json" + (
            f" (trained to iteration {record.curve[-1].get('iteration')})" if record.curve else ""
        )
    if bad_lines:
        record.error = "; ".join(
            filter(None, [record.error, f"metrics.jsonl: {bad_lines} unreadable line(s)"])
        )
    _fill_from_eval(record)
    return record


def _short_label(run_dir: Path, roots: Sequence[Path]) -> str:
    """`<root name>/<path below it>` for the first searched root that holds the run."""
    resolved = run_dir.resolve()
    for root in roots:
        try:
            rel = resolved.relative_to(Path(root).resolve())
        except ValueError:
            continue
        name = Path(root).resolve().name
        return name if str(rel) == "." else f"{name}/{rel}"
    return str(run_dir)


def _load_config(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    try:  # Hydra saves config.yaml unresolved (e.g. name: ${task}_${env.name})
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # noqa: BLE001 - an unregistered resolver: keep the raw values
        data = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(data, dict):
        raise ValueError("not a mapping")
    return data


def _load_overrides(path: Path) -> list[str]:
    if not path.is_file():
        return []
    try:
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(OmegaConf.load(path))
        return [str(x) for x in data] if isinstance(data, list) else []
    except Exception:  # noqa: BLE001 - overrides are informative only
        return []


def _load_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """metrics.jsonl rows; a run killed mid-write may leave a truncated last line, which is skipped."""
    if not path.is_file():
        return [], 0
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def _name(section: Any) -> str | None:
    if isinstance(section, dict) and section.get("name") is not None:
        return str(section["name"])
    return None


def _describe(record: RunRecord, cfg: dict[str, Any], overrides: list[str]) -> None:
    env, agent, algo, model = (_name(cfg.get(k)) for k in ("env", "agent", "algo", "model"))
    record.env = env or "?"
    if algo is not None and cfg.get("task", "train") == "train":  # a training run: name it by its algorithm
        record.agent = algo
        llm = algo not in NON_LLM_ALGOS
    else:
        record.agent = agent or "?"
        llm = agent not in NON_LLM_AGENTS
    record.model = (model or "?") if llm else "-"
    seed = cfg.get("seed")
    record.seed = int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None
    record.overrides = [
        o for o in overrides if _override_key(o) not in _NON_VARIANT_KEYS and not _is_hydra(o)
    ]


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _is_hydra(override: str) -> bool:
    return _override_key(override).startswith("hydra.")


def _fill_from_eval(record: RunRecord) -> None:
    """eval.json may name env/agent/algo/model/seed too (write_eval extras): use them where the
    config did not say."""
    ev = record.eval
    if record.env == "?" and ev.get("env"):
        record.env = str(ev["env"])
    if record.agent == "?" and (ev.get("algo") or ev.get("agent")):
        record.agent = str(ev.get("algo") or ev.get("agent"))
    if record.seed is None and isinstance(ev.get("seed"), int):
        record.seed = int(ev["seed"])


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _blank(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    return value


# ---------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------
def mean_stderr(values: Iterable[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n)); stderr is nan for n < 2."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return math.nan, math.nan
    if arr.size == 1:
        return float(arr[0]), math.nan
    return float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(arr.size))


def summarise_groups(runs: Sequence[RunRecord]) -> list[GroupSummary]:
    """Aggregate complete runs over seeds, grouped by (env, agent/algo, model, variant)."""
    groups: dict[tuple[str, str, str, str], list[RunRecord]] = {}
    for run in runs:
        if run.status == "complete":
            groups.setdefault(run.group_key, []).append(run)
    summaries = []
    for (env, agent, model, variant), members in sorted(groups.items()):

        def values(key: str, members: list[RunRecord] = members) -> list[float]:
            return [v for v in (m.metric(key) for m in members) if v is not None]

        summaries.append(
            GroupSummary(
                env=env,
                agent=agent,
                model=model,
                variant=variant,
                runs=members,
                success=mean_stderr(values("success_rate")),
                episode_return=mean_stderr(values("mean_return")),
                length=mean_stderr(values("mean_length"))[0],
                invalid_rate=mean_stderr(values("invalid_rate"))[0],
                train_time_s=mean_stderr(values("train_time_s"))[0],
            )
        )
    return summaries


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


RUN_HEADERS = [
    "run",
    "status",
    "env",
    "agent/algo",
    "model",
    "seed",
    "overrides",
    "success",
    "return ± stderr",
    "length",
    "invalid",
    "train time",
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
    "train time",
]


def run_table_rows(runs: Sequence[RunRecord]) -> list[list[str]]:
    rows = []
    for r in runs:
        error = r.error if len(r.error) <= 70 else r.error[:69] + "…"
        status = r.status if not r.error or r.status == "complete" else f"{r.status}: {error}"
        rows.append(
            [
                r.label,
                status,
                r.env,
                r.agent,
                r.model,
                "" if r.seed is None else str(r.seed),
                " ".join(r.overrides),
                _fmt(r.metric("success_rate")),
                _pm(r.metric("mean_return"), r.metric("return_stderr")),
                _fmt(r.metric("mean_length"), 1),
                _fmt(r.metric("invalid_rate")),
                _duration(r.metric("train_time_s")),
            ]
        )
    return rows


def group_table_rows(groups: Sequence[GroupSummary]) -> list[list[str]]:
    return [
        [
            g.env,
            g.agent,
            g.model,
            g.variant,
            str(len(g.runs)),
            _pm(*g.success),
            _pm(*g.episode_return),
            _fmt(g.length, 1),
            _fmt(g.invalid_rate),
            _duration(g.train_time_s),
        ]
        for g in groups
    ]


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(report: Report) -> str:
    counts = {s: sum(r.status == s for r in report.runs) for s in ("complete", "incomplete", "corrupt")}
    parts = [
        "# agentrl report",
        "",
        f"{len(report.runs)} runs: {counts['complete']} complete, {counts['incomplete']} incomplete, "
        f"{counts['corrupt']} corrupt.",
        "",
        "## Aggregates over seeds",
        "",
        "Mean ± standard error across seeds (runs sharing env, agent/algo, model and non-seed overrides). "
        "Success is the share of held-out eval episodes solved; return is the mean undiscounted episode "
        "return; length is in agent moves; invalid is the share of moves whose answer was invalid.",
        "",
        _md_table(GROUP_HEADERS, group_table_rows(report.groups)) if report.groups else "_no complete runs_",
        "",
        "## Runs",
        "",
        "Return ± standard error over the run's eval episodes.",
        "",
        _md_table(RUN_HEADERS, run_table_rows(report.runs)),
        "",
    ]
    plots = report.plots
    if plots:
        parts += ["## Plots", ""]
        parts += [f"![{p.stem}]({p.name})" for p in plots]
        parts.append("")
    return "\n".join(parts)


def print_report(report: Report, console: Any) -> None:
    """Print the group and run tables with rich."""
    from rich.table import Table

    if report.groups:
        table = Table(title="Aggregates over seeds (mean ± stderr)", title_justify="left")
        for h in GROUP_HEADERS:
            table.add_column(
                h, justify="right" if h in {"seeds", "length", "invalid", "train time"} else "left"
            )
        for row in group_table_rows(report.groups):
            table.add_row(*row)
        console.print(table)
    table = Table(title="Runs", title_justify="left")
    for h in RUN_HEADERS:
        table.add_column(h, overflow="fold")
    styles = {"complete": "", "incomplete": "yellow", "corrupt": "red"}
    for record, row in zip(report.runs, run_table_rows(report.runs), strict=True):
        table.add_row(*row, style=styles.get(record.status, ""))
    console.print(table)
    if report.files:
        console.print("Wrote " + ", ".join(str(p) for p in report.files))


def _write_csv(path: Path, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
def _curve(run: RunRecord, keys: Sequence[str], x_key: str) -> tuple[np.ndarray, np.ndarray] | None:
    for key in keys:
        pts = [
            (float(row[x_key]), float(row[key]))
            for row in run.curve
            if isinstance(row.get(x_key), (int, float)) and isinstance(row.get(key), (int, float))
        ]
        if pts:
            pts.sort()
            xs, ys = zip(*pts, strict=True)
            return np.asarray(xs), np.asarray(ys)
    return None


def _plot_label(agent: str, model: str, variant: str, width: int = 32, max_lines: int = 4) -> str:
    """A legend / tick label: agent, model, then the variant's overrides wrapped a few per line."""
    head = " / ".join(p for p in (agent, model if model != "-" else "") if p)
    lines: list[str] = []
    for item in filter(None, variant.split(",")):
        if lines and len(lines[-1]) + len(item) + 1 <= width:
            lines[-1] += "," + item
        else:
            lines.append(item)
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], f"... (+{len(lines) - max_lines + 1} more)"]
    return "\n".join([head, *lines])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "env"


def plot_learning_curves(runs: Sequence[RunRecord], out_dir: Path) -> list[Path]:
    """One PNG per env: success and return vs iteration and vs wall-clock minutes. Each run is a thin
    line coloured by its group; a group with several seeds adds its mean ± stderr band (on the common
    range of its runs, linearly interpolated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    by_env: dict[str, list[RunRecord]] = {}
    for run in runs:
        if run.curve and run.status != "corrupt":
            by_env.setdefault(run.env, []).append(run)
    for env, env_runs in sorted(by_env.items()):
        metrics = [
            (name, keys)
            for name, keys in (("success rate", SUCCESS_KEYS), ("mean episode return", RETURN_KEYS))
            if any(_curve(r, keys, "iteration") for r in env_runs)
        ]
        if not metrics:
            continue
        groups: dict[tuple[str, str, str, str], list[RunRecord]] = {}
        for run in env_runs:
            groups.setdefault(run.group_key, []).append(run)
        colours = plt.get_cmap("tab10")
        fig, axes = plt.subplots(
            len(metrics), 2, figsize=(13, 4.5 * len(metrics)), squeeze=False, layout="constrained"
        )
        for row, (ylabel, keys) in enumerate(metrics):
            for col, (x_key, xlabel, scale) in enumerate(
                (
                    ("iteration", "training iteration (env steps for DQN)", 1.0),
                    ("time_s", "wall-clock (min)", 60.0),
                )
            ):
                ax = axes[row][col]
                for gi, (gkey, members) in enumerate(sorted(groups.items())):
                    colour = colours(gi % 10)
                    label = _plot_label(gkey[1], gkey[2], gkey[3])
                    curves = [c for c in (_curve(m, keys, x_key) for m in members) if c is not None]
                    single = len(curves) == 1
                    for xs, ys in curves:
                        ax.plot(
                            xs / scale,
                            ys,
                            color=colour,
                            lw=1.8 if single else 0.8,
                            alpha=1.0 if single else 0.45,
                            marker="o" if len(xs) <= 20 else None,  # a short run's points stay visible
                            markersize=3,
                            label=f"{label} (1 run)" if single else None,
                        )
                    if len(curves) >= 2:
                        lo = max(c[0][0] for c in curves)
                        hi = min(c[0][-1] for c in curves)
                        if hi > lo:
                            grid = np.linspace(lo, hi, 100)
                            stack = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
                            mean = stack.mean(axis=0)
                            err = stack.std(axis=0, ddof=1) / math.sqrt(len(curves))
                            ax.plot(
                                grid / scale, mean, color=colour, lw=2, label=f"{label} ({len(curves)} seeds)"
                            )
                            ax.fill_between(grid / scale, mean - err, mean + err, color=colour, alpha=0.25)
                        else:  # no common range: label the first line instead
                            ax.lines[-1].set_label(f"{label} ({len(curves)} runs)")
                ax.set_xlabel(xlabel)
                ax.set_ylabel(ylabel)
                if keys is SUCCESS_KEYS:
                    ax.set_ylim(-0.02, 1.02)
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=8, loc="best")
        fig.suptitle(f"Learning curves — {env} (band: mean ± stderr over seeds)")
        path = out_dir / f"curves_{_slug(env)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_final_eval(groups: Sequence[GroupSummary], out_dir: Path) -> Path | None:
    """Bar chart of the final held-out eval per group: success rate and mean return (one row per env),
    error bars = stderr over seeds."""
    if not groups:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({g.env for g in groups})
    width = max(10.0, 1.1 * max(sum(g.env == e for g in groups) for e in envs) * 2)
    fig, axes = plt.subplots(
        len(envs), 2, figsize=(min(width, 24), 4.8 * len(envs)), squeeze=False, layout="constrained"
    )
    for row, env in enumerate(envs):
        members = [g for g in groups if g.env == env]
        labels = [f"{_plot_label(g.agent, g.model, g.variant)}\n(n={len(g.runs)})" for g in members]
        xs = np.arange(len(members))
        for col, (attr, ylabel) in enumerate(
            (("success", "success rate (share of episodes)"), ("episode_return", "mean episode return"))
        ):
            ax = axes[row][col]
            means = np.array([getattr(g, attr)[0] for g in members], dtype=float)
            errs = np.array([getattr(g, attr)[1] for g in members], dtype=float)
            ax.bar(
                xs,
                np.nan_to_num(means),
                yerr=np.where(np.isnan(errs), 0.0, errs),
                width=0.6,
                capsize=4,
                color=[plt.get_cmap("tab10")(i % 10) for i in range(len(members))],
            )
            ax.set_xlim(-0.6, max(len(members), 2) - 0.4)  # one or two bars do not fill the panel
            for x, m in zip(xs, means, strict=True):
                if not math.isnan(m):  # the value, beside the bar top so the error bar stays readable
                    ax.annotate(
                        f"{m:.2f}",
                        (x + 0.06, m),
                        xytext=(3, 2),
                        textcoords="offset points",
                        fontsize=8,
                        va="bottom",
                    )
            ax.set_xticks(xs)
            ax.set_xticklabels(labels, fontsize=8)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{env}: {ylabel.split(' (')[0]}")
            if attr == "success":
                ax.set_ylim(0, 1.1)
            ax.axhline(0, color="black", lw=0.6)
            ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Final eval on held-out episodes, per group (error bars: stderr over seeds)")
    path = out_dir / "final_eval.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
def build_report(paths: Sequence[Path], out_dir: Path | None = None, console: Any = None) -> Report:
    """Find every run under `paths`, write report.md, report.csv (one row per run),
    report_groups.csv (aggregates) and PNG plots into `out_dir` (default: the first path), and print
    the tables to `console` (a rich Console) when given. Raises RunDirError when a path is missing or
    no run is found."""
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
        if r.status != "complete":
            log.warning("run %s is %s: %s", r.path, r.status, r.error)
    out_dir = Path(out_dir) if out_dir is not None else paths[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(runs=runs, groups=summarise_groups(runs), out_dir=out_dir)

    csv_path = out_dir / "report.csv"
    _write_csv(csv_path, RUN_COLUMNS, (r.row() for r in runs))
    groups_path = out_dir / "report_groups.csv"
    _write_csv(groups_path, GROUP_COLUMNS, (g.row() for g in report.groups))
    try:
        plots = plot_learning_curves(runs, out_dir)
        bar = plot_final_eval(report.groups, out_dir)
        plots += [bar] if bar else []
    except Exception as exc:  # noqa: BLE001 - plots must never cost the tables
        log.error("report: plotting failed: %s", exc)
        plots = []
    report.files = [out_dir / "report.md", csv_path, groups_path, *plots]
    (out_dir / "report.md").write_text(render_markdown(report))
    if console is not None:
        print_report(report, console)
    return report


__all__ = [
    "GroupSummary",
    "Report",
    "RunRecord",
    "build_report",
    "find_runs",
    "load_run",
    "mean_stderr",
    "plot_final_eval",
    "plot_learning_curves",
    "print_report",
    "render_markdown",
    "summarise_groups",
]
