"""Contextual bandit in BanditBench's "button" framing: the best button depends on a context shown each round.

K buttons carry colour names (envs/bandit.py COLOURS) shuffled by the reset seed. Before every press the
env draws a context x of d named numeric features, each uniform in [-1, 1] and rounded to two decimals
(the text shows exactly the values the rewards use). With x~ = (1, x) and per-arm parameters
theta_a ~ N(0, scale^2 I) drawn per seed, a button's expected reward is

- bernoulli: mu_a(x) = sigmoid(theta_a . x~), the reward is 1 with that probability, else 0;
- gaussian: mu_a(x) = theta_a . x~ (linear, LinUCB's model), the reward ~ N(mu_a(x), gaussian_sd^2).

The episode never terminates early; it truncates at `horizon`. The observation shows the current
context and the last `history` presses with their contexts. ``info`` carries ``context`` (the features
of the next press), ``arm_means`` and ``best_arm``/``best_arm_name`` for that context, and ``regret``,
the cumulative expected regret ``sum_t (max_a mu_a(x_t) - mu_{a_t}(x_t))``, and ``step_arm_means`` (the K
means of every press so far, for the evaluation's decision diagnostics). ``success`` at the end: in
the second half of the episode, the pressed button was the best one for its context more than half of
the time.

``info["episode_metrics"]`` holds the bandit env's RLFT diagnostics, computed so far in the episode:
``regret``; ``action_coverage`` (share of arms tried); ``best_arm_share`` (share of presses of the best
arm for that press's context); ``greedy_share`` and ``frequency_share`` as in envs/bandit.py (judged on
the context-free empirical means and counts, so they show an agent that ignores the context).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.envs.bandit import COLOURS, REWARD_KINDS, pull_arm
from agentrl.envs.base import TextEnv
from agentrl.errors import ConfigError, UnknownChoiceError

#: Context feature names, in the order the context vector lists them (the first `features` are used).
FEATURE_NAMES: tuple[str, ...] = (
    "temperature",
    "humidity",
    "traffic",
    "hour",
    "price",
    "age",
    "income",
    "distance",
    "rating",
    "demand",
    "wind",
    "noise",
)
#: gymnasium's Text observation space caps an observation at this many characters (envs/base.py)
_MAX_OBSERVATION_CHARS = 8192


def sigmoid(z: np.ndarray | float) -> np.ndarray | float:
    """The logistic function."""
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


class ContextualBanditEnv(TextEnv):
    """K coloured buttons whose expected rewards are a seeded (generalised) linear function of a context."""

    name = "contextual_bandit"

    def __init__(
        self,
        arms: int = 5,
        features: int = 3,
        reward: str = "bernoulli",
        gaussian_sd: float = 0.5,
        scale: float = 1.5,
        horizon: int = 50,
        history: int = 20,
        render_mode: str | None = None,
    ):
        if not 2 <= int(arms) <= len(COLOURS):
            raise ConfigError(f"env contextual_bandit: arms must be between 2 and {len(COLOURS)}, got {arms}")
        if not 1 <= int(features) <= len(FEATURE_NAMES):
            raise ConfigError(
                f"env contextual_bandit: features must be between 1 and {len(FEATURE_NAMES)}, got {features}"
            )
        if reward not in REWARD_KINDS:
            raise UnknownChoiceError("contextual_bandit reward", reward, REWARD_KINDS)
        if float(gaussian_sd) <= 0:
            raise ConfigError(f"env contextual_bandit: gaussian_sd must be positive, got {gaussian_sd}")
        if float(scale) <= 0:
            raise ConfigError(f"env contextual_bandit: scale must be positive, got {scale}")
        if int(horizon) < 1:
            raise ConfigError(f"env contextual_bandit: horizon must be at least 1, got {horizon}")
        if int(history) < 0:
            raise ConfigError(f"env contextual_bandit: history must be >= 0 (0 = no history), got {history}")
        self.arms = int(arms)
        self.features = int(features)
        self.reward_kind = reward
        self.gaussian_sd = float(gaussian_sd)
        self.scale = float(scale)
        self.horizon = self.max_steps = int(horizon)
        self.history = int(history)
        self.feature_names = list(FEATURE_NAMES[: self.features])
        longest = self._longest_observation()
        if longest > _MAX_OBSERVATION_CHARS:
            raise ConfigError(
                f"env contextual_bandit: history={history} with {features} features can make observations of "
                f"{longest} characters, over the {_MAX_OBSERVATION_CHARS} an observation may have; show "
                "fewer presses"
            )
        # Placeholder names until the first reset shuffles them; the action space only needs K.
        self.action_names = list(COLOURS[: self.arms])
        super().__init__(render_mode=render_mode)
        self.theta = np.zeros((self.arms, self.features + 1))
        self.context = np.zeros(self.features)
        self._clear()

    def _longest_observation(self) -> int:
        """An upper bound on the observation's length (the longest names, values and rewards)."""
        name = max(len(c) for c in COLOURS)
        header = 40 + 2 * len(str(self.horizon)) + self.arms * (name + 2)
        current = 20 + sum(len(f) + 8 for f in self.feature_names)
        legend = 90 + sum(len(f) + 2 for f in self.feature_names)
        # 30 characters cover the arrow, "reward" and a reward of up to ten characters
        line = 6 * self.features + name + 30
        return header + current + legend + self.history * line

    def _clear(self) -> None:
        self.counts = [0] * self.arms
        self.sums = [0.0] * self.arms
        self.step_means: list[list[float]] = []  # the K means each press was drawn from (diagnostics)
        self.t = 0
        self.last_action: int | None = None
        self.last_reward: float | None = None
        self.regret = 0.0
        self.contexts: list[list[float]] = []  # the context of each press so far
        self.actions: list[int] = []
        self.rewards: list[float] = []
        self.best_pulls: list[bool] = []  # whether each press was the best arm for its context
        self.greedy_pulls = 0  # pulls of an empirically best arm (after the first pull)
        self.frequent_pulls = 0  # pulls of a most-pulled arm (after the first pull)

    # ---- the reward model ----------------------------------------------------------------------
    def means(self, context: np.ndarray | list[float]) -> np.ndarray:
        """Expected reward of every arm for a context (the generator's means)."""
        logits = self.theta @ np.concatenate([[1.0], np.asarray(context, dtype=np.float64)])
        return np.asarray(sigmoid(logits)) if self.reward_kind == "bernoulli" else logits

    @property
    def arm_means(self) -> np.ndarray:
        """The arms' expected rewards for the current context."""
        return self.means(self.context)

    @property
    def best_arm(self) -> int:
        """The best arm for the current context."""
        return int(np.argmax(self.arm_means))

    def _draw_context(self) -> np.ndarray:
        # Rounded, so the two decimals the text shows are exactly the values the rewards use.
        return np.round(self.np_random.uniform(-1.0, 1.0, size=self.features), 2)

    # ---- episode dynamics ----------------------------------------------------------------------
    def _reset(self, options: dict) -> None:
        # Draw order is part of reproducibility: names, then the arm parameters, then the first context.
        order = self.np_random.permutation(len(COLOURS))[: self.arms]
        self.action_names = [COLOURS[i] for i in order]
        self.theta = self.np_random.normal(0.0, self.scale, size=(self.arms, self.features + 1))
        self._clear()
        self.context = self._draw_context()

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        means = self.arm_means
        reward = pull_arm(self, index, means)
        self.contexts.append([float(v) for v in self.context])
        self.actions.append(index)
        self.rewards.append(reward)
        self.best_pulls.append(index == int(np.argmax(means)))
        self.step_means.append([float(m) for m in means])
        self.context = self._draw_context()  # the context of the next press
        success = self.t >= self.horizon and self.mostly_best()
        return reward, False, success, {}

    def mostly_best(self) -> bool:
        """True when, in the second half of the presses so far, the best arm for the context was pressed
        more than half of the time."""
        late = self.best_pulls[len(self.best_pulls) // 2 :]
        return bool(late) and 2 * sum(late) > len(late)

    def _info(self, success: bool) -> dict[str, Any]:
        info = super()._info(success)
        means = self.arm_means
        info["context"] = [float(v) for v in self.context]
        info["arm_means"] = [float(m) for m in means]
        info["best_arm"] = int(np.argmax(means))
        info["best_arm_name"] = self.action_names[info["best_arm"]]
        info["regret"] = float(self.regret)
        # per press, the means of that press's context: agentrl/diagnostics.py's regret and greediness curves
        info["step_arm_means"] = list(self.step_means)
        judged = max(self.t - 1, 1)
        info["episode_metrics"] = {
            "regret": float(self.regret),
            "action_coverage": sum(c > 0 for c in self.counts) / self.arms,
            "best_arm_share": sum(self.best_pulls) / max(self.t, 1),
            "greedy_share": self.greedy_pulls / judged,
            "frequency_share": self.frequent_pulls / judged,
        }
        return info

    # ---- text interface ------------------------------------------------------------------------
    def _format_reward(self, reward: float) -> str:
        return str(int(reward)) if self.reward_kind == "bernoulli" else f"{reward:.2f}"

    def _format_context(self, context: np.ndarray | list[float], names: bool) -> str:
        if names:
            return ", ".join(f"{n} {v:+.2f}" for n, v in zip(self.feature_names, context, strict=True))
        return " ".join(f"{v:+.2f}" for v in context)

    @property
    def instructions(self) -> str:
        names = ", ".join(self.action_names)
        features = ", ".join(self.feature_names)
        if self.reward_kind == "bernoulli":
            distribution = (
                "pressing a button gives reward 1 with a probability that depends on the button and on the "
                "context, and reward 0 otherwise."
            )
        else:
            distribution = (
                "pressing a button gives a reward drawn from a Gaussian distribution whose mean depends on "
                f"the button and on the context (standard deviation {self.gaussian_sd:g})."
            )
        return (
            f"You are a contextual bandit algorithm in a room with {self.arms} buttons labeled {names}. "
            f"Before each press you see a context of {self.features} features ({features}), each a number "
            f"between -1 and 1 that changes every round. The button rewards are fixed but unknown functions "
            f"of the context: {distribution} Which button is best can differ from context to context. "
            f"You have {self.horizon} time steps; at each time step you press one button and receive its "
            f"reward. Your goal is to maximize the total reward over the {self.horizon} time steps. "
            f"Your action is the label of one button: {names}."
        )

    def render_text(self) -> str:
        lines = [
            f"Round {min(self.t + 1, self.horizon)} of {self.horizon}. Buttons: {', '.join(self.action_names)}."
        ]
        if self.history > 0:
            shown = list(zip(self.contexts, self.actions, self.rewards, strict=True))[-self.history :]
            if shown:
                lines.append(
                    f"Your last {len(shown)} presses (oldest first), each as: context "
                    f"({', '.join(self.feature_names)}) -> button, reward:"
                )
                lines += [
                    f"{self._format_context(x, names=False)} -> {self.action_names[a]}, "
                    f"reward {self._format_reward(r)}"
                    for x, a, r in shown
                ]
            else:
                lines.append("No button has been pressed yet.")
        lines.append(f"Context now: {self._format_context(self.context, names=True)}.")
        return "\n".join(lines)

    def state(self) -> dict[str, Any]:
        return {
            "arms": self.arms,
            "features": self.features,
            # not "names": agentrl/diagnostics.py treats a final info with arm_means and state["names"] as a
            # context-free bandit whose means are fixed, which would misreport this env's regret curves
            "arm_names": list(self.action_names),
            "feature_names": list(self.feature_names),
            "context": [float(v) for v in self.context],
            "contexts": [list(x) for x in self.contexts],
            "actions": list(self.actions),
            "rewards": list(self.rewards),
            "counts": list(self.counts),
            "sums": [float(s) for s in self.sums],
            "t": self.t,
            "last_action": self.last_action,
            "last_reward": self.last_reward,
        }

    # ---- numeric view for DQN ------------------------------------------------------------------
    def numeric_space(self) -> gym.spaces.Box:
        # [context (d), pull share per arm (K), empirical mean per arm (K), t / horizon]
        k, d = self.arms, self.features
        mean_low, mean_high = (0.0, 1.0) if self.reward_kind == "bernoulli" else (-np.inf, np.inf)
        low = np.array([-1.0] * d + [0.0] * k + [mean_low] * k + [0.0], dtype=np.float32)
        high = np.array([1.0] * d + [1.0] * k + [mean_high] * k + [1.0], dtype=np.float32)
        return gym.spaces.Box(low=low, high=high, dtype=np.float32)

    def numeric_observation(self) -> np.ndarray:
        counts = np.asarray(self.counts, dtype=np.float64)
        means = np.divide(self.sums, counts, out=np.zeros(self.arms), where=counts > 0)
        share = np.minimum(counts / self.horizon, 1.0)
        progress = min(self.t / self.horizon, 1.0)
        return np.concatenate([self.context, share, means, [progress]]).astype(np.float32)


def linear_features(context: list[float] | np.ndarray) -> np.ndarray:
    """The context with a leading 1 (the bias term of the reward model): what LinUCB regresses on."""
    return np.concatenate([[1.0], np.asarray(context, dtype=np.float64)])


__all__ = ["FEATURE_NAMES", "ContextualBanditEnv", "linear_features", "sigmoid"]
