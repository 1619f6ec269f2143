"""A trained Stable-Baselines3 DQN as an agent: `agentrl eval env=snake agent=dqn agent.path=<run dir>`.

The Q-network reads the env's `numeric_observation()` (the same view trainers/dqn.py trains on), so a
model only fits the env it was trained on; `build_dqn_agent` checks the shapes before playing.
torch and stable_baselines3 are imported only when a model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.agents.base import PolicyAgent
from agentrl.errors import ConfigError, RunDirError
from agentrl.types import Decision, StepContext

#: where train_dqn saves the model it evaluates at the end, relative to the run directory
FINAL_MODEL = Path("final") / "model.zip"
PATH_REQUIRED = "agent.path is required for agent=dqn: a DQN run directory or checkpoint zip"


class DQNAgent(PolicyAgent):
    """Greedy policy of a trained SB3 DQN. Illegal argmax actions (tic-tac-toe: an occupied cell) are
    replaced by the legal action with the highest Q-value. `act` scores all episodes of a lockstep
    batch in one forward pass."""

    name = "dqn"

    def __init__(self, model: Any):
        self.model = model
        model.policy.set_training_mode(False)

    @staticmethod
    def observe(env: Any) -> np.ndarray:
        return env.unwrapped.numeric_observation()

    def q_values(self, observations: np.ndarray) -> np.ndarray:
        """Q-values, shape (batch, actions)."""
        import torch

        with torch.no_grad():
            obs, _ = self.model.policy.obs_to_tensor(observations)
            return self.model.policy.q_net(obs).cpu().numpy()

    @staticmethod
    def _valid(ctx: StepContext) -> list[int]:
        valid = [ctx.env.action_index(a) for a in ctx.info.get("valid_actions", [])]
        return valid or list(range(len(ctx.env.action_names)))  # none listed: every action

    def choose(self, ctx: StepContext) -> int:
        obs = self.observe(ctx.env)
        action, _ = self.model.predict(obs, deterministic=True)
        valid = self._valid(ctx)
        if int(action) in valid:
            return int(action)
        q = self.q_values(obs[None])[0]
        return max(valid, key=lambda i: q[i])

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        if not contexts:
            return []
        q = self.q_values(np.stack([self.observe(ctx.env) for ctx in contexts]))
        # argmax over the legal actions = predict(deterministic=True) whenever its action is legal
        return [
            Decision(action=max(self._valid(ctx), key=lambda i: row[i]))
            for ctx, row in zip(contexts, q, strict=True)
        ]


def dqn_model_path(path: str | Path | None) -> Path:
    """The SB3 zip that `agent.path` names: a zip as given; a run directory's final model
    (`final/model.zip`, written at the end of training) or else its newest `checkpoint-N.zip`
    (a run that was stopped before the end) whose manifest checks out. ConfigError / RunDirError with
    one line otherwise."""
    from agentrl.runs.runlog import newest_valid_checkpoint

    if path is None or not str(path).strip():
        raise ConfigError(PATH_REQUIRED)
    path = Path(str(path)).expanduser()
    if not path.exists():
        raise ConfigError(f"{PATH_REQUIRED}; {path} does not exist")
    if path.is_file():
        if path.suffix != ".zip":
            raise ConfigError(f"{PATH_REQUIRED}; {path} is not a .zip file")
        return path
    if (path / FINAL_MODEL).is_file():
        return path / FINAL_MODEL
    newest = newest_valid_checkpoint(path, kind="zip")
    if newest is None:
        raise RunDirError(f"no DQN model in {path}: neither {FINAL_MODEL} nor an intact checkpoint-N.zip")
    return newest


def trained_env(model_path: Path) -> str | None:
    """The env name recorded next to a saved model (final/dqn.json), if any."""
    sidecar = model_path.parent / "dqn.json"
    if model_path.name == FINAL_MODEL.name and sidecar.is_file():
        return json.loads(sidecar.read_text(encoding="utf-8")).get("env")
    return None


def load_dqn_agent(path: str | Path, device: str = "cpu") -> DQNAgent:
    """A DQNAgent from a DQN run directory or an SB3 zip (see `dqn_model_path`)."""
    from stable_baselines3 import DQN

    model_path = dqn_model_path(path)
    try:
        model = DQN.load(model_path, device=device)
    except Exception as exc:  # not an SB3 DQN zip, or a truncated one
        raise RunDirError(f"cannot load a DQN model from {model_path}: {exc}") from exc
    return DQNAgent(model)


def build_dqn_agent(cfg: Any) -> DQNAgent:
    """`agent=dqn` from the composed config: load `agent.path`, check it fits `cfg.env`."""
    from agentrl.envs import env_factory

    agent_cfg = cfg.agent
    model_path = dqn_model_path(agent_cfg.get("path"))
    agent = load_dqn_agent(model_path, device=str(agent_cfg.get("device") or "cpu"))
    env = env_factory(cfg.env)()
    expected = tuple(env.numeric_space().shape)
    got = tuple(agent.model.observation_space.shape)
    actions = int(agent.model.action_space.n)
    if got != expected or actions != len(env.action_names):
        trained = trained_env(model_path)
        hint = f"; it was trained on env={trained}" if trained else ""
        raise ConfigError(
            f"agent=dqn does not fit env={cfg.env.name}: the model takes observations {got} and "
            f"{actions} actions, the env gives {expected} and {len(env.action_names)}{hint} ({model_path})"
        )
    env.close()
    return agent


__all__ = ["FINAL_MODEL", "DQNAgent", "build_dqn_agent", "dqn_model_path", "load_dqn_agent"]
