"""Planners for the grid games (agent=planner): the best classic policy to compare LLM agents with.

Both read the structured state in `ctx.info["state"]` (envs/frozenlake.py, envs/snake.py), never the
text. Signature: `(ctx: StepContext, **options) -> action index`; unknown options (e.g. the bandit's
`ucb_c`, which agent=planner passes to every planner) are ignored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import numpy as np

from agentrl.envs.frozenlake import MOVES, FrozenLakeEnv, goal_distances, transition_model
from agentrl.envs.snake import DIRECTIONS, SnakeEnv
from agentrl.types import StepContext

Cell = tuple[int, int]

# ---- Frozen Lake ---------------------------------------------------------------------------------
assert FrozenLakeEnv.action_names == ["left", "down", "right", "up"]


@lru_cache(maxsize=256)
def _lake_q_values(rows: tuple[str, ...], gamma: float, tol: float = 1e-9) -> np.ndarray:
    """Q[state, action] by value iteration on gymnasium's slippery transition model."""
    model = transition_model(rows, slippery=True)
    n_states = len(model)
    # Expected immediate reward and the probability of continuing to each next state.
    reward = np.zeros((n_states, 4))
    cont = np.zeros((n_states, 4, n_states))
    for s in range(n_states):
        for a in range(4):
            for p, nxt, r, done in model[s][a]:
                reward[s, a] += p * r
                if not done:
                    cont[s, a, nxt] += p
    values = np.zeros(n_states)
    q = reward
    for _ in range(100_000):
        q = reward + gamma * cont @ values
        new_values = q.max(axis=1)
        if np.max(np.abs(new_values - values)) < tol:
            break
        values = new_values
    return q


def frozenlake_action(ctx: StepContext, gamma: float = 0.99, **_: Any) -> int:
    """Shortest safe path (BFS) on a deterministic lake; value iteration (discount `gamma`) on gymnasium's
    transition model when slippery. Ties go to the first action in the env's order."""
    state = ctx.info["state"]
    rows = tuple(state["map"])
    n, pos = len(rows), (int(state["row"]), int(state["col"]))
    if state.get("slippery"):
        return int(np.argmax(_lake_q_values(rows, float(gamma))[pos[0] * n + pos[1]]))
    dist = goal_distances(rows)
    best, best_dist = None, None
    for action, (dr, dc) in enumerate(MOVES):
        # Moving into the edge leaves the player in place (gymnasium's rule).
        nxt = (min(max(pos[0] + dr, 0), n - 1), min(max(pos[1] + dc, 0), n - 1))
        if rows[nxt[0]][nxt[1]] == "H":
            continue
        d = dist.get(nxt, n * n + 1)  # unreachable goal: any hole-free move is as good as another
        if best_dist is None or d < best_dist:
            best, best_dist = action, d
    return best if best is not None else ctx.env.default_action()


# ---- Snake ---------------------------------------------------------------------------------------
def _cells(items: Iterable[Any]) -> set[Cell]:
    return {(int(r), int(c)) for r, c in items}


def _explore(
    start: Cell, board: set[Cell], free_at: dict[Cell, int], targets: set[Cell], cap: int
) -> tuple[int | None, int]:
    """Time-aware BFS from `start`, entered at move 1: a cell can be entered at move t when it is on
    the board and `t >= free_at[cell]` (body cells free up as tails move on). Returns the moves to the
    nearest target (None if unreachable) and how many cells can be entered (counting `start`, stopping
    once `cap` is reached and a target is found)."""
    dist = 1 if start in targets else None
    entered, queue = {start}, deque([(start, 1)])
    while queue and (dist is None or len(entered) < cap):
        (r, c), t = queue.popleft()
        for dr, dc in DIRECTIONS.values():
            nxt = (r + dr, c + dc)
            if nxt in entered or nxt not in board or t + 1 < free_at.get(nxt, 0):
                continue
            entered.add(nxt)
            queue.append((nxt, t + 1))
            if dist is None and nxt in targets:
                dist = t + 1
    return dist, len(entered)


def _free_times(cells: list[Cell]) -> dict[Cell, int]:
    """Move from which each cell of a snake (head first) is vacated if it does not grow: cells[i] at
    move len - i (the tail at move 1)."""
    return {cell: len(cells) - i for i, cell in enumerate(cells)}


def snake_action(ctx: StepContext, **_: Any) -> int:
    """Go for the nearest apple by a safe shortest path.

    Every move that does not die now is scored, best first, by: not a trap (from the new cell the
    snake can still reach more cells than it is long: flood fill), its risk (a safe cell, then a cell
    next to the opponent's head where a head-on collision could happen, then a poison apple), room
    (at least twice the snake's length + 2 cells reachable), the moves to the nearest apple, and the
    room left. Ties keep the action order; with no move that survives, the env's default action.

    The search is a BFS that knows bodies move: a body cell can be entered once the tail has left it
    (the snake only grows on the step it eats; the opponent's cells are freed one move later in case
    it eats). Poison apples are never crossed; reversing into the own neck is never considered.
    """
    state = ctx.info["state"]
    n = int(state["size"])
    head = (int(state["head"][0]), int(state["head"][1]))
    cells = [head] + [(int(r), int(c)) for r, c in state["body"]]
    poison = _cells(state.get("poison", []))
    board = {(r, c) for r in range(n) for c in range(n)} - poison
    # free_at[cell]: first move at which the cell can be entered; free_after_eating: the same when the
    # first move eats an apple (the tail then stays one move longer).
    # Reversing into the neck kills, so the neck cannot be entered at move 1, nor the head's current
    # cell at move 2 once the snake has a body then.
    free_at = _free_times(cells)
    if len(cells) > 1:
        free_at[cells[1]] = max(free_at[cells[1]], 2)
        free_at[head] = max(free_at[head], 3)
    free_after_eating = {cell: t + 1 for cell, t in free_at.items()}
    free_after_eating[head] = max(free_after_eating[head], 3)
    near_opponent: set[Cell] = set()
    if state.get("opponent"):
        opp = state["opponent"]
        opp_cells = [(int(r), int(c)) for r, c in [opp["head"], *opp["body"]]]
        for cell, t in _free_times(opp_cells).items():
            # One move later than its own tail would: the opponent keeps its tail when it eats.
            for table in (free_at, free_after_eating):
                table[cell] = max(table.get(cell, 0), t + 1)
        near_opponent = {(opp_cells[0][0] + dr, opp_cells[0][1] + dc) for dr, dc in DIRECTIONS.values()}
    apples = _cells(state.get("apples", [])) & board
    room = 2 * len(cells) + 2  # cells a move must leave reachable to count as roomy (tuned on 200 seeds)

    def enterable(cell: Cell) -> bool:  # at move 1 without dying (poison does not kill)
        return 0 <= cell[0] < n and 0 <= cell[1] < n and free_at.get(cell, 0) <= 1

    def key(name: str) -> tuple[int, int, int, int, int]:
        cell = moves[name]
        tier = 2 if cell in poison else 1 if cell in near_opponent else 0
        times = free_after_eating if cell in apples else free_at
        dist, area = _explore(cell, board | {cell}, times, apples, cap=room)
        # A move whose flood fill cannot even hold the snake is a trap: worse than any risk.
        trapped = area <= len(cells)
        return (int(trapped), tier, int(area < room), dist if dist is not None else n * n, -area)

    names = list(SnakeEnv.action_names)
    moves = {name: (head[0] + DIRECTIONS[name][0], head[1] + DIRECTIONS[name][1]) for name in names}
    candidates = [name for name in names if enterable(moves[name])]
    if not candidates:
        return ctx.env.default_action()
    return ctx.env.action_index(min(candidates, key=key))  # min is stable: ties keep action order
