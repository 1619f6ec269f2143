"""Frozen Lake as a text game (docs/envs.md).

Built on gymnasium's FrozenLake: the standard maps (`MAPS["4x4"]`, `MAPS["8x8"]`), its random-map
generator (`generate_random_map(size, p, seed)`, a new map per reset seed, as in the MS-GRPO authors'
code) and its transition table `P` (so the slippery dynamics are gymnasium's own: the intended move
with probability 1/3, each perpendicular move with 1/3). Defaults follow the seed paper: not
slippery, episode capped at 8 moves, reward 1 at the goal else 0, default action "left".
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import MAPS, generate_random_map
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.envs.toy_text.utils import categorical_sample

from agentrl.envs.base import TextEnv, reset_probability
from agentrl.errors import ConfigError, UnknownChoiceError

MAP_CHOICES = ("4x4", "8x8", "random")

#: one transition of gymnasium's table: (probability, next state, reward, terminated)
Transition = tuple[float, int, float, bool]


@lru_cache(maxsize=256)
def _transition_table(rows: tuple[str, ...], slippery: bool) -> dict[int, dict[int, list[Transition]]]:
    table = GymFrozenLake(desc=list(rows), is_slippery=slippery).P
    return {
        s: {a: [(float(p), int(n), float(r), bool(t)) for p, n, r, t in ts] for a, ts in acts.items()}
        for s, acts in table.items()
    }


def transition_model(
    rows: list[str] | tuple[str, ...], slippery: bool
) -> dict[int, dict[int, list[Transition]]]:
    """Gymnasium's transition table for a map: `P[state][action] -> [(prob, next, reward, done)]`.

    States are `row * ncols + col`, actions follow `FrozenLakeEnv.action_names`. Cached per map;
    treat the result as read-only. Planners use it for value iteration (agents/planning_grid.py).
    """
    return _transition_table(tuple(rows), bool(slippery))


class FrozenLakeEnv(TextEnv):
    """Reach the goal `G` from the top-left start without falling into a hole `O`.

    Reset options (`env.reset(seed=s, options={...})`):

    - ``random_start`` (float in [0, 1], default 0): with this probability the episode starts on a
      random safe cell (`S` or `F`) instead of the start cell, both drawn from the env's seeded
      generator after the map is set, so a seed fixes the start. A training curriculum: episodes
      also begin on cells a fixed start rarely reaches. With 0 (or absent) the generator is not
      touched, so the episode is exactly the plain reset's.
    """

    name = "frozenlake"
    # gymnasium's action order (LEFT=0, DOWN=1, RIGHT=2, UP=3)
    action_names = ["left", "down", "right", "up"]
    reset_option_names = ("random_start",)

    def __init__(
        self,
        map: str = "4x4",
        size: int = 4,
        p: float = 0.8,
        slippery: bool = False,
        max_steps: int = 8,
        render_mode: str | None = None,
    ):
        if map not in MAP_CHOICES:
            raise UnknownChoiceError("frozenlake map", map, MAP_CHOICES)
        if map == "random" and int(size) < 2:
            raise ConfigError(f"frozenlake size must be >= 2, got {size}")
        if not 0.0 < float(p) <= 1.0:
            raise ConfigError(f"frozenlake p (probability a tile is frozen) must be in (0, 1], got {p}")
        if int(max_steps) < 1:
            raise ConfigError(f"frozenlake max_steps must be >= 1, got {max_steps}")
        super().__init__(render_mode=render_mode)
        self.map_name = map
        self.p = float(p)
        self.slippery = bool(slippery)
        self.max_steps = int(max_steps)
        self.size = int(size) if map == "random" else len(MAPS[map])
        self.steps_taken = 0
        self._set_map(MAPS[map] if map != "random" else generate_random_map(self.size, self.p, seed=0))

    def _set_map(self, rows: list[str]) -> None:
        self.rows: list[str] = list(rows)
        self.P = transition_model(self.rows, self.slippery)
        n = self.size
        self.holes = [[r, c] for r in range(n) for c in range(n) if self.rows[r][c] == "H"]
        self.goal = next([r, c] for r in range(n) for c in range(n) if self.rows[r][c] == "G")
        self.start = next((r, c) for r in range(n) for c in range(n) if self.rows[r][c] == "S")
        self.position = self.start

    # ---- episode dynamics ------------------------------------------------------------------
    def _reset(self, options: dict) -> None:
        random_start = reset_probability(self.name, "random_start", options.get("random_start", 0.0))
        if self.map_name == "random":
            # The map seed comes from the reset seed's generator: same seed -> same map.
            self._set_map(
                generate_random_map(self.size, self.p, seed=int(self.np_random.integers(2**31 - 1)))
            )
        self.position = self.start
        if random_start > 0 and self.np_random.random() < random_start:
            cells = [(r, c) for r, row in enumerate(self.rows) for c, ch in enumerate(row) if ch in "SF"]
            self.position = cells[int(self.np_random.integers(len(cells)))]

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        row, col = self.position
        cell = self.rows[row][col]
        if cell in "GH":  # stepping after the episode ended: stay put, nothing happens
            return 0.0, True, cell == "G", {}
        transitions = self.P[row * self.size + col][index]
        if len(transitions) == 1:
            _, nxt, reward, terminated = transitions[0]
        else:
            chosen = categorical_sample([t[0] for t in transitions], self.np_random)
            _, nxt, reward, terminated = transitions[chosen]
        self.position = divmod(nxt, self.size)
        landed = self.rows[self.position[0]][self.position[1]]
        return reward, terminated, landed == "G", {"event": {"G": "goal", "H": "hole"}.get(landed, "move")}

    # ---- text interface --------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        n = self.size
        slip = (
            " The ice is slippery: each move goes in the chosen direction only 1/3 of the time and "
            "otherwise to one of the two perpendicular directions."
            if self.slippery
            else " The ice is not slippery: every move goes where you choose."
        )
        return (
            f"You are playing Frozen Lake on a {n}x{n} grid. Walk from the start (top-left) to the goal "
            "without falling into a hole. Rows are numbered 0 to "
            f"{n - 1} from the top, columns 0 to {n - 1} from the left.\n"
            "Symbols: P is you, O is a hole, G is the goal, _ is safe ice.\n"
            "Moves: left, down, right, up move one cell; moving into the edge of the grid leaves you "
            f"where you are.{slip}\n"
            "Reward: 1 for reaching the goal, 0 otherwise. Falling into a hole ends the episode with 0. "
            f"You have at most {self.max_steps} moves.\n"
            f"Valid actions: {', '.join(self.action_names)}."
        )

    def render_text(self) -> str:
        pr, pc = self.position
        symbol = {"H": "O", "G": "G", "F": "_", "S": "_"}
        lines = [
            " ".join("P" if (r, c) == (pr, pc) else symbol[ch] for c, ch in enumerate(row))
            for r, row in enumerate(self.rows)
        ]
        gr, gc = self.goal
        text = "\n".join(lines) + f"\nYou are at (row {pr}, col {pc}). The goal is at (row {gr}, col {gc})."
        landed = self.rows[pr][pc]
        if landed == "H":
            text += " You fell into a hole."
        elif landed == "G":
            text += " You reached the goal."
        return text

    def state(self) -> dict[str, Any]:
        return {
            "row": int(self.position[0]),
            "col": int(self.position[1]),
            "goal": list(self.goal),
            "holes": [list(h) for h in self.holes],
            "size": self.size,
            "map": list(self.rows),
            "slippery": self.slippery,
            "steps_left": self.max_steps - self.steps_taken,
        }

    def default_action(self) -> int:
        return self.action_index("left")  # the seed paper's default for an unparseable answer

    # ---- numeric view for DQN --------------------------------------------------------------
    def numeric_space(self) -> gym.spaces.Box:
        return gym.spaces.Box(0.0, 1.0, shape=(3 * self.size * self.size,), dtype=np.float32)

    def numeric_observation(self) -> np.ndarray:
        """One-hot planes (player, holes, goal), flattened row-major."""
        planes = np.zeros((3, self.size, self.size), dtype=np.float32)
        planes[0, self.position[0], self.position[1]] = 1.0
        for r, c in self.holes:
            planes[1, r, c] = 1.0
        planes[2, self.goal[0], self.goal[1]] = 1.0
        return planes.reshape(-1)
