"""Tic-tac-toe against a random, MCTS or perfect opponent (the RLFT paper; docs/envs.md).

The agent plays `agent_mark` ("X" moves first; if the agent is "O" the opponent moves inside `reset`).
Actions are the cells "1".."9", numbered row by row; ``info["valid_actions"]`` lists the empty cells.
Reward +1 win, 0 draw, -1 loss. An occupied cell (only raw index users such as DQN can send one; the LLM
agent filters invalid answers first) ends the episode as a loss with ``info["illegal_move"] = True``.
``info["outcome"]`` is "win", "draw", "loss" or "" (game on); ``info["step_boards"]`` is the board before
each agent move of the episode so far (agentrl/diagnostics.py judges each move from it);
``info["episode_metrics"]`` holds 0/1 indicators ``win_rate``, ``draw_rate``, ``loss_rate``,
``illegal_move_rate`` that evaluation averages into rates (named as rates so a share of games lost never
reads as a training loss).

The game logic lives here as plain functions so the planner (agents/planning_games.py) can reuse the
perfect player without environments importing agents:

- `perfect_moves`: negamax with memoisation over the ~5,500 reachable positions; a win scores
  1 + the empty cells left after it, so quicker wins (and slower losses) are preferred.
- `mcts_move`: plain UCT (UCB1 selection with c = sqrt(2), one expansion per simulation, uniformly
  random rollouts, most-visited child), the MCTS opponent of the RLFT paper; its strength is set by the
  simulation budget.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from functools import cache
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.envs.base import TextEnv
from agentrl.errors import ConfigError, UnknownChoiceError

MARKS = ("X", "O")
OPPONENTS = ("random", "mcts", "perfect")
#: the 8 winning lines as cell indices (rows, columns, diagonals)
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2),
    (3, 4, 5),
    (6, 7, 8),
    (0, 3, 6),
    (1, 4, 7),
    (2, 5, 8),
    (0, 4, 8),
    (2, 4, 6),
)

Board = Sequence[str]  # 9 cells, each "X", "O" or ""


# ---- game rules --------------------------------------------------------------------------------
def other(mark: str) -> str:
    return "O" if mark == "X" else "X"


def winner(board: Board) -> str:
    """The mark that has three in a row, or "" if none."""
    for a, b, c in LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return ""


def empty_cells(board: Board) -> list[int]:
    return [i for i, cell in enumerate(board) if not cell]


def game_over(board: Board) -> bool:
    return bool(winner(board)) or all(board)


def winning_cells(board: Board, mark: str) -> list[int]:
    """The empty cells where `mark` completes a line on this move."""
    return [
        cell
        for cell in empty_cells(board)
        if any(cell in line and sum(board[i] == mark for i in line) == 2 for line in LINES)
    ]


# ---- perfect play ------------------------------------------------------------------------------
@cache
def _negamax(board: tuple[str, ...], to_move: str) -> int:
    """Value of a non-terminal position for the player to move under perfect play by both sides."""
    return max(_move_value(board, to_move, i) for i in empty_cells(board))


def _move_value(board: tuple[str, ...], mark: str, cell: int) -> int:
    child = board[:cell] + (mark,) + board[cell + 1 :]
    if winner(child) == mark:
        return 1 + child.count("")  # quicker wins score higher
    if all(child):
        return 0
    return -_negamax(child, other(mark))


def move_values(board: Board, mark: str) -> dict[int, int]:
    """Perfect-play value of each legal move for `mark`: > 0 forced win, 0 draw, < 0 forced loss."""
    if game_over(board):
        raise ValueError("the game is over: no moves to value")
    key = tuple(board)
    return {i: _move_value(key, mark, i) for i in empty_cells(key)}


def perfect_moves(board: Board, mark: str) -> list[int]:
    """All optimal moves for `mark` (cell indices, ascending)."""
    values = move_values(board, mark)
    best = max(values.values())
    return [i for i, v in values.items() if v == best]


def perfect_move(board: Board, mark: str, rng: np.random.Generator | None = None) -> int:
    """An optimal move: the lowest optimal cell, or a uniformly random optimal cell when `rng` is given."""
    moves = perfect_moves(board, mark)
    return moves[0] if rng is None else moves[int(rng.integers(len(moves)))]


# ---- Monte Carlo tree search (UCT) ------------------------------------------------------------
class _Node:
    __slots__ = ("move", "mover", "parent", "children", "untried", "visits", "score")

    def __init__(self, move: int | None, mover: str, parent: _Node | None, board: list[str]):
        self.move = move
        self.mover = mover  # the mark that made `move` (scores are from its point of view)
        self.parent = parent
        self.children: list[_Node] = []
        self.untried = [] if game_over(board) else empty_cells(board)
        self.visits = 0
        self.score = 0.0  # wins + 0.5 * draws for `mover`


def mcts_move(
    board: Board,
    mark: str,
    simulations: int,
    rng: np.random.Generator,
    exploration: float = math.sqrt(2.0),
) -> int:
    """Plain UCT move for `mark`: `simulations` select-expand-rollout-backup passes from this position."""
    if game_over(board):
        raise ValueError("the game is over: no move to search")
    # A stdlib generator seeded from the numpy one: same reproducibility, much cheaper per draw.
    fast = random.Random(int(rng.integers(2**63)))
    root = _Node(None, other(mark), None, list(board))
    for _ in range(max(1, int(simulations))):
        node, cells = root, list(board)
        # Selection: descend fully expanded nodes by UCB1.
        while not node.untried and node.children:
            log_n = math.log(node.visits)
            node = max(
                node.children,
                key=lambda ch: ch.score / ch.visits + exploration * math.sqrt(log_n / ch.visits),
            )
            cells[node.move] = node.mover
        # Expansion: one untried move.
        if node.untried:
            move = node.untried.pop(fast.randrange(len(node.untried)))
            mover = other(node.mover)
            cells[move] = mover
            child = _Node(move, mover, node, cells)
            node.children.append(child)
            node = child
        # Rollout: uniformly random moves to the end of the game.
        to_move = other(node.mover)
        won = winner(cells)
        while not won and not all(cells):
            free = [i for i, c in enumerate(cells) if not c]
            cells[free[fast.randrange(len(free))]] = to_move
            to_move = other(to_move)
            won = winner(cells)
        # Backup: 1 for the winner's moves, 0.5 each for a draw.
        while node is not None:
            node.visits += 1
            node.score += 0.5 if not won else float(won == node.mover)
            node = node.parent
    return max(root.children, key=lambda ch: ch.visits).move


# ---- the environment ---------------------------------------------------------------------------
class TicTacToeEnv(TextEnv):
    """Tic-tac-toe; the opponent moves inside `step` (and inside `reset` when the agent plays O)."""

    name = "tictactoe"
    action_names = [str(i) for i in range(1, 10)]
    max_steps = 5  # the agent makes at most 5 moves

    def __init__(
        self,
        agent_mark: str = "X",
        opponent: str = "random",
        mcts_simulations: int = 100,
        render_mode: str | None = None,
    ):
        agent_mark = str(agent_mark).upper()
        if agent_mark not in MARKS:
            raise UnknownChoiceError("tictactoe agent_mark", agent_mark, MARKS)
        if opponent not in OPPONENTS:
            raise UnknownChoiceError("tictactoe opponent", opponent, OPPONENTS)
        if int(mcts_simulations) < 1:
            raise ConfigError(f"env tictactoe: mcts_simulations must be >= 1, got {mcts_simulations}")
        self.agent_mark = agent_mark
        self.opponent_mark = other(agent_mark)
        self.opponent = opponent
        self.mcts_simulations = int(mcts_simulations)
        super().__init__(render_mode=render_mode)
        self.board: list[str] = [""] * 9
        self.last_opponent_move: int | None = None
        self.outcome = ""  # "", "win", "draw", "loss"
        self.illegal_move = False
        self.step_boards: list[list[str]] = []  # the board before each agent move

    # ---- episode dynamics ----------------------------------------------------------------------
    def _reset(self, options: dict) -> None:
        self.board = [""] * 9
        self.last_opponent_move = None
        self.outcome = ""
        self.illegal_move = False
        self.step_boards = []
        if self.agent_mark == "O":
            self._opponent_moves()

    def _opponent_moves(self) -> None:
        if self.opponent == "random":
            free = empty_cells(self.board)
            move = free[int(self.np_random.integers(len(free)))]
        elif self.opponent == "perfect":
            move = perfect_move(self.board, self.opponent_mark, self.np_random)
        else:
            move = mcts_move(self.board, self.opponent_mark, self.mcts_simulations, self.np_random)
        self.board[move] = self.opponent_mark
        self.last_opponent_move = move

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.outcome:
            raise RuntimeError("the tic-tac-toe game is over; call reset() first")
        self.last_opponent_move = None
        self.step_boards.append(list(self.board))
        if self.board[index]:
            self.outcome, self.illegal_move = "loss", True
            return -1.0, True, False, {}
        self.board[index] = self.agent_mark
        if not self._settle():
            self._opponent_moves()
            self._settle()
        reward = {"win": 1.0, "loss": -1.0}.get(self.outcome, 0.0)
        return reward, bool(self.outcome), self.outcome == "win", {}

    def _settle(self) -> bool:
        """Record the outcome if the game has ended; True when it has."""
        won = winner(self.board)
        if won:
            self.outcome = "win" if won == self.agent_mark else "loss"
        elif all(self.board):
            self.outcome = "draw"
        return bool(self.outcome)

    def _info(self, success: bool) -> dict[str, Any]:
        info = super()._info(success)
        info["outcome"] = self.outcome
        info["illegal_move"] = self.illegal_move
        info["step_boards"] = [list(b) for b in self.step_boards]
        # Per-episode outcome indicators; evaluation.py averages them into win/draw/loss rates.
        info["episode_metrics"] = {
            "win_rate": float(self.outcome == "win"),
            "draw_rate": float(self.outcome == "draw"),
            "loss_rate": float(self.outcome == "loss"),
            "illegal_move_rate": float(self.illegal_move),
        }
        return info

    def valid_actions(self) -> list[str]:
        if self.outcome:
            return []
        return [self.action_names[i] for i in empty_cells(self.board)]

    def facts(self) -> str:
        """The cells that win now and the cells that block the opponent's win."""
        names = self.action_names
        wins = [names[c] for c in winning_cells(self.board, self.agent_mark)]
        blocks = [names[c] for c in winning_cells(self.board, self.opponent_mark)]
        if not wins and not blocks:
            return "No line can be completed on this move."
        text = [f"Winning cells for {self.agent_mark}: {', '.join(wins)}."] if wins else []
        text += [f"Cells that block {self.opponent_mark}: {', '.join(blocks)}."] if blocks else []
        return " ".join(text)

    def default_action(self) -> int:
        """The first empty cell (cell 1 once the game is over)."""
        free = empty_cells(self.board)
        return free[0] if free and not self.outcome else 0

    # ---- text interface ------------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        return (
            f"You are playing tic-tac-toe as {self.agent_mark} against an opponent playing "
            f"{self.opponent_mark}. X moves first. Players take turns placing their mark in an empty cell; "
            "the first to get three marks in a row (horizontally, vertically or diagonally) wins. "
            "Cells are numbered 1 to 9 row by row (1 2 3 on top, 7 8 9 at the bottom); the board shows "
            "the number of each empty cell. You get reward 1 for a win, 0 for a draw and -1 for a loss. "
            "Your action is the number of an empty cell."
        )

    def render_text(self) -> str:
        cells = [mark or str(i + 1) for i, mark in enumerate(self.board)]
        rows = [f" {cells[r]} | {cells[r + 1]} | {cells[r + 2]}" for r in (0, 3, 6)]
        lines = []
        if self.last_opponent_move is not None:
            lines.append(f"The opponent ({self.opponent_mark}) played {self.last_opponent_move + 1}.")
        lines.append("\n---+---+---\n".join(rows))
        lines.append(f"You play {self.agent_mark}.")
        if self.outcome:
            lines.append(
                {"win": "You won.", "loss": "You lost.", "draw": "The game is a draw."}[self.outcome]
            )
        else:
            lines.append(f"Legal moves: {', '.join(self.valid_actions())}")
        return "\n".join(lines)

    def state(self) -> dict[str, Any]:
        to_move = ""
        if not self.outcome:
            to_move = "X" if self.board.count("X") == self.board.count("O") else "O"
        return {"board": list(self.board), "agent_mark": self.agent_mark, "to_move": to_move}

    # ---- numeric view for DQN ------------------------------------------------------------------
    def numeric_space(self) -> gym.spaces.Box:
        # 9 cells x one-hot (own, opponent, empty), flattened cell-major
        return gym.spaces.Box(low=0.0, high=1.0, shape=(27,), dtype=np.float32)

    def numeric_observation(self) -> np.ndarray:
        planes = np.zeros((9, 3), dtype=np.float32)
        for i, mark in enumerate(self.board):
            planes[i, 0 if mark == self.agent_mark else 1 if mark else 2] = 1.0
        return planes.reshape(-1)
