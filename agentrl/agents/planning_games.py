"""Planners for the game environments: UCB1 for the bandit, perfect play for tic-tac-toe.

Both read only ``ctx.info["state"]`` (the per-episode counts/sums and the board), so they are
stateless and serve many lockstep episodes at once. Signature: ``(ctx, **options) -> action index``;
options meant for other planners (e.g. ``ucb_c`` from conf/agent/planner.yaml) are ignored.
"""

from __future__ import annotations

import math
from typing import Any

from agentrl.envs.tictactoe import perfect_move
from agentrl.types import StepContext


def ucb1_action(ctx: StepContext, ucb_c: float = 2.0, **options: Any) -> int:
    """UCB1 (Auer et al. 2002): try each arm once (lowest index first), then pick
    argmax_a  mean_a + sqrt(c * ln t / n_a), t = pulls so far; ties go to the lowest index."""
    state = ctx.info["state"]
    counts, sums = state["counts"], state["sums"]
    for arm, n in enumerate(counts):
        if n == 0:
            return arm
    log_t = math.log(sum(counts))
    scores = [s / n + math.sqrt(ucb_c * log_t / n) for s, n in zip(sums, counts, strict=True)]
    return max(range(len(scores)), key=scores.__getitem__)


def tictactoe_action(ctx: StepContext, **options: Any) -> int:
    """Perfect play by memoised negamax (envs/tictactoe.py), preferring the quickest win;
    the lowest-numbered cell among equally good moves."""
    state = ctx.info["state"]
    return perfect_move(state["board"], state["agent_mark"])
