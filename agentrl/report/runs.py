"""Run directories -> RunRecords (discovery, loading, run status) and their aggregation over seeds
into GroupSummaries (see the package doc)."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agentrl.errors import RunDirError
from agentrl.runs.rundir import effective_status, override_key

log = logging.getLogger(__name__)

#: algorithms whose policy is not an LLM (the `model` config group is irrelevant for them); their
#: metrics.jsonl `iteration` counts env steps, so their curves get their own x-axis
NON_LLM_ALGOS = frozenset({"dqn"})
#: agents that are not LLMs (their `model` config group is irrelevant: a label never names one)
NON_LLM_AGENTS = frozenset({"random", "planner", "human", "dqn"})
#: eval overrides that name a model file or directory a training run wrote; an eval of a trained model
#: is identified by the run and checkpoint they resolve to (`RunRecord.marker`), never by the path text
MODEL_PATH_KEYS = frozenset({"agent.path", "model.name_or_path"})
#: eval overrides `from_run=` derives from the trained run's own eval settings (agentrl/runs/launch.py
#: `from_run_overrides`): part of "evaluated as its run did", not a variant of their own
FROM_RUN_SAMPLING = {
    "agent.sampling.temperature": "eval_temperature",
    "agent.sampling.max_new_tokens": "max_new_tokens",
}
#: an eval of a trained model's keys that choose where it is evaluated (a transfer preset and its env,
#: which the env column shows), not what the model is
FROM_RUN_CHOICE_KEYS = frozenset({"experiment", "from_run_env"})
#: the label suffix of an eval of a trained run's model (from_run= or a DQN's agent.path=)
FROM_RUN_MARKER = "from_run eval"
#: override keys that are table columns already
COLUMN_KEYS = frozenset({"env", "agent", "algo", "model", "seed", "task", "name"})
#: override keys that say how a run was executed, logged, checkpointed or resumed, not what it
#: computes, so they never define a variant. The time limit and the stop at a target success are here
#: because the iterations a run reached are its own column; the periodic-eval keys change only the
#: curve's sampling; `eval.episodes` changes how precisely the same quantity is measured (its stderr),
#: not the quantity.
BOOKKEEPING_KEYS = frozenset(
    {
        "resume",
        "from_run",
        "eval.transcripts",
        "eval.episodes",
        "eval.lockstep",
        "algo.time_limit_minutes",
        "algo.stop_at_success",
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
TRAIN_INVALID_KEYS = ("train/invalid_rate",)
EVAL_INVALID_KEYS = ("eval/invalid_rate",)
#: eval.json metric -> the metrics.jsonl keys of its periodic evals
EVAL_CURVE_KEYS = {
    "success_rate": EVAL_SUCCESS_KEYS,
    "mean_return": EVAL_RETURN_KEYS,
    "invalid_rate": EVAL_INVALID_KEYS,
}

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

COMPLETE, RUNNING, FAILED, INTERRUPTED, KILLED, INCOMPLETE, CORRUPT = (
    "complete",
    "running",
    "failed",
    "interrupted",
    "killed",
    "incomplete",
    "corrupt",
)
STATUSES = (COMPLETE, FAILED, INTERRUPTED, KILLED, RUNNING, INCOMPLETE, CORRUPT)
_STATUS_FILE_VALUES = frozenset({COMPLETE, RUNNING, FAILED, INTERRUPTED})

RUN_COLUMNS = [
    "run",
    "status",
    "env",
    "agent",
    "model",
    "from_run",
    "seed",
    "overrides",
    "other_overrides",
    "success_rate",
    "mean_return",
    "return_stderr",
    "mean_length",
    "invalid_rate",
    "untagged_rate",
    "episodes",
    "iterations",
    "train_time_s",
    "before_success_rate",
    "before_mean_return",
    "error",
]
GROUP_COLUMNS = [
    "label",
    "env",
    "agent",
    "model",
    "from_run",
    "variant",
    "seeds",
    "runs",
    "success_mean",
    "success_stderr",
    "return_mean",
    "return_stderr",
    "length_mean",
    "invalid_rate_mean",
    "untagged_rate_mean",
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
    """`dqn` (x-axis: env steps) or `llm` (x-axis: iterations), of an algorithm or a `method_head`."""
    return "dqn" if agent.split(" ")[0] in NON_LLM_ALGOS else "llm"


def method_head(agent: str, model: str = "-", marker: str = "") -> str:
    """`agent / model [marker]`; an agent without a model (`-`: a classic agent, DQN) is named alone."""
    head = " / ".join(p for p in (agent, model) if p and p != "-")
    return f"{head} [{marker}]" if marker else head


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
    marker: str = ""  # FROM_RUN_MARKER (and the checkpoint) for an eval of a trained run's model
    trained_run: str = ""  # that run's directory and checkpoint, `<dir>:<checkpoint>`
    trained_env: str | None = None  # the env that trained model was trained on

    def __post_init__(self) -> None:
        self.label = self.label or str(self.path)

    @property
    def group_key(self) -> tuple[str, str, str, str, str]:
        return (self.env, self.agent, self.model, self.marker, self.variant)

    @property
    def head(self) -> str:
        """`msgrpo / tiny-random`, `planner`, `dqn [from_run eval]`: what played, as every table,
        CSV and plot names it."""
        return method_head(self.agent, self.model, self.marker)

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
            "from_run": self.trained_run,
            "seed": "" if self.seed is None else self.seed,
            "overrides": self.variant,
            "other_overrides": " ".join(self.other_overrides),
            "success_rate": self.raw("success_rate"),
            "mean_return": self.raw("mean_return"),
            "return_stderr": self.raw("return_stderr"),
            "mean_length": self.raw("mean_length"),
            "invalid_rate": self.raw("invalid_rate"),
            "untagged_rate": self.raw("untagged_rate"),
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
    marker: str = ""  # RunRecord.marker of its runs
    untagged_rate: float = math.nan  # mean over seeds of the runs that report it

    @property
    def seeds(self) -> int:
        """Distinct seeds (a run without a seed counts as its own)."""
        return len(_by_seed(self.runs))

    @property
    def head(self) -> str:
        return method_head(self.agent, self.model, self.marker)

    @property
    def label(self) -> str:
        return " / ".join(self.head_and_variant)

    @property
    def head_and_variant(self) -> list[str]:
        return [self.head] + ([self.variant] if self.variant else [])

    def row(self, env_metric_names: Sequence[str] = ()) -> dict[str, Any]:
        row = {
            "label": self.label,
            "env": self.env,
            "agent": self.agent,
            "model": self.model,
            "from_run": " ".join(sorted({r.trained_run for r in self.runs if r.trained_run})),
            "variant": self.variant,
            "seeds": self.seeds,
            "runs": len(self.runs),
            "success_mean": _blank(self.success[0]),
            "success_stderr": _blank(self.success[1]),
            "return_mean": _blank(self.episode_return[0]),
            "return_stderr": _blank(self.episode_return[1]),
            "length_mean": _blank(self.length),
            "invalid_rate_mean": _blank(self.invalid_rate),
            "untagged_rate_mean": _blank(self.untagged_rate),
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
    target: Any = None  # target.TargetTable: time to the eval target per group of training runs

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
    if said == RUNNING and effective_status(run_dir) == KILLED:
        # SIGKILL or a power cut leaves "running" behind; no process holds the run's lock any more
        said, reason = KILLED, "killed: status.json says running, but no process holds the run's .lock"
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

    if said in (FAILED, INTERRUPTED, KILLED, RUNNING):  # what the runner recorded wins over any eval.json
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
    _describe_trained_model(record, cfg)
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


def _describe_trained_model(record: RunRecord, cfg: dict[str, Any]) -> None:
    """An eval of a trained run's model is named by that run: its algorithm, model and variant, the
    `FROM_RUN_MARKER` (with the checkpoint when it is not the final model), and the eval's own
    overrides that change results. `from_run=<run>` and a DQN's `agent.path=<run or its zip>` of one
    model so land in one group, whatever path text named it. An LLM eval that names a trained model
    with `model.name_or_path=` but not its run's settings stays the base agent's, its path shortened."""
    if record.task != "eval":
        return
    found = _trained_source(record, cfg)
    if found is None:
        record.overrides = [_short_model_path(o, record.path) for o in record.overrides]
        return
    root, checkpoint = found
    origin = _origin_config(root)
    algo = _name(origin.get("algo")) or str(record.eval.get("algo") or record.agent)
    record.agent = algo
    record.model = "-" if algo in NON_LLM_ALGOS else (_name(origin.get("model")) or record.model)
    record.marker = FROM_RUN_MARKER + ("" if checkpoint.split("/")[0] == "final" else f", {checkpoint}")
    record.trained_run = f"{root}:{checkpoint}"
    trained_env = record.eval.get("trained_env") or _name(origin.get("env"))
    record.trained_env = str(trained_env) if trained_env else record.env
    inherited = _load_overrides(root / ".hydra" / "overrides.yaml")
    trained_variant = [o for o in inherited if override_key(o) not in COLUMN_KEYS and not is_bookkeeping(o)]
    own = [
        o
        for o in record.overrides
        if o not in inherited
        and override_key(o) not in MODEL_PATH_KEYS | FROM_RUN_CHOICE_KEYS
        and not _inherited_setting(o, origin)
    ]
    record.overrides = [*trained_variant, *own]


def _trained_source(record: RunRecord, cfg: dict[str, Any]) -> tuple[Path, str] | None:
    """(training run directory, checkpoint) of the model an eval played: eval.json's `from_run` (when
    the run's model played, not only its settings), or a DQN's `agent.path` inside a training run."""
    ev = record.eval
    if ev.get("from_run") and not ev.get("settings_from_run"):
        return Path(str(ev["from_run"])).resolve(), str(ev.get("checkpoint") or "final")
    agent = cfg.get("agent") if isinstance(cfg.get("agent"), dict) else {}
    if agent.get("name") != "dqn" or not agent.get("path"):
        return None
    path = _existing(Path(str(agent["path"])), record.path)
    root = _training_root(path.resolve()) if path is not None else None
    if root is None:
        return None
    model = path
    if path.is_dir():  # a run directory or its final/: the zip agentrl/agents/dqn.py plays from it
        model = path / "model.zip" if (path / "model.zip").is_file() else path / "final" / "model.zip"
    try:
        return root, model.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


def _existing(path: Path, run_dir: Path) -> Path | None:
    """`path` as the eval that named it meant it: absolute, relative to here, or relative to a
    directory above the run (the one the eval was started in, which held outputs/)."""
    if path.is_absolute():
        return path if path.exists() else None
    for base in (Path.cwd(), *run_dir.resolve().parents):
        if (base / path).exists():
            return base / path
    return None


def _training_root(path: Path) -> Path | None:
    """The training run directory holding `path` (itself or up to two levels above)."""
    for candidate in (path, *list(path.parents)[:2]):
        if (candidate / ".hydra" / "config.yaml").is_file():
            return candidate if candidate.is_dir() else None
    return None


def _origin_config(root: Path) -> dict[str, Any]:
    try:
        return _load_config(root / ".hydra" / "config.yaml")
    except Exception:  # noqa: BLE001 - a moved or broken run: eval.json's own fields name it
        return {}


def _inherited_setting(override: str, origin: dict[str, Any]) -> bool:
    """Whether `override` only repeats the trained run's own setting, as `from_run=` writes it: an
    `agent.*` or `model.*` value equal to the run's config, or the eval sampling copied from its algo
    config (`FROM_RUN_SAMPLING`)."""
    key = override_key(override)
    if "=" not in override or override.startswith("~"):
        return False
    source = FROM_RUN_SAMPLING.get(key)
    if source is not None:
        path = ["algo", source]
    elif key.split(".")[0] in ("agent", "model"):
        path = key.split(".")
    else:
        return False
    node: Any = origin
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    try:
        value = yaml.safe_load(override.split("=", 1)[1])
    except yaml.YAMLError:
        return False
    if isinstance(value, (int, float)) and isinstance(node, (int, float)):
        return float(value) == float(node)
    return value == node


def _short_model_path(override: str, run_dir: Path) -> str:
    """`model.name_or_path=<run dir name>/final` for a path inside a training run (tables and plot
    legends name the run, not the whole path); any other override unchanged."""
    if override_key(override) not in MODEL_PATH_KEYS or "=" not in override:
        return override
    key, value = override.split("=", 1)
    path = _existing(Path(value.strip("'\"")), run_dir)
    root = _training_root(path) if path is not None else None
    if root is None:
        return override
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    return f"{key}={root.name}" + ("" if rel == "." else f"/{rel}")


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


def _seed_values(
    runs: Sequence[RunRecord], get: Callable[[RunRecord], float | None], per_episode: bool = False
) -> list[float]:
    """One value per distinct seed: the mean over the runs of that seed that have the value. With
    `per_episode` (a number measured over the run's eval episodes) each run counts by its eval.json
    `episodes`, so 100 episodes outweigh 10 (equally where a run does not say)."""
    values = []
    for members in _by_seed(runs).values():
        found = [(v, m) for v, m in ((get(m), m) for m in members) if v is not None]
        if not found:
            continue
        weights = [m.metric("episodes") for _, m in found] if per_episode else []
        if weights and all(w is not None and w > 0 for w in weights):
            values.append(float(np.average([v for v, _ in found], weights=weights)))
        else:
            values.append(float(np.mean([v for v, _ in found])))
    return values


def _seed_stat(
    runs: Sequence[RunRecord], get: Callable[[RunRecord], float | None], per_episode: bool = True
) -> tuple[float, float]:
    """Mean ± stderr over seeds of an eval number (`per_episode`: see `_seed_values`)."""
    return mean_stderr(_seed_values(runs, get, per_episode))


def _natural(text: str) -> list[Any]:
    """Sort key that orders embedded numbers by value (lr=2e-6 before lr=10e-6, seed=2 before seed=10)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def summarise_groups(runs: Sequence[RunRecord]) -> list[GroupSummary]:
    """Aggregate complete runs over distinct seeds, grouped by (env, agent/algo, model, variant), in
    natural order (lr=2e-6 before lr=10e-6)."""
    groups: dict[tuple[str, str, str, str, str], list[RunRecord]] = {}
    for run in runs:
        if run.status == COMPLETE:
            groups.setdefault(run.group_key, []).append(run)
    summaries = []
    for (env, agent, model, marker, variant), members in sorted(
        groups.items(), key=lambda item: [_natural(part) for part in item[0]]
    ):
        keys = ("success_rate", "mean_return", "mean_length", "invalid_rate", "untagged_rate")
        stats = {key: _seed_stat(members, lambda r, key=key: r.metric(key)) for key in keys}
        stats["train_time_s"] = _seed_stat(members, lambda r: r.metric("train_time_s"), per_episode=False)
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
                marker=marker,
                untagged_rate=stats["untagged_rate"][0],
                before_success=_seed_stat(members, lambda r: r.before("success_rate"))[0],
                before_return=_seed_stat(members, lambda r: r.before("mean_return"))[0],
                env_metrics={
                    name: _seed_stat(members, lambda r, name=name: r.env_metrics.get(name)) for name in names
                },
            )
        )
    return summaries


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (pipes and newlines in cells escaped)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def seeds_text(group: GroupSummary) -> str:
    """'3 seeds', or '3 seeds, 4 runs' when a seed has several runs."""
    seeds = f"{group.seeds} seed" + ("s" if group.seeds != 1 else "")
    return seeds if len(group.runs) == group.seeds else f"{seeds}, {len(group.runs)} runs"


def write_csv(path: Path, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
    """`rows` (dicts keyed by `columns`) as a CSV file with a header."""
    import csv

    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
