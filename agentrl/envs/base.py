"""TextEnv: the contract every environment follows. Environments know nothing about LLMs or torch.

An environment is a gymnasium.Env whose observations are text and whose actions are indices into a
fixed list of action names. `step` accepts an index or a name. Each `info` carries:

- ``valid_actions``: list[str], the action names that are legal now (tic-tac-toe: empty cells);
- ``state``: a JSON-serialisable dict with the structured state (for planners, DQN and logging);
- ``success``: bool, only meaningful at episode end (goal reached, game won, ...).

`instructions` is the fixed task text (rules, rewards, the list of actions). The answer format an LLM
must use is added by the agent's text interface (agents/interface.py), not here.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from agentrl.errors import ConfigError

# Observation text alphabet for the gymnasium Text space (printable ASCII plus newline).
TEXT_CHARSET = frozenset(chr(c) for c in range(32, 127)) | {"\n"}


class TextEnv(gym.Env):
    """Base class. Subclasses set `action_names`, implement `_reset`, `_step`, `render_text`, `state`."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    #: registry name, e.g. "frozenlake"
    name: ClassVar[str] = "base"
    #: the action shown to the model and parsed back, e.g. ["left", "down", "right", "up"]
    action_names: list[str]
    #: hard cap on the number of agent moves in one episode (truncation)
    max_steps: int
    #: the keys `reset(options=...)` understands (documented in each env's class docstring)
    reset_option_names: ClassVar[tuple[str, ...]] = ()
    #: True for an env whose agent answers with free text (e.g. code): its `step` also accepts that text
    #: (a str), the rollout passes `Decision.text` to it and records `text_action_name(text)`, and the LLM
    #: agent extracts the text from its completion instead of matching an action name. Action indices
    #: still work (classic agents); what they mean is the env's choice (datascicoding: reference solutions).
    free_text_action: ClassVar[bool] = False
    #: a free-text env's reward for an empty answer, which is what an agent submits when it has no usable
    #: text (the LLM agent's prompt states it, with its invalid-answer penalty); None: not stated
    empty_answer_reward: ClassVar[float | None] = None

    observation_space = gym.spaces.Text(max_length=8192, charset=TEXT_CHARSET)

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(len(self.action_names))

    # ---- the text interface -------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        """Fixed task text: rules, rewards, and the names of the actions."""
        raise NotImplementedError

    def render_text(self) -> str:
        """The current observation as text (grid and coordinates where spatial)."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """Structured state (JSON-serialisable) for planners, DQN and logging."""
        raise NotImplementedError

    def text_action_name(self, text: str) -> str:
        """A short name of a free-text action for logs and episode summaries (not the text itself)."""
        return f"text ({len(text)} chars)" if text.strip() else "empty answer"

    def valid_actions(self) -> list[str]:
        return list(self.action_names)

    def facts(self) -> str | None:
        """What the current state shows that bears on the next decision, in a sentence or two (a bandit:
        the buttons not pressed yet), for demonstrations that state their reason (`algo.state_facts`);
        None where the env states none."""
        return None

    def describe(self) -> str | None:
        """One line on the task the settings make (the map, the cap), shown by `--dry-run`; None where the
        settings say it all."""
        return None

    def default_action(self) -> int:
        """The action executed when an agent's answer cannot be parsed (`penalty_default` rule)."""
        return self.action_index(self.valid_actions()[0])

    def action_index(self, action: int | str | np.integer) -> int:
        """Index of an action given as index or (case-insensitive) name; ValueError if neither."""
        if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            if 0 <= int(action) < len(self.action_names):
                return int(action)
            raise ValueError(f"action index {action} out of range 0..{len(self.action_names) - 1}")
        if isinstance(action, str):
            lowered = [a.lower() for a in self.action_names]
            if action.strip().lower() in lowered:
                return lowered.index(action.strip().lower())
        raise ValueError(f"unknown action {action!r}; valid: {', '.join(self.action_names)}")

    # ---- gymnasium API ------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.steps_taken = 0
        self._reset(options or {})
        return self.render_text(), self._info(success=False)

    def step(self, action: int | str):
        index = self.action_index(action)
        reward, terminated, success, extra = self._step(index)
        self.steps_taken += 1
        truncated = (not terminated) and self.steps_taken >= self.max_steps
        info = self._info(success=success)
        info.update(extra)
        return self.render_text(), float(reward), bool(terminated), bool(truncated), info

    def render(self):
        return self.render_text()

    def _info(self, success: bool) -> dict[str, Any]:
        return {"valid_actions": self.valid_actions(), "state": self.state(), "success": bool(success)}

    # ---- what subclasses implement -----------------------------------------------------------
    def _reset(self, options: dict) -> None:
        """Start a new episode using self.np_random (already seeded by reset)."""
        raise NotImplementedError

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        """Apply one action: return (reward, terminated, success, extra info)."""
        raise NotImplementedError

    # ---- numeric view for DQN ----------------------------------------------------------------
    def numeric_space(self) -> gym.spaces.Box:
        """Box space of `numeric_observation`."""
        raise NotImplementedError

    def numeric_observation(self) -> np.ndarray:
        """The current state as a float32 vector/planes for DQN (see NumericObservation)."""
        raise NotImplementedError


def reset_probability(env: str, key: str, value: Any) -> float:
    """A probability reset option (e.g. `random_start`) as a float in [0, 1]; ConfigError otherwise."""
    try:
        p = float(value)
    except (TypeError, ValueError):
        p = float("nan")
    if isinstance(value, bool) or not 0.0 <= p <= 1.0:  # NaN fails the comparison too
        raise ConfigError(f"{env} reset option {key} must be a probability in [0, 1], got {value!r}")
    return p


class NumericObservation(gym.ObservationWrapper):
    """Wraps a TextEnv so observations are `numeric_observation()` arrays (for Stable-Baselines3)."""

    def __init__(self, env: TextEnv):
        super().__init__(env)
        self.observation_space = env.unwrapped.numeric_space()

    def observation(self, observation):
        return self.env.unwrapped.numeric_observation()
