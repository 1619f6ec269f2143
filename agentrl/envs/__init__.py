"""Text environments and their registry (also registered as gymnasium ids `agentrl/<Name>-v0`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from agentrl.envs.base import NumericObservation, TextEnv
from agentrl.errors import ConfigError, UnknownChoiceError


@dataclass(frozen=True)
class EnvSpec:
    name: str  # registry / config name, e.g. "snake_poison"
    gym_id: str  # e.g. "agentrl/SnakePoison-v0"
    entry_point: str  # "module:Class"
    defaults: dict[str, Any]  # constructor kwargs that define this variant
    description: str


ENV_SPECS: dict[str, EnvSpec] = {
    spec.name: spec
    for spec in [
        EnvSpec(
            "frozenlake",
            "agentrl/FrozenLake-v0",
            "agentrl.envs.frozenlake:FrozenLakeEnv",
            {},
            "Frozen Lake: reach the goal without falling in a hole (fixed 4x4, 8x8 or random maps)",
        ),
        EnvSpec(
            "snake",
            "agentrl/Snake-v0",
            "agentrl.envs.snake:SnakeEnv",
            {},
            "Snake: eat apples (+1), avoid walls and bodies (-1), optional opponent snake",
        ),
        EnvSpec(
            "snake_poison",
            "agentrl/SnakePoison-v0",
            "agentrl.envs.snake:SnakeEnv",
            {"poison_apples": 2},
            "Snake with poison apples (negative reward, own symbol, named in the instructions)",
        ),
        EnvSpec(
            "bandit",
            "agentrl/Bandit-v0",
            "agentrl.envs.bandit:BanditEnv",
            {},
            "Multi-armed bandit: K coloured buttons, Bernoulli or Gaussian arms, horizon 50",
        ),
        EnvSpec(
            "contextual_bandit",
            "agentrl/ContextualBandit-v0",
            "agentrl.envs.contextual_bandit:ContextualBanditEnv",
            {},
            "Contextual bandit: K coloured buttons whose rewards depend on a context shown each round",
        ),
        EnvSpec(
            "tictactoe",
            "agentrl/TicTacToe-v0",
            "agentrl.envs.tictactoe:TicTacToeEnv",
            {},
            "Tic-tac-toe against a random, MCTS or perfect opponent (+1 win, 0 draw, -1 loss)",
        ),
        EnvSpec(
            "datascicoding",
            "agentrl/DataSciCoding-v0",
            "agentrl.envs.datascicoding:DataSciCodingEnv",
            {},
            "DataSciCoding: write a scikit-learn build_model(X, y); reward = mean ROC-AUC, -1 on error",
        ),
        EnvSpec(
            "kitchen",
            "agentrl/Kitchen-v0",
            "agentrl.envs.kitchen:KitchenEnv",
            {},
            "Kitchen: make a salad with multi-word actions (POAD's Overcooked tasks; +0.2 subtasks, +1 serve)",
        ),
        EnvSpec(
            "openenv",
            "agentrl/OpenEnv-v0",
            "agentrl.envs.openenv:OpenEnvEnv",
            {},
            "Any OpenEnv server (env.url=http://host:port), e.g. an agentrl env served by agentrl serve",
        ),
    ]
}


def _load(entry_point: str) -> type[TextEnv]:
    import importlib

    module, _, attr = entry_point.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_env(name: str, **kwargs: Any) -> TextEnv:
    """Build a registered env by name; kwargs override the variant's defaults."""
    if name not in ENV_SPECS:
        raise UnknownChoiceError("env", name, sorted(ENV_SPECS))
    spec = ENV_SPECS[name]
    cls = _load(spec.entry_point)
    try:
        return cls(**{**spec.defaults, **kwargs})
    except TypeError as exc:  # an unknown or missing constructor argument
        raise ConfigError(f"env {name!r}: {exc}") from exc


def env_factory(env_cfg: Any) -> Callable[[], TextEnv]:
    """A zero-argument constructor of the env an `env` config names (its other keys are the constructor's
    arguments); builds one env now so a bad option fails early."""
    options = {str(k): env_cfg[k] for k in env_cfg}
    name = options.pop("name")
    make_env(name, **options).close()
    return lambda: make_env(name, **options)


def prelaunch_check(cfg: Any, machine: Any) -> None:
    """The env a job names builds: a bad option fails in one line, before a run directory exists."""
    env_factory(cfg.env)


def register_gym_envs() -> None:
    for spec in ENV_SPECS.values():
        if spec.gym_id not in gym.registry:
            gym.register(id=spec.gym_id, entry_point=spec.entry_point, kwargs=dict(spec.defaults))


register_gym_envs()

__all__ = [
    "ENV_SPECS",
    "EnvSpec",
    "NumericObservation",
    "TextEnv",
    "env_factory",
    "make_env",
    "prelaunch_check",
    "register_gym_envs",
]
