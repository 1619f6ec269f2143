"""Grid planners (agentrl/agents/planning_grid.py) through the real rollout engine and on hand-made boards."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.agents.baselines import PlannerAgent, RandomAgent
from agentrl.agents.planning_grid import frozenlake_action, snake_action
from agentrl.envs import make_env
from agentrl.rollout import rollout
from agentrl.types import StepContext


def mean_return(episodes) -> float:
    return float(np.mean([e.episode_return for e in episodes]))


def context(env, obs_info) -> StepContext:
    obs, info = obs_info
    return StepContext(env, obs, info, [], np.random.default_rng(0), 0)


# ---- Frozen Lake ---------------------------------------------------------------------------------
def test_planner_solves_fixed_4x4_map_in_every_seed():
    episodes = rollout(
        lambda: make_env("frozenlake", map="4x4"), PlannerAgent("frozenlake", ucb_c=2.0), range(20)
    )
    assert len(episodes) == 20
    assert all(e.success and e.episode_return == 1.0 for e in episodes)
    assert {e.length for e in episodes} == {6}  # the shortest path


def test_planner_solves_random_maps_within_the_cap():
    episodes = rollout(lambda: make_env("frozenlake", map="random"), PlannerAgent("frozenlake"), range(50))
    assert all(e.success for e in episodes)
    random_episodes = rollout(lambda: make_env("frozenlake", map="random"), RandomAgent(), range(50))
    assert mean_return(episodes) > mean_return(random_episodes) + 0.8


@pytest.mark.parametrize(
    "kwargs",
    [{"size": 6}, {"size": 8}, {"map": "8x8"}, {"map": "random", "p": 0.6, "size": 8, "max_steps": 14}],
)
def test_planner_solves_every_board_at_its_cap(kwargs):
    episodes = rollout(lambda: make_env("frozenlake", **kwargs), PlannerAgent("frozenlake"), range(30))
    assert all(e.success for e in episodes)


def test_planner_mostly_solves_slippery_random_maps_at_the_default_cap():
    episodes = rollout(lambda: make_env("frozenlake", slippery=True), PlannerAgent("frozenlake"), range(50))
    assert np.mean([e.success for e in episodes]) > 0.7  # 0.88 over seeds 0-99 (the 8-move cap: 0.06)


def test_planner_shortest_path_on_8x8():
    episodes = rollout(
        lambda: make_env("frozenlake", map="8x8", max_steps=14), PlannerAgent("frozenlake"), [0]
    )
    assert episodes[0].success and episodes[0].length == 14


def test_value_iteration_on_slippery_ice_beats_random():
    def make():
        return make_env("frozenlake", map="4x4", slippery=True, max_steps=100)

    planned = rollout(make, PlannerAgent("frozenlake"), range(100))
    random_play = rollout(make, RandomAgent(), range(100))
    # The optimal policy on the slippery 4x4 map reaches the goal about 74% of the time (gamma 0.99).
    assert np.mean([e.success for e in planned]) > 0.6
    assert mean_return(planned) > mean_return(random_play) + 0.5


def test_frozenlake_planner_avoids_holes_next_to_it():
    env = make_env("frozenlake", map="4x4")
    env.reset(seed=0)
    env.step("down")  # (1, 0): right is the hole at (1, 1)
    ctx = context(env, (env.render_text(), env._info(success=False)))
    assert env.action_names[frozenlake_action(ctx, ucb_c=1.0)] == "down"


# ---- Snake ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["snake", "snake_poison"])
@pytest.mark.parametrize("max_steps", [100, 8])
def test_snake_planner_beats_random(name, max_steps):
    def make():
        return make_env(name, max_steps=max_steps)

    planned = rollout(make, PlannerAgent(name), range(20))
    random_play = rollout(make, RandomAgent(), range(20))
    assert mean_return(planned) > mean_return(random_play) + 0.5
    assert np.mean([e.success for e in planned]) > np.mean([e.success for e in random_play])


def test_snake_planner_goes_for_the_apple_and_around_poison():
    env = make_env("snake_poison")
    obs_info = env.reset(
        seed=0, options={"snake": [[5, 5]], "opponent": None, "apples": [[5, 2]], "poison": [[5, 4], [0, 0]]}
    )
    first = env.action_names[snake_action(context(env, obs_info))]
    assert first in ("up", "down")  # left is poison; the apple lies beyond it
    episodes = rollout(
        lambda: make_env("snake_poison", max_steps=50), PlannerAgent("snake_poison"), range(20)
    )
    assert sum(e.final_info["state"]["poison_eaten"] for e in episodes) == 0
    assert sum(e.final_info["state"]["score"] for e in episodes) >= 20 * 3


def test_snake_planner_avoids_walls_bodies_and_the_opponent_head():
    env = make_env("snake")
    # Head in the top-left corner heading up: up and left are walls, the apple is to the right.
    obs_info = env.reset(seed=0, options={"snake": [[0, 0], [1, 0]], "opponent": None, "apples": [[0, 5]]})
    assert env.action_names[snake_action(context(env, obs_info))] == "right"
    # The cell toward the apple (5, 4) touches the opponent's head at (4, 4): go around instead.
    obs_info = env.reset(
        seed=0, options={"snake": [[5, 5], [5, 6]], "opponent": [[4, 4], [3, 4]], "apples": [[5, 0]]}
    )
    assert env.action_names[snake_action(context(env, obs_info))] == "down"
    # Boxed in with only one free cell: take it.
    obs_info = env.reset(
        seed=0,
        options={"snake": [[0, 1], [0, 2], [1, 2], [1, 1], [1, 0]], "opponent": None, "apples": [[9, 9]]},
    )
    assert env.action_names[snake_action(context(env, obs_info))] == "left"
