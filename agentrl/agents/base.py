"""The agent contract: `act` maps a batch of step contexts to decisions (one call per lockstep step)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from agentrl.types import Decision, StepContext


class Agent(ABC):
    name: str = "agent"

    @abstractmethod
    def act(self, contexts: list[StepContext]) -> list[Decision]:
        """One decision per context, in order."""


class PolicyAgent(Agent):
    """A classic agent that decides each episode independently from (observation, info)."""

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        return [Decision(action=self.choose(ctx)) for ctx in contexts]

    @abstractmethod
    def choose(self, ctx: StepContext) -> int:
        """Index of the action to take (must be one of ctx.info['valid_actions'])."""
