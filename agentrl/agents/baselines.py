"""Classic agents: random, planner (the best classic policy per env) and a human at the terminal."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agentrl.agents.base import PolicyAgent
from agentrl.errors import UnknownChoiceError
from agentrl.types import StepContext

# env name -> "module:function" with signature (ctx: StepContext, **options) -> action index.
PLANNERS: dict[str, str] = {
    "frozenlake": "agentrl.agents.planning_grid:frozenlake_action",
    "snake": "agentrl.agents.planning_grid:snake_action",
    "snake_poison": "agentrl.agents.planning_grid:snake_action",
    "bandit": "agentrl.agents.planning_games:ucb1_action",
    "tictactoe": "agentrl.agents.planning_games:tictactoe_action",
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


class HumanAgent(PolicyAgent):
    """Asks a person for each move; re-prompts until the answer names a legal action."""

    name = "human"

    def __init__(self, console: Any = None, ask: Callable[[str], str] | None = None):
        from rich.console import Console

        self.console = console or Console()
        self.ask = ask or (lambda prompt: self.console.input(prompt))

    def choose(self, ctx: StepContext) -> int:
        self.console.print(ctx.observation)
        valid = ctx.info["valid_actions"]
        while True:
            answer = self.ask(f"Your move ({', '.join(valid)}): ").strip()
            for name in valid:
                if answer.lower() == name.lower():
                    return ctx.env.action_index(name)
            self.console.print(f"[red]Illegal move {answer!r}.[/red] Legal moves: {', '.join(valid)}")
