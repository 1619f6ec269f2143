"""Classic agents: random, planner (the best classic policy per env) and a human at the terminal."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.agents.base import PolicyAgent
from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.types import StepContext

# env name -> "module:function" with signature (ctx: StepContext, **options) -> action index.
PLANNERS: dict[str, str] = {
    "frozenlake": "agentrl.agents.planning_grid:frozenlake_action",
    "snake": "agentrl.agents.planning_grid:snake_action",
    "snake_poison": "agentrl.agents.planning_grid:snake_action",
    "bandit": "agentrl.agents.planning_games:ucb1_action",
    "contextual_bandit": "agentrl.agents.linucb:linucb_action",
    "tictactoe": "agentrl.agents.planning_games:tictactoe_action",
    "kitchen": "agentrl.agents.planning_kitchen:kitchen_action",
}


class RandomAgent(PolicyAgent):
    name = "random"

    def choose(self, ctx: StepContext) -> int:
        valid = ctx.info["valid_actions"]
        return ctx.env.action_index(valid[int(ctx.rng.integers(len(valid)))])


class PlannerAgent(PolicyAgent):
    name = "planner"

    def __init__(self, env_name: str, **options: Any):
        if env_name not in PLANNERS:
            raise UnknownChoiceError("env for agent=planner", env_name, sorted(PLANNERS))
        module, _, fn = PLANNERS[env_name].partition(":")
        self._plan: Callable[..., int] = getattr(importlib.import_module(module), fn)
        self.options = options

    def choose(self, ctx: StepContext) -> int:
        return self._plan(ctx, **self.options)


#: what `input()` returns for an arrow key in a terminal (normal and application cursor modes)
ARROW_KEYS: dict[str, str] = {
    "\x1b[A": "up",
    "\x1b[B": "down",
    "\x1b[C": "right",
    "\x1b[D": "left",
    "\x1bOA": "up",
    "\x1bOB": "down",
    "\x1bOC": "right",
    "\x1bOD": "left",
}


def stdin_is_interactive() -> bool:
    """True when stdin is an open terminal (a person can type moves)."""
    stream = sys.stdin
    try:
        return stream is not None and not stream.closed and stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def require_terminal(what: str = "agent=human") -> None:
    """Refuse to start a human player without a terminal: every move would hit end-of-input."""
    if not stdin_is_interactive():
        raise ConfigError(
            f"{what} needs a person at a terminal, but stdin is not interactive (closed, a pipe or a "
            "file); run it in a terminal, or pick another agent (agent=planner, agent=random, agent=llm)"
        )


def short_names(actions: Sequence[str]) -> dict[str, str]:
    """Each action's shortest prefix that no other action shares ("u" for up), when shorter than it."""
    lowered = [a.lower() for a in actions]
    short = {}
    for action, low in zip(actions, lowered, strict=True):
        for k in range(1, len(low)):
            if sum(other.startswith(low[:k]) for other in lowered) == 1:
                short[action] = low[:k]
                break
    return short


def parse_move(answer: str, actions: Sequence[str], valid: Sequence[str]) -> tuple[str | None, str]:
    """(the legal action an answer names, "") or (None, why not). An answer names an action by its name
    (any case), a prefix only it has (u: up) or, for up/down/left/right, an arrow key."""
    text = answer.strip(" \t\r\n")
    lowered = {a.lower(): a for a in actions}
    name = ARROW_KEYS.get(text)
    if name is not None and name not in lowered:
        name = None
    if name is None:
        low = text.lower()
        matches = [a for a in actions if a.lower() == low] or (
            [a for a in actions if a.lower().startswith(low)] if low else []
        )
        if len(matches) > 1:
            return None, f"{text!r} could be {' or '.join(matches)}"
        name = matches[0] if matches else None
    if name is None:
        return None, f"Illegal move {answer!r}."
    action = lowered[name.lower()]
    if action not in valid:
        return None, f"Illegal move {answer!r}: {action} is not legal now."
    return action, ""


class HumanAgent(PolicyAgent):
    """Asks a person for each move; re-prompts until the answer names a legal action.

    A move is an action's name, a prefix only it has, or an arrow key for up/down/left/right. Without an
    `ask` function it reads the terminal, and refuses to start when stdin is not one. End of input
    (Ctrl-D) raises EOFError and Ctrl-C KeyboardInterrupt, for the caller to end the game.
    """

    name = "human"

    def __init__(self, console: Any = None, ask: Callable[[str], str] | None = None):
        from rich.console import Console

        if ask is None:
            require_terminal()
        self.console = console or Console()
        self.ask = ask or (lambda prompt: self.console.input(prompt, markup=False))

    @staticmethod
    def controls(actions: Sequence[str]) -> str:
        """How to enter moves, for the player's screen."""
        short = short_names(actions)
        names = ", ".join(f"{a} ({short[a]})" if a in short else a for a in actions)
        arrows = " or an arrow key" if {"up", "down", "left", "right"} <= set(actions) else ""
        return (
            f"Moves: {names}{arrows}, then Enter. An unknown or illegal move is asked again. "
            "Ctrl-D or Ctrl-C quits."
        )

    def choose(self, ctx: StepContext) -> int:
        self.console.print(ctx.observation, markup=False, highlight=False, soft_wrap=False)
        valid = ctx.info["valid_actions"]
        while True:
            answer = self.ask(f"Your move ({', '.join(valid)}): ")
            action, problem = parse_move(answer, ctx.env.action_names, valid)
            if action is not None:
                return ctx.env.action_index(action)
            from rich.text import Text

            line = Text(problem, style="red").append(f" Legal moves: {', '.join(valid)}", style="")
            self.console.print(line, soft_wrap=False)
