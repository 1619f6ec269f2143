"""The data every layer passes along: what an agent sees and decides, what a rollout records, what a
trainer trains on, and the `Agent` protocol that rollouts and evaluation are typed against.

Nothing here imports torch, transformers or a concrete environment, so envs, agents, algorithms and
trainers can all depend on this module without depending on each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from agentrl.envs.base import TextEnv

#: an env config (its `name` and the constructor's arguments) -> a zero-argument constructor of that env
#: (`agentrl.envs.env_factory`). The runner hands it to the trainers, which import no env module.
EnvFactory = Callable[[Any], Callable[[], "TextEnv"]]


@dataclass
class Generation:
    """What a language model produced for one step (absent for classic agents)."""

    prompt_text: str
    completion_text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    #: sampling log-probabilities of each completion token (same length as completion_ids), or None
    logprobs: list[float] | None = None
    #: agent.decision=score (agents/scoring.py): the policy's probability of every valid action, else None
    action_probs: dict[str, float] | None = None
    #: agent.decision=score: the scored continuation of every valid action (token ids), each one's
    #: normaliser (word count, ...) and the index of the chosen one (for action-level training)
    candidates: list[list[int]] | None = None
    normalizers: list[int] | None = None
    choice: int | None = None


@dataclass
class Decision:
    """An agent's answer for one step: the action to execute and how it came about."""

    action: int  # index of the action the env executes (after the invalid-action rule)
    valid: bool = True  # False when the agent's answer could not be parsed / was illegal
    penalty: float = 0.0  # added to the env reward (invalid-action rule)
    end_episode: bool = False  # `penalty_end` rule: stop after this step
    generation: Generation | None = None
    #: free-text envs (`TextEnv.free_text_action`): the answer text the env executes instead of `action`
    #: ("" when none could be extracted); None: execute the action index
    text: str | None = None
    #: the answer named an action only outside the asked format (no usable answer tag): the lenient
    #: parser played it (valid); the strict one did not (invalid)
    untagged: bool = False
    #: with `agent.cot`: the answer holds a closed, non-empty `<think>...</think>` (the asked rationale);
    #: None when no rationale was asked for
    rationale: bool | None = None


@dataclass
class StepContext:
    """What an agent sees when it must act in one episode."""

    env: TextEnv
    observation: str
    info: dict[str, Any]
    history: list[Step]  # this episode's previous steps, oldest first
    rng: np.random.Generator  # per-episode randomness for agents (random actions, tie breaks)
    episode_index: int  # position in the rollout batch


@dataclass
class Step:
    """One move of one episode."""

    observation: str
    action: int
    action_name: str
    valid: bool
    reward: float  # env reward + penalty: what training credits
    env_reward: float
    generation: Generation | None = None
    untagged: bool = False  # Decision.untagged
    rationale: bool | None = None  # Decision.rationale
    reason: str = ""  # why the env scored the step so, where it says (its info["reason"])

    @property
    def prompt_ids(self) -> list[int]:
        return self.generation.prompt_ids if self.generation else []

    @property
    def completion_ids(self) -> list[int]:
        return self.generation.completion_ids if self.generation else []

    @property
    def logprobs(self) -> list[float] | None:
        return self.generation.logprobs if self.generation else None


@dataclass
class Episode:
    """One played episode; episodes of one group share an env seed."""

    seed: int
    group_id: int = 0
    steps: list[Step] = field(default_factory=list)
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    final_info: dict[str, Any] = field(default_factory=dict)
    final_observation: str = ""  # the observation after the last step (the end position)

    @property
    def episode_return(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def invalid_count(self) -> int:
        return sum(not s.valid for s in self.steps)

    @property
    def untagged_count(self) -> int:
        return sum(s.untagged for s in self.steps)

    def summary(self) -> dict[str, Any]:
        """One JSON line for episodes.jsonl."""
        return {
            "seed": self.seed,
            "group_id": self.group_id,
            "return": self.episode_return,
            "length": self.length,
            "success": self.success,
            "invalid": self.invalid_count,
            "actions": [s.action_name for s in self.steps],
            # why the env scored each step so, where it says (DataSciCoding's -1)
            **({"reasons": [s.reason for s in self.steps]} if any(s.reason for s in self.steps) else {}),
        }


@dataclass
class StepSample:
    """One training row: the prompt of one step, what the policy generated there, and its advantage.

    `advantage` is a float (the same for every completion token: MS-GRPO) or one float per completion
    token (token-level credit)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    #: sampling log-probs of the completion tokens (None when the backend gave none)
    old_logprobs: list[float] | None
    advantage: float | list[float]
    episode_index: int
    step_index: int
    #: algorithms with a critic: the value targets and the critic's values of each completion token
    returns: list[float] | None = None
    old_values: list[float] | None = None
    #: action-level rows (TWOSOME): every valid action's scored tokens, normalisers and the chosen index
    candidates: list[list[int]] | None = None
    normalizers: list[int] | None = None
    choice: int | None = None


@runtime_checkable
class Agent(Protocol):
    """Anything that acts: one decision per context, in order, for a batch of lockstep episodes."""

    name: str

    def act(self, contexts: list[StepContext]) -> list[Decision]: ...


@dataclass
class TrainResult:
    """What a trainer hands back to the runner, which writes eval.json from it: the final evaluation's
    metrics and episodes, and the fields that stand beside them (algo, iterations, train_time_s, the
    evaluation before training, ...)."""

    metrics: dict[str, Any]
    episodes: list[Episode]
    extra: dict[str, Any] = field(default_factory=dict)


__all__ = ["Agent", "Decision", "Episode", "Generation", "Step", "StepContext", "StepSample", "TrainResult"]
