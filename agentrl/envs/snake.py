"""Snake as a text game (docs/envs.md), with optional poison apples.

Rules (the seed paper's Snake, with the choices it leaves open made explicit):

- An n x n board (10 by default); rows count from the top, columns from the left; "up" is row - 1.
- Both snakes move at the same time each step. Eating an apple gives +1 and the snake grows by one
  (its tail stays put that step). Eaten apples respawn at once on random free cells.
- Every step the agent survives costs `step_penalty` (0.01), also on steps where it eats.
- The agent dies (reward exactly -1, episode terminates, the board freezes) when its head leaves the
  board ("wall"), enters its own body ("self"), enters the opponent's body ("opponent") or meets the
  opponent's head on the same cell or by swapping cells ("head_on"). Bodies are checked after both
  snakes moved, so a tail that moves away frees its cell. Moving opposite to the current heading runs
  into the snake's own neck: death when the snake has a body (length > 1), a plain move otherwise.
- The opponent (`opponent=True`, as in the seed) moves uniformly at random among the moves that do
  not die immediately given the current board (any non-reversing move if none is safe). It eats
  apples and grows too. If it dies, it respawns at once at a random free place, away from the agent's
  head, at the start length (removed only if no room is left), so the board always keeps one.
- Poison apples (`poison_apples` > 0, symbol X) give `poison_reward` (-1) and do not make the snake
  grow; they respawn like apples. Nothing else changes, which is the point of the variant: only the
  instructions tell the agent that X is bad.
- `success` (read at the episode's end): the agent is alive and ate at least one apple.
- `approach_reward` (0 by default; a training aid, [ours]): a move that neither kills the agent nor eats
  adds approach_reward x (d_before - d_after), where d is the Manhattan distance from the head to the
  apple that was nearest before the move: +c a step toward it, -c a step away, so going back and forth
  earns nothing. The instructions do not mention it; `algo.curriculum.approach_reward` sets it for
  training episodes only, and evaluation keeps the standard reward.

All randomness (placement, respawns, opponent moves) comes from `self.np_random`, so a seed fixes the
whole episode given the agent's actions. `reset(options=...)` can place things by hand (tests,
scripted scenarios): keys "snake" (cells, head first), "direction", "opponent" (cells or None),
"opponent_direction", "apples", "poison" (lists of [row, col]); missing keys are drawn at random.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.envs.base import TextEnv
from agentrl.errors import ConfigError

Cell = tuple[int, int]

#: heading name -> (row delta, col delta); "up" decreases the row (row 0 is the top).
DIRECTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

#: what `render_text` shows: the board with coordinates (the seed paper's observation), a short
#: summary of what lies around the head (the facts Snake's numeric view gives DQN, in words), or both.
VIEWS = ("board", "summary", "board+summary")

#: why a move would kill, for the summary view
MOVE_DEATH_TEXT = {"wall": "the wall", "self": "your body", "opponent": "the enemy snake"}

DEATH_TEXT = {
    "wall": "it hit the wall",
    "self": "it ran into its own body",
    "opponent": "it ran into the enemy snake's body",
    "head_on": "it collided head-on with the enemy snake",
}


@dataclass
class SnakeBody:
    """One snake: its cells head first, and the direction of its last move."""

    cells: list[Cell]
    direction: str

    @property
    def head(self) -> Cell:
        return self.cells[0]


def _step_cell(cell: Cell, direction: str) -> Cell:
    dr, dc = DIRECTIONS[direction]
    return cell[0] + dr, cell[1] + dc


def _heading(cells: list[Cell]) -> str | None:
    """Direction from the neck to the head, or None for a one-cell snake."""
    if len(cells) < 2:
        return None
    delta = (cells[0][0] - cells[1][0], cells[0][1] - cells[1][1])
    return next((name for name, d in DIRECTIONS.items() if d == delta), None)


class SnakeEnv(TextEnv):
    """Eat apples, avoid walls and bodies; an optional random opponent snake shares the board."""

    name = "snake"
    action_names = ["up", "down", "left", "right"]
    reset_option_names = ("snake", "direction", "opponent", "opponent_direction", "apples", "poison")

    def __init__(
        self,
        size: int = 10,
        apples: int = 1,
        opponent: bool = True,
        max_steps: int = 100,
        step_penalty: float = 0.01,
        poison_apples: int = 0,
        poison_reward: float = -1.0,
        start_length: int = 1,
        view: str = "board",
        approach_reward: float = 0.0,
        render_mode: str | None = None,
    ):
        if int(size) < 4:
            raise ConfigError(f"snake size must be >= 4, got {size}")
        if int(apples) < 0 or int(poison_apples) < 0:
            raise ConfigError(f"snake apples and poison_apples must be >= 0, got {apples}, {poison_apples}")
        if not 1 <= int(start_length) <= int(size) // 2:
            raise ConfigError(
                f"snake start_length must be in 1..size/2 = {int(size) // 2}, got {start_length}"
            )
        if int(max_steps) < 1:
            raise ConfigError(f"snake max_steps must be >= 1, got {max_steps}")
        if view not in VIEWS:
            raise ConfigError(f"snake view must be one of {', '.join(VIEWS)}, got {view!r}")
        if float(approach_reward) < 0:
            raise ConfigError(f"snake approach_reward must be >= 0, got {approach_reward}")
        super().__init__(render_mode=render_mode)
        self.approach_reward = float(approach_reward)
        self.size = int(size)
        self.n_apples = int(apples)
        self.opponent_enabled = bool(opponent)
        self.max_steps = int(max_steps)
        self.step_penalty = float(step_penalty)
        self.n_poison = int(poison_apples)
        self.poison_reward = float(poison_reward)
        self.start_length = int(start_length)
        self.view = view
        self.apple_reward = 1.0
        self.death_reward = -1.0
        self.steps_taken = 0
        self.snake = SnakeBody([(self.size // 2, self.size // 2)], "up")
        self.opponent: SnakeBody | None = None
        self.apples: list[Cell] = []
        self.poison: list[Cell] = []
        self.score = 0
        self.poison_eaten = 0
        self.death: str | None = None

    # ---- placement -------------------------------------------------------------------------
    def _in_bounds(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self.size and 0 <= cell[1] < self.size

    def _occupied(self) -> set[Cell]:
        cells = set(self.snake.cells) | set(self.apples) | set(self.poison)
        if self.opponent is not None:
            cells |= set(self.opponent.cells)
        return cells

    def _random_snake(self, occupied: set[Cell], away_from: Cell | None) -> SnakeBody | None:
        """A straight snake of `start_length` on free cells, heading away from its body; with
        `away_from`, its head at Manhattan distance >= 3 from that cell where possible."""
        options: list[tuple[list[Cell], str]] = []
        for r in range(self.size):
            for c in range(self.size):
                for direction, (dr, dc) in DIRECTIONS.items():
                    cells = [(r - k * dr, c - k * dc) for k in range(self.start_length)]
                    if all(self._in_bounds(x) and x not in occupied for x in cells):
                        options.append((cells, direction))
        if away_from is not None:
            far = [o for o in options if abs(o[0][0][0] - away_from[0]) + abs(o[0][0][1] - away_from[1]) >= 3]
            options = far or options
        if not options:
            return None
        cells, direction = options[int(self.np_random.integers(len(options)))]
        return SnakeBody(cells, direction)

    def _fill(self, items: list[Cell], count: int) -> None:
        """Top `items` (apples or poison) up to `count` on random free cells."""
        while len(items) < count:
            occupied = self._occupied()
            free = [(r, c) for r in range(self.size) for c in range(self.size) if (r, c) not in occupied]
            if not free:
                return
            items.append(free[int(self.np_random.integers(len(free)))])

    def _given_cells(self, value: Any, key: str) -> list[Cell]:
        cells = [(int(r), int(c)) for r, c in value]
        if not all(self._in_bounds(x) for x in cells):
            raise ConfigError(
                f"snake reset option {key!r} has cells outside the {self.size}x{self.size} board"
            )
        return cells

    # ---- episode dynamics ------------------------------------------------------------------
    def _reset(self, options: dict) -> None:
        self.score, self.poison_eaten, self.death = 0, 0, None
        # Hand-placed items first, so randomly placed snakes avoid them.
        self.apples = self._given_cells(options["apples"], "apples") if "apples" in options else []
        self.poison = self._given_cells(options["poison"], "poison") if "poison" in options else []
        self.opponent = None
        if "snake" in options:
            cells = self._given_cells(options["snake"], "snake")
            self.snake = SnakeBody(cells, options.get("direction") or _heading(cells) or "up")
        else:
            snake = self._random_snake(set(self.apples) | set(self.poison), None)
            if snake is None:
                raise ConfigError("snake: no room to place the snake")
            self.snake = snake
        if "opponent" in options:
            if options["opponent"] is not None:
                cells = self._given_cells(options["opponent"], "opponent")
                self.opponent = SnakeBody(cells, options.get("opponent_direction") or _heading(cells) or "up")
        elif self.opponent_enabled:
            self.opponent = self._random_snake(self._occupied(), self.snake.head)
        self._fill(self.apples, self.n_apples)
        self._fill(self.poison, self.n_poison)

    def _opponent_direction(self) -> str:
        """Uniformly random among moves that do not die on the current board, else any non-reversal."""
        assert self.opponent is not None
        neck = self.opponent.cells[1] if len(self.opponent.cells) > 1 else None
        moves = [d for d in self.action_names if _step_cell(self.opponent.head, d) != neck]
        blocked = set(self.snake.cells) | set(self.opponent.cells)
        safe = [
            d for d in moves if self._in_bounds(c := _step_cell(self.opponent.head, d)) and c not in blocked
        ]
        pool = safe or moves
        return pool[int(self.np_random.integers(len(pool)))]

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.death is not None:  # stepping after death: nothing moves
            return 0.0, True, False, {"event": "dead"}
        direction = self.action_names[index]
        agent, opp = self.snake, self.opponent
        opp_direction = self._opponent_direction() if opp is not None else None

        target = self._nearest(self.apples) if self.approach_reward and self.apples else None
        # Both snakes move at once; a snake that eats an apple keeps its tail (grows by one).
        head = _step_cell(agent.head, direction)
        agent_cells = [head] + (agent.cells if head in self.apples else agent.cells[:-1])
        opp_head: Cell | None = None
        opp_cells: list[Cell] = []
        if opp is not None and opp_direction is not None:
            opp_head = _step_cell(opp.head, opp_direction)
            opp_cells = [opp_head] + (opp.cells if opp_head in self.apples else opp.cells[:-1])

        death = None
        if not self._in_bounds(head):
            death = "wall"
        elif (len(agent.cells) > 1 and head == agent.cells[1]) or head in agent_cells[1:]:
            death = "self"  # includes reversing into the neck
        elif opp is not None and (head == opp_head or (head == opp.head and opp_head == agent.head)):
            death = "head_on"
        elif head in opp_cells[1:]:
            death = "opponent"
        if death is not None:
            self.death = death
            return self.death_reward, True, False, {"event": death}

        reward = -self.step_penalty
        event = "move"
        self.snake = SnakeBody(agent_cells, direction)
        if head in self.apples:
            self.apples.remove(head)
            self.score += 1
            reward += self.apple_reward
            event = "apple"
        elif head in self.poison:
            self.poison.remove(head)
            self.poison_eaten += 1
            reward += self.poison_reward
            event = "poison"
        if target is not None and event != "apple":
            reward += self.approach_reward * (_distance(agent.head, target) - _distance(head, target))

        opponent_event = None
        if opp is not None and opp_head is not None and opp_direction is not None:
            opp_dies = (
                not self._in_bounds(opp_head)
                or opp_head in opp_cells[1:]
                or (len(opp.cells) > 1 and opp_head == opp.cells[1])
                or opp_head in agent_cells
            )
            if opp_dies:
                opponent_event = "died"
                self.opponent = None
                self.opponent = self._random_snake(self._occupied(), self.snake.head)
            else:
                self.opponent = SnakeBody(opp_cells, opp_direction)
                if opp_head in self.apples:
                    self.apples.remove(opp_head)
                    opponent_event = "apple"
                elif opp_head in self.poison:
                    self.poison.remove(opp_head)
                    opponent_event = "poison"
        self._fill(self.apples, self.n_apples)
        self._fill(self.poison, self.n_poison)
        return reward, False, self.score >= 1, {"event": event, "opponent_event": opponent_event}

    # ---- text interface --------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        n = self.size
        enemy = self.opponent_enabled  # without an enemy, no rule mentions one
        lines = [
            f"You control a snake on a {n}x{n} board. Rows are numbered 0 to {n - 1} from the top, "
            f"columns 0 to {n - 1} from the left.",
            "Each move your snake's head goes one cell up (row - 1), down (row + 1), left (col - 1) or "
            "right (col + 1), and its body follows.",
        ]
        if "board" in self.view:
            lines.append(
                (
                    "Symbols: 1 is your snake's head, 2 is the enemy snake's head, T is a body segment (yours "
                    "or the enemy's), A is an apple, "
                    if enemy
                    else "Symbols: 1 is your snake's head, T is a body segment, A is an apple, "
                )
                + ("X is a poison apple, " if self.n_poison else "")
                + "_ is an empty cell."
            )
        if "summary" in self.view:
            lines.append(
                "Each turn you are told where the nearest apple is from your head and what each move "
                "would run into."
            )
        lines += [
            f"Eating an apple (A) gives +{self.apple_reward:g} and your snake grows by one segment.",
        ]
        if self.n_poison:
            lines.append(
                f"Eating a poison apple (X) gives {self.poison_reward:+g} and your snake does not grow: "
                "avoid poison apples."
            )
        lines += [
            f"Each move costs {self.step_penalty:g}.",
            f"Your snake dies (reward {self.death_reward:g}, the game ends) if its head hits a wall"
            + (", any body segment (yours or the enemy's) or the enemy's head." if enemy else " or its body.")
            + " A tail end that moves away in the same move is not in the way. Moving back the way you "
            "came runs into your own body once you have one.",
        ]
        if enemy:
            lines.append(
                "An enemy snake (2) moves at random on the same board, avoiding moves that kill it at once "
                "when it can; it can eat apples too, and reappears elsewhere when it dies."
            )
        lines += [
            f"The game ends after at most {self.max_steps} moves.",
            f"Valid actions: {', '.join(self.action_names)}.",
        ]
        return "\n".join(lines)

    @staticmethod
    def _cells_text(cells: list[Cell]) -> str:
        return ", ".join(f"(row {r}, col {c})" for r, c in cells) if cells else "none"

    def render_text(self) -> str:
        if self.view == "summary":
            return self._summary_text()
        grid = [["_"] * self.size for _ in range(self.size)]
        for r, c in self.apples:
            grid[r][c] = "A"
        for r, c in self.poison:
            grid[r][c] = "X"
        snakes = [(self.snake, "1")] + ([(self.opponent, "2")] if self.opponent is not None else [])
        for snake, _mark in snakes:
            for r, c in snake.cells[1:]:
                grid[r][c] = "T"
        for snake, mark in snakes:
            r, c = snake.head
            grid[r][c] = mark
        lines = [
            f"Your snake (1): head at {self._cells_text([self.snake.head])}; "
            f"body: {self._cells_text(self.snake.cells[1:])}.",
        ]
        if self.opponent is not None:
            lines.append(
                f"Enemy snake (2): head at {self._cells_text([self.opponent.head])}; "
                f"body: {self._cells_text(self.opponent.cells[1:])}."
            )
        elif self.opponent_enabled:
            lines.append("Enemy snake: none.")
        lines.append(f"Apples (A): {self._cells_text(self.apples)}.")
        if self.n_poison or self.poison:
            lines.append(f"Poison apples (X): {self._cells_text(self.poison)}.")
        lines.append("Board:")
        lines += [" ".join(row) for row in grid]
        if self.view == "board+summary":
            return "\n".join(lines) + "\n" + self._summary_text()
        if self.death is not None:
            lines.append(f"Your snake died: {DEATH_TEXT[self.death]}.")
        return "\n".join(lines)

    @staticmethod
    def _offset_text(target: Cell, head: Cell) -> str:
        """Where `target` lies from `head` in words: "2 rows up and 3 columns right", "here"."""
        dr, dc = target[0] - head[0], target[1] - head[1]
        parts = []
        if dr:
            parts.append(f"{abs(dr)} row{'s' if abs(dr) > 1 else ''} {'up' if dr < 0 else 'down'}")
        if dc:
            parts.append(f"{abs(dc)} column{'s' if abs(dc) > 1 else ''} {'left' if dc < 0 else 'right'}")
        return " and ".join(parts) or "here"

    def _summary_text(self) -> str:
        """What lies around the head, in words: the facts `numeric_observation` gives DQN."""
        head = self.snake.head
        lines = [
            f"Your snake: head at {self._cells_text([head])}, length {len(self.snake.cells)}"
            + (f", last move {self.snake.direction}." if len(self.snake.cells) > 1 else ".")
        ]
        if self.apples:
            apple = self._nearest(self.apples)
            lines.append(f"Nearest apple: {self._offset_text(apple, head)} of your head.")
        else:
            lines.append("Nearest apple: none on the board.")
        if self.poison:
            lines.append(
                f"Nearest poison apple: {self._offset_text(self._nearest(self.poison), head)} of your head."
            )
        if self.opponent is not None:
            lines.append(f"Enemy snake's head: {self._offset_text(self.opponent.head, head)} of your head.")
        if self.death is not None:
            lines.append(f"Your snake died: {DEATH_TEXT[self.death]}.")
            return "\n".join(lines)
        outcomes = []
        for move, (death, near_enemy, poison, apple) in self._move_outcomes().items():
            if death is not None:
                text = f"deadly ({MOVE_DEATH_TEXT[death]})"
            else:
                notes = ["eats the apple"] if apple else []
                notes += ["eats a poison apple"] if poison else []
                notes += ["next to the enemy's head"] if near_enemy else []
                text = "safe" + (f" ({', '.join(notes)})" if notes else "")
            outcomes.append(f"{move} is {text}")
        lines.append("Moves: " + "; ".join(outcomes) + ".")
        return "\n".join(lines)

    def _nearest(self, cells: list[Cell]) -> Cell:
        head = self.snake.head
        return min(cells, key=lambda a: _distance(a, head))

    def _blocked(self) -> tuple[set[Cell], set[Cell], set[Cell]]:
        """(cells of the agent's body in the way, enemy cells, cells next to the enemy head)."""
        body = self.snake.cells[1:]
        # The tail leaves its cell this step unless the snake eats; with one body segment the tail is
        # the neck, and reversing into the neck kills.
        own = set(body[:-1] if len(body) >= 2 else body)
        enemy: set[Cell] = set()
        near_enemy: set[Cell] = set()
        if self.opponent is not None:
            enemy = set(self.opponent.cells)
            near_enemy = {_step_cell(self.opponent.head, d) for d in DIRECTIONS}
        return own, enemy, near_enemy

    def _move_outcomes(self) -> dict[str, tuple[str | None, bool, bool, bool]]:
        """Per move, in `action_names` order: (death cause or None, next to the enemy head, poison, apple)."""
        own, enemy, near_enemy = self._blocked()
        outcomes = {}
        for name in self.action_names:
            cell = _step_cell(self.snake.head, name)
            death = (
                "wall"
                if not self._in_bounds(cell)
                else "self"
                if cell in own
                else "opponent"
                if cell in enemy
                else None
            )
            outcomes[name] = (death, cell in near_enemy, cell in self.poison, cell in self.apples)
        return outcomes

    def state(self) -> dict[str, Any]:
        opp = self.opponent
        return {
            "head": list(self.snake.head),
            "body": [list(x) for x in self.snake.cells[1:]],
            "direction": self.snake.direction,
            "opponent": None
            if opp is None
            else {
                "head": list(opp.head),
                "body": [list(x) for x in opp.cells[1:]],
                "direction": opp.direction,
            },
            "apples": [list(x) for x in self.apples],
            "poison": [list(x) for x in self.poison],
            "size": self.size,
            "score": self.score,
            "poison_eaten": self.poison_eaten,
            "alive": self.death is None,
            "steps_left": self.max_steps - self.steps_taken,
        }

    def default_action(self) -> int:
        return self.action_index("up")  # the seed paper's default for an unparseable answer

    # ---- numeric view for DQN --------------------------------------------------------------
    #: blocks of `numeric_observation`, in order: 4 values each (up, down, left, right, the
    #: `action_names` order, which is also the Q-network's action order), then 2 scalars
    FEATURES = (
        "danger",
        "head_on",
        "poison",
        "apple_direction",
        "room",
        "heading",
        "length",
        "apple_distance",
    )
    N_FEATURES = 26

    def numeric_space(self) -> gym.spaces.Box:
        return gym.spaces.Box(0.0, 1.0, shape=(self.N_FEATURES,), dtype=np.float32)

    def numeric_observation(self) -> np.ndarray:
        """26 compact features of the board around the head (each 4-block in `action_names` order).

        danger (4): the move dies now (wall, own body except the tail that moves away, any cell of the
        enemy); head_on (4): the target cell is next to the enemy head (it may move there: head-on
        collision); poison (4): the target cell holds a poison apple; apple_direction (4): the nearest
        apple (Manhattan) lies up / down / left / right of the head; room (4): free cells reachable
        from the target cell (flood fill) / board cells, 0 if the move dies; heading (4): one-hot
        direction of the last move; then length / board cells and the nearest apple's distance /
        (2 * size).

        Why features rather than board planes: an MLP on flattened planes has to learn the
        translation-invariant "is the cell next to my head free" from hundreds of inputs and, on a
        CPU budget of a few minutes, stays near random; these features make the one-step dangers and
        the apple direction linear in the input, and DQN eats several apples per episode after
        30k steps (benchmarks/dqn_snake.py).
        """
        n = self.size
        head = self.snake.head
        own, enemy, near_enemy = self._blocked()
        free = {(r, c) for r in range(n) for c in range(n)} - own - enemy - {head}
        component = _component_sizes(free)
        feats = np.zeros(self.N_FEATURES, dtype=np.float32)
        for k, name in enumerate(self.action_names):
            cell = _step_cell(head, name)
            dies = cell not in free
            feats[k] = float(dies)
            feats[4 + k] = float(cell in near_enemy)
            feats[8 + k] = float(cell in self.poison)
            feats[16 + k] = 0.0 if dies else component.get(cell, 0) / (n * n)
        if self.apples:
            ar, ac = self._nearest(self.apples)
            feats[12:16] = [ar < head[0], ar > head[0], ac < head[1], ac > head[1]]
            feats[25] = (abs(ar - head[0]) + abs(ac - head[1])) / (2 * n)
        if self.snake.direction in self.action_names:
            feats[20 + self.action_names.index(self.snake.direction)] = 1.0
        feats[24] = len(self.snake.cells) / (n * n)
        return feats


def _component_sizes(free: set[Cell]) -> dict[Cell, int]:
    """Size of the 4-connected component of every free cell (one pass over the board)."""
    sizes: dict[Cell, int] = {}
    for start in free:
        if start in sizes:
            continue
        seen, stack = {start}, [start]
        while stack:
            r, c = stack.pop()
            for nxt in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if nxt in free and nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        for cell in seen:
            sizes[cell] = len(seen)
    return sizes


def _distance(a: Cell, b: Cell) -> int:
    """Manhattan distance between two cells."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])
