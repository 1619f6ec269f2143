"""Tic-tac-toe env: rules (all win lines, draws, illegal moves), opponents, perfect play, MCTS, views."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.envs import NumericObservation, make_env
from agentrl.envs.tictactoe import (
    TicTacToeEnv,
    mcts_move,
    move_values,
    other,
    perfect_move,
    perfect_moves,
    winner,
)
from agentrl.errors import ConfigError, UnknownChoiceError

# The 8 winning lines written out here (not imported) so a missing line in the env fails a test.
WIN_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def _no_line(cells) -> bool:
    return not any(set(line) <= set(cells) for line in WIN_LINES)


def _position(agent_mark: str, agent_cells, opponent_cells) -> TicTacToeEnv:
    """An env (perfect opponent) reset and then set to a hand-made position with the agent to move."""
    env = TicTacToeEnv(agent_mark=agent_mark, opponent="perfect")
    env.reset(seed=0)
    env.board = [""] * 9
    for i in agent_cells:
        env.board[i] = agent_mark
    for i in opponent_cells:
        env.board[i] = other(agent_mark)
    assert env.state()["to_move"] == agent_mark
    return env


@pytest.mark.parametrize("mark", ["X", "O"])
@pytest.mark.parametrize("line", WIN_LINES)
def test_every_win_line_wins_for_the_agent(mark, line):
    a, b, c = line
    free = [i for i in range(9) if i not in line]
    n_opp = 2 if mark == "X" else 3  # X moves first, so O to move means X has one mark more
    opp = next(cells for cells in itertools.combinations(free, n_opp) if _no_line(cells))
    env = _position(mark, [a, b], opp)
    obs, reward, terminated, truncated, info = env.step(str(c + 1))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["outcome"] == "win" and not info["illegal_move"]
    assert winner(env.board) == mark and info["state"]["to_move"] == ""
    assert "You won." in obs and info["valid_actions"] == []
    assert info["episode_metrics"] == {
        "win_rate": 1.0,
        "draw_rate": 0.0,
        "loss_rate": 0.0,
        "illegal_move_rate": 0.0,
    }


@pytest.mark.parametrize("mark", ["X", "O"])
@pytest.mark.parametrize("line", WIN_LINES)
def test_every_win_line_loses_for_the_agent(mark, line):
    """The opponent holds two cells of `line`; the agent moves elsewhere and the opponent completes it."""
    a, b, c = line
    free = [i for i in range(9) if i not in line]
    n_own = 3 if mark == "X" else 2  # agent cells after its move (X moves first: equal counts before)
    own = next(cells for cells in itertools.combinations(free, n_own) if _no_line(cells))
    env = _position(mark, own[:-1], [a, b])
    _, reward, terminated, _, info = env.step(own[-1])
    assert (reward, terminated) == (-1.0, True)
    assert not info["success"] and info["outcome"] == "loss"
    assert env.board[c] == other(mark) and winner(env.board) == other(mark)
    assert info["episode_metrics"]["loss_rate"] == 1.0 and not info["illegal_move"]


def test_draw_detection():
    # X O X / X O O / O X _ : X fills the last cell and nobody has a line.
    env = _position("X", [0, 2, 3, 7], [1, 4, 5, 6])
    obs, reward, terminated, truncated, info = env.step("9")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["outcome"] == "draw" and not info["success"] and info["valid_actions"] == []
    assert "draw" in obs and info["episode_metrics"]["draw_rate"] == 1.0


def test_draw_when_the_opponent_fills_the_board():
    # Agent O to move on X X O / O O X / X _ _ ; after O plays 8, X must fill 9: no line for anyone.
    env = _position("O", [2, 3, 4], [0, 1, 5, 6])
    _, reward, terminated, _, info = env.step("8")
    assert env.board[8] == "X" and winner(env.board) == ""
    assert (reward, terminated, info["outcome"]) == (0.0, True, "draw")


def test_illegal_move_is_a_loss_not_a_crash():
    env = TicTacToeEnv(agent_mark="O", opponent="random")
    _, info = env.reset(seed=5)
    occupied = next(i for i, cell in enumerate(env.board) if cell)
    assert str(occupied + 1) not in info["valid_actions"]
    _, reward, terminated, truncated, info = env.step(occupied)
    assert (reward, terminated, truncated) == (-1.0, True, False)
    assert info["illegal_move"] is True and not info["success"] and info["outcome"] == "loss"
    assert info["episode_metrics"] == {
        "win_rate": 0.0,
        "draw_rate": 0.0,
        "loss_rate": 1.0,
        "illegal_move_rate": 1.0,
    }
    with pytest.raises(RuntimeError):
        env.step(0)  # the game is over


@pytest.mark.parametrize("opponent", ["random", "mcts", "perfect"])
def test_agent_as_o_sees_the_opponents_first_move(opponent):
    env = TicTacToeEnv(agent_mark="O", opponent=opponent, mcts_simulations=30)
    obs, info = env.reset(seed=3)
    assert env.board.count("X") == 1 and env.board.count("O") == 0
    assert len(info["valid_actions"]) == 8 and info["state"]["to_move"] == "O"
    assert info["outcome"] == "" and info["illegal_move"] is False
    assert f"The opponent (X) played {env.board.index('X') + 1}." in obs and "You play O." in obs
    env_x = TicTacToeEnv(agent_mark="X", opponent=opponent)
    _, info = env_x.reset(seed=3)
    assert env_x.board == [""] * 9 and len(info["valid_actions"]) == 9


def _play(env: TicTacToeEnv, seed: int, agent_rng: np.random.Generator) -> list:
    """Random legal agent moves; checks each opponent reply is one mark on a cell that was empty."""
    obs, info = env.reset(seed=seed)
    trace = [obs]
    done = False
    while not done:
        before = list(env.board)
        move = int(env.action_index(info["valid_actions"][agent_rng.integers(len(info["valid_actions"]))]))
        obs, reward, terminated, truncated, info = env.step(move)
        changed = [i for i in range(9) if env.board[i] != before[i]]
        assert all(before[i] == "" for i in changed) and move in changed
        assert len(changed) <= 2 and [env.board[i] for i in changed if i != move] in ([], [env.opponent_mark])
        assert len(changed) == 2 or terminated  # the opponent replies unless the game ended
        trace += [move, obs, reward]
        done = terminated or truncated
    assert terminated and not truncated and env.steps_taken <= env.max_steps
    return trace


@pytest.mark.parametrize("mark", ["X", "O"])
@pytest.mark.parametrize("opponent", ["random", "mcts", "perfect"])
def test_opponents_are_legal_and_reproducible(opponent, mark):
    def traces(seeds):
        env = TicTacToeEnv(agent_mark=mark, opponent=opponent, mcts_simulations=50)
        return [_play(env, s, np.random.default_rng(s)) for s in seeds]

    first = traces(range(6))
    assert first == traces(range(6))  # same seed -> same episode
    if opponent != "perfect" or mark == "O":
        assert len({str(t) for t in first}) > 1  # the seed matters


def test_random_opponent_is_uniform_over_empty_cells():
    first = [TicTacToeEnv(agent_mark="O").reset(seed=s)[1]["state"]["board"].index("X") for s in range(180)]
    counts = np.bincount(first, minlength=9)
    assert counts.min() >= 8 and counts.max() <= 35  # expected 20 each


def test_perfect_play_values():
    assert move_values([""] * 9, "X") == {i: 0 for i in range(9)}  # the game is a draw
    # X to move can win at cell 3 (index 2) now, or later elsewhere: the quickest win is preferred.
    board = ["X", "X", "", "O", "O", "", "", "", ""]
    assert perfect_moves(board, "X") == [2]
    assert perfect_moves(board, "O") == [5]  # O to move wins at once too
    # O must block X's open row.
    assert perfect_moves(["X", "X", "", "", "O", "", "", "", ""], "O") == [2]
    # Against corner-corner, the only non-losing replies for O are the edges.
    assert perfect_moves(["X", "", "", "", "O", "", "", "", "X"], "O") == [1, 3, 5, 7]
    with pytest.raises(ValueError):
        perfect_move(["X", "X", "X", "O", "O", "", "", "", ""], "O")


def test_perfect_versus_perfect_is_always_a_draw():
    for seed in range(30):
        rng = np.random.default_rng(seed)
        board, mark = [""] * 9, "X"
        while not winner(board) and not all(board):
            board[perfect_move(board, mark, rng)] = mark
            mark = other(mark)
        assert winner(board) == "" and all(board)


def test_mcts_takes_wins_and_blocks():
    board = ["O", "O", "", "X", "X", "", "", "", ""]
    for seed in range(5):
        assert mcts_move(board, "X", 100, np.random.default_rng(seed)) == 5  # win now
        assert mcts_move(board, "O", 100, np.random.default_rng(seed)) == 2
    block = ["X", "", "", "", "X", "", "O", "", ""]  # O must block cell 9
    assert all(mcts_move(block, "O", 100, np.random.default_rng(s)) == 8 for s in range(5))
    assert mcts_move(board, "X", 20, np.random.default_rng(1)) == mcts_move(
        board, "X", 20, np.random.default_rng(1)
    )


def test_facts_name_the_cells_that_win_and_the_cells_that_block():
    env = _position("X", [0, 1, 4], [3, 6, 8])  # X wins with 3 (top row) or 8 (middle column); O needs 7
    assert env.facts() == "Winning cells for X: 3, 8. Cells that block O: 8."
    assert _position("X", [0, 1], [6, 4]).facts() == "Winning cells for X: 3. Cells that block O: 3."
    assert _position("O", [4], [0, 8]).facts() == "No line can be completed on this move."
    assert _position("O", [4, 3], [0, 8, 2]).facts() == "Winning cells for O: 6. Cells that block X: 2, 6."
    assert _position("X", [], []).facts() == "No line can be completed on this move."


def test_mcts_opponent_is_stronger_than_random():
    from agentrl.agents.baselines import RandomAgent
    from agentrl.rollout import rollout

    seeds = range(40)
    returns = {
        opp: np.mean(
            [e.episode_return for e in rollout(lambda o=opp: TicTacToeEnv(opponent=o), RandomAgent(), seeds)]
        )
        for opp in ("random", "mcts")
    }
    assert returns["mcts"] < returns["random"] - 0.5


@pytest.mark.parametrize(
    "kwargs", [{}, {"agent_mark": "O"}, {"opponent": "mcts", "mcts_simulations": 20}, {"opponent": "perfect"}]
)
def test_check_env_passes(kwargs):
    check_env(TicTacToeEnv(**kwargs), skip_render_check=True)


def test_registered_as_gymnasium_id():
    env = gym.make("agentrl/TicTacToe-v0", opponent="perfect", agent_mark="O")
    _, info = env.reset(seed=0)
    assert len(info["valid_actions"]) == 8


def test_rendering_and_instructions():
    env = _position("X", [0], [2])
    text = env.render_text()
    assert text.startswith(" X | 2 | O\n---+---+---\n 4 | 5 | 6\n---+---+---\n 7 | 8 | 9\n")
    assert "You play X." in text and "Legal moves: 2, 4, 5, 6, 7, 8, 9" in text
    assert env.default_action() == 1
    assert "as X" in env.instructions and "number of an empty cell" in env.instructions


def test_state_and_numeric_view():
    env = _position("O", [4], [0, 8])
    state = env.state()
    assert state == {"board": ["X", "", "", "", "O", "", "", "", "X"], "agent_mark": "O", "to_move": "O"}
    vec = env.numeric_observation().reshape(9, 3)
    assert vec.dtype == np.float32 and env.numeric_space().contains(vec.reshape(-1))
    assert vec[4].tolist() == [1, 0, 0] and vec[0].tolist() == [0, 1, 0] and vec[1].tolist() == [0, 0, 1]
    assert vec.sum() == 9
    wrapped = NumericObservation(TicTacToeEnv())
    obs, _ = wrapped.reset(seed=0)
    assert wrapped.observation_space.contains(obs) and obs.sum() == 9 and obs[2::3].sum() == 9


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"agent_mark": "Z"}, UnknownChoiceError),
        ({"opponent": "alphazero"}, UnknownChoiceError),
        ({"mcts_simulations": 0}, ConfigError),
    ],
)
def test_bad_config_raises_typed_error(kwargs, error):
    with pytest.raises(error):
        make_env("tictactoe", **kwargs)


def test_config_file_matches_constructor():
    import inspect
    from pathlib import Path

    import yaml

    import agentrl

    conf = yaml.safe_load((Path(agentrl.__file__).parent / "conf/env/tictactoe.yaml").read_text())
    assert conf.pop("name") == "tictactoe"
    conf.pop("defaults", None)  # Hydra's defaults list (the schema), not a constructor argument
    params = inspect.signature(TicTacToeEnv).parameters
    assert conf == {k: p.default for k, p in params.items() if k != "render_mode"}


def test_instructions_state_only_rules_every_player_meets():
    """The instructions go to LLMs and to people (`agentrl play`). An occupied cell is asked again of a
    person and handled by agent.invalid_rule for an LLM; only raw `env.step` callers lose by it, so the
    instructions must not say that it loses."""
    from agentrl.agents.baselines import parse_move

    env = _position("X", [0], [4])
    text = env.instructions
    assert "occupied" not in text and text.endswith("Your action is the number of an empty cell.")
    assert parse_move("5", env.action_names, env.valid_actions()) == (
        None,
        "Illegal move '5': 5 is not legal now.",
    )
    assert parse_move("2", env.action_names, env.valid_actions()) == ("2", "")
