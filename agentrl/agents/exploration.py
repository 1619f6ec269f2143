"""Exploration mechanisms of the RLFT paper (Schmied et al. 2025, arXiv 2504.16078) as agent wrappers.

Each mechanism wraps any agent (LLM, random, planner, DQN) and is one switch under `agent.explore`
(docs/algorithms.md#exploration-mechanisms); `build_agent` applies them with `apply_exploration`:

- `try_all` (`TryAll`): while the episode has made fewer steps than the env has actions, play the first
  valid action (in the env's action order) not played yet in this episode. On a K-armed bandit the
  first K steps try every arm once (the bandit's colour names are shuffled per seed, so the arm order
  is too). The wrapped agent is not called for these steps: their decisions carry no generation, so
  a trainer, which trains on generations only, never trains on them, while later prompts show them
  through the observation or `agent.history`.
- `epsilon` (`EpsilonGreedy`): after the wrapped agent decides, with probability epsilon (drawn from
  the episode's own generator `ctx.rng`) a uniformly random valid action is executed instead. The
  decision keeps the agent's generation, validity and penalty (an invalid answer is still penalised),
  and is marked: an `ExploredDecision` with `exploration="epsilon"` and the agent's
  `proposed_action`, whose generation becomes an `ExploredGeneration` carrying the same mark, so the
  step a rollout records from it is marked too (`exploration_of(step)`). Its tokens did not choose
  the executed action; a trainer that wants on-policy credit skips such steps.
- `self_consistency` (`SelfConsistency`): the wrapped agent answers n times per step (one batched call
  on the contexts repeated n times; an LLM samples each row on its own, so it needs temperature > 0 to
  differ), and the action named by most valid answers is played; ties go to the action named first.
  The decision returned is the first answer that voted for the winner, so the step's generation is a
  completion that names the executed action and training on it is consistent; the other n - 1
  completions are dropped (never trained on). `ExploredDecision.votes` holds the count per action.
  When no answer is valid, the first answer is played as it is (the invalid-action rule applies).

Order when several are on: self-consistency wraps the agent, epsilon-greedy wraps that, try-all is
outermost (its steps call nobody). The wrappers keep no state between calls, so they serve lockstep
episodes; they forward every other attribute (an LLM's `backend`, `sampling`, `tokenizer`) to the agent
they wrap, and `configured(...)` (an LLM's sampling or penalty view) returns the view wrapped alike.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from agentrl.agents.base import Agent
from agentrl.config.agent import ExploreConfig
from agentrl.errors import ConfigError
from agentrl.types import Decision, Generation, Step, StepContext

log = logging.getLogger(__name__)

TRY_ALL = "try_all"
EPSILON = "epsilon"


@dataclass
class ExploredDecision(Decision):
    """A decision an exploration mechanism produced or changed."""

    #: "try_all" or "epsilon" when the executed action is not the agent's own choice, else None
    exploration: str | None = None
    #: epsilon: the action the wrapped agent chose (the one its generation names, when valid)
    proposed_action: int | None = None
    #: self-consistency: valid answers per action name, in order of first appearance
    votes: dict[str, int] | None = None


@dataclass
class ExploredGeneration(Generation):
    """The agent's generation for a step whose executed action an exploration mechanism chose."""

    exploration: str = ""
    executed_action: int = -1


def exploration_of(item: Decision | Step) -> str | None:
    """The exploration mechanism that chose the executed action of a decision or recorded step
    ("try_all", "epsilon"), or None when it was the agent's own choice. A step keeps the mark through
    its generation; try-all steps have none, so for steps only the epsilon mark survives a rollout."""
    mark = getattr(item, "exploration", None)
    if mark:
        return str(mark)
    generation = getattr(item, "generation", None)
    return getattr(generation, "exploration", None) or None


def explore_settings(node: Any) -> ExploreConfig:
    """`agent.explore` (a mapping, an ExploreConfig, or None for all off), checked: a bad value raises a
    one-line ConfigError naming the key (`agent.explore.epsilon=1.5: must be in [0, 1]`)."""
    if node is None:
        settings = ExploreConfig()
    elif isinstance(node, ExploreConfig):
        settings = node
    elif isinstance(node, Mapping) or hasattr(node, "keys"):
        values = {str(k): node[k] for k in node.keys()}
        known = {f.name for f in fields(ExploreConfig)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown config key 'agent.explore.{unknown[0]}'; valid keys: {', '.join(sorted(known))}"
            )
        settings = ExploreConfig(**values)
    else:
        raise ConfigError(
            f"agent.explore must be a mapping of {', '.join(f.name for f in fields(ExploreConfig))}"
        )
    settings.validate("agent.explore")
    return settings


def apply_exploration(agent: Agent, explore: Any) -> Agent:
    """`agent` wrapped in the mechanisms `explore` switches on (self-consistency innermost, try-all
    outermost); the agent itself when all are off."""
    settings = explore_settings(explore)
    if settings.self_consistency > 1:
        agent = SelfConsistency(agent, settings.self_consistency)
    if settings.epsilon > 0:
        agent = EpsilonGreedy(agent, settings.epsilon)
    if settings.try_all:
        agent = TryAll(agent)
    return agent


def unwrap(agent: Agent) -> Agent:
    """The agent inside every exploration wrapper."""
    while isinstance(agent, ExplorationWrapper):
        agent = agent.inner
    return agent


def _valid_names(ctx: StepContext) -> list[str]:
    return list(ctx.info.get("valid_actions") or ctx.env.valid_actions())


def _explored(decision: Decision, **changes: Any) -> ExploredDecision:
    """`decision` as an ExploredDecision with `changes` applied (its own marks kept otherwise)."""
    values = {
        f.name: getattr(decision, f.name) for f in fields(ExploredDecision) if hasattr(decision, f.name)
    }
    values.update(changes)
    return ExploredDecision(**values)


class ExplorationWrapper(Agent):
    """Base of the wrappers: acts through `inner`, forwards other attributes to it."""

    def __init__(self, inner: Agent):
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, attribute: str) -> Any:
        # Only called for attributes the wrapper lacks; reading __dict__ avoids recursion while unpickling.
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(attribute)
        return getattr(inner, attribute)

    @abstractmethod
    def rewrap(self, inner: Agent) -> ExplorationWrapper:
        """The same wrapper around another agent."""

    def configured(self, **kwargs: Any) -> ExplorationWrapper:
        """The wrapped agent's `configured(...)` view (an LLM's sampling/penalty view), wrapped alike."""
        return self.rewrap(self.inner.configured(**kwargs))

    def with_backend(self, backend: Any) -> ExplorationWrapper:
        """The wrapped agent generating through another backend, wrapped alike."""
        return self.rewrap(self.inner.with_backend(backend))


class TryAll(ExplorationWrapper):
    """Try every action once at the start of an episode (see the module doc)."""

    def rewrap(self, inner: Agent) -> TryAll:
        return TryAll(inner)

    @staticmethod
    def untried_action(ctx: StepContext) -> int | None:
        """The first valid action, in the env's order, that this episode has not played, while the
        episode has made fewer steps than the env has actions; else None."""
        names = ctx.env.action_names
        if len(ctx.history) >= len(names):
            return None
        played = {step.action for step in ctx.history}
        valid = set(_valid_names(ctx))
        for index, name in enumerate(names):
            if name in valid and index not in played:
                return index
        return None

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        decisions: list[Decision | None] = [None] * len(contexts)
        rest = []
        for i, ctx in enumerate(contexts):
            action = self.untried_action(ctx)
            if action is None:
                rest.append(i)
            else:
                decisions[i] = ExploredDecision(action=action, exploration=TRY_ALL)
        if rest:
            answers = self.inner.act([contexts[i] for i in rest])
            for i, decision in zip(rest, answers, strict=True):
                decisions[i] = decision
        return [d for d in decisions if d is not None]


class EpsilonGreedy(ExplorationWrapper):
    """With probability epsilon execute a uniformly random valid action (see the module doc)."""

    def __init__(self, inner: Agent, epsilon: float):
        if not 0.0 <= float(epsilon) <= 1.0:
            raise ConfigError(f"agent.explore.epsilon={epsilon}: must be in [0, 1]")
        super().__init__(inner)
        self.epsilon = float(epsilon)

    def rewrap(self, inner: Agent) -> EpsilonGreedy:
        return EpsilonGreedy(inner, self.epsilon)

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        decisions = self.inner.act(contexts)
        if self.epsilon <= 0.0:  # no draws either: the episodes' generators stay as the agent left them
            return decisions
        out: list[Decision] = []
        for ctx, decision in zip(contexts, decisions, strict=True):
            if ctx.rng.random() >= self.epsilon:
                out.append(decision)
                continue
            valid = _valid_names(ctx)
            action = ctx.env.action_index(valid[int(ctx.rng.integers(len(valid)))])
            generation = decision.generation
            if generation is not None:
                values = {f.name: getattr(generation, f.name) for f in fields(Generation)}
                generation = ExploredGeneration(**values, exploration=EPSILON, executed_action=action)
            out.append(
                _explored(
                    decision,
                    action=action,
                    generation=generation,
                    exploration=EPSILON,
                    proposed_action=decision.action,
                )
            )
        return out


class SelfConsistency(ExplorationWrapper):
    """Play the majority action of n answers per step (see the module doc)."""

    def __init__(self, inner: Agent, samples: int):
        if int(samples) < 1:
            raise ConfigError(f"agent.explore.self_consistency={samples}: must be >= 1")
        super().__init__(inner)
        self.samples = int(samples)
        sampling = getattr(inner, "sampling", None)
        if self.samples > 1 and sampling is not None and not getattr(sampling, "do_sample", True):
            log.warning(
                "agent.explore.self_consistency=%d with greedy decoding: every answer is the same; "
                "set agent.sampling.temperature > 0",
                self.samples,
            )

    def rewrap(self, inner: Agent) -> SelfConsistency:
        return SelfConsistency(inner, self.samples)

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        if not contexts:
            return []
        batch = len(contexts)
        answers = self.inner.act(list(contexts) * self.samples)
        return [
            majority([answers[k * batch + i] for k in range(self.samples)], ctx.env.action_names)
            for i, ctx in enumerate(contexts)
        ]


def majority(answers: list[Decision], action_names: list[str]) -> Decision:
    """The first answer that voted for the action most valid answers chose (ties: the action voted for
    first), marked with the vote counts; the first answer when none is valid."""
    votes: dict[int, int] = {}
    for answer in answers:
        if answer.valid:
            votes[answer.action] = votes.get(answer.action, 0) + 1
    counts = {action_names[a]: n for a, n in votes.items()}
    if not votes:
        return _explored(answers[0], votes=counts)
    winner = max(votes, key=votes.__getitem__)  # max keeps the first of equal counts: first vote wins ties
    chosen = next(a for a in answers if a.valid and a.action == winner)
    return _explored(chosen, votes=counts)


__all__ = [
    "EPSILON",
    "TRY_ALL",
    "EpsilonGreedy",
    "ExplorationWrapper",
    "ExploredDecision",
    "ExploredGeneration",
    "SelfConsistency",
    "TryAll",
    "apply_exploration",
    "explore_settings",
    "exploration_of",
    "majority",
    "unwrap",
]
