"""Aggregate run directories into tables (markdown, CSV, rich) and PNG plots.

A run directory is any directory holding `.hydra/config.yaml` (single runs and the job directories of
a multirun sweep alike). What is read from each run:

- `.hydra/config.yaml` -> env, agent or algo, model, seed; `.hydra/overrides.yaml` -> key overrides;
- `status.json` -> `running` | `complete` | `failed` | `interrupted` and a `reason`;
- `eval.json` -> final metrics (success_rate, mean_return, return_stderr, mean_length, invalid_rate,
  episodes, train_time_s; a `before` sub-dict for LLM training; env-specific `mean_<key>` means);
- `metrics.jsonl` -> learning curves (iteration, time_s, training and periodic greedy-eval metrics).

Run status: `complete` (eval.json, and status.json absent or `complete`), `failed` / `interrupted` /
`running` (as status.json says), `incomplete` (no eval.json and no status.json saying otherwise) or
`corrupt` (config or eval file unreadable). Only complete runs are aggregated; every other run is
listed apart with its reason and never stops the report.

Aggregates: complete runs that share (env, agent/algo, model) and the same variant form a group,
reported as mean ± standard error across distinct seeds (runs that repeat a seed are averaged into
that seed first; stderr = sample std / sqrt(n seeds)). A variant is the run's overrides minus the
table columns and the bookkeeping keys (`BOOKKEEPING_KEYS`: how a run was executed, logged or
resumed, not what it computes).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.errors import RunDirError

log = logging.getLogger(__name__)

#: algorithms whose policy is not an LLM (the `model` config group is irrelevant for them); their
#: metrics.jsonl `iteration` counts env steps, so their curves get their own x-axis
NON_LLM_ALGOS = frozenset({"dqn"})
#: agents that are not LLMs
NON_LLM_AGENTS = frozenset({"random", "planner", "human"})
#: override keys that are table columns already
COLUMN_KEYS = frozenset({"env", "agent", "algo", "model", "seed", "task", "name"})
#: override keys that say how a run was executed, logged, checkpointed or resumed, not what it
#: computes, so they never define a variant. The time limit is here because the iterations a run
#: reached are its own column; the periodic-eval keys change only the curve's sampling.
BOOKKEEPING_KEYS = frozenset(
    {
        "resume",
        "from_run",
        "eval.transcripts",
        "eval.lockstep",
        "algo.time_limit_minutes",
        "algo.torch_threads",
        "algo.device",
        "algo.eval_every",
        "algo.periodic_eval_episodes",
        "algo.eval_before",
        "algo.log_every",
        "algo.checkpoint_every",
        "algo.keep_checkpoints",
        "algo.save_final",
        "algo.save_replay_buffer",
        "algo.shared_prefix",
        "algo.gradient_checkpointing",
        "agent.device",
        "model.cache_dir",
        "model.device",
        "model.device_map",
        "model.prefix_cache",
        "model.timeout",
        "model.max_concurrency",
        "model.api_key_env",
    }
)
#: override key prefixes of Hydra's own settings (run dir, launcher, sweeper)
BOOKKEEPING_PREFIXES = ("hydra.", "hydra/")

#: metrics.jsonl keys tried in order for each curve. Training metrics come from the sampled
#: (exploring) policy; `eval/` rows are the periodic greedy evaluations on held-out seeds.
TRAIN_SUCCESS_KEYS = ("train/success_rate", "success_rate", "success")
TRAIN_RETURN_KEYS = ("train/mean_return", "mean_return", "episode_return", "return", "ep_rew_mean")
EVAL_SUCCESS_KEYS = ("eval/success_rate", "eval_success_rate")
EVAL_RETURN_KEYS = ("eval/mean_return", "eval_mean_return")

#: eval.json keys that are fixed columns; any other `mean_<key>` is an env-specific mean
STANDARD_EVAL_KEYS = frozenset({"mean_return", "mean_length"})
#: tic-tac-toe outcome shares in eval.json files whose env names its indicators without `_rate`;
#: `mean_loss` (the share of games lost) would otherwise read like the training `loss`
ENV_METRIC_RENAMES = {
    "mean_win": "win_rate",
    "mean_draw": "draw_rate",
    "mean_loss": "loss_rate",
    "mean_illegal_move": "illegal_move_rate",
}

COMPLETE, RUNNING, FAILED, INTERRUPTED, INCOMPLETE, CORRUPT = (
    "complete",
    "running",
    "failed",
    "interrupted",
    "incomplete",
    "corrupt",
)
STATUSES = (COMPLETE, FAILED, INTERRUPTED, RUNNING, INCOMPLETE, CORRUPT)
_STATUS_FILE_VALUES = frozenset({COMPLETE, RUNNING, FAILED, INTERRUPTED})

RUN_COLUMNS = [
    "run",
    "status",
    "env",
    "agent",
    "model",
    "seed",
    "overrides",
    "other_overrides",
    "success_rate",
    "mean_return",
    "return_stderr",
    "mean_length",
    "invalid_rate",
    "episodes",
    "iterations",
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
    "seeds",
    "runs",
    "success_mean",
    "success_stderr",
    "return_mean",
    "return_stderr",
    "length_mean",
    "invalid_rate_mean",
    "train_time_s_mean",
    "before_success_mean",
    "before_return_mean",
]


def env_metric_name(key: str) -> str | None:
    """The report's name for an env-specific eval.json mean, or None when `key` is not one.

    A per-episode indicator or share named `<x>_rate` averages into the rate itself, so
    `mean_<x>_rate` is shown as `<x>_rate`; other means keep their eval.json name."""
    if not key.startswith("mean_") or key in STANDARD_EVAL_KEYS:
        return None
    name = ENV_METRIC_RENAMES.get(key, key)
    if name.startswith("mean_") and name.endswith("_rate"):
        name = name[len("mean_") :]
    return name


def family_of(agent: str) -> str:
    """`dqn` (x-axis: env steps) or `llm` (x-axis: iterations)."""
    return "dqn" if agent in NON_LLM_ALGOS else "llm"


@dataclass
class RunRecord:
    """One run directory as the report sees it."""

    path: Path  # as found (root as the user gave it / relative part)
    status: str  # one of STATUSES
    env: str = "?"
    agent: str = "?"  # the algorithm for training runs, else the agent
    model: str = "-"
    seed: int | None = None
    task: str = "eval"
    overrides: list[str] = field(default_factory=list)  # the variant: key overrides that change results
    other_overrides: list[str] = field(default_factory=list)  # bookkeeping overrides (resume=, hydra.*)
    eval: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl rows
    error: str = ""  # why the run is not complete, or what could not be read
    label: str = ""  # short name for tables: the path from the searched directory's name down

    def __post_init__(self) -> None:
        self.label = self.label or str(self.path)

    @property
    def group_key(self) -> tuple[str, str, str, str]:
        return (self.env, self.agent, self.model, self.variant)

    @property
    def variant(self) -> str:
        return " ".join(self.overrides)

    @property
    def family(self) -> str:
        return family_of(self.agent)

    @property
    def is_training(self) -> bool:
        return self.task == "train"

    def metric(self, key: str) -> float | None:
        return _number(self.eval.get(key))

    def raw(self, key: str) -> Any:
        """An eval.json number exactly as written (20 stays 20), or "" when absent."""
        return self.eval[key] if self.metric(key) is not None else ""

    def before(self, key: str) -> float | None:
        before = self.eval.get("before")
        return _number(before.get(key)) if isinstance(before, dict) else None

    @property
    def env_metrics(self) -> dict[str, float]:
        """Env-specific means from eval.json under the report's names (`env_metric_name`)."""
        out = {}
        for key, value in self.eval.items():
            name = env_metric_name(key)
            if name is not None and _number(value) is not None:
                out[name] = float(value)
        return out

    @property
    def progress(self) -> float | None:
        """How far training got: iterations (LLM) or env steps (DQN), from eval.json or metrics.jsonl."""
        for key in ("iterations", "total_timesteps"):
            if self.metric(key) is not None:
                return self.metric(key)
        steps = [_number(r.get("iteration")) for r in self.curve]
        steps = [s for s in steps if s is not None]
        return max(steps) if steps else None

    def row(self, env_metric_names: Sequence[str] = ()) -> dict[str, Any]:
        """The CSV row: raw numbers exactly as in eval.json."""
        row = {
            "run": str(self.path),
            "status": self.status,
            "env": self.env,
            "agent": self.agent,
            "model": self.model,
            "seed": "" if self.seed is None else self.seed,
            "overrides": self.variant,
            "other_overrides": " ".join(self.other_overrides),
            "success_rate": self.raw("success_rate"),
            "mean_return": self.raw("mean_return"),
            "return_stderr": self.raw("return_stderr"),
            "mean_length": self.raw("mean_length"),
            "invalid_rate": self.raw("invalid_rate"),
            "episodes": self.raw("episodes"),
            "iterations": _blank(_integral(self.progress) if self.is_training else None),
            "train_time_s": self.raw("train_time_s"),
            "before_success_rate": _blank(self.before("success_rate")),
            "before_mean_return": _blank(self.before("mean_return")),
            "error": self.error,
        }
        metrics = self.env_metrics
        row.update({name: _blank(metrics.get(name)) for name in env_metric_names})
        return row


@dataclass
class GroupSummary:
    """Mean ± stderr over the distinct seeds of one (env, agent/algo, model, variant) of complete runs."""

    env: str
    agent: str
    model: str
    variant: str
    runs: list[RunRecord]
    success: tuple[float, float]  # (mean, stderr); stderr is nan for a single seed
    episode_return: tuple[float, float]
    length: float
    invalid_rate: float
    train_time_s: float
    before_success: float = math.nan
    before_return: float = math.nan
    env_metrics: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def seeds(self) -> int:
        """Distinct seeds (a run without a seed counts as its own)."""
        return len(_by_seed(self.runs))

    @property
    def label(self) -> str:
        return " / ".join(self.head_and_variant)

    @property
    def head_and_variant(self) -> list[str]:
        head = " / ".join([self.agent] + ([self.model] if self.model != "-" else []))
        return [head] + ([self.variant] if self.variant else [])

    def row(self, env_metric_names: Sequence[str] = ()) -> dict[str, Any]:
        row = {
            "env": self.env,
            "agent": self.agent,
            "model": self.model,
            "variant": self.variant,
            "seeds": self.seeds,
            "runs": len(self.runs),
            "success_mean": _blank(self.success[0]),
            "success_stderr": _blank(self.success[1]),
            "return_mean": _blank(self.episode_return[0]),
            "return_stderr": _blank(self.episode_return[1]),
            "length_mean": _blank(self.length),
            "invalid_rate_mean": _blank(self.invalid_rate),
            "train_time_s_mean": _blank(self.train_time_s),
            "before_success_mean": _blank(self.before_success),
            "before_return_mean": _blank(self.before_return),
        }
        for name in env_metric_names:
            mean, err = self.env_metrics.get(name, (math.nan, math.nan))
            row[f"{name}_mean"], row[f"{name}_stderr"] = _blank(mean), _blank(err)
        return row


@dataclass
class Report:
    runs: list[RunRecord]
    groups: list[GroupSummary]
    out_dir: Path
    files: list[Path] = field(default_factory=list)  # report.md, report.csv, report_groups.csv, PNGs

    @property
    def plots(self) -> list[Path]:
        return [p for p in self.files if p.suffix == ".png"]

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.runs)


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
        return RunRecord(path=run_dir, status=CORRUPT, error=f"config.yaml: {_short(exc)}")
    record = RunRecord(path=run_dir, status=INCOMPLETE)
    _describe(record, cfg, _load_overrides(run_dir / ".hydra" / "overrides.yaml"))
    record.curve, bad_lines = _load_metrics(run_dir / "metrics.jsonl")
    notes: list[str] = []
    said, reason, status_note = _load_status(run_dir / "status.json")
    notes += [status_note] if status_note else []

    eval_path, eval_ok = run_dir / "eval.json", False
    if eval_path.is_file():
        try:
            data = json.loads(eval_path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            record.eval, eval_ok = data, True
        except (ValueError, OSError) as exc:
            record.status = CORRUPT
            notes.append(f"eval.json: {_short(exc)}")

    if said in (FAILED, INTERRUPTED, RUNNING):  # what the runner recorded wins over any eval.json
        record.status = said
        notes.insert(0, reason or f"status.json: {said}")
    elif eval_ok:
        record.status = COMPLETE
    elif record.status != CORRUPT:
        reached = record.progress if record.curve else None
        notes.insert(
            0,
            "no eval.json"
            + (" although status.json says complete" if said == COMPLETE else "")
            + (f" (trained to iteration {reached:g})" if reached is not None else ""),
        )
    if bad_lines:
        notes.append(f"metrics.jsonl: {bad_lines} unreadable line(s)")
    record.error = "; ".join(notes)
    _fill_from_eval(record)
    return record


def _load_status(path: Path) -> tuple[str | None, str, str]:
    """(status, reason, note) from status.json; status is None when the file is absent or unusable."""
    if not path.is_file():
        return None, "", ""
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        return None, "", f"status.json: {_short(exc)}"
    status = data.get("status") if isinstance(data, dict) else None
    if status not in _STATUS_FILE_VALUES:
        return None, "", f"status.json: unknown status {status!r}"
    reason = data.get("reason")
    return str(status), (str(reason) if reason else ""), ""


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
    record.task = str(cfg.get("task", "train" if algo is not None else "eval"))
    if algo is not None and record.task == "train":  # a training run: name it by its algorithm
        record.agent = algo
        llm = algo not in NON_LLM_ALGOS
    else:
        record.agent = agent or "?"
        llm = agent not in NON_LLM_AGENTS
    record.model = (model or "?") if llm else "-"
    seed = cfg.get("seed")
    record.seed = int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None
    keyed = [o for o in overrides if override_key(o) not in COLUMN_KEYS]
    record.overrides = [o for o in keyed if not is_bookkeeping(o)]
    record.other_overrides = [o for o in keyed if is_bookkeeping(o)]


def override_key(override: str) -> str:
    """`algo.lr` for `algo.lr=1e-6`, `+algo.lr=1e-6` and `~algo.lr`."""
    return override.split("=", 1)[0].lstrip("+~")


def is_bookkeeping(override: str) -> bool:
    """True for an override that does not change what a run computes (`BOOKKEEPING_KEYS`, Hydra's own)."""
    key = override_key(override)
    return key in BOOKKEEPING_KEYS or key == "hydra" or key.startswith(BOOKKEEPING_PREFIXES)


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


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _integral(value: float | None) -> float | int | None:
    return int(value) if value is not None and float(value).is_integer() else value


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


def _by_seed(runs: Sequence[RunRecord]) -> dict[Any, list[RunRecord]]:
    out: dict[Any, list[RunRecord]] = {}
    for run in runs:
        out.setdefault(run.seed if run.seed is not None else ("run", str(run.path)), []).append(run)
    return out


def _seed_values(runs: Sequence[RunRecord], get: Callable[[RunRecord], float | None]) -> list[float]:
    """One value per distinct seed: the mean over the runs of that seed that have the value."""
    values = []
    for members in _by_seed(runs).values():
        found = [v for v in (get(m) for m in members) if v is not None]
        if found:
            values.append(float(np.mean(found)))
    return values


def _seed_stat(runs: Sequence[RunRecord], get: Callable[[RunRecord], float | None]) -> tuple[float, float]:
    return mean_stderr(_seed_values(runs, get))


def summarise_groups(runs: Sequence[RunRecord]) -> list[GroupSummary]:
    """Aggregate complete runs over distinct seeds, grouped by (env, agent/algo, model, variant), in
    natural order (lr=2e-6 before lr=10e-6)."""
    groups: dict[tuple[str, str, str, str], list[RunRecord]] = {}
    for run in runs:
        if run.status == COMPLETE:
            groups.setdefault(run.group_key, []).append(run)
    summaries = []
    for (env, agent, model, variant), members in sorted(
        groups.items(), key=lambda item: [_natural(part) for part in item[0]]
    ):
        stats = {
            key: _seed_stat(members, lambda r, key=key: r.metric(key))
            for key in ("success_rate", "mean_return", "mean_length", "invalid_rate", "train_time_s")
        }
        names = sorted({name for r in members for name in r.env_metrics})
        summaries.append(
            GroupSummary(
                env=env,
                agent=agent,
                model=model,
                variant=variant,
                runs=members,
                success=stats["success_rate"],
                episode_return=stats["mean_return"],
                length=stats["mean_length"][0],
                invalid_rate=stats["invalid_rate"][0],
                train_time_s=stats["train_time_s"][0],
                before_success=_seed_stat(members, lambda r: r.before("success_rate"))[0],
                before_return=_seed_stat(members, lambda r: r.before("mean_return"))[0],
                env_metrics={
                    name: _seed_stat(members, lambda r, name=name: r.env_metrics.get(name)) for name in names
                },
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


def _seeds_text(group: GroupSummary) -> str:
    seeds = f"{group.seeds} seed" + ("s" if group.seeds != 1 else "")
    return seeds if len(group.runs) == group.seeds else f"{seeds}, {len(group.runs)} runs"


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
    "train time",
]


def run_table_rows(runs: Sequence[RunRecord]) -> list[list[str]]:
    return [
        [
            r.label,
            r.env,
            r.agent,
            r.model,
            "" if r.seed is None else str(r.seed),
            r.variant,
            _fmt(r.metric("success_rate")),
            _pm(r.metric("mean_return"), r.metric("return_stderr")),
            _fmt(r.metric("mean_length"), 1),
            _fmt(r.metric("invalid_rate")),
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
            r.agent,
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
            g.agent,
            g.model,
            g.variant,
            _seeds_cell(g),
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
        parts += [f"### {env}", "", _md_table(["group", *names], rows), ""]
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
    stopped = [r for r in report.runs if r.status in (FAILED, INTERRUPTED)]
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
        "moves whose answer was invalid.",
        "",
        _md_table(GROUP_HEADERS, group_table_rows(report.groups)) if report.groups else "_no complete runs_",
        "",
        *_env_metric_section(report.groups),
        "## Runs",
        "",
        "Complete runs. Return ± standard error over the run's eval episodes.",
        "",
        _md_table(RUN_HEADERS, run_table_rows(complete)) if complete else "_none_",
        "",
    ]
    if stopped:
        parts += [
            "## Failed and interrupted runs",
            "",
            "Never averaged with complete runs; numbers are whatever eval the run wrote before it stopped.",
            "",
            _md_table(OTHER_RUN_HEADERS, other_run_rows(stopped)),
            "",
        ]
    if unfinished:
        parts += [
            "## Running, incomplete and corrupt runs",
            "",
            _md_table(OTHER_RUN_HEADERS, other_run_rows(unfinished)),
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
    for env in sorted({g.env for g in report.groups}):
        table = Table(
            title=f"{env}: held-out eval, mean ± stderr over seeds",
            title_justify="left",
            box=box.SIMPLE,
            show_lines=True,
            pad_edge=False,
        )
        table.add_column("agent/algo · model · variant", overflow="fold", ratio=1, min_width=16)
        table.add_column("seeds", justify="right", no_wrap=True)
        table.add_column("success", no_wrap=True)
        table.add_column("return", no_wrap=True)
        if wide:
            for h in ("length", "invalid", "train time"):
                table.add_column(h, justify="right", no_wrap=True)
        for g in (g for g in report.groups if g.env == env):
            cells = [
                escape("\n".join(g.head_and_variant)),
                _seeds_cell(g),
                _pm(*g.success),
                _pm(*g.episode_return),
            ]
            if wide:
                cells += [_fmt(g.length, 1), _fmt(g.invalid_rate), _duration(g.train_time_s)]
            table.add_row(*cells)
        console.print(table)
    if not report.groups:
        console.print("no complete runs")
    others = [r for r in report.runs if r.status != COMPLETE]
    if others:
        table = Table(title="Runs not complete", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("run", overflow="fold", ratio=1, min_width=12)
        table.add_column("status", no_wrap=True)
        table.add_column("reason", overflow="fold", ratio=1, min_width=12)
        styles = {FAILED: "red", INTERRUPTED: "yellow", RUNNING: "cyan", INCOMPLETE: "yellow", CORRUPT: "red"}
        for r in others:
            table.add_row(escape(r.label), r.status, escape(r.error), style=styles.get(r.status, ""))
        console.print(table)
    complete = [r for r in report.runs if r.status == COMPLETE]
    if wide and complete:
        table = Table(title="Complete runs", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for h in RUN_HEADERS:
            table.add_column(h, overflow="fold", no_wrap=h not in {"run", "overrides"})
        for row in run_table_rows(complete):
            table.add_row(*map(escape, row))
        console.print(table)
    elif complete:
        console.print("Per-run table: report.md and report.csv.")
    if report.files:
        console.print(escape("Wrote " + ", ".join(str(p) for p in report.files)), overflow="fold")


def _write_csv(path: Path, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------
_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = ("s", "^", "D", "v", "P", "X", "<", ">")  # "o" and "*" mark the before/final evals
_HATCHES = ("", "//", "..", "xx")
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


def _natural(text: str) -> list[Any]:
    """Sort key that orders embedded numbers by value (lr=2e-6 before lr=10e-6, seed=2 before seed=10)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


StyleKey = tuple[str, str, str, str]  # (agent, model, variant, status; "" for complete runs)


def style_map(keys: Iterable[StyleKey]) -> dict[StyleKey, Style]:
    """One style per legend entry, in natural order, so an entry looks the same in every figure."""
    ordered = sorted(set(keys), key=lambda k: (bool(k[3]), *(_natural(p) for p in k)))
    return {key: plot_style(i) for i, key in enumerate(ordered)}


def _style_keys(runs: Sequence[RunRecord]) -> list[StyleKey]:
    return [(r.agent, r.model, r.variant, "" if r.status == COMPLETE else r.status) for r in runs]


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
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def _plot_label(head: str, variant: str, width: int = 30, max_lines: int = 4) -> str:
    """A legend / tick label: `head` (agent and model), then the variant's overrides wrapped to `width`."""
    lines: list[str] = []
    for item in variant.split():
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
    keys = EVAL_SUCCESS_KEYS if metric == "success_rate" else EVAL_RETURN_KEYS
    periodic = _series(run, keys, x_key)
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
    common x range (linearly interpolated)."""
    st = group.style
    several = len(curves) >= 2
    for xs, ys in curves:
        ax.plot(
            xs / scale,
            ys,
            color=st.colour,
            linestyle=st.linestyle,
            lw=0.8 if several else 1.8,
            alpha=0.4 if several else 1.0,
            marker=None if several else st.marker,
            markevery=max(1, len(xs) // 8),
            markersize=4,
        )
    if several:
        lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
        if hi > lo:
            grid = np.linspace(lo, hi, 100)
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
                markevery=12,
                markersize=5,
            )
            ax.fill_between(grid / scale, mean - err, mean + err, color=st.colour, alpha=0.2, lw=0)


def _mean_point(points: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    found = [p for p in points if p is not None]
    if not found:
        return None
    return float(np.mean([p[0] for p in found])), float(np.mean([p[1] for p in found]))


def _add_legend(fig: Any, handles: list[Any], fontsize: float = 8) -> Any:
    """One legend for the whole figure, outside every axes (right of them), in as many columns as the
    figure's height needs."""
    lines = sum(h.get_label().count("\n") + 1 for h in handles)
    height_pt = fig.get_figheight() * 72
    capacity = max(1, int(height_pt * 0.85 / (fontsize * 1.45)))
    ncols = max(1, math.ceil(lines / capacity))
    return fig.legend(
        handles=handles,
        loc="outside right upper",
        fontsize=fontsize,
        ncols=ncols,
        frameon=False,
        handlelength=3.2,
        labelspacing=0.7,
    )


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
    each family on its own x-axes so neither squashes the other. Rows: training success and return (the
    sampled policy), then the greedy held-out eval success and return with the before-training (hollow
    circle) and final (star) evals marked; complete eval-only runs of the env appear there as horizontal
    reference lines. Rows share their y-axis, columns their x-axis. One legend, outside the axes;
    `styles` (default: `style_map` of these runs) keeps an entry's look across figures."""
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
        ("eval", "success_rate", EVAL_SUCCESS_KEYS, "greedy eval success rate\n(held-out seeds)"),
        ("eval", "mean_return", EVAL_RETURN_KEYS, "greedy eval mean return\n(held-out seeds)"),
    ]

    def has_data(kind: str, metric: str, keys: Sequence[str], run: RunRecord) -> bool:
        if _series(run, keys, "iteration") is not None:
            return True
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
        figsize=(3.5 * len(columns) + 3.8, 2.6 * len(rows) + 1.0),
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
                    value = mean_stderr(_seed_values(group.runs, lambda m, k=metric: m.metric(k)))[0]
                    if not math.isnan(value):
                        ax.axhline(value, color=group.style.colour, linestyle=group.style.linestyle, lw=1.2)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, min_n_ticks=3))
            if x_key == "iteration" and fam == "dqn":
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            if metric == "success_rate":
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
    fig.suptitle(title, fontsize=11)
    _add_legend(fig, _legend_handles(groups, marked))
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
    keys = {id(g): (g.agent, g.model, g.variant, "") for g in groups}
    styles = styles if styles is not None else style_map(keys.values())
    labeller = _Labeller.of(list(keys.values()))
    labels = {id(g): labeller(keys[id(g)], width=34) + f"\n({_seeds_text(g)})" for g in groups}
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
    fig.suptitle(title, fontsize=11)
    if has_before:
        handle = Line2D([], [], color="black", markeredgecolor="black", label="before training", **_BEFORE)
        _add_legend(fig, [handle])
    return fig


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=110)
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
        if r.status != COMPLETE:
            log.warning("run %s is %s: %s", r.path, r.status, r.error)
    out_dir = Path(out_dir) if out_dir is not None else paths[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(runs=runs, groups=summarise_groups(runs), out_dir=out_dir)

    names = sorted({n for r in runs for n in r.env_metrics})
    csv_path = out_dir / "report.csv"
    _write_csv(csv_path, RUN_COLUMNS + names, (r.row(names) for r in runs))
    groups_path = out_dir / "report_groups.csv"
    group_columns = GROUP_COLUMNS + [f"{n}_{s}" for n in names for s in ("mean", "stderr")]
    _write_csv(groups_path, group_columns, (g.row(names) for g in report.groups))
    try:
        styles = style_map(_style_keys([r for r in runs if r.status != CORRUPT]))
        plots = plot_learning_curves(runs, out_dir, styles)
        bar = plot_final_eval(report.groups, out_dir, styles)
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
    "BOOKKEEPING_KEYS",
    "GroupSummary",
    "Report",
    "RunRecord",
    "build_report",
    "env_metric_name",
    "figure_final_eval",
    "figure_learning_curves",
    "find_runs",
    "is_bookkeeping",
    "load_run",
    "mean_stderr",
    "plot_final_eval",
    "plot_learning_curves",
    "plot_style",
    "print_report",
    "render_markdown",
    "summarise_groups",
]
