"""Runs as models: `from_run=<run>` evaluates what a training run trained, `init_from=<run>` trains from it.

`trained_model` finds the weights a run directory names (its `final/` or a named checkpoint);
`from_run_overrides` composes an evaluation of it with the run's own settings (the env it trained on, or
another one for a transfer preset); `init_source` / `with_init_weights` check that a run to start from
trained the same base model and load its weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentrl.config import CONF_DIR, CONFIG_GROUPS
from agentrl.config.presets import flatten, override_text
from agentrl.errors import ConfigError, RunDirError
from agentrl.runs.rundir import (
    SavedRun,
    load_train_run,
    merge_overrides,
    override_key,
    override_value,
    quote,
    under,
)

log = logging.getLogger(__name__)

NO_ALGO_IN_EVAL = "eval takes no algo; to evaluate a trained run use from_run=<run dir>"
#: keys of a training run's overrides that an evaluation of it leaves out
NOT_FOR_EVAL = ("task", "algo", "resume", "from_run", "init_from", "name", "hydra")


@dataclass
class TrainedModel:
    """What `from_run=` names: the training run, the model file or directory to load, and its name
    relative to the run (`final`, `checkpoint-4`, `final/model.zip`, `checkpoint-3000.zip`)."""

    run: SavedRun
    path: Path
    checkpoint: str


def trained_model(value: str | Path, what: str = "cannot evaluate from_run") -> TrainedModel:
    """The model `from_run=<value>` evaluates (or `init_from=` starts from: `what` opens its errors): a
    training run directory (its final model, else its newest intact checkpoint), or a `final/` or
    `checkpoint-N` inside one."""
    from agentrl.runs.runlog import newest_valid_checkpoint

    path = Path(str(value)).expanduser().resolve()
    given: Path | None = None
    if not (path / ".hydra" / "config.yaml").is_file() and (path.parent / ".hydra" / "config.yaml").is_file():
        path, given = path.parent, path
    run = load_train_run(path, what)
    root = run.root
    if run.algo == "dqn":
        from agentrl.agents.dqn import dqn_model_path

        if given is not None and given.is_dir() and (given / "model.zip").is_file():
            model = given / "model.zip"
        else:
            model = dqn_model_path(given or root)
    else:
        candidates = [given] if given is not None else [root / "final"]
        if given is None:
            candidates.append(newest_valid_checkpoint(root, kind="dir"))
        model = next((p for p in candidates if _holds_model(p)), None)
        if model is None:
            where = given.name if given is not None else "final/ nor a checkpoint-N/"
            raise RunDirError(f"{what} {value}: no trained model there (neither {where} with a model)")
    return TrainedModel(run, model, model.relative_to(root).as_posix())


def prelaunch_check(cfg: DictConfig, machine: Any) -> None:
    """A run to train from (`init_from=`) is there and trained the same base model: one line, no run
    directory."""
    init_source(cfg)


def init_source(cfg: DictConfig) -> TrainedModel | None:
    """What `init_from=<value>` names (a training run: its final/, else its newest checkpoint, or a final/
    or checkpoint-N inside one), checked: an LLM training run of the same base model (`model.name` and
    `model.name_or_path` in its .hydra config). None without init_from. Raises one-line errors."""
    value = cfg.get("init_from")
    if value is None:
        return None
    if cfg.task != "train":
        raise ConfigError(
            f"init_from={value}: is for train; to evaluate a trained run use from_run=<run dir>"
        )
    if cfg.algo.name == "dqn":
        raise ConfigError(f"init_from={value}: algo=dqn does not train a language model")
    what = "cannot init_from"
    trained = trained_model(value, what=what)
    if trained.run.algo == "dqn":
        raise RunDirError(f"{what} {value}: it trained algo=dqn, not a language model")
    theirs, ours = (
        tuple(str(m.get(k)) for k in ("name", "name_or_path")) for m in (trained.run.config.model, cfg.model)
    )
    if theirs != ours:
        raise ConfigError(
            f"{what} {value}: it trained model {theirs[0]} ({theirs[1]}), this run's model is {ours[0]} "
            f"({ours[1]}); pass model={theirs[0]} or init_from a run of the same model"
        )
    return trained


def with_init_weights(cfg: DictConfig) -> DictConfig:
    """`cfg` loading the model from `init_from`'s weights (a copy: the run's saved config keeps the base
    model and init_from, so a chain of runs always compares against one base model)."""
    trained = init_source(cfg)
    if trained is None:
        return cfg
    log.info("init_from: %s of %s (trained %s)", trained.checkpoint, trained.run.root, trained.run.algo)
    return OmegaConf.merge(cfg, {"model": {"name_or_path": str(trained.path)}})


#: what an SFT run's `algo.demonstrations` makes of the model RL starts from
START_LABELS = {
    "planner": "planner BC",
    "random": "format warm-up (random moves)",
    "scored": "format warm-up (own scores)",
}


def start_description(cfg: DictConfig) -> dict[str, Any]:
    """What a training run starts from (eval.json `start`; its `before` block is that start evaluated on
    the same held-out seeds): `label` ("base model", "planner BC", ...), and with init_from the run and
    checkpoint it loaded and the algorithm that trained them."""
    trained = init_source(cfg)
    if trained is None:
        return {"label": "untrained network" if cfg.algo.name == "dqn" else "base model"}
    algo = str(trained.run.algo)
    demos = OmegaConf.select(trained.run.config, "algo.demonstrations") if algo == "sft" else None
    return {
        "label": START_LABELS.get(str(demos), f"{algo} run"),
        "run": str(trained.run.root),
        "checkpoint": trained.checkpoint,
        "algo": algo,
    }


def init_plan_line(cfg: DictConfig) -> list[str]:
    """The dry run's init_from line (none without it)."""
    trained = init_source(cfg)
    if trained is None:
        return []
    return [
        f"  init_from  {trained.run.root} ({trained.checkpoint}; trained {trained.run.algo}): {trained.path}"
    ]


def plays_trained_model(cfg: DictConfig, trained: TrainedModel) -> bool:
    """Whether an eval config plays `trained`'s model (a command-line `model.name_or_path=` or
    `agent.path=` may name another model while keeping the run's settings)."""
    named = cfg.agent.get("path") if cfg.agent.name == "dqn" else cfg.model.get("name_or_path")
    return named is not None and Path(str(named)).expanduser().resolve() == trained.path.resolve()


def _holds_model(path: Path | None) -> bool:
    return (
        path is not None
        and path.is_dir()
        and any((path / f).is_file() for f in ("config.json", "adapter_config.json"))
    )


def from_run_overrides(trained: TrainedModel, extra: list[str], env: str | None = None) -> list[str]:
    """Overrides that evaluate a trained model as its run's own final evaluation did: the run's
    overrides without the training-only keys, the model, and the evaluation's sampling settings (the
    LLM trainer evaluates at algo.eval_temperature and algo.max_new_tokens); `extra` wins over all.

    `env` (an env option, from `from_run_env`): evaluate on that env instead (zero-shot transfer). The
    run's env settings and its preset are dropped (they configure the env it trained on); its agent and
    model settings, which the preset may have set, are kept as explicit overrides read from its config."""
    run = trained.run
    dropped = NOT_FOR_EVAL + (("env", "experiment") if env else ())
    previous = [o for o in run.overrides if not under(override_key(o), dropped)]
    if env and run.algo != "dqn":
        previous = merge_overrides(previous, _kept_settings(run), CONFIG_GROUPS)
    if env:
        previous = merge_overrides(previous, [f"env={env}"], CONFIG_GROUPS)
    if run.algo == "dqn":
        previous = [o for o in previous if not under(override_key(o), ("agent", "model"))]
        derived = ["agent=dqn", f"agent.path={quote(trained.path)}"]
    else:
        from agentrl.algos import LLM_ALGORITHMS

        algo = run.config.algo
        derived = [f"model.name_or_path={quote(trained.path)}"]
        spec = LLM_ALGORITHMS.get(str(run.algo))
        if spec is not None and spec.decision != "generate":
            # the trainer set it at run time (TWOSOME scores the valid actions); the saved config keeps
            # the agent's own setting, under which the trained policy would be asked to generate
            derived.append(f"agent.decision={spec.decision}")
        if algo.get("eval_temperature") is not None:
            derived.append(f"agent.sampling.temperature={float(algo.eval_temperature)}")
        if algo.get("max_new_tokens") is not None:
            derived.append(f"agent.sampling.max_new_tokens={int(algo.max_new_tokens)}")
    return merge_overrides(merge_overrides(previous, derived, CONFIG_GROUPS), extra, CONFIG_GROUPS)


def _kept_settings(run: SavedRun) -> list[str]:
    """A run's agent and model as overrides: each group's option, then every resolved key whose value
    differs from that option's file (what the run's preset or command line set)."""
    from agentrl.config import group_options, option_config

    kept: list[str] = []
    for group in ("agent", "model"):
        node = run.config.get(group)
        if not isinstance(node, DictConfig):
            continue
        values = flatten(OmegaConf.to_container(node, resolve=True))
        option = str(node.get("name"))
        defaults: dict[str, Any] = {}
        if option in group_options(group):
            kept.append(f"{group}={option}")
            defaults = flatten(OmegaConf.to_container(option_config(group, option), resolve=True))
        kept += [
            f"{group}.{key}={override_text(value)}"
            for key, value in values.items()
            if key not in defaults or defaults[key] != value
        ]
    return kept


def _transfer_env(overrides: list[str]) -> str | None:
    """The env `from_run_env` names: on the command line, else in the experiment preset named there
    (read from its file: the preset is composed only after the run's settings are known)."""
    from agentrl.config import group_options
    from agentrl.errors import UnknownChoiceError

    given = [o for o in overrides if override_key(o) == "from_run_env"]
    value: Any = override_value(given[-1]) if given else None
    presets = [o for o in overrides if override_key(o) == "experiment"]
    if not given and presets:
        option = override_value(presets[-1])
        path = CONF_DIR / "experiment" / f"{option}.yaml"
        if isinstance(option, str) and path.is_file():
            value = OmegaConf.load(path).get("from_run_env")
    if value is None or str(value) in ("", "null"):
        return None
    if str(value) not in group_options("env"):
        raise UnknownChoiceError("from_run_env", str(value), group_options("env"))
    return str(value)


def eval_overrides(overrides: list[str]) -> list[str]:
    """An eval's overrides: `algo` refused, `from_run=` expanded into the run's settings."""
    if any(under(override_key(o), ("algo",)) for o in overrides):
        raise ConfigError(NO_ALGO_IN_EVAL)
    given = [o for o in overrides if override_key(o) == "from_run"]
    value = override_value(given[-1]) if given else None
    if value is None or str(value) in ("", "null"):
        _hint_from_run(overrides)
        return overrides
    if isinstance(value, list):
        raise ConfigError(f"from_run takes one run directory, not a sweep ({given[-1]})")
    return from_run_overrides(trained_model(str(value)), overrides, env=_transfer_env(overrides))


def _hint_from_run(overrides: list[str]) -> None:
    """A model named inside a training run plays with the command's settings, not the run's (its
    prefill, answer length, eval temperature): say how to get the run's own."""
    given = [o for o in overrides if override_key(o) in ("model.name_or_path", "agent.path")]
    value = override_value(given[-1]) if given else None
    if not isinstance(value, str):
        return
    path = Path(value).expanduser()
    for root in (path, path.parent):
        try:
            run = load_train_run(root, "")
        except RunDirError:
            continue
        log.warning(
            "%s is a model of training run %s; this eval uses the command's settings, labelled as the "
            "base agent. To evaluate it with the run's own settings: agentrl eval from_run=%s",
            value,
            run.root,
            path,
        )
        return
