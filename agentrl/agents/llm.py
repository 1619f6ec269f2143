"""The LLM agent: the text interface (observation -> prompt, completion -> action) and `LLMAgent`.

In the MS-GRPO paper's terms (docs/algorithms.md#ms-grpo) the environment is a text-mediated game and the agent
is a Language-Agent Policy: the LLM plus this interface. The interface is configured by `conf/agent/
llm.yaml`:

- prompt: the env's instructions (system message), then the current observation, optionally the last
  `history` steps ("action -> reward" lines; MS-GRPO shows no history, RLFT the last C transitions),
  the valid actions and the answer format (`<action>NAME</action>`, or reasoning in
  `<think>...</think>` first when `cot` is on);
- parsing never raises: the last tagged answer naming a valid action wins; with `lenient`, a completion
  without a usable tag falls back to the last valid action named as a whole word (outside `<think>`);
- an unparseable or illegal answer is invalid and handled by `invalid_rule`: `penalty_default` executes
  the env's default action and adds `invalid_penalty` (MS-GRPO: default action, reward -1),
  `penalty_end` does the same and ends the episode, `random` executes a random legal action (RLFT).

`LLMAgent.act` renders one prompt per active episode and makes ONE batched backend call per lockstep
step.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.agents.backends import Backend, SamplingConfig, build_backend
from agentrl.agents.base import Agent
from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.types import Decision, Generation, StepContext

log = logging.getLogger(__name__)

INVALID_RULES = ("penalty_default", "penalty_end", "random")
# Longest completion text the parser looks at: bounds regex work on pathological inputs.
_MAX_PARSE_CHARS = 20_000
_STRIP_CHARS = " \t\r\n\"'`*.,;:!?()[]{}"


@dataclass
class TextInterface:
    """Renders observations into chat messages and parses completions into action names."""

    history: int = 0
    history_observations: bool = False
    cot: bool = False
    answer_tag: str = "action"
    lenient: bool = True
    system_prompt: str | None = None
    prefill: str = ""
    invalid_rule: str = "penalty_default"
    invalid_penalty: float = -1.0
    stop_at_answer: bool = True

    def __post_init__(self) -> None:
        if self.invalid_rule not in INVALID_RULES:
            raise UnknownChoiceError("agent.invalid_rule", self.invalid_rule, INVALID_RULES)
        if self.history < 0:
            raise ConfigError("agent.history must be >= 0")
        if not re.fullmatch(r"[A-Za-z_][\w-]*", self.answer_tag or ""):
            raise ConfigError(f"agent.answer_tag {self.answer_tag!r} must be a plain tag name like 'action'")
        tag = re.escape(self.answer_tag)
        # closed tags, and an unclosed tag at the very end (generation stopped or truncated)
        self._tagged = re.compile(rf"<{tag}>(.*?)</{tag}>", re.IGNORECASE | re.DOTALL)
        self._open_tail = re.compile(rf"<{tag}>([^<]*)$", re.IGNORECASE)
        self._think = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)

    @classmethod
    def from_cfg(cls, agent_cfg: Any) -> TextInterface:
        """Build from `cfg.agent` (agent/llm.yaml); unknown keys are ignored, None means default."""
        fields = cls.__dataclass_fields__
        values = {}
        for key in fields:
            value = agent_cfg.get(key) if agent_cfg is not None else None
            if value is not None:
                values[key] = value
        values["history"] = int(values.get("history", 0))
        values["invalid_penalty"] = float(values.get("invalid_penalty", -1.0))
        if "prefill" in values:
            values["prefill"] = str(values["prefill"])
        return cls(**values)

    # ---- prompting ---------------------------------------------------------------------------------
    @property
    def answer_format(self) -> str:
        tag = self.answer_tag
        if self.cot:
            return f"First think step by step inside <think>...</think>, then answer with one action as <{tag}>NAME</{tag}>."
        return f"Answer with one action as <{tag}>NAME</{tag}>."

    def stop_strings(self) -> tuple[str, ...]:
        """Extra stop strings: the closing answer tag ends the useful part of a completion."""
        return (f"</{self.answer_tag}>",) if self.stop_at_answer else ()

    def history_lines(self, ctx: StepContext) -> list[str]:
        """The last `history` steps, oldest first, as "action -> reward" lines."""
        if self.history <= 0 or not ctx.history:
            return []
        steps = ctx.history[-self.history :]
        first = len(ctx.history) - len(steps) + 1
        lines = []
        for number, step in enumerate(steps, start=first):
            if self.history_observations:
                lines.append(f"Observation {number}:\n{step.observation}")
            note = "" if step.valid else " (your answer was invalid; this action was played instead)"
            lines.append(f"{step.action_name} -> {step.env_reward:g}{note}")
        return lines

    def messages(self, ctx: StepContext) -> list[dict[str, str]]:
        """Chat messages for one step: instructions as the system message (or after `system_prompt`)."""
        valid = ctx.info.get("valid_actions") or ctx.env.valid_actions()
        instructions = ctx.env.instructions.strip()
        parts: list[str] = []
        if self.system_prompt:
            parts.append(instructions)
        past = self.history_lines(ctx)
        if past:
            parts.append("Previous steps (action -> reward):\n" + "\n".join(past))
        parts.append(f"Observation:\n{ctx.observation.rstrip()}")
        parts.append(f"Valid actions: {', '.join(valid)}\n{self.answer_format}")
        system = self.system_prompt.strip() if self.system_prompt else instructions
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]

    def render(self, messages: list[dict[str, str]], tokenizer: Any = None) -> str:
        """The exact prompt text: chat template with the generation prompt, then `prefill`."""
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # no template (openai without a tokenizer): a plain, readable rendering
            text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"
        return text + self.prefill

    # ---- parsing -----------------------------------------------------------------------------------
    def parse(self, text: str, valid_actions: list[str]) -> str | None:
        """The valid action named by `text`, or None. Never raises."""
        try:
            return self._parse(str(text)[-_MAX_PARSE_CHARS:], list(valid_actions))
        except Exception:  # a parser bug must not crash a rollout: count it as an invalid answer
            log.debug("parse failed on %r", text, exc_info=True)
            return None

    def _parse(self, text: str, valid_actions: list[str]) -> str | None:
        if not valid_actions:
            return None
        by_lower = {a.lower(): a for a in valid_actions}
        answers = [m.group(1) for m in self._tagged.finditer(text)]
        tail = self._open_tail.search(text)
        if tail is not None:
            answers.append(tail.group(1))
        for answer in reversed(answers):  # the last answer counts
            name = by_lower.get(answer.strip(_STRIP_CHARS).lower())
            if name is not None:
                return name
        if not self.lenient:
            return None
        # Lenient: a tagged answer that names exactly one valid action ("<action>move right</action>"),
        # else the last valid action named anywhere after the reasoning.
        for answer in reversed(answers):
            named = {m for m in _mentions(answer, valid_actions)}
            if len(named) == 1:
                return named.pop()
        visible = self._think.sub(" ", text)
        if "<think>" in visible.lower():  # reasoning never closed: everything is reasoning
            return None
        mentions = _mentions(visible, valid_actions)
        return mentions[-1] if mentions else None

    # ---- the invalid-action rule -------------------------------------------------------------------
    def decide(self, ctx: StepContext, action_name: str | None) -> Decision:
        """Decision for a parsed answer: execute it, or apply `invalid_rule` when it is None."""
        if action_name is not None:
            return Decision(action=ctx.env.action_index(action_name), valid=True)
        if self.invalid_rule == "random":
            valid = ctx.info.get("valid_actions") or ctx.env.valid_actions()
            action = ctx.env.action_index(valid[int(ctx.rng.integers(len(valid)))])
            return Decision(action=action, valid=False, penalty=self.invalid_penalty)
        end = self.invalid_rule == "penalty_end"
        return Decision(
            action=ctx.env.default_action(), valid=False, penalty=self.invalid_penalty, end_episode=end
        )


def _mentions(text: str, names: list[str]) -> list[str]:
    """Valid action names mentioned as whole words in `text`, in order of appearance."""
    found: list[tuple[int, str]] = []
    for name in names:
        pattern = rf"(?<![\w-]){re.escape(name)}(?![\w-])"
        found.extend((m.start(), name) for m in re.finditer(pattern, text, re.IGNORECASE))
    return [name for _, name in sorted(found)]


class LLMAgent(Agent):
    """Acts with a language model: one batched backend call per step for all active episodes."""

    name = "llm"

    def __init__(self, interface: TextInterface, backend: Backend, sampling: SamplingConfig | None = None):
        self.interface = interface
        self.backend = backend
        self.sampling = sampling or SamplingConfig()

    def configured(
        self, *, sampling: SamplingConfig | None = None, invalid_penalty: float | None = None
    ) -> LLMAgent:
        """The same policy (same backend and model) with other sampling settings or invalid-action
        penalty: training rolls out and evaluates through two such views and never changes this one."""
        interface = self.interface
        if invalid_penalty is not None:
            interface = dataclasses.replace(interface, invalid_penalty=float(invalid_penalty))
        return LLMAgent(interface, self.backend, sampling or self.sampling)

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    def effective_sampling(self) -> SamplingConfig:
        return self.sampling.with_stop(*self.interface.stop_strings())

    def prompt_ids(self, prompt_texts: list[str]) -> list[list[int]]:
        """Token ids of rendered prompts, in one tokenizer call (the template holds the special tokens)."""
        if self.tokenizer is None:
            return [[] for _ in prompt_texts]
        return [list(ids) for ids in self.tokenizer(prompt_texts, add_special_tokens=False).input_ids]

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        if not contexts:
            return []
        sampling = self.effective_sampling()
        conversations = [self.interface.messages(ctx) for ctx in contexts]
        prompt_texts = [self.interface.render(m, self.tokenizer) for m in conversations]
        seed = _batch_seed(contexts) if sampling.do_sample else None
        if self.backend.chat_input:
            replies = self.backend.generate_chat(
                conversations, sampling, prefill=self.interface.prefill, seed=seed
            )
            prompt_ids = self.prompt_ids(prompt_texts)
        else:
            prompt_ids = self.prompt_ids(prompt_texts)
            completions = self.backend.generate(prompt_ids, sampling, seed=seed)
            replies = [
                (self.tokenizer.decode(ids, skip_special_tokens=True), ids, logprobs)
                for ids, logprobs in completions
            ]
        decisions = []
        for ctx, text, ids, reply in zip(contexts, prompt_texts, prompt_ids, replies, strict=True):
            completion_text, completion_ids, logprobs = reply
            valid = ctx.info.get("valid_actions") or ctx.env.valid_actions()
            action_name = self.interface.parse(self.interface.prefill + completion_text, valid)
            decision = self.interface.decide(ctx, action_name)
            decision.generation = Generation(
                prompt_text=text,
                completion_text=completion_text,
                prompt_ids=ids,
                completion_ids=list(completion_ids),
                logprobs=None if logprobs is None else list(logprobs),
            )
            decisions.append(decision)
        return decisions


def _batch_seed(contexts: list[StepContext]) -> int:
    """A sampling seed drawn from the episodes' own generators: same seeds -> same samples."""
    draws = [int(ctx.rng.integers(2**31)) for ctx in contexts]
    return int(np.random.SeedSequence(draws).generate_state(1)[0] % (2**31))


def sampling_from_cfg(agent_cfg: Any, interface: TextInterface | None = None) -> SamplingConfig:
    """`agent.sampling`; max_new_tokens null -> 32 without chain-of-thought, 256 with it."""
    sampling_cfg = agent_cfg.get("sampling") if agent_cfg is not None else None
    cot = bool(interface.cot) if interface is not None else False
    default_tokens = 256 if cot else 32
    max_new = sampling_cfg.get("max_new_tokens") if sampling_cfg is not None else None
    return SamplingConfig.from_cfg(sampling_cfg, max_new_tokens=max_new or default_tokens)


def build_llm_agent(cfg: Any, **kwargs: Any) -> LLMAgent:
    """Build the LLM agent from the full config (cfg.agent, cfg.model, cfg.seed).

    kwargs: `backend=` (use it as is), or `model=`/`tokenizer=` (a preloaded policy, e.g. training's) and
    `share_prompts=` (the hf backend's prompt sharing, for training rollouts).
    """
    interface = TextInterface.from_cfg(cfg.agent)
    sampling = sampling_from_cfg(cfg.agent, interface)
    backend = kwargs.pop("backend", None)
    if backend is None:
        backend = build_backend(
            cfg.model,
            model=kwargs.pop("model", None),
            tokenizer=kwargs.pop("tokenizer", None),
            seed=int(cfg.get("seed", 0) or 0),
            share_prompts=bool(kwargs.pop("share_prompts", False)),
        )
    if kwargs:
        log.debug("build_llm_agent ignores %s", sorted(kwargs))
    return LLMAgent(interface, backend, sampling)


def format_prompt_preview(cfg: Any) -> str:
    """The exact prompt the model sees for the env's first observation (seed cfg.seed)."""
    import numpy as np

    from agentrl.envs import env_factory
    from agentrl.models import load_tokenizer, model_config

    interface = TextInterface.from_cfg(cfg.agent)
    env = env_factory(cfg.env)()
    seed = int(cfg.seed)
    observation, info = env.reset(seed=seed)
    ctx = StepContext(env, observation, info, [], np.random.default_rng(seed), 0)
    model = model_config(cfg.model)
    tokenizer = None
    if model.backend != "openai":
        tokenizer = load_tokenizer(model)
    elif model.tokenizer:
        tokenizer = load_tokenizer(dataclasses.replace(model, name_or_path=model.tokenizer))
    env.close()
    return interface.render(interface.messages(ctx), tokenizer)


__all__ = [
    "INVALID_RULES",
    "LLMAgent",
    "TextInterface",
    "build_llm_agent",
    "format_prompt_preview",
    "sampling_from_cfg",
]
