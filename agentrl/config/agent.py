"""`agent=` schemas: the LLM agent (prompting, parsing, sampling, exploration) and the classic agents."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from agentrl.config.base import Schema, setting

INVALID_RULES = ("penalty_default", "penalty_end", "random")
_TAG = re.compile(r"[A-Za-z_][\w-]*")


@dataclass
class SamplingSchema(Schema):
    """`agent.sampling`: how an LLM agent's completions are sampled in evaluation."""

    temperature: float = setting(
        0.0, "0 = greedy (the evaluation default; training presets set their own)", ge=0
    )
    top_p: float = setting(1.0, "nucleus sampling mass (1 = off)", gt=0, le=1)
    top_k: int = setting(0, "top-k sampling (0 = off)", ge=0)
    max_new_tokens: int | None = setting(
        None, "null: 1 when agent.prefill=auto chose one-token answers, else 32 (256 with cot)", ge=1
    )
    stop: list[str] = setting(
        factory=list, help="extra stop strings (the closing answer tag comes from stop_at_answer)"
    )


@dataclass
class ExploreConfig(Schema):
    """`agent.explore`: the RLFT paper's exploration mechanisms, as agent wrappers (agents/exploration.py)."""

    try_all: bool = setting(
        False,
        "the first steps of an episode play each valid action not played yet, in the env's order",
        "paper",
    )
    epsilon: float = setting(
        0.0,
        "probability of executing a uniformly random valid action instead of the agent's",
        "paper",
        ge=0,
        le=1,
    )
    self_consistency: int = setting(
        1, "answers sampled per step; the majority action is played (1: off)", "paper", ge=1
    )


@dataclass
class LLMAgentConfig(Schema):
    """A language model plays (conf/agent/llm.yaml; the model is model=...)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("llm", "agent name", choices=("llm",))
    history: int = setting(0, "last k steps shown as 'action -> reward' lines (MS-GRPO: 0)", "code", ge=0)
    history_observations: bool = setting(False, "also show those steps' observations (longer prompts)")
    cot: bool = setting(False, "reason inside <think>...</think> before answering")
    answer_tag: str = setting("action", "the answer is read from <tag>NAME</tag>; a plain tag name")
    lenient: bool = setting(
        False,
        "true: an answer without a usable tag plays the last valid action it names (train logs a warning); "
        "false: it is invalid. Either way it counts in untagged_rate",
    )
    require_rationale: bool = setting(
        False,
        "with cot: an answer without a closed, non-empty <think>...</think> is invalid (false: it is valid "
        "and counts against rationale_rate)",
    )
    stop_at_answer: bool = setting(True, "stop generating after the closing answer tag")
    observation_last: bool = setting(
        False,
        "the observation ends the user message, after the valid actions and the answer format: prompts that "
        "differ only in the observation then share everything before it (computed once per rollout step)",
    )
    system_prompt: str | None = setting(
        None,
        "null: the env instructions are the system message; else this is, and they open the user message",
    )
    prefill: str = setting(
        "auto",
        "text the assistant turn starts with ('' none, e.g. 'I move'); auto: 'Move:' and one-token answers "
        "when every action name is one token after it (not with cot), else none",
    )
    invalid_rule: str = setting(
        "penalty_default",
        "invalid answer: env default action + penalty, the same then end, or a random legal action + penalty",
        "code",
        choices=INVALID_RULES,
    )
    invalid_penalty: float = setting(-1.0, "added to an invalid step's reward", "code")
    decision: str = setting(
        "generate",
        "generate: sample an answer and parse it; score: TWOSOME, sample a valid action from the softmax of "
        "their normalised log-likelihoods after <tag> (hf backend; never invalid; agents/scoring.py)",
        choices=("generate", "score"),
    )
    score_normalization: str = setting(
        "word",
        "decision=score: divide each action's log-likelihood by its word count (TWOSOME), token count, or 1",
        "paper",
        choices=("word", "token", "none"),
    )
    sampling: SamplingSchema = setting(factory=SamplingSchema, help="sampling settings of the completions")
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )

    def check(self, prefix: str) -> None:
        if not _TAG.fullmatch(self.answer_tag):
            self.fail(prefix, "answer_tag", "must be a plain tag name like action (letters, digits, _ or -)")
        if self.decision == "score" and self.cot:
            self.fail(prefix, "cot", "decision=score scores the answer itself; it cannot reason first")
        if self.require_rationale and not self.cot:
            self.fail(
                prefix, "require_rationale", "needs agent.cot=true (no rationale is asked for without it)"
            )


@dataclass
class RandomAgentConfig(Schema):
    """Uniformly random legal action (conf/agent/random.yaml)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("random", "agent name", choices=("random",))
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )


@dataclass
class PlannerAgentConfig(Schema):
    """The best classic policy per env (conf/agent/planner.yaml)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("planner", "agent name", choices=("planner",))
    ucb_c: float = setting(2.0, "bandit UCB1 exploration constant: mean + sqrt(c * ln t / n)", ge=0)
    linucb_alpha: float = setting(
        1.0, "contextual bandit LinUCB width: theta_a . x + alpha * sqrt(x^T A_a^-1 x)", "paper", ge=0
    )
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )


@dataclass
class HumanAgentConfig(Schema):
    """A person at the terminal (conf/agent/human.yaml; `agentrl play`)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("human", "agent name", choices=("human",))


@dataclass
class DQNAgentConfig(Schema):
    """A trained DQN playing greedily (conf/agent/dqn.yaml)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("dqn", "agent name", choices=("dqn",))
    path: str | None = setting(None, "a DQN run directory or checkpoint zip (required to play)")
    device: str = setting("cpu", "torch device for the Q-network")
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )
