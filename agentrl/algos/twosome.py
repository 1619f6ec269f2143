"""TWOSOME credit assignment: action-level PPO over the valid actions, each scored by its word-normalised
log-likelihood (Tan et al., "True Knowledge Comes from Practice", ICLR 2024; the action-level baseline of
the POAD paper; docs/algorithms.md#twosome).

The policy is the scoring agent's (`agent.decision=score`, agents/scoring.py):

    pi(a | s) = softmax over valid a of  log L(a) / n(a),    log L(a) = sum_j log p(a_j | s, a_<j)

with n(a) the action's word count. The credit is one advantage per action, from GAE over steps with the
critic's state values V(s_t) (agentrl/trainers/critic.py, read at the last prompt position):

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},        R_t = A_t + V(s_t)

which is POAD's token GAE with every action one token long (`poad.token_gae` on one value per step).
The trainer's loss is PPO's clipped surrogate on log pi(a_t | s_t) over the candidate set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.algos.msgrpo import Credit
from agentrl.algos.poad import explained_variance, normalize_tokens, token_gae
from agentrl.errors import ConfigError
from agentrl.types import Episode, StepSample


def assign_credit(
    episodes: Sequence[Episode],
    algo: Any,
    rng: np.random.Generator,
    values: Sequence[Sequence[Sequence[float]]] | None = None,
) -> Credit:
    """Action-level GAE on every episode with the critic's state values `values[episode][step][0]`, then one
    action-level row per scored step: its prompt, every candidate's tokens and normaliser, the chosen index,
    the advantage (normalised over the batch when `algo.normalize_advantages`), the value target."""
    if values is None:
        raise ValueError("TWOSOME needs the critic's values (the trainer computes them)")
    samples: list[StepSample] = []
    raw: list[float] = []
    for i, (episode, episode_values) in enumerate(zip(episodes, values, strict=True)):
        state_values = [[step_values[0]] for step_values in episode_values]
        rewards = [step.reward for step in episode.steps]
        advantages, returns = token_gae(rewards, state_values, gamma=algo.gamma, lam=algo.lam, decompose=True)
        for t, step in enumerate(episode.steps):
            generation = step.generation
            if generation is None:
                continue
            if generation.candidates is None or generation.choice is None:
                raise ConfigError("algo=twosome trains a scoring agent: set agent.decision=score")
            raw.append(advantages[t][0])
            samples.append(
                StepSample(
                    prompt_ids=list(generation.prompt_ids),
                    completion_ids=list(generation.completion_ids),
                    old_logprobs=None,
                    advantage=advantages[t][0],
                    episode_index=i,
                    step_index=t,
                    returns=[returns[t][0]],
                    old_values=[state_values[t][0]],
                    candidates=[list(c) for c in generation.candidates],
                    normalizers=list(generation.normalizers or [1] * len(generation.candidates)),
                    choice=generation.choice,
                )
            )
    normalized = (
        normalize_tokens([raw], std_floor=algo.advantage_std_floor)[0]
        if algo.normalize_advantages and raw
        else raw
    )
    for sample, advantage in zip(samples, normalized, strict=True):
        sample.advantage = float(advantage)
    returns_flat = [s.returns[0] for s in samples if s.returns]
    stats = {
        "value/return_mean": float(np.mean(returns_flat)) if returns_flat else 0.0,
        "value/explained_variance": explained_variance([s.old_values[0] for s in samples], returns_flat),
    }
    return Credit(samples, raw, list(range(len(episodes))), stats)


__all__ = ["assign_credit"]
