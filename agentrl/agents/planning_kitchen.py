"""Planner for the kitchen: optimal play by dynamic programming over the env's own rules.

Reads only ``ctx.info["state"]`` (where each ingredient is, which subtask rewards are paid, the steps
left), so it is stateless and serves many lockstep episodes at once. Signature: ``(ctx, **options) ->
action index``; options meant for other planners (e.g. ``ucb_c`` from conf/agent/planner.yaml) are
ignored.
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.kitchen import TASKS, optimal_actions, state_from_dict
from agentrl.types import StepContext


def kitchen_action(ctx: StepContext, **options: Any) -> int:
    """An action with the highest return over the steps left (envs/kitchen.py `optimal_actions`: one
    that changes something, then the lowest index): the recipe's ingredients in order, each picked up,
    chopped and plated, then the delivery; from a spoiled state (a distractor in hand or on the plate)
    the cheapest repair."""
    state = ctx.info["state"]
    recipe = frozenset(TASKS[state["task"]])
    return optimal_actions(recipe, state_from_dict(state), int(state["steps_left"]))[0]
