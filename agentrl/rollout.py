"""Episode/Step types and lockstep rollouts: many episodes advance together, one agent call per step.

The rollout engine is shared by evaluation (any agent) and training (LLM policies). At each step all
active episodes' contexts go to the agent in one batched `act` call (for an LLM: one batched
`generate`); finished episodes drop out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.envs.base import TextEnv


@dataclass
class Generation:
    """What an LLM produced for one step (absent for classic agents)."""

    prompt_text: str
    completion_text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    #: sampling log-probabilities of each completion token (same length as completion_ids), or None
    logprobs: list[float] | None = None


@dataclass
class Decision:
    """An agent's answer for one step: the action to execute and how it came about."""

    action: int  # index of the action the env executes (after the invalid-action rule)
    valid: bool = True  # False when the agent's answer could not be parsed / was illegal
    penalty: float = 0.0  # added to the env reward (invalid-action rule)
    end_episode: bool = False  # `penalty_end` rule: stop after this step
    generation: Generation | None = None


@dataclass
class StepContext:
    """What an agent sees when it must act in one episode."""

    env: TextEnv
    observation: str
    info: dict[str, Any]
    history: list[Step]  # this episode's previous steps, oldest first
    rng: np.random.Generator  # per-episode randomness for agents (random actions, tie breaks)
    episode_index: int  # position in the rollout batch


@dataclass
class Step:
    observation: str
    action: int
    action_name: str
    valid: bool
    reward: float  # env reward + penalty: what training credits
    env_reward: float
    generation: Generation | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.generation.prompt_ids if self.generation else []

    @property
    def completion_ids(self) -> list[int]:
        return self.generation.completion_ids if self.generation else []

    @property
    def logprobs(self) -> list[float] | None:
        return self.generation.logprobs if self.generation else None


@dataclass
class Episode:
    seed: int
    group_id: int = 0
    steps: list[Step] = field(default_factory=list)
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    final_info: dict[str, Any] = field(default_factory=dict)
    final_observation: str = ""  # the observation after the last step (the end position)

    @property
    def episode_return(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def invalid_count(self) -> int:
        return sum(not s.valid for s in self.steps)

    def summary(self) -> dict[str, Any]:
        """One JSON line for episodes.jsonl."""
        return {
            "seed": self.seed,
            "group_id": self.group_id,
            "return": self.episode_return,
            "length": self.length,
            "success": self.success,
            "invalid": self.invalid_count,
            "actions": [s.action_name for s in self.steps],
        }


EnvFactory = Callable[[], TextEnv]


class RolloutStats:
    """Running counts for the live progress line."""

    def __init__(self) -> None:
        self.episodes = 0
        self.successes = 0
        self.steps = 0
        self.completion_tokens = 0

    def line(self, elapsed: float) -> str:
        rate = self.successes / self.episodes if self.episodes else 0.0
        tok = (
            f" tok/s {self.completion_tokens / elapsed:.0f}" if self.completion_tokens and elapsed > 0 else ""
        )
        return (
            f"episodes {self.episodes} success {rate:.2f} steps/s {self.steps / max(elapsed, 1e-9):.1f}{tok}"
        )


def rollout(
    make_env: EnvFactory,
    agent: Any,
    seeds: Sequence[int],
    group_ids: Sequence[int] | None = None,
    *,
    progress: Any = None,
    lockstep: bool = True,
    agent_seed: int = 0,
) -> list[Episode]:
    """Play one episode per seed. `lockstep=True` advances all episodes together with one
    `agent.act` call per step; `lockstep=False` plays them one at a time (for benchmarks).

    `progress` is an optional `agentrl.progress.RolloutProgress` (rich) updated as episodes finish.
    """
    import time

    group_ids = list(group_ids) if group_ids is not None else [0] * len(seeds)
    if len(group_ids) != len(seeds):
        raise ValueError("group_ids and seeds must have the same length")
    stats = RolloutStats()
    start = time.perf_counter()
    batches = [list(range(len(seeds)))] if lockstep else [[i] for i in range(len(seeds))]
    episodes: list[Episode | None] = [None] * len(seeds)
    for batch in batches:
        for i, ep in _lockstep(make_env, agent, seeds, group_ids, batch, agent_seed, stats):
            episodes[i] = ep
            stats.episodes += 1
            stats.successes += int(ep.success)
            if progress is not None:
                progress.advance(stats.line(time.perf_counter() - start))
    return [ep for ep in episodes if ep is not None]


def _lockstep(make_env, agent, seeds, group_ids, indices, agent_seed, stats):
    envs = {i: make_env() for i in indices}
    episodes = {i: Episode(seed=int(seeds[i]), group_id=int(group_ids[i])) for i in indices}
    rngs = {i: np.random.default_rng([agent_seed, int(seeds[i]), i]) for i in indices}
    current: dict[int, tuple[str, dict]] = {}
    for i in indices:
        current[i] = envs[i].reset(seed=int(seeds[i]))
    active = list(indices)
    while active:
        contexts = [
            StepContext(envs[i], current[i][0], current[i][1], episodes[i].steps, rngs[i], i) for i in active
        ]
        decisions = agent.act(contexts)
        still_active = []
        for i, decision in zip(active, decisions, strict=True):
            env, episode = envs[i], episodes[i]
            obs_before = current[i][0]
            obs, env_reward, terminated, truncated, info = env.step(decision.action)
            episode.steps.append(
                Step(
                    observation=obs_before,
                    action=decision.action,
                    action_name=env.action_names[decision.action],
                    valid=decision.valid,
                    reward=float(env_reward) + float(decision.penalty),
                    env_reward=float(env_reward),
                    generation=decision.generation,
                )
            )
            stats.steps += 1
            if decision.generation is not None:
                stats.completion_tokens += len(decision.generation.completion_ids)
            truncated = truncated or (decision.end_episode and not terminated)
            if terminated or truncated:
                episode.terminated, episode.truncated = bool(terminated), bool(truncated)
                episode.success = bool(info.get("success", False))
                episode.final_info = {k: v for k, v in info.items() if k != "valid_actions"}
                episode.final_observation = obs
                env.close()
                yield i, episode
            else:
                current[i] = (obs, info)
                still_active.append(i)
        active = still_active
