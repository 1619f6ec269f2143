"""Multi-armed bandit in BanditBench's "button" framing (the RLFT paper; docs/envs.md).

K buttons carry colour names drawn from a fixed list and shuffled by the reset seed, so the
name -> arm map differs between episodes but is fixed within one. Each button pays a reward drawn
from its own distribution: Bernoulli (means ~ U(0, 1), drawn per seed) or Gaussian (means ~ N(0, 1),
standard deviation `gaussian_sd`). The episode never terminates early; it truncates at `horizon`.

The observation shows the last `history` transitions ("blue button, reward 1"), the context
BanditBench gives the model. ``info`` carries the diagnostics evaluation needs at every step:
``arm_means``, ``best_arm`` (index), ``best_arm_name`` and ``regret``, the cumulative expected regret
``sum_t (max_a mu_a - mu_{a_t})``. ``success`` at the end of an episode: the best arm was pulled strictly
more often than every other arm (the agent identified and exploited it).

``info["episode_metrics"]`` (averaged over episodes by evaluation.py as ``mean_<key>``) holds the RLFT
paper's diagnostics (docs/algorithms.md), computed so far in the episode:
``regret``; ``action_coverage`` (share of arms tried); ``best_arm_share`` (share of pulls on the best arm);
``greedy_share`` (share of pulls, after the first, of an arm with the highest empirical mean so far);
``frequency_share`` (share of pulls, after the first, of an arm pulled most often so far: frequency bias).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.envs.base import TextEnv
from agentrl.errors import ConfigError, UnknownChoiceError

#: Button names. Distinct single words, none a substring of another, so a parser can match them in text.
COLOURS: tuple[str, ...] = (
    "blue",
    "green",
    "red",
    "yellow",
    "purple",
    "orange",
    "pink",
    "brown",
    "black",
    "white",
    "gray",
    "cyan",
    "magenta",
    "teal",
    "navy",
    "maroon",
    "olive",
    "lime",
    "gold",
    "silver",
    "beige",
    "violet",
    "indigo",
    "turquoise",
)

REWARD_KINDS = ("bernoulli", "gaussian")

#: What the observation shows of the episode so far: the last `history` presses one per line (the RLFT
#: paper's context), or a summary with one line per button (presses and average reward; BanditBench's
#: summarised history, which Krishnamurthy et al. 2024 found an LLM needs to explore in context).
VIEWS = ("history", "summary")


def pull_arm(env: Any, index: int, means: np.ndarray) -> float:
    """Draw arm `index`'s reward (Bernoulli or Gaussian around `means[index]`) and update the pull
    statistics a bandit env keeps: greedy and most-frequent pulls (judged against the history before this
    pull), counts, sums, t, the last action and reward, and the expected regret. Shared by BanditEnv and
    ContextualBanditEnv (there `means` are the current context's)."""
    mean = float(means[index])
    if env.reward_kind == "bernoulli":
        reward = float(env.np_random.random() < mean)
    else:
        reward = float(env.np_random.normal(mean, env.gaussian_sd))
    if env.t > 0:  # diagnostics judge the choice against the history before it
        tried = [a for a in range(env.arms) if env.counts[a]]
        best_mean = max(env.sums[a] / env.counts[a] for a in tried)
        env.greedy_pulls += int(env.counts[index] > 0 and env.sums[index] / env.counts[index] == best_mean)
        env.frequent_pulls += int(env.counts[index] == max(env.counts))
    env.counts[index] += 1
    env.sums[index] += reward
    env.t += 1
    env.last_action, env.last_reward = index, reward
    env.regret += float(np.max(means)) - mean
    return reward


class BanditEnv(TextEnv):
    """K-armed bandit with coloured buttons; actions are the colour names of this episode."""

    name = "bandit"

    def __init__(
        self,
        arms: int = 5,
        reward: str = "bernoulli",
        gaussian_sd: float = 1.0,
        horizon: int = 50,
        history: int = 50,
        view: str = "history",
        render_mode: str | None = None,
    ):
        if not 2 <= int(arms) <= len(COLOURS):
            raise ConfigError(f"env bandit: arms must be between 2 and {len(COLOURS)}, got {arms}")
        if reward not in REWARD_KINDS:
            raise UnknownChoiceError("bandit reward", reward, REWARD_KINDS)
        if float(gaussian_sd) <= 0:
            raise ConfigError(f"env bandit: gaussian_sd must be positive, got {gaussian_sd}")
        if int(horizon) < 1:
            raise ConfigError(f"env bandit: horizon must be at least 1, got {horizon}")
        if int(history) < 0:
            raise ConfigError(f"env bandit: history must be >= 0 (0 = no history), got {history}")
        if view not in VIEWS:
            raise UnknownChoiceError("bandit view", view, VIEWS)
        self.arms = int(arms)
        self.reward_kind = reward
        self.gaussian_sd = float(gaussian_sd)
        self.horizon = self.max_steps = int(horizon)
        self.history = int(history)
        self.view = view
        # Placeholder names until the first reset shuffles them; the action space only needs K.
        self.action_names = list(COLOURS[: self.arms])
        super().__init__(render_mode=render_mode)
        self.arm_means = np.zeros(self.arms)
        self._clear()

    def _clear(self) -> None:
        self.counts = [0] * self.arms
        self.sums = [0.0] * self.arms
        self.t = 0
        self.last_action: int | None = None
        self.last_reward: float | None = None
        self.regret = 0.0
        self.transitions: list[tuple[int, float]] = []
        self.greedy_pulls = 0  # pulls of an empirically best arm (after the first pull)
        self.frequent_pulls = 0  # pulls of a most-pulled arm (after the first pull)

    # ---- episode dynamics ----------------------------------------------------------------------
    def _reset(self, options: dict) -> None:
        # Draw order is part of reproducibility: names first, then the arm means.
        order = self.np_random.permutation(len(COLOURS))[: self.arms]
        self.action_names = [COLOURS[i] for i in order]
        if self.reward_kind == "bernoulli":
            self.arm_means = self.np_random.uniform(0.0, 1.0, size=self.arms)
        else:
            self.arm_means = self.np_random.normal(0.0, 1.0, size=self.arms)
        self._clear()

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        reward = pull_arm(self, index, self.arm_means)
        self.transitions.append((index, reward))
        success = self.t >= self.horizon and self.best_arm_identified()
        return reward, False, success, {}

    @property
    def best_arm(self) -> int:
        return int(np.argmax(self.arm_means))

    def best_arm_identified(self) -> bool:
        """True when the best arm was pulled strictly more often than every other arm."""
        best = self.best_arm
        return all(self.counts[best] > c for a, c in enumerate(self.counts) if a != best)

    def _info(self, success: bool) -> dict[str, Any]:
        info = super()._info(success)
        info["arm_means"] = [float(m) for m in self.arm_means]
        info["best_arm"] = self.best_arm
        info["best_arm_name"] = self.action_names[self.best_arm]
        info["regret"] = float(self.regret)
        judged = max(self.t - 1, 1)
        info["episode_metrics"] = {
            "regret": float(self.regret),
            "action_coverage": sum(c > 0 for c in self.counts) / self.arms,
            "best_arm_share": self.counts[self.best_arm] / max(self.t, 1),
            "greedy_share": self.greedy_pulls / judged,
            "frequency_share": self.frequent_pulls / judged,
        }
        return info

    # ---- text interface ------------------------------------------------------------------------
    def _format_reward(self, reward: float) -> str:
        return str(int(reward)) if self.reward_kind == "bernoulli" else f"{reward:.2f}"

    @property
    def instructions(self) -> str:
        names = ", ".join(self.action_names)
        if self.reward_kind == "bernoulli":
            distribution = (
                "Each button is associated with a Bernoulli distribution with a fixed but unknown mean; "
                "pressing a button gives reward 1 with that probability and reward 0 otherwise."
            )
        else:
            distribution = (
                "Each button is associated with a Gaussian distribution with a fixed but unknown mean "
                f"and standard deviation {self.gaussian_sd:g}; pressing a button gives a reward sampled "
                "from it."
            )
        return (
            f"You are a bandit algorithm in a room with {self.arms} buttons labeled {names}. "
            f"{distribution} The means of different buttons can differ. "
            f"You have {self.horizon} time steps; at each time step you press one button and receive "
            f"its reward. Your goal is to maximize the total reward over the {self.horizon} time steps. "
            f"Your action is the label of one button: {names}."
        )

    def facts(self) -> str:
        untried = [name for name, count in zip(self.action_names, self.counts, strict=True) if not count]
        text = f"Not pressed yet: {', '.join(untried)}." if untried else "Every button has been pressed."
        if len(untried) < self.arms:
            means = [
                total / count if count else -np.inf
                for total, count in zip(self.sums, self.counts, strict=True)
            ]
            text += f" Best average so far: {self.action_names[int(np.argmax(means))]}."
        return text

    def render_text(self) -> str:
        lines = [
            f"Round {min(self.t + 1, self.horizon)} of {self.horizon}. Buttons: {', '.join(self.action_names)}."
        ]
        if self.view == "summary":
            lines.append(
                f"Your {self.t} presses so far, by button:" if self.t else "No button has been pressed yet."
            )
            for name, count, total in zip(self.action_names, self.counts, self.sums, strict=True):
                if count:
                    times = "time" if count == 1 else "times"
                    lines.append(
                        f"{name} button: pressed {count} {times}, average reward {total / count:.2f}"
                    )
                else:
                    lines.append(f"{name} button: not pressed yet")
        elif self.history > 0:
            shown = self.transitions[-self.history :]
            if shown:
                lines.append(f"Your last {len(shown)} presses (oldest first):")
                lines += [f"{self.action_names[a]} button, reward {self._format_reward(r)}" for a, r in shown]
            else:
                lines.append("No button has been pressed yet.")
        return "\n".join(lines)

    def state(self) -> dict[str, Any]:
        return {
            "arms": self.arms,
            "names": list(self.action_names),
            "counts": list(self.counts),
            "sums": [float(s) for s in self.sums],
            "t": self.t,
            "last_action": self.last_action,
            "last_reward": self.last_reward,
        }

    # ---- numeric view for DQN ------------------------------------------------------------------
    def numeric_space(self) -> gym.spaces.Box:
        # [pull share per arm (K), empirical mean per arm (K), t / horizon]
        mean_low, mean_high = (0.0, 1.0) if self.reward_kind == "bernoulli" else (-np.inf, np.inf)
        low = np.array([0.0] * self.arms + [mean_low] * self.arms + [0.0], dtype=np.float32)
        high = np.array([1.0] * self.arms + [mean_high] * self.arms + [1.0], dtype=np.float32)
        return gym.spaces.Box(low=low, high=high, dtype=np.float32)

    def numeric_observation(self) -> np.ndarray:
        counts = np.asarray(self.counts, dtype=np.float64)
        means = np.divide(self.sums, counts, out=np.zeros(self.arms), where=counts > 0)
        share = counts / self.horizon
        progress = min(self.t / self.horizon, 1.0)
        return np.concatenate([np.minimum(share, 1.0), means, [progress]]).astype(np.float32)
