"""LinUCB with disjoint linear models (Li, Chu, Langford, Schapire 2010, Algorithm 1): the planner of
the contextual bandit (envs/contextual_bandit.py).

Each arm a keeps a ridge regression of its rewards on the context features x~ = (1, x):
``A_a = I + sum x~ x~^T`` and ``b_a = sum r x~`` over the presses of a, and the arm played maximises
``theta_a . x~ + alpha * sqrt(x~^T A_a^-1 x~)`` with ``theta_a = A_a^-1 b_a``. A_a and b_a are rebuilt
from the episode's (context, action, reward) history in ``ctx.info["state"]`` at every call, so the
planner keeps no state and serves many lockstep episodes at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl.envs.contextual_bandit import linear_features
from agentrl.types import StepContext


def linucb_scores(
    contexts: list[list[float]],
    actions: list[int],
    rewards: list[float],
    context: list[float],
    arms: int,
    alpha: float = 1.0,
) -> np.ndarray:
    """The upper confidence bound of every arm for `context`, given the history so far."""
    dim = len(context) + 1
    gram = np.broadcast_to(np.eye(dim), (arms, dim, dim)).copy()
    target = np.zeros((arms, dim))
    for x, a, r in zip(contexts, actions, rewards, strict=True):
        features = linear_features(x)
        gram[a] += np.outer(features, features)
        target[a] += r * features
    x_now = linear_features(context)
    scores = np.empty(arms)
    for a in range(arms):
        inverse = np.linalg.inv(gram[a])
        theta = inverse @ target[a]
        scores[a] = theta @ x_now + alpha * np.sqrt(max(x_now @ inverse @ x_now, 0.0))
    return scores


def linucb_action(ctx: StepContext, linucb_alpha: float = 1.0, **options: Any) -> int:
    """LinUCB (disjoint): argmax_a of the arm's ridge estimate plus `linucb_alpha` times its confidence
    width for the current context; ties go to the lowest index. Options meant for other planners (e.g.
    ``ucb_c``) are ignored."""
    state = ctx.info["state"]
    scores = linucb_scores(
        state["contexts"],
        state["actions"],
        state["rewards"],
        state["context"],
        int(state["arms"]),
        alpha=float(linucb_alpha),
    )
    return int(np.argmax(scores))


__all__ = ["linucb_action", "linucb_scores"]
