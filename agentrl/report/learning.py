"""The learning table (`agentrl report DIR --table learning`): one row per complete training run, what it
learned on held-out seeds and how it was asked to answer.

Columns: env, algo, model, answer format, the env's primary metric for the baselines on the same held-out
instances (random, planner, the base model: eval runs found under the same directories, below), the start
(what training began from, eval.json `start`, and its score before the first update, eval.json `before`),
after training (± standard error over the eval episodes), RL's gain over the start paired seed by seed
(± standard error of the paired differences), a second metric where the env has one, the share of
untagged answers, minutes of training and the command that made the run.

Baselines: a complete `agentrl eval` run under the searched directories counts for a training run when it
played the same held-out instances (the same `env` settings and the same eval seeds: `seed`,
`eval.seed_offset`, `eval.episodes`); `random` and `planner` are `agent=random` / `agent=planner`, `base
model` an LLM eval of the run's base model (`model.name_or_path`, no `from_run`) asked in the same format
(the agent's interface settings equal). "–" where none was found.

RL's gain over the start: eval.json's `per_episode` values of the final eval and of its `before` block
(the start on the same seeds), paired by seed: the mean difference and its standard error (sample std of
the differences / sqrt(n)).

Primary metric per env (`PRIMARY`), the quantity the learning targets are set on:

- frozenlake, kitchen: success rate (share of held-out episodes solved);
- snake, snake_poison, tictactoe, datascicoding: mean return (tic-tac-toe also shows the win rate);
- bandit, contextual_bandit: final action coverage (share of arms tried by the last pull; the RLFT
  paper's exploration figure), with the final cumulative regret beside it, both from eval.json
  `diagnostics` (or the env's own `mean_action_coverage` / `mean_regret` when there is none);
- any other env: success rate.

Standard errors: `return_stderr` for returns, the diagnostics' own stderr for coverage and regret, and
sqrt(p (1 - p) / (n - 1)) for a share p of n episodes (the sample standard error of a 0/1 variable).

Answer format (`answer_format`), from the run's agent config, its first transcript where the prefill
was chosen at run time (`agent.prefill=auto`), and `agent.lenient`: `one token after "Move:"` (a prefill
and a one-token answer), `<action> tag` (free text, the tagged answer parsed), `rationale + <action> tag
(cot)`, `scored actions` (TWOSOME's `decision=score`), `numeric observation` (DQN); `, lenient` when
an untagged answer was read anyway.

Files: `learning.md` and `learning.csv` in the output directory.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.errors import RunDirError
from agentrl.report.runs import (
    COMPLETE,
    NON_LLM_ALGOS,
    RunRecord,
    _load_config,
    _load_overrides,
    _natural,
    _number,
    find_runs,
    is_bookkeeping,
    load_run,
    md_table,
)
from agentrl.runs.rundir import override_key

Value = tuple[float, float]  # (value, stderr); nan where unknown


def _share(d: dict[str, Any], *keys: str) -> Value:
    """A share of episodes and its sample standard error."""
    p = next((_number(d.get(k)) for k in keys if _number(d.get(k)) is not None), None)
    n = _number(d.get("episodes"))
    if p is None:
        return math.nan, math.nan
    err = math.sqrt(p * (1 - p) / (n - 1)) if n is not None and n > 1 and 0 <= p <= 1 else math.nan
    return p, err


def _return(d: dict[str, Any]) -> Value:
    value, err = _number(d.get("mean_return")), _number(d.get("return_stderr"))
    return (math.nan if value is None else value), (math.nan if err is None else err)


def _diagnostic(name: str, env_key: str) -> Callable[[dict[str, Any]], Value]:
    def get(d: dict[str, Any]) -> Value:
        block = d.get("diagnostics", {}).get(name) if isinstance(d.get("diagnostics"), dict) else None
        if isinstance(block, dict) and _number(block.get("mean")) is not None:
            err = _number(block.get("stderr"))
            return float(block["mean"]), (math.nan if err is None else err)
        value = _number(d.get(env_key))
        return (math.nan if value is None else value), math.nan

    return get


#: metric name -> how to read (value, stderr) from an eval.json dict or its `before` block
METRICS: dict[str, Callable[[dict[str, Any]], Value]] = {
    "success_rate": lambda d: _share(d, "success_rate"),
    "mean_return": _return,
    "win_rate": lambda d: _share(d, "mean_win_rate", "mean_win"),
    "coverage": _diagnostic("final_coverage", "mean_action_coverage"),
    "regret": _diagnostic("final_regret", "mean_regret"),
}
#: env -> (primary metric, second metric or None)
PRIMARY: dict[str, tuple[str, str | None]] = {
    "frozenlake": ("success_rate", None),
    "kitchen": ("success_rate", None),
    "snake": ("mean_return", None),
    "snake_poison": ("mean_return", None),
    "tictactoe": ("mean_return", "win_rate"),
    "datascicoding": ("mean_return", None),
    "bandit": ("coverage", "regret"),
    "contextual_bandit": ("coverage", "regret"),
}
DEFAULT_PRIMARY = ("success_rate", None)

#: the eval.json `per_episode` list each metric pairs (None: not paired)
PER_EPISODE: dict[str, str | None] = {
    "success_rate": "success",
    "mean_return": "return",
    "coverage": "coverage",
    "regret": "regret",
    "win_rate": None,
}
#: agent settings that make two LLM evaluations ask in the same format
INTERFACE_KEYS = (
    "history",
    "history_observations",
    "observation_last",
    "cot",
    "answer_tag",
    "lenient",
    "system_prompt",
    "prefill",
    "invalid_rule",
    "invalid_penalty",
    "decision",
)
BASELINES = ("random", "planner", "base model")

CSV_COLUMNS = [
    "env",
    "algo",
    "model",
    "answer_format",
    "metric",
    "random",
    "planner",
    "base_model",
    "start",
    "before",
    "before_stderr",
    "after",
    "after_stderr",
    "gain",
    "gain_stderr",
    "gain_pairs",
    "second_metric",
    "second_before",
    "second_after",
    "second_after_stderr",
    "untagged_rate",
    "before_untagged_rate",
    "invalid_rate",
    "episodes",
    "iterations",
    "minutes",
    "seed",
    "run",
    "command",
]
MD_HEADERS = [
    "env",
    "algo",
    "model",
    "answer format",
    "metric",
    "random",
    "planner",
    "base model",
    "start",
    "after ± stderr",
    "RL's gain over the start (paired) ± stderr",
    "also (start → after)",
    "untagged",
    "minutes",
    "command",
]


@dataclass
class LearningRow:
    run: RunRecord
    answer_format: str
    metric: str
    before: Value
    after: Value
    second: str | None
    second_before: Value
    second_after: Value
    command: str
    start: str = "–"  # what training began from (eval.json `start`)
    gain: tuple[float, float, int] = (math.nan, math.nan, 0)  # paired mean difference, its stderr, pairs
    baselines: dict[str, float] = dataclasses.field(default_factory=dict)  # BASELINES -> primary metric

    @property
    def minutes(self) -> float:
        seconds = self.run.metric("train_time_s")
        return math.nan if seconds is None else seconds / 60

    def csv_row(self) -> dict[str, Any]:
        r = self.run
        before = r.eval.get("before") if isinstance(r.eval.get("before"), dict) else {}
        return {
            "env": r.env,
            "algo": r.agent,
            "model": r.model,
            "answer_format": self.answer_format,
            "metric": self.metric,
            "random": _blank(self.baselines.get("random")),
            "planner": _blank(self.baselines.get("planner")),
            "base_model": _blank(self.baselines.get("base model")),
            "start": self.start,
            "before": _blank(self.before[0]),
            "before_stderr": _blank(self.before[1]),
            "after": _blank(self.after[0]),
            "after_stderr": _blank(self.after[1]),
            "gain": _blank(self.gain[0]),
            "gain_stderr": _blank(self.gain[1]),
            "gain_pairs": self.gain[2] or "",
            "second_metric": self.second or "",
            "second_before": _blank(self.second_before[0]),
            "second_after": _blank(self.second_after[0]),
            "second_after_stderr": _blank(self.second_after[1]),
            "untagged_rate": r.raw("untagged_rate"),
            "before_untagged_rate": _blank(_number(before.get("untagged_rate"))),
            "invalid_rate": r.raw("invalid_rate"),
            "episodes": r.raw("episodes"),
            "iterations": r.raw("iterations") or r.raw("total_timesteps"),
            "minutes": _blank(round(self.minutes, 2) if not math.isnan(self.minutes) else math.nan),
            "seed": "" if r.seed is None else r.seed,
            "run": str(r.path),
            "command": self.command,
        }

    def cells(self) -> list[str]:
        also = ""
        if self.second:
            also = f"{self.second} {_fmt(self.second_before)} → {_fmt(self.second_after)}"
        baselines = [_fmt((_nan(self.baselines.get(b)), math.nan)) for b in BASELINES]
        gain = _fmt(self.gain[:2], with_err=True, signed=True)
        return [
            self.run.env,
            self.run.agent,
            self.run.model,
            self.answer_format,
            self.metric,
            *baselines,
            f"{self.start} {_fmt(self.before)}",
            _fmt(self.after, with_err=True),
            gain if math.isnan(self.gain[0]) else f"{gain} (n={self.gain[2]})",
            also,
            _fmt((_nan(_number(self.run.eval.get("untagged_rate"))), math.nan)),
            "–" if math.isnan(self.minutes) else f"{self.minutes:.{2 if self.minutes < 1 else 1}f}",
            self.command,
        ]


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _blank(value: float | None) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _fmt(value: Value, with_err: bool = False, signed: bool = False) -> str:
    mean, err = value
    if math.isnan(mean):
        return "–"
    digits = 2 if abs(mean) >= 10 else 3
    text = f"{mean:{'+' if signed else ''}.{digits}f}"
    return text + (f" ± {err:.{digits}f}" if with_err and not math.isnan(err) else "")


# ---------------------------------------------------------------------------------------------
# what a run asked for
# ---------------------------------------------------------------------------------------------
def answer_format(record: RunRecord, agent: dict[str, Any]) -> str:
    """How the run's model was asked to answer (see the module doc)."""
    if record.agent in NON_LLM_ALGOS:
        return "numeric observation"
    if agent.get("decision") == "score":
        return "scored actions"
    lenient = ", lenient" if agent.get("lenient") is True else ""
    if agent.get("cot"):
        return "rationale + <action> tag (cot)" + lenient
    prefill = agent.get("prefill")
    sampling = agent.get("sampling") if isinstance(agent.get("sampling"), dict) else {}
    if prefill == "auto" and agent.get("lenient", True) and sampling.get("max_new_tokens") in (None, 1):
        # resolved at run time per env and tokenizer (agentrl/agents/llm.py resolve_interface)
        prefill = _transcript_prefill(record.path)
        if prefill is None:
            return "auto (prefill not recorded)"
    elif prefill == "auto":  # a strict parser or a longer answer: auto resolves to no prefill
        prefill = ""
    one_token = sampling.get("max_new_tokens") in (None, 1) and agent.get("prefill") == "auto"
    if prefill and not str(prefill).rstrip().endswith(">"):
        if one_token or sampling.get("max_new_tokens") == 1:
            return f'one token after "{prefill}"'
        return f'free text after "{prefill}"' + lenient
    return "<action> tag" + lenient


def _transcript_prefill(run_dir: Path) -> str | None:
    """The prefill the run's final eval used: the end of its first transcript's prompt after the chat
    template's assistant header ("" for none); None without a transcript."""
    path = run_dir / "transcripts.jsonl"
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as fh:
            first = json.loads(fh.readline())
    except (OSError, ValueError):
        return None
    prompt = first.get("prompt") if isinstance(first, dict) else None
    if not isinstance(prompt, str):
        return None
    return prompt.rsplit("\n", 1)[-1]


def command(run_dir: Path) -> str:
    """`agentrl train <overrides>`, from the run's .hydra/overrides.yaml (Hydra's own settings and the
    task the command sets itself left out), each override shell-quoted where it needs it."""
    overrides = [
        o
        for o in _load_overrides(run_dir / ".hydra" / "overrides.yaml")
        if override_key(o) != "task" and not (is_bookkeeping(o) and override_key(o).startswith("hydra"))
    ]
    return " ".join(["agentrl", "train", *map(_shell_word, overrides)])


def _shell_word(override: str) -> str:
    """`override` as one shell word: as is when safe, in double quotes when only Hydra's single quotes or
    brackets need protecting (`"algo.lr='1e-5'"`), else as `shlex.quote` writes it."""
    quoted = shlex.quote(override)
    if quoted == override or any(c in override for c in '"$`\\!'):
        return quoted
    return f'"{override}"'


def paired_gain(before: dict[str, Any], after: dict[str, Any], metric: str) -> tuple[float, float, int]:
    """The after-minus-before difference of `metric`'s per-episode values (eval.json `per_episode`) over
    the seeds both played: (mean, standard error, pairs); nan where the values are not recorded."""
    key = PER_EPISODE.get(metric)
    lists = [d.get("per_episode") for d in (before, after)]
    if key is None or not all(isinstance(x, dict) for x in lists):
        return math.nan, math.nan, 0
    first, second = (dict(zip(x.get("seed", []), x.get(key, []), strict=False)) for x in lists)  # type: ignore[union-attr]
    diffs = [float(second[s]) - float(first[s]) for s in second if s in first]
    n = len(diffs)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(diffs) / n
    err = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else math.nan
    return mean, err, n


def _instances(cfg: dict[str, Any]) -> str | None:
    """The held-out instances a run evaluated on: its env settings and eval seeds (as JSON text)."""
    env, evals = cfg.get("env"), cfg.get("eval")
    if not isinstance(env, dict) or not isinstance(evals, dict):
        return None
    try:
        seeds = [int(evals["seed_offset"]), int(cfg.get("seed", 0)), int(evals["episodes"])]
    except (KeyError, TypeError, ValueError):
        return None
    return json.dumps({"env": env, "seeds": seeds}, sort_keys=True, default=str)


def _interface(cfg: dict[str, Any]) -> str:
    """The base model and how it is asked to answer (as JSON text)."""
    agent = cfg.get("agent") if isinstance(cfg.get("agent"), dict) else {}
    sampling = agent.get("sampling") if isinstance(agent.get("sampling"), dict) else {}
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    keys = {k: agent.get(k) for k in INTERFACE_KEYS}
    keys["observation_last"] = bool(keys["observation_last"])  # runs from before the option: false
    keys["max_new_tokens"] = sampling.get("max_new_tokens")
    return json.dumps({"model": model.get("name_or_path"), **keys}, sort_keys=True, default=str)


def baseline_index(records: Sequence[RunRecord]) -> dict[tuple[str, ...], RunRecord]:
    """Complete eval runs that are baselines: (instances, "random" | "planner") and (instances, "base
    model", interface) -> the run (the last one found when several match)."""
    index: dict[tuple[str, ...], RunRecord] = {}
    for record in records:
        if record.is_training or record.status != COMPLETE or record.marker:
            continue
        try:
            cfg = _load_config(record.path / ".hydra" / "config.yaml")
        except Exception:  # noqa: BLE001 - load_run read it already
            continue
        instances = _instances(cfg)
        if instances is None or cfg.get("from_run") is not None:
            continue
        agent = cfg.get("agent", {}).get("name") if isinstance(cfg.get("agent"), dict) else None
        if agent in ("random", "planner"):
            index[(instances, agent)] = record
        elif agent == "llm":
            index[(instances, "base model", _interface(cfg))] = record
    return index


def learning_row(record: RunRecord, baselines: dict[tuple[str, ...], RunRecord] | None = None) -> LearningRow:
    try:
        cfg = _load_config(record.path / ".hydra" / "config.yaml")
    except Exception:  # noqa: BLE001 - load_run read it already; a race leaves the format unknown
        cfg = {}
    agent = cfg.get("agent") if isinstance(cfg.get("agent"), dict) else {}
    primary, second = PRIMARY.get(record.env, DEFAULT_PRIMARY)
    before = record.eval.get("before") if isinstance(record.eval.get("before"), dict) else {}
    none: Value = (math.nan, math.nan)
    found: dict[str, float] = {}
    instances = _instances(cfg)
    for name in BASELINES:
        key = (instances, name, _interface(cfg)) if name == "base model" else (instances, name)
        match = (baselines or {}).get(key) if instances is not None else None  # type: ignore[arg-type]
        if match is not None and not math.isnan(METRICS[primary](match.eval)[0]):
            found[name] = METRICS[primary](match.eval)[0]
    start = record.eval.get("start") if isinstance(record.eval.get("start"), dict) else {}
    return LearningRow(
        run=record,
        answer_format=answer_format(record, agent),
        metric=primary,
        before=METRICS[primary](before) if before else none,
        after=METRICS[primary](record.eval),
        second=second,
        second_before=METRICS[second](before) if second and before else none,
        second_after=METRICS[second](record.eval) if second else none,
        command=command(record.path),
        start=str(start.get("label") or _start_label(record, cfg)),
        gain=paired_gain(before, record.eval, primary) if before else (math.nan, math.nan, 0),
        baselines=found,
    )


def _start_label(record: RunRecord, cfg: dict[str, Any]) -> str:
    """What a run without eval.json `start` began from, by its config."""
    if cfg.get("init_from") is not None:
        return "init_from run"
    return "untrained network" if record.agent in NON_LLM_ALGOS else "base model"


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
@dataclass
class LearningReport:
    rows: list[LearningRow]
    skipped: int  # training runs found that are not complete
    out_dir: Path
    files: list[Path]
    group_sizes: list[int] | None = None  # with best_only: how many complete runs each row was chosen from


def best_rows(rows: Sequence[LearningRow]) -> tuple[list[LearningRow], list[int]]:
    """One row per env, algorithm and answer format: the run with the highest primary metric after
    training (ties: the larger paired gain over its start), and how many runs it was chosen from. The
    answer format is part of the key because a result counts only in the format its agent was asked for."""
    groups: dict[tuple[str, str, str], list[LearningRow]] = {}
    for row in rows:
        groups.setdefault((row.run.env, row.run.agent, row.answer_format), []).append(row)

    def score(row: LearningRow) -> tuple[float, float]:
        after, gain = row.after[0], row.gain[0]
        return (
            -math.inf if after is None or math.isnan(after) else after,
            -math.inf if math.isnan(gain) else gain,
        )

    chosen = [(max(group, key=score), len(group)) for group in groups.values()]
    chosen.sort(key=lambda pair: rows.index(pair[0]))
    return [row for row, _ in chosen], [n for _, n in chosen]


def render_learning_markdown(report: LearningReport) -> str:
    parts = [
        "# Learning table",
        "",
        "One row per complete training run: the env's primary metric on held-out seeds for the baselines "
        "on the same instances (random, planner and the base model, from eval runs found beside it), for "
        "the start (what training began from, before the first update: eval.json `before`) and after "
        "training (± standard error over the eval episodes); RL's gain over the start is paired seed by "
        "seed (± standard error of the differences, n pairs). "
        "Primary metric: success rate (frozenlake, kitchen), mean return (snake, tictactoe with the win "
        "rate beside it, datascicoding), final action coverage with the final cumulative regret beside it "
        "(bandit, contextual_bandit). untagged: share of answers without the asked-for tag that the "
        "lenient parser read anyway (– where the run did not record it). minutes: training time.",
    ]
    if report.group_sizes is not None:
        parts += [
            "",
            "Best rows only (`--best`): one row per env, algorithm and answer format, the run with the highest "
            "primary metric after training, with the number of complete runs it was chosen from beside its algo.",
        ]
    if report.skipped:
        parts += [
            "",
            f"{report.skipped} training run(s) not complete were left out (`agentrl report` lists them).",
        ]
    rows = [r.cells() for r in report.rows]
    for cells, n in zip(rows, report.group_sizes or [], strict=False):
        cells[1] = f"{cells[1]} (best of {n})"
    parts += ["", md_table(MD_HEADERS, [[*c[:-1], f"`{c[-1]}`"] for c in rows]) if rows else "_none_", ""]
    return "\n".join(parts)


def build_learning_report(
    paths: Sequence[Path], out_dir: Path | None = None, console: Any = None, best_only: bool = False
) -> LearningReport:
    """Find the training runs under `paths`, write learning.md and learning.csv into `out_dir`
    (default: the first path) and print the table to `console` when given; `best_only` keeps one row per
    env, algorithm and answer format (`best_rows`). Raises RunDirError when a path is missing or no
    complete training run is found."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise RunDirError("report: give at least one directory")
    loaded = [load_run(d) for d in find_runs(paths)]
    records = [r for r in loaded if r.is_training]
    complete = [r for r in records if r.status == COMPLETE]
    baselines = baseline_index(loaded)
    if not complete:
        where = ", ".join(map(str, paths))
        raise RunDirError(
            f"report --table learning: no complete training runs (with eval.json) under {where}"
        )
    rows = sorted(
        (learning_row(r, baselines) for r in complete),
        key=lambda row: [_natural(p) for p in (row.run.env, row.run.agent, row.run.model, str(row.run.path))],
    )
    sizes = None
    if best_only:
        rows, sizes = best_rows(rows)
    out_dir = Path(out_dir) if out_dir is not None else paths[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    report = LearningReport(
        rows,
        len(records) - len(complete),
        out_dir,
        [out_dir / "learning.md", out_dir / "learning.csv"],
        sizes,
    )
    with (out_dir / "learning.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(r.csv_row() for r in rows)
    (out_dir / "learning.md").write_text(render_learning_markdown(report))
    if console is not None:
        print_learning_report(report, console)
    return report


def print_learning_report(report: LearningReport, console: Any) -> None:
    from agentrl.report.layout import print_fitted, print_paths

    # a row number leads, so rows that share env and algo (seeds) stay matched across split tables
    rows = [[str(k), *r.cells()] for k, r in enumerate(report.rows, 1)]
    for cells, n in zip(rows, report.group_sizes or [], strict=False):
        cells[2] = f"{cells[2]} (best of {n})"
    print_fitted(
        console,
        "Learning: held-out eval before and after training",
        ["#", *MD_HEADERS],
        rows,
        keys=3,
        fold=[3, 4, 9, 11, 12, 15],
        right=[0, 6, 7, 8, 10, 13, 14],
        show_lines=True,
    )
    if report.skipped:
        console.print(f"{report.skipped} training run(s) not complete were left out.")
    print_paths(console, "Wrote:", report.files)


__all__ = [
    "LearningReport",
    "LearningRow",
    "answer_format",
    "baseline_index",
    "best_rows",
    "build_learning_report",
    "command",
    "learning_row",
    "paired_gain",
]
