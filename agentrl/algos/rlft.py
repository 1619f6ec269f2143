"""RLFT credit assignment: RL fine-tuning on self-generated rationales (Schmied, Bornschein, Grau-Moya,
Wulfmeier, Pascanu, "LLMs are Greedy Agents: Effects of RL Fine-tuning on Decision-Making Abilities",
arXiv 2504.16078; docs/algorithms.md#rlft).

Pure functions over `Episode`s (and, with `advantage=gae`, the critic's values): no model, no torch. At
each step the policy writes a rationale and then an action (agent.cot=true); every generated token of step
t, rationale and action alike, carries that step's advantage A_t. The trainer's loss is TRL's clipped
surrogate on those tokens plus beta * KL to the reference policy.

Training reward of step t of an episode (the env reward with the invalid-answer penalty, `Step.reward`,
plus the exploration bonus for a valid answer whose action the episode has not executed before):

    r'_t = r_t + bonus * [valid_t and a_t not in {a_0, ..., a_{t-1}}]

advantage = return_to_go (fixed-length tasks such as the bandit):

    G_t = sum_{k >= t} gamma^(k - t) r'_k                      (Monte-Carlo return-to-go)
    b_t = mean of G_t over the episodes of t's group that reach step t      (baseline group_step)
        = mean of G_k over every step k of every episode of the batch       (baseline batch)
        = 0                                                                 (baseline none)
    A_t = G_t - b_t,   then A_t / (max(std(A), advantage_std_floor) + eps) over the batch's rows when
                       normalize_advantages

advantage = gae (variable-length tasks such as tic-tac-toe), with the critic's state values V(s_t)
(values[episode][step][0]) and d_t = 1 after the last step:

    delta_t = r'_t + gamma * V(s_{t+1}) * (1 - d_t) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - d_t) * A_{t+1},      R_t = A_t + V(s_t)  (the value target)

which is `poad.token_gae` with one value per step (as TWOSOME's credit); normalize_advantages there
standardises (mean and std) as POAD does, since the critic already centres the advantages, with the std
floored at `advantage_std_floor`: when all episodes of the batch end alike the advantages are the
critic's errors, and a small std would scale them up to full-size updates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.algos.msgrpo import Credit
from agentrl.algos.poad import explained_variance, normalize_tokens, token_gae
from agentrl.errors import ConfigError
from agentrl.types import Episode, StepSample

ADVANTAGES = ("return_to_go", "gae")
BASELINES = ("group_step", "batch", "none")
EPS = 1e-8  # of the std normalisation, as poad.normalize_tokens


def new_actions(episode: Episode) -> list[bool]:
    """Per step: the answer was valid and its action was not executed earlier in the episode. An invalid
    answer never counts (its executed action is the random fallback's, not the policy's choice), but the
    fallback's action counts as tried, so choosing it later is not new."""
    flags, tried = [], set()
    for step in episode.steps:
        flags.append(step.valid and step.action not in tried)
        tried.add(step.action)
    return flags


def shaped_rewards(episode: Episode, exploration_bonus: float = 0.0) -> list[float]:
    """r'_t = r_t + bonus * [valid_t and a_t not executed earlier in the episode] (`new_actions`)."""
    return [
        float(step.reward) + (exploration_bonus if new else 0.0)
        for step, new in zip(episode.steps, new_actions(episode), strict=True)
    ]


def returns_to_go(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, G_T = 0: the discounted sum of the rewards from t on."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def baselines(returns: Sequence[Sequence[float]], group_ids: Sequence[int], kind: str) -> list[list[float]]:
    """b_t of every step of every episode (shaped like `returns`), by `kind` (module doc). With
    `group_step`, an episode longer than its group's others averages over those that reach step t; a
    step only one episode reaches has b_t = G_t (advantage 0), as a group of one does."""
    if len(returns) != len(group_ids):
        raise ValueError(f"{len(returns)} episodes but {len(group_ids)} group ids")
    if kind == "none":
        return [[0.0] * len(g) for g in returns]
    if kind == "batch":
        flat = [x for g in returns for x in g]
        mean = float(np.mean(flat)) if flat else 0.0
        return [[mean] * len(g) for g in returns]
    if kind == "group_step":
        sums: dict[tuple[int, int], list[float]] = defaultdict(list)
        for g, group in zip(returns, group_ids, strict=True):
            for t, x in enumerate(g):
                sums[(group, t)].append(x)
        return [
            [float(np.mean(sums[(group, t)])) for t in range(len(g))]
            for g, group in zip(returns, group_ids, strict=True)
        ]
    raise ConfigError(f"algo.baseline={kind!r}: must be one of {', '.join(BASELINES)}")


def return_to_go_advantages(
    episodes: Sequence[Episode], *, gamma: float, baseline: str, exploration_bonus: float = 0.0
) -> tuple[list[list[float]], list[list[float]]]:
    """(A, G) per episode and step: A_t = G_t - b_t over the shaped rewards (module doc), unnormalised."""
    returns = [returns_to_go(shaped_rewards(e, exploration_bonus), gamma) for e in episodes]
    base = baselines(returns, [e.group_id for e in episodes], baseline)
    advantages = [[g - b for g, b in zip(gs, bs, strict=True)] for gs, bs in zip(returns, base, strict=True)]
    return advantages, returns


def _rows(episodes: Sequence[Episode]) -> list[tuple[int, int]]:
    """(episode, step) of every step with a generation to train on (a non-empty completion)."""
    return [
        (i, t)
        for i, episode in enumerate(episodes)
        for t, step in enumerate(episode.steps)
        if step.generation is not None and step.completion_ids
    ]


def _sample(episode: Episode, i: int, t: int, advantage: float, **extra: Any) -> StepSample:
    step = episode.steps[t]
    return StepSample(
        prompt_ids=list(step.prompt_ids),
        completion_ids=list(step.completion_ids),
        old_logprobs=list(step.logprobs) if step.logprobs is not None else None,
        advantage=float(advantage),
        episode_index=i,
        step_index=t,
        **extra,
    )


def assign_credit(
    episodes: Sequence[Episode],
    algo: Any,
    rng: np.random.Generator,
    values: Sequence[Sequence[Sequence[float]]] | None = None,
) -> Credit:
    """RLFT for one iteration: one row per step with a generation (all its completion tokens: the rationale
    and the action), carrying the step's advantage A_t (`algo.advantage`: return_to_go with
    `algo.baseline`, or gae with the critic's `values[episode][step][0]`). Every episode is kept; `rng` is
    unused (no episode sampling). gae rows carry the value target and the critic's value for the value
    loss (one per row, at the state's position)."""
    if algo.advantage not in ADVANTAGES:
        raise ConfigError(f"algo.advantage={algo.advantage!r}: must be one of {', '.join(ADVANTAGES)}")
    rows = _rows(episodes)
    bonus = float(algo.exploration_bonus)
    stats: dict[str, float] = {}
    if algo.advantage == "return_to_go":
        advantages, returns = return_to_go_advantages(
            episodes, gamma=algo.gamma, baseline=algo.baseline, exploration_bonus=bonus
        )
        raw = [advantages[i][t] for i, t in rows]
        # a division by the std only: subtracting the batch mean would be a second baseline
        scale = (
            max(float(np.std(raw)), algo.advantage_std_floor) + EPS
            if algo.normalize_advantages and raw
            else 1.0
        )
        samples = [_sample(episodes[i], i, t, advantages[i][t] / scale) for i, t in rows]
        flat = [x for g in returns for x in g]
        stats["return_to_go/mean"] = float(np.mean(flat)) if flat else 0.0
    else:
        if values is None:
            raise ValueError("RLFT with advantage=gae needs the critic's values (the trainer computes them)")
        raw, samples = [], []
        for i, (episode, episode_values) in enumerate(zip(episodes, values, strict=True)):
            state_values = [[step_values[0]] for step_values in episode_values]
            gae, targets = token_gae(
                shaped_rewards(episode, bonus), state_values, gamma=algo.gamma, lam=algo.lam, decompose=True
            )
            for t, step in enumerate(episode.steps):
                if step.generation is None or not step.completion_ids:
                    continue
                raw.append(gae[t][0])
                samples.append(
                    _sample(
                        episode, i, t, gae[t][0], returns=[targets[t][0]], old_values=[state_values[t][0]]
                    )
                )
        floor = algo.advantage_std_floor
        normalized = normalize_tokens([raw], std_floor=floor)[0] if algo.normalize_advantages and raw else raw
        for sample, advantage in zip(samples, normalized, strict=True):
            sample.advantage = float(advantage)
        targets_flat = [s.returns[0] for s in samples if s.returns]
        stats["value/return_mean"] = float(np.mean(targets_flat)) if targets_flat else 0.0
        stats["value/explained_variance"] = explained_variance(
            [s.old_values[0] for s in samples if s.old_values], targets_flat
        )
    if bonus:
        stats["exploration_bonus/steps"] = float(sum(sum(new_actions(e)) for e in episodes))
    return Credit(samples, raw, list(range(len(episodes))), stats)


__all__ = [
    "ADVANTAGES",
    "BASELINES",
    "assign_credit",
    "baselines",
    "new_actions",
    "return_to_go_advantages",
    "returns_to_go",
    "shaped_rewards",
]
