"""Frozen Lake as a text game (docs/envs.md).

Built on gymnasium's FrozenLake: the standard maps (`MAPS["4x4"]`, `MAPS["8x8"]`), its random-map
generator (`generate_random_map(size, p, seed)`, a new map per reset seed, as in the MS-GRPO authors'
code) and its transition table `P` (so the slippery dynamics are gymnasium's own: the intended move
with probability 1/3, each perpendicular move with 1/3). Defaults: a new random 4x4 map per reset seed
(evaluation on held-out seeds plays maps the policy never trained on), not slippery, reward 1 at the
goal else 0, default action "left" (the seed paper's).

The move cap fits the board: by default (`max_steps=None`) 2 x the side on non-slippery ice (the
paper's 8 on 4x4) and 25 x the side on slippery ice (gymnasium's 100 and 200 for its 4x4 and 8x8
registrations). Every map an episode plays is solvable within the cap: a random map is drawn again
until its shortest safe route fits, and a fixed map or a board whose shortest route cannot fit the cap
is refused.
"""

from __future__ import annotations

from collections import deque
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
VIEW_CHOICES = ("board", "board+neighbours")
#: random maps drawn for one reset before a cap that (almost) no map fits is refused
MAP_ATTEMPTS = 1000
#: (row delta, col delta) per action, in the env's (gymnasium's) order left, down, right, up
MOVES: list[tuple[int, int]] = [(0, -1), (1, 0), (0, 1), (-1, 0)]

#: one transition of gymnasium's table: (probability, next state, reward, terminated)
Transition = tuple[float, int, float, bool]


@lru_cache(maxsize=256)
def _transition_table(rows: tuple[str, ...], slippery: bool) -> dict[int, dict[int, list[Transition]]]:
    table = GymFrozenLake(desc=list(rows), is_slippery=slippery).P
    return {
        s: {a: [(float(p), int(n), float(r), bool(t)) for p, n, r, t in ts] for a, ts in acts.items()}
        for s, acts in table.items()
    }


def goal_distances(rows: list[str] | tuple[str, ...]) -> dict[tuple[int, int], int]:
    """Moves from each cell to the goal over ice (holes never entered), by BFS backwards from the goal
    (moves are reversible); cells that cannot reach the goal are absent. Cached per map."""
    return dict(_goal_distances(tuple(rows)))


@lru_cache(maxsize=1024)
def _goal_distances(rows: tuple[str, ...]) -> tuple[tuple[tuple[int, int], int], ...]:
    n = len(rows)
    goal = next((r, c) for r in range(n) for c in range(n) if rows[r][c] == "G")
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES:
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in dist and rows[nxt[0]][nxt[1]] != "H":
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return tuple(dist.items())


def shortest_route(rows: list[str] | tuple[str, ...]) -> int | None:
    """Moves of the shortest safe route from the start to the goal (None: the goal cannot be reached)."""
    n = len(rows)
    start = next((r, c) for r in range(n) for c in range(n) if rows[r][c] == "S")
    return goal_distances(rows).get(start)


def default_cap(size: int, slippery: bool) -> int:
    """The move cap for a size x size board when none is given: 2 x the side on non-slippery ice (the seed
    paper's 8 on 4x4; a shortest route is at least 2 x (side - 1) moves), 25 x the side on slippery ice
    (gymnasium's FrozenLake-v1 and FrozenLake8x8-v1 limits, 100 and 200)."""
    return 25 * size if slippery else 2 * size


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
        map: str = "random",
        size: int = 4,
        p: float = 0.8,
        slippery: bool = False,
        max_steps: int | None = None,
        view: str = "board",
        render_mode: str | None = None,
    ):
        if map not in MAP_CHOICES:
            raise UnknownChoiceError("frozenlake map", map, MAP_CHOICES)
        if view not in VIEW_CHOICES:
            raise UnknownChoiceError("frozenlake view", view, VIEW_CHOICES)
        if map == "random" and int(size) < 2:
            raise ConfigError(f"frozenlake size must be >= 2, got {size}")
        if not 0.0 < float(p) <= 1.0:
            raise ConfigError(f"frozenlake p (probability a tile is frozen) must be in (0, 1], got {p}")
        if max_steps is not None and int(max_steps) < 1:
            raise ConfigError(f"frozenlake max_steps must be >= 1, got {max_steps}")
        super().__init__(render_mode=render_mode)
        self.map_name = map
        self.p = float(p)
        self.slippery = bool(slippery)
        self.view = view
        self.size = int(size) if map == "random" else len(MAPS[map])
        self.cap_is_default = max_steps is None
        self.max_steps = default_cap(self.size, self.slippery) if max_steps is None else int(max_steps)
        # random maps are drawn solvable within the cap the env is made with; a trainer that cuts its
        # training episodes shorter (algo.max_steps) sets max_steps afterwards and keeps these instances
        self.route_cap = self.max_steps
        self.steps_taken = 0
        if map != "random":
            route = shortest_route(MAPS[map])
            if route is not None and route > self.max_steps:
                raise ConfigError(
                    f"frozenlake map={map}: its shortest route is {route} moves, more than "
                    f"max_steps={self.max_steps}: no episode can reach the goal (leave max_steps unset for "
                    f"{default_cap(self.size, self.slippery)}, or give at least {route})"
                )
        elif self.max_steps < 2 * (self.size - 1):
            raise ConfigError(
                f"frozenlake map=random size={self.size}: every route is at least {2 * (self.size - 1)} moves, "
                f"more than max_steps={self.max_steps} (leave max_steps unset for "
                f"{default_cap(self.size, self.slippery)})"
            )
        self._set_map(MAPS[map] if map != "random" else self._solvable_map(0))

    def _solvable_map(self, seed: int) -> list[str]:
        """gymnasium's random map for `seed`; while its shortest route does not fit the cap, another drawn
        from a generator seeded by `seed` (the same seed gives the same map)."""
        rng = None
        for _ in range(MAP_ATTEMPTS):
            rows = generate_random_map(self.size, self.p, seed=seed)
            route = shortest_route(rows)
            if route is not None and route <= self.route_cap:
                return rows
            rng = rng or np.random.default_rng(seed)
            seed = int(rng.integers(2**31 - 1))
        raise ConfigError(
            f"frozenlake: no random {self.size}x{self.size} map with p={self.p} in {MAP_ATTEMPTS} draws has a "
            f"route of at most max_steps={self.route_cap} moves; raise max_steps or p"
        )

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
            self._set_map(self._solvable_map(int(self.np_random.integers(2**31 - 1))))
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
        elif self.view == "board+neighbours":
            text += "\n" + self.neighbours_text()
        return text

    def neighbours_text(self) -> str:
        """What each move runs into, one word each, in the action order: `ice`, `hole`, `goal` or `edge`
        (the player stays put), e.g. "Next to you: left edge, down ice, right hole, up edge." """
        pr, pc = self.position
        words = {"H": "hole", "G": "goal", "F": "ice", "S": "ice"}
        parts = []
        for name, (dr, dc) in zip(self.action_names, MOVES, strict=True):
            r, c = pr + dr, pc + dc
            inside = 0 <= r < self.size and 0 <= c < self.size
            parts.append(f"{name} {words[self.rows[r][c]] if inside else 'edge'}")
        return "Next to you: " + ", ".join(parts) + "."

    def describe(self) -> str:
        """One line on the task: the map (a fixed one spelled out, with its shortest route) and the cap."""
        auto = f" ({25 if self.slippery else 2} x the side)" if self.cap_is_default else ""
        rest = f"cap {self.max_steps} moves{auto}; {'slippery' if self.slippery else 'non-slippery'}; view {self.view}"
        if self.map_name == "random":
            return (
                f"a new random {self.size}x{self.size} map per seed (p={self.p:g}), drawn again until a safe "
                f"route fits the cap; {rest}"
            )
        route = shortest_route(self.rows)
        return f"the fixed {self.map_name} map {' / '.join(self.rows)} (shortest route {route} moves); {rest}"

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
