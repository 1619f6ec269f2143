"""POAD credit assignment: token-level GAE with Bellman backup with Action Decomposition (BAD), and its
naive token-level baseline NTPO (Wen et al., "Reinforcing LLM Agents via Policy Optimization with Action
Decomposition", NeurIPS 2024; docs/algorithms.md#poad).

Pure functions over `Episode`s and critic values: no model, no torch. The critic
(agentrl/trainers/critic.py) supplies the values; the trainer turns the rows into TRL's tensors.

An action a_t is the token sequence w_t^0 .. w_t^{L_t - 1} the policy generated at step t. V[t][j] is the
critic's value at the position before token j of action t, so V[t][0] is the value of the state s_t.
Backwards over steps t and tokens j (done_t: the episode ends after step t):

    last token of a_t:   delta = r_t + gamma * V[t+1][0] * (1 - done_t) - V[t][j]
                         gae   = delta + gamma * lam * (1 - done_t) * gae
    inside a_t (BAD):    delta = V[t][j+1] - V[t][j]
                         gae   = delta + lam * gae
    inside a_t (NTPO):   delta = gamma * V[t][j+1] - V[t][j]
                         gae   = delta + gamma * lam * gae
    advantage[t][j] = gae          return[t][j] = gae + V[t][j]   (the critic's target)

BAD puts no reward and no discount between the tokens of one action, so every token of a_t backs up to
the same action-level return: token-level credit with the action-level optimum. NTPO discounts between
tokens as if each were an environment step, so the first token of a long action sees its reward
discounted by gamma^(L_t - 1): a bias that grows with the action's length.

Truncated episodes are treated as ending (no bootstrap from the state after the last step) [ours]: the
state after a truncation has no prompt in the rollout, and the tasks here end within their step limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.algos.msgrpo import Credit
from agentrl.types import Episode, StepSample


def token_gae(
    rewards: Sequence[float],
    values: Sequence[Sequence[float]],
    *,
    gamma: float,
    lam: float,
    decompose: bool = True,
) -> tuple[list[list[float]], list[list[float]]]:
    """Per-token advantages and returns of one episode (the equations in the module doc).

    `rewards[t]` is step t's reward; `values[t]` holds V[t][0..L_t-1], one value per token of action t
    (at least one: an action without tokens still has its state's value). The episode ends after its last
    step. `decompose=True` is BAD (POAD), False is NTPO. Returns (advantages, returns), shaped like
    `values`."""
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards but {len(values)} steps of values")
    if any(len(v) == 0 for v in values):
        raise ValueError("every step needs at least one value (the state's)")
    inner_discount = 1.0 if decompose else gamma
    advantages = [[0.0] * len(v) for v in values]
    returns = [[0.0] * len(v) for v in values]
    gae = 0.0
    for t in reversed(range(len(values))):
        v = values[t]
        last = len(v) - 1
        ends = t == len(values) - 1
        next_state_value = 0.0 if ends else values[t + 1][0]
        for j in reversed(range(len(v))):
            if j == last:
                not_done = 0.0 if ends else 1.0
                delta = rewards[t] + gamma * next_state_value * not_done - v[j]
                gae = delta + gamma * lam * not_done * gae
            else:
                delta = inner_discount * v[j + 1] - v[j]
                gae = delta + inner_discount * lam * gae
            advantages[t][j] = gae
            returns[t][j] = gae + v[j]
    return advantages, returns


def normalize_tokens(
    rows: Sequence[Sequence[float]], eps: float = 1e-8, std_floor: float = 0.0
) -> list[list[float]]:
    """(A - mean) / (max(std, std_floor) + eps) over every token of every row: the per-minibatch advantage
    normalisation of the authors' code (there the minibatch is the iteration's whole batch; std_floor 0).

    `std_floor` (in reward units) keeps a batch whose advantages hardly differ from being scaled up to unit
    spread: when every episode of a small batch ends alike, what differs is the critic's error, and dividing
    by its tiny std turns that noise into full-size updates."""
    flat = np.asarray([a for row in rows for a in row], dtype=np.float64)
    if flat.size == 0:
        return [list(row) for row in rows]
    mean, std = flat.mean(), max(flat.std(), std_floor)
    return [[float((a - mean) / (std + eps)) for a in row] for row in rows]


def assign_credit(
    episodes: Sequence[Episode],
    algo: Any,
    rng: np.random.Generator,
    values: Sequence[Sequence[Sequence[float]]] | None = None,
) -> Credit:
    """POAD (or, with `algo.decompose=false`, NTPO) for one iteration: token GAE on every episode with the
    critic's `values[episode][step][token]`, then one row per step with a generation, carrying per-token
    advantages (normalised over the batch when `algo.normalize_advantages`), the critic's targets
    (`returns`) and the values it had (`old_values`, for the clipped value loss). Every episode is kept."""
    if values is None:
        raise ValueError("POAD needs the critic's values (the trainer computes them)")
    samples: list[StepSample] = []
    raw: list[list[float]] = []
    for i, (episode, episode_values) in enumerate(zip(episodes, values, strict=True)):
        rewards = [step.reward for step in episode.steps]
        advantages, returns = token_gae(
            rewards, episode_values, gamma=algo.gamma, lam=algo.lam, decompose=algo.decompose
        )
        for t, step in enumerate(episode.steps):
            tokens = len(step.completion_ids)
            if step.generation is None or tokens == 0:
                continue
            raw.append(advantages[t][:tokens])
            samples.append(
                StepSample(
                    prompt_ids=list(step.prompt_ids),
                    completion_ids=list(step.completion_ids),
                    old_logprobs=list(step.logprobs) if step.logprobs is not None else None,
                    advantage=advantages[t][:tokens],
                    episode_index=i,
                    step_index=t,
                    returns=returns[t][:tokens],
                    old_values=list(episode_values[t][:tokens]),
                )
            )
    normalized = (
        normalize_tokens(raw, std_floor=algo.advantage_std_floor) if algo.normalize_advantages else raw
    )
    for sample, advantage in zip(samples, normalized, strict=True):
        sample.advantage = advantage
    flat = [a for row in raw for a in row]
    returns_flat = [r for s in samples for r in (s.returns or [])]
    stats = {
        "value/return_mean": float(np.mean(returns_flat)) if returns_flat else 0.0,
        "value/explained_variance": explained_variance(
            [v for s in samples for v in (s.old_values or [])], returns_flat
        ),
    }
    return Credit(samples, flat, list(range(len(episodes))), stats)


def explained_variance(predictions: Sequence[float], targets: Sequence[float]) -> float:
    """1 - Var(target - prediction) / Var(target): 1 for a perfect critic, 0 for a constant one (0 when the
    targets do not vary)."""
    if len(targets) < 2:
        return 0.0
    y, p = np.asarray(targets, dtype=np.float64), np.asarray(predictions, dtype=np.float64)
    var = y.var()
    return float(1.0 - (y - p).var() / var) if var > 1e-12 else 0.0


__all__ = ["assign_credit", "explained_variance", "normalize_tokens", "token_gae"]
