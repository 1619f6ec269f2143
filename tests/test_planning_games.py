"""Planners for the games: UCB1 on the bandit, perfect play on tic-tac-toe (unit cases and rollouts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentrl.agents.baselines import PlannerAgent, RandomAgent
from agentrl.agents.planning_games import tictactoe_action, ucb1_action
from agentrl.envs import make_env
from agentrl.envs.bandit import BanditEnv
from agentrl.envs.tictactoe import TicTacToeEnv
from agentrl.rollout import rollout
from agentrl.types import StepContext


def _ctx(env, state: dict) -> StepContext:
    return StepContext(env, "", {"state": state}, [], np.random.default_rng(0), 0)


def _bandit_state(counts, sums) -> dict:
    return {"counts": counts, "sums": sums, "t": sum(counts)}


def test_ucb1_tries_every_arm_once_in_order():
    env = BanditEnv(arms=4)
    assert ucb1_action(_ctx(env, _bandit_state([0, 0, 0, 0], [0.0] * 4))) == 0
    assert ucb1_action(_ctx(env, _bandit_state([5, 1, 0, 2], [5.0, 1.0, 0.0, 2.0]))) == 2


def test_ucb1_formula():
    env = BanditEnv(arms=3)
    counts, sums = [10, 2, 8], [7.0, 1.0, 6.0]  # means 0.7, 0.5, 0.75
    t = sum(counts)
    bonus = [math.sqrt(2.0 * math.log(t) / n) for n in counts]
    expected = int(np.argmax([s / n + b for s, n, b in zip(sums, counts, bonus, strict=True)]))
    assert expected == 1  # the rarely pulled arm wins on its exploration bonus
    assert ucb1_action(_ctx(env, _bandit_state(counts, sums))) == expected
    assert ucb1_action(_ctx(env, _bandit_state(counts, sums)), ucb_c=0.0) == 2  # c = 0: greedy
    assert PlannerAgent("bandit", ucb_c=0.0).choose(_ctx(env, _bandit_state(counts, sums))) == 2


def test_ucb1_has_lower_regret_than_random():
    seeds = range(20)
    regret = {
        agent.name: np.mean(
            [e.final_info["regret"] for e in rollout(lambda: make_env("bandit"), agent, seeds)]
        )
        for agent in (PlannerAgent("bandit"), RandomAgent())
    }
    assert regret["planner"] < 0.75 * regret["random"]


def test_ucb1_finds_the_best_arm_more_often_than_random():
    seeds = range(20)
    success = {
        agent.name: np.mean([e.success for e in rollout(lambda: make_env("bandit"), agent, seeds)])
        for agent in (PlannerAgent("bandit"), RandomAgent())
    }
    assert success["planner"] > success["random"]


def test_tictactoe_planner_wins_blocks_and_ignores_foreign_options():
    env = TicTacToeEnv()
    win = {"board": ["X", "X", "", "O", "O", "", "", "", ""], "agent_mark": "X", "to_move": "X"}
    assert tictactoe_action(_ctx(env, win)) == 2
    assert tictactoe_action(_ctx(env, {**win, "agent_mark": "O", "to_move": "O"})) == 5
    block = {"board": ["X", "", "", "", "X", "", "O", "", ""], "agent_mark": "O", "to_move": "O"}
    assert tictactoe_action(_ctx(env, block), ucb_c=2.0) == 8


def _returns(opponent: str, mark: str, episodes: int) -> list[float]:
    episodes_ = rollout(
        lambda: make_env("tictactoe", opponent=opponent, agent_mark=mark),
        PlannerAgent("tictactoe", ucb_c=2.0),  # the planner config passes ucb_c to every planner
        seeds=range(episodes),
    )
    assert all(not e.final_info["illegal_move"] for e in episodes_)
    return [e.episode_return for e in episodes_]


@pytest.mark.parametrize("mark", ["X", "O"])
def test_planner_never_loses_to_random_and_mostly_wins(mark):
    returns = _returns("random", mark, 30)
    assert min(returns) >= 0
    assert np.mean([r == 1 for r in returns]) >= (0.8 if mark == "X" else 0.5)


@pytest.mark.parametrize("mark", ["X", "O"])
def test_planner_never_loses_to_mcts(mark):
    assert min(_returns("mcts", mark, 10)) >= 0


@pytest.mark.parametrize("mark", ["X", "O"])
def test_planner_versus_perfect_opponent_always_draws(mark):
    assert _returns("perfect", mark, 10) == [0.0] * 10


def test_planner_rollouts_are_reproducible():
    def summaries():
        eps = rollout(lambda: make_env("tictactoe", opponent="mcts"), PlannerAgent("tictactoe"), range(4))
        return [e.summary() for e in eps]

    assert summaries() == summaries()
