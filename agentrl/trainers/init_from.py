"""`init_from=<run dir>`: a training run starts from another training run's weights.

The value names a training run (its `final/`, else its newest intact checkpoint) or a `final/` or
`checkpoint-N/` inside one, as `agentrl eval from_run=` does. The source must have trained the same base
model (`model.name` and `model.name_or_path` in its `.hydra/config.yaml`): the run's config keeps the base
model and `init_from`, and only the weights loaded at the start come from the source. So a chain
(`algo=sft` warm-up, then `algo=msgrpo init_from=<sft run>`, then another `init_from` of that run) always
compares against the one base model.

Light on purpose: `agentrl train --dry-run` checks `init_from` here without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentrl.errors import ConfigError, RunDirError

WHAT = "cannot init_from"


@dataclass(frozen=True)
class InitSource:
    """The run `init_from` names and the weights it lends: `path` (a model or LoRA adapter directory),
    `checkpoint` (its name in the run: `final`, `checkpoint-4`)."""

    run_root: Path
    algo: str
    path: Path
    checkpoint: str


def init_source(cfg: DictConfig) -> InitSource | None:
    """What `cfg.init_from` names, checked: a training run of an LLM algorithm with saved weights, of the
    same base model as `cfg.model`. None without `init_from`. Raises one-line errors."""
    value = cfg.get("init_from")
    if value is None:
        return None
    if cfg.task != "train":
        raise ConfigError(
            f"init_from={value}: is for train; to evaluate a trained run use from_run=<run dir>"
        )
    if cfg.algo.name == "dqn":
        raise ConfigError(f"init_from={value}: algo=dqn does not train a language model")
    from agentrl.run import trained_model

    trained = trained_model(value, what=WHAT)
    run = trained.run
    if run.algo == "dqn":
        raise RunDirError(f"{WHAT} {value}: it trained algo=dqn, not a language model")
    theirs, ours = _model_identity(run.config.model), _model_identity(cfg.model)
    if theirs != ours:
        raise ConfigError(
            f"{WHAT} {value}: it trained model {theirs[0]} ({theirs[1]}), this run's model is {ours[0]} "
            f"({ours[1]}); pass model={theirs[0]} or init_from a run of the same model"
        )
    return InitSource(run.root, str(run.algo), trained.path, trained.checkpoint)


def _model_identity(model: Any) -> tuple[str, str]:
    return str(model.get("name")), str(model.get("name_or_path"))


def with_init_weights(cfg: DictConfig) -> DictConfig:
    """`cfg` with the model loaded from `init_from`'s weights (a copy; the run's saved config keeps the
    base model and `init_from`). Unchanged without `init_from`."""
    source = init_source(cfg)
    if source is None:
        return cfg
    import logging

    logging.getLogger(__name__).info(
        "init_from: %s of %s (trained %s)", source.checkpoint, source.run_root, source.algo
    )
    return OmegaConf.merge(cfg, {"model": {"name_or_path": str(source.path)}})


def plan_line(cfg: DictConfig) -> list[str]:
    """The dry run's line for `init_from` (none without it)."""
    source = init_source(cfg)
    if source is None:
        return []
    return [f"  init_from  {source.run_root} ({source.checkpoint}; trained {source.algo}): {source.path}"]


__all__ = ["InitSource", "init_source", "plan_line", "with_init_weights"]
