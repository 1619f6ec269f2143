"""A text kitchen: make a salad with multi-word action phrases (docs/envs.md).

Modelled on the Overcooked salad tasks of TWOSOME (Tan et al. ICLR 2024) and POAD (Wen et al. NeurIPS
2024), the testbed of token-level PPO, so the actions are free-form phrases of different token lengths
("chop the onion", "put the lettuce on the plate"). The grid and walking of Overcooked are left out:
what remains is the order of the macro-actions, the subtask rewards and the wrong-delivery penalty.

Tomato, lettuce and onion start whole on the counter. A task names a recipe: ``tomato_salad`` (1
ingredient, the easiest), ``tomato_lettuce_salad`` (2) and ``tomato_lettuce_onion_salad`` (3); the other
ingredients are distractors that stay available. Rules:

- the agent holds at most one item;
- ``pick up the X``: with empty hands, takes the whole X from the counter;
- ``chop the X``: chops the whole X in hand; the chopped X stays in hand;
- ``put the X on the plate``: puts the chopped X in hand on the plate;
- ``deliver the plate``: correct when the plate holds exactly the recipe's (chopped) ingredients: +1,
  the episode ends with success. Otherwise (an empty plate included) a wrong delivery: -0.1, and every
  ingredient on the plate goes back to the counter whole; what the agent holds stays in hand.
- An action whose conditions do not hold does nothing. With ``actions="all"`` (the default) every action
  is always valid (DQN and scoring agents use all of them); a useless one costs only the step penalty.
  With ``actions="feasible"`` the valid actions of a state are those that do something there (the
  delivery always counts: a wrong one clears the plate), listed with each observation; the others stay
  playable by index and do nothing, but are not among ``valid_actions()``.

Rewards (POAD's Overcooked): +0.2 the first time each recipe ingredient is chopped, +0.2 the first time
each chopped recipe ingredient is put on the plate, +1 a correct delivery, -0.1 a wrong delivery, and
-0.001 every step. The only way to free a hand holding a distractor is to chop it and plate it; a wrong
delivery then clears the plate.

The reset seed only shuffles the order in which the counter lists its ingredients; the dynamics are
deterministic given the actions. Reset option ``random_start`` (a probability, training curricula only):
the episode starts after the first k moves of an optimal play, k uniform in 1..3n for a recipe of n
ingredients (so the delivery is always left to do); the subtask rewards of those moves count as paid.
Reset option ``count_start_moves`` (bool, with ``random_start``): those k moves also count against
``max_steps``, so every start leaves the same slack over the optimal play (``max_steps`` minus its length)
instead of more the later the start. The rules live here as plain functions (`transition`) so the planner
(`optimal_actions`, used by agents/planning_kitchen.py) runs the env's own dynamics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.envs.base import TextEnv, reset_probability
from agentrl.errors import ConfigError, UnknownChoiceError

INGREDIENTS = ("tomato", "lettuce", "onion")
#: task name -> recipe (ingredients in INGREDIENTS order)
TASKS: dict[str, tuple[str, ...]] = {
    "tomato_salad": ("tomato",),
    "tomato_lettuce_salad": ("tomato", "lettuce"),
    "tomato_lettuce_onion_salad": ("tomato", "lettuce", "onion"),
}
TASK_NAMES = tuple(TASKS)
#: which actions a state lists as valid: every one, or those that do something there
ACTION_LISTS = ("all", "feasible")

# Where an ingredient is: whole on the counter, whole in hand, chopped in hand, chopped on the plate.
COUNTER, HELD, HELD_CHOPPED, PLATE = "counter", "held", "held_chopped", "plate"
STATUSES = (COUNTER, HELD, HELD_CHOPPED, PLATE)

PICK, CHOP, PUT = 0, 1, 2
#: per ingredient (INGREDIENTS order): pick up, chop, put on the plate; then deliver
ACTION_NAMES = [
    phrase
    for x in INGREDIENTS
    for phrase in (f"pick up the {x}", f"chop the {x}", f"put the {x} on the plate")
] + ["deliver the plate"]
DELIVER = len(ACTION_NAMES) - 1

# Rewards in thousandths, so returns add up exactly (the planner compares sums of them).
STEP_MILLI = -1
SUBTASK_MILLI = 200
DELIVERY_MILLI = 1000
WRONG_DELIVERY_MILLI = -100
#: the planner looks at most this many steps ahead: from any state the optimal plan is far shorter
#: (10 steps: a 3-ingredient salad from scratch), so a longer episode cap changes no decision
PLANNER_HORIZON = 32


@dataclass(frozen=True)
class KitchenState:
    """Where each ingredient is (INGREDIENTS order) and which subtask rewards have been paid."""

    status: tuple[str, ...] = (COUNTER,) * len(INGREDIENTS)
    chop_rewarded: frozenset[str] = frozenset()
    plate_rewarded: frozenset[str] = frozenset()

    def held(self) -> str | None:
        """The ingredient in hand, or None."""
        return next(
            (x for x, s in zip(INGREDIENTS, self.status, strict=True) if s in (HELD, HELD_CHOPPED)), None
        )

    def on(self, where: str) -> list[str]:
        """Ingredients with status `where`, in INGREDIENTS order."""
        return [x for x, s in zip(INGREDIENTS, self.status, strict=True) if s == where]

    def with_status(self, ingredient: str, status: str) -> KitchenState:
        i = INGREDIENTS.index(ingredient)
        return replace(self, status=self.status[:i] + (status,) + self.status[i + 1 :])


@dataclass(frozen=True)
class Outcome:
    """What one action did: the next state, the reward in thousandths, and a short account."""

    state: KitchenState
    reward_milli: int
    event: str  # pick | chop | plate | deliver | wrong_delivery | nothing
    message: str
    success: bool = False


def transition(recipe: frozenset[str], state: KitchenState, action: int) -> Outcome:
    """Apply action `action` (an index into ACTION_NAMES) to `state` for `recipe`; the step penalty
    is included in the reward."""
    if action == DELIVER:
        plated = state.on(PLATE)
        if set(plated) == recipe:
            return Outcome(state, STEP_MILLI + DELIVERY_MILLI, "deliver", "You delivered the salad.", True)
        back = state
        for x in plated:
            back = back.with_status(x, COUNTER)
        what = ", ".join(f"chopped {x}" for x in plated) if plated else "an empty plate"
        message = f"Wrong delivery ({what}); the plate's ingredients went back to the counter whole."
        return Outcome(back, STEP_MILLI + WRONG_DELIVERY_MILLI, "wrong_delivery", message)
    x = INGREDIENTS[action // 3]
    verb = action % 3
    status = state.status[INGREDIENTS.index(x)]
    held = state.held()
    if verb == PICK:
        if held is not None:
            return Outcome(state, STEP_MILLI, "nothing", f"Nothing happened: you already hold the {held}.")
        if status != COUNTER:
            return Outcome(
                state, STEP_MILLI, "nothing", f"Nothing happened: there is no whole {x} on the counter."
            )
        return Outcome(state.with_status(x, HELD), STEP_MILLI, "pick", f"You picked up the {x}.")
    if verb == CHOP:
        if status != HELD:
            return Outcome(state, STEP_MILLI, "nothing", f"Nothing happened: you do not hold a whole {x}.")
        after = state.with_status(x, HELD_CHOPPED)
        reward = STEP_MILLI
        if x in recipe and x not in state.chop_rewarded:
            after = replace(after, chop_rewarded=state.chop_rewarded | {x})
            reward += SUBTASK_MILLI
        return Outcome(after, reward, "chop", f"You chopped the {x}.")
    if status != HELD_CHOPPED:
        return Outcome(state, STEP_MILLI, "nothing", f"Nothing happened: you do not hold a chopped {x}.")
    after = state.with_status(x, PLATE)
    reward = STEP_MILLI
    if x in recipe and x not in state.plate_rewarded:
        after = replace(after, plate_rewarded=state.plate_rewarded | {x})
        reward += SUBTASK_MILLI
    return Outcome(after, reward, "plate", f"You put the chopped {x} on the plate.")


@cache
def _best_value(recipe: frozenset[str], state: KitchenState, steps_left: int) -> int:
    """The highest return (thousandths) reachable from `state` within `steps_left` steps."""
    if steps_left <= 0:
        return 0
    return max(_action_value(recipe, state, a, steps_left) for a in range(len(ACTION_NAMES)))


def _action_value(recipe: frozenset[str], state: KitchenState, action: int, steps_left: int) -> int:
    out = transition(recipe, state, action)
    if out.success:
        return out.reward_milli
    return out.reward_milli + _best_value(recipe, out.state, steps_left - 1)


def action_values(recipe: frozenset[str], state: KitchenState, steps_left: int) -> list[int]:
    """Optimal return (thousandths) after each action, with `steps_left` steps left (capped at
    PLANNER_HORIZON): exact finite-horizon dynamic programming over the env's own `transition`."""
    horizon = max(1, min(int(steps_left), PLANNER_HORIZON))
    return [_action_value(recipe, state, a, horizon) for a in range(len(ACTION_NAMES))]


def optimal_actions(recipe: frozenset[str], state: KitchenState, steps_left: int) -> list[int]:
    """Every optimal action from `state`: those that change something first, then those that do
    nothing, each group in ascending index order. With a step budget that leaves slack, wasting a step
    first can tie with acting now; the planner should act now."""
    values = action_values(recipe, state, steps_left)
    best = max(values)
    tied = [a for a, v in enumerate(values) if v == best]
    return sorted(tied, key=lambda a: transition(recipe, state, a).event == "nothing")


def feasible_actions(recipe: frozenset[str], state: KitchenState) -> list[int]:
    """The actions that do something in `state` (ascending index): the delivery always does."""
    return [a for a in range(len(ACTION_NAMES)) if transition(recipe, state, a).event != "nothing"]


def state_from_dict(state: dict[str, Any]) -> KitchenState:
    """The KitchenState inside `KitchenEnv.state()`'s dict."""
    return KitchenState(
        status=tuple(state["ingredients"][x] for x in INGREDIENTS),
        chop_rewarded=frozenset(state["chop_rewarded"]),
        plate_rewarded=frozenset(state["plate_rewarded"]),
    )


def _join(words: list[str] | tuple[str, ...]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _salad_name(recipe: tuple[str, ...]) -> str:
    return f"{_join(recipe)} salad"


class KitchenEnv(TextEnv):
    """Make a salad: pick up, chop and plate each recipe ingredient, then deliver the plate."""

    name = "kitchen"
    action_names = list(ACTION_NAMES)
    reset_option_names = ("random_start", "count_start_moves")

    def __init__(
        self,
        task: str = "tomato_salad",
        max_steps: int = 20,
        actions: str = "all",
        render_mode: str | None = None,
    ):
        if task not in TASKS:
            raise UnknownChoiceError("kitchen task", task, TASK_NAMES)
        if actions not in ACTION_LISTS:
            raise UnknownChoiceError("kitchen actions", actions, ACTION_LISTS)
        if int(max_steps) < 1:
            raise ConfigError(f"kitchen max_steps must be >= 1, got {max_steps}")
        super().__init__(render_mode=render_mode)
        self.task = task
        self.actions = actions
        self.recipe = TASKS[task]
        self._recipe_set = frozenset(self.recipe)
        self.max_steps = int(max_steps)
        self.steps_taken = 0
        self.kitchen = KitchenState()
        self.counter_order: list[str] = list(INGREDIENTS)
        self.plate_order: list[str] = []
        self.delivered = False
        self.wrong_deliveries = 0
        self.message = ""

    # ---- episode dynamics ----------------------------------------------------------------------
    def _reset(self, options: dict) -> None:
        self.kitchen = KitchenState()
        # The seed only changes the order the counter lists its ingredients in.
        self.counter_order = [INGREDIENTS[i] for i in self.np_random.permutation(len(INGREDIENTS))]
        self.plate_order = []
        self.delivered = False
        self.wrong_deliveries = 0
        self.message = ""
        random_start = reset_probability(self.name, "random_start", options.get("random_start", 0.0))
        count = options.get("count_start_moves", False)
        if not isinstance(count, bool):
            raise ConfigError(f"kitchen reset option count_start_moves must be true or false, got {count!r}")
        if random_start > 0 and self.np_random.random() < random_start:
            moves = int(self.np_random.integers(1, 3 * len(self.recipe) + 1))
            self._play_optimally(moves)
            if count:
                # the agent always keeps at least one action
                self.steps_taken = min(moves, self.max_steps - 1)

    def _play_optimally(self, moves: int) -> None:
        """Advance the kitchen by `moves` optimal moves (a curriculum start; no reward is paid for them)."""
        for _ in range(moves):
            action = optimal_actions(self._recipe_set, self.kitchen, self.max_steps)[0]
            out = transition(self._recipe_set, self.kitchen, action)
            self.kitchen = out.state
            if out.event == "plate":
                self.plate_order.append(INGREDIENTS[action // 3])

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.delivered:  # stepping after the episode ended: nothing happens
            return 0.0, True, True, {"event": "nothing"}
        out = transition(self._recipe_set, self.kitchen, index)
        self.kitchen = out.state
        self.message = f"{self.action_names[index]}. {out.message}"
        if out.event == "plate":
            self.plate_order.append(INGREDIENTS[index // 3])
        elif out.event == "wrong_delivery":
            self.plate_order = []
            self.wrong_deliveries += 1
        elif out.event == "deliver":
            self.delivered = True
        return out.reward_milli / 1000.0, out.success, out.success, {"event": out.event}

    def _info(self, success: bool) -> dict[str, Any]:
        info = super()._info(success)
        done = len(self.kitchen.chop_rewarded) + len(self.kitchen.plate_rewarded)
        # Per-episode diagnostics; evaluation.py averages them into mean_<key>.
        info["episode_metrics"] = {
            "subtask_rate": done / (2 * len(self.recipe)),
            "wrong_deliveries": float(self.wrong_deliveries),
        }
        return info

    def valid_actions(self) -> list[str]:
        if self.actions == "all":
            return list(self.action_names)
        return [self.action_names[a] for a in feasible_actions(self._recipe_set, self.kitchen)]

    def default_action(self) -> int:
        """`pick up the tomato`: fixed, never a delivery (tomato is in every recipe); under
        `actions="feasible"` it may be unlisted in the state, where it does nothing."""
        return 0

    # ---- text interface ------------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        salad = _salad_name(self.recipe)
        needed = _join([f"the {x}" for x in self.recipe])
        them = "it" if len(self.recipe) == 1 else "them"
        others = [x for x in INGREDIENTS if x not in self.recipe]
        distractors = ""
        if others:
            verb = "is" if len(others) == 1 else "are"
            distractors = f" {_join([f'the {x}' for x in others]).capitalize()} {verb} not in the recipe."
        return (
            f"You are a cook in a kitchen. Make a {salad}: chop {needed}, put {them} on the plate and "
            "deliver the plate. The tomato, the lettuce and the onion start whole on the counter."
            f"{distractors}\n"
            "Rules: you hold at most one item. 'pick up the X' takes the whole X from the counter when your "
            "hands are empty. 'chop the X' chops the whole X you hold; the chopped X stays in your hand. "
            "'put the X on the plate' puts the chopped X you hold on the plate. 'deliver the plate' serves "
            "the plate: if it holds exactly the chopped recipe ingredients, the salad is done; otherwise it "
            "is a wrong delivery and every ingredient on the plate goes back to the counter whole. An action "
            "whose conditions do not hold does nothing.\n"
            "Rewards: +0.2 the first time you chop each recipe ingredient, +0.2 the first time you put each "
            "chopped recipe ingredient on the plate, +1 for a correct delivery (the episode ends), -0.1 for a "
            f"wrong delivery, and -0.001 for every action. You have at most {self.max_steps} actions.\n"
            + (
                f"Valid actions: {', '.join(self.action_names)}."
                if self.actions == "all"
                else f"Actions: {', '.join(self.action_names)}. Each step lists the ones that do something."
            )
        )

    def render_text(self) -> str:
        held = self.kitchen.held()
        hand = "nothing"
        if held is not None:
            chopped = self.kitchen.status[INGREDIENTS.index(held)] == HELD_CHOPPED
            hand = f"a {'chopped' if chopped else 'whole'} {held}"
        counter = [x for x in self.counter_order if self.kitchen.status[INGREDIENTS.index(x)] == COUNTER]
        plate = ", ".join(f"chopped {x}" for x in self.plate_order) or "nothing"
        lines = [
            f"Recipe: {_salad_name(self.recipe)} ({', '.join(f'chopped {x}' for x in self.recipe)}).",
            f"Counter (whole): {', '.join(counter) or 'nothing'}.",
            f"You hold: {hand}.",
            f"Plate: {plate}.",
        ]
        if self.message:
            lines.append(f"Last action: {self.message}")
        if self.delivered:
            lines.append("The salad is served.")
        return "\n".join(lines)

    def state(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "recipe": list(self.recipe),
            "ingredients": dict(zip(INGREDIENTS, self.kitchen.status, strict=True)),
            "holding": self.kitchen.held(),
            "counter": [
                x for x in self.counter_order if self.kitchen.status[INGREDIENTS.index(x)] == COUNTER
            ],
            "plate": list(self.plate_order),
            "chop_rewarded": [x for x in INGREDIENTS if x in self.kitchen.chop_rewarded],
            "plate_rewarded": [x for x in INGREDIENTS if x in self.kitchen.plate_rewarded],
            "wrong_deliveries": self.wrong_deliveries,
            "delivered": self.delivered,
            "steps_left": self.max_steps - self.steps_taken,
        }

    # ---- numeric view for DQN ------------------------------------------------------------------
    def numeric_space(self) -> gym.spaces.Box:
        # per ingredient: one-hot status (4), in recipe, chop rewarded, plate rewarded
        return gym.spaces.Box(0.0, 1.0, shape=(len(INGREDIENTS) * (len(STATUSES) + 3),), dtype=np.float32)

    def numeric_observation(self) -> np.ndarray:
        """Per ingredient (tomato, lettuce, onion): one-hot of (counter, held whole, held chopped, plate),
        then recipe membership, chop reward paid, plate reward paid; the reward bits keep the view Markov."""
        rows = np.zeros((len(INGREDIENTS), len(STATUSES) + 3), dtype=np.float32)
        for i, x in enumerate(INGREDIENTS):
            rows[i, STATUSES.index(self.kitchen.status[i])] = 1.0
            rows[i, 4] = float(x in self._recipe_set)
            rows[i, 5] = float(x in self.kitchen.chop_rewarded)
            rows[i, 6] = float(x in self.kitchen.plate_rewarded)
        return rows.reshape(-1)
