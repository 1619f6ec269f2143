"""Episode/Step types and lockstep rollouts: many episodes advance together, one agent call per step.

The rollout engine is shared by evaluation (any agent) and training (LLM policies). At each step all
active episodes' contexts go to the agent in one batched `act` call (for an LLM: one batched
`generate`); finished episodes drop out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentrl.envs.base import TextEnv
from agentrl.types import Agent, Episode, Step, StepContext

EnvFactory = Callable[[], TextEnv]


class RolloutStats:
    """Running counts for the progress line (episodes done, env steps, steps/s, success so far) and a
    bound on the time left: lockstep episodes tend to end together, late, so the episodes done say
    little about the ETA until the end, while every env caps an episode's steps (`max_steps`)."""

    def __init__(self, total: int = 0) -> None:
        self.total = total  # episodes to play
        self.episodes = 0
        self.successes = 0
        self.steps = 0
        self.completion_tokens = 0
        self.cap: int | None = None  # the env's step cap (None: unknown)
        self.running = 0  # episodes started and not finished
        self.running_steps_left = 0  # steps the running episodes may still take (cap - steps so far)

    def seconds_left_bound(self, elapsed: float) -> float | None:
        """At most this many seconds left at the speed so far (None when the cap is unknown)."""
        if self.cap is None or not self.steps or elapsed <= 0:
            return None
        waiting = max(self.total - self.episodes - self.running, 0)
        return (self.running_steps_left + waiting * self.cap) * elapsed / self.steps

    def line(self, elapsed: float) -> str:
        rate = self.successes / self.episodes if self.episodes else 0.0
        tok = (
            f" tok/s {self.completion_tokens / elapsed:.0f}" if self.completion_tokens and elapsed > 0 else ""
        )
        return (
            f"episodes {self.episodes} steps {self.steps} steps/s {self.steps / max(elapsed, 1e-9):.1f}"
            f" success {rate:.2f}{tok}"
        )


def rollout(
    make_env: EnvFactory,
    agent: Agent,
    seeds: Sequence[int],
    group_ids: Sequence[int] | None = None,
    *,
    progress: Any = None,
    lockstep: bool = True,
    agent_seed: int = 0,
    reset_options: dict[str, Any] | None = None,
) -> list[Episode]:
    """Play one episode per seed. `lockstep=True` advances all episodes together with one
    `agent.act` call per step; `lockstep=False` plays them one at a time (for benchmarks).

    `progress` is an optional `runlog.progress` bar, advanced as episodes finish; after every lockstep
    step its line is refreshed (steps/s), so an eval whose episodes all end late still shows it is
    moving. `reset_options` go to every `env.reset` (e.g. a training curriculum's start rule). A Ctrl-C
    (KeyboardInterrupt) carries the episodes finished so far as its `episodes` attribute.
    """
    import time

    group_ids = list(group_ids) if group_ids is not None else [0] * len(seeds)
    if len(group_ids) != len(seeds):
        raise ValueError("group_ids and seeds must have the same length")
    stats = RolloutStats(len(seeds))
    start = time.perf_counter()
    batches = [list(range(len(seeds)))] if lockstep else [[i] for i in range(len(seeds))]
    episodes: list[Episode | None] = [None] * len(seeds)

    def on_step() -> None:
        if progress is not None:
            elapsed = time.perf_counter() - start
            progress.update(stats.line(elapsed), eta_s=stats.seconds_left_bound(elapsed))

    try:
        for batch in batches:
            steps = _lockstep(
                make_env, agent, seeds, group_ids, batch, agent_seed, stats, reset_options, on_step
            )
            for i, ep in steps:
                episodes[i] = ep
                stats.episodes += 1
                stats.successes += int(ep.success)
                if progress is not None:
                    elapsed = time.perf_counter() - start
                    progress.advance(stats.line(elapsed), eta_s=stats.seconds_left_bound(elapsed))
    except KeyboardInterrupt as exc:
        exc.episodes = [ep for ep in episodes if ep is not None]  # type: ignore[attr-defined]  # an eval keeps them
        raise
    return [ep for ep in episodes if ep is not None]


def _lockstep(make_env, agent, seeds, group_ids, indices, agent_seed, stats, reset_options, on_step=None):
    envs = {i: make_env() for i in indices}
    episodes = {i: Episode(seed=int(seeds[i]), group_id=int(group_ids[i])) for i in indices}
    rngs = {i: np.random.default_rng([agent_seed, int(seeds[i]), i]) for i in indices}
    current: dict[int, tuple[str, dict]] = {}
    for i in indices:
        current[i] = envs[i].reset(seed=int(seeds[i]), options=reset_options)
    active = list(indices)
    caps = {i: getattr(envs[i], "max_steps", None) for i in indices}
    if all(isinstance(c, int) for c in caps.values()) and caps:
        stats.cap = max(caps.values())
    while active:
        contexts = [
            StepContext(envs[i], current[i][0], current[i][1], episodes[i].steps, rngs[i], i) for i in active
        ]
        decisions = agent.act(contexts)
        still_active = []
        for i, decision in zip(active, decisions, strict=True):
            env, episode = envs[i], episodes[i]
            obs_before = current[i][0]
            # a free-text env executes the answer text when the agent gave one (an LLM), else the index
            text = decision.text if getattr(env, "free_text_action", False) else None
            obs, env_reward, terminated, truncated, info = env.step(decision.action if text is None else text)
            name = env.action_names[decision.action] if text is None else env.text_action_name(text)
            episode.steps.append(
                Step(
                    observation=obs_before,
                    action=decision.action,
                    action_name=name,
                    valid=decision.valid,
                    reward=float(env_reward) + float(decision.penalty),
                    env_reward=float(env_reward),
                    generation=decision.generation,
                    untagged=decision.untagged,
                    rationale=decision.rationale,
                    reason=str(info.get("reason") or ""),
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
        stats.running = len(active)
        if stats.cap is not None:
            stats.running_steps_left = sum(max(caps[i] - len(episodes[i].steps), 0) for i in active)
        if on_step is not None:
            on_step()


def informative_group_count(episodes: Sequence[Episode], tol: float = 1e-9) -> int:
    """Groups whose episodes do not all have the same return (the others carry no group-relative
    learning signal)."""
    returns: dict[int, list[float]] = {}
    for episode in episodes:
        returns.setdefault(episode.group_id, []).append(episode.episode_return)
    return sum(max(r) - min(r) > tol for r in returns.values())


def collect_groups(
    make_env: EnvFactory,
    agent: Agent,
    *,
    group_seeds: Callable[[int], list[int]],
    group_size: int,
    agent_seed: Callable[[int], int],
    min_informative: int = 0,
    max_rounds: int = 1,
    reset_options: dict[str, Any] | None = None,
) -> tuple[list[Episode], int]:
    """Roll out groups of `group_size` episodes that share an env seed, with dynamic sampling: while fewer
    than `min_informative` groups have non-zero return variance, roll out another round of groups, up to
    `max_rounds` rounds. `group_seeds(round)` gives the env seed of each group of a round and
    `agent_seed(round)` the round's agent seed. Group ids number the groups over all rounds.
    Returns (episodes, rounds played)."""
    episodes: list[Episode] = []
    rounds, first_group = 0, 0
    while rounds < max(max_rounds, 1):
        seeds = group_seeds(rounds)
        episodes += rollout(
            make_env,
            agent,
            [s for s in seeds for _ in range(group_size)],
            [first_group + g for g in range(len(seeds)) for _ in range(group_size)],
            agent_seed=agent_seed(rounds),
            reset_options=reset_options,
        )
        first_group += len(seeds)
        rounds += 1
        if informative_group_count(episodes) >= min_informative:
            break
    return episodes, rounds
