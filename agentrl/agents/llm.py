"""The LLM agent: `LLMAgent` (one batched backend call per lockstep step) and how it is built from the
config (`build_llm_agent`, `resolve_interface`: the answer mode per env and tokenizer). The text interface
(observation -> prompt, completion -> action, the answer formats and the parsers) is `agents/interface.py`.

`LLMAgent.act` renders one prompt per active episode and makes ONE batched backend call per lockstep
step.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.agents.backends import Backend, SamplingConfig, build_backend
from agentrl.agents.base import Agent
from agentrl.agents.interface import (  # noqa: F401 - INVALID_RULES, FREE_TEXT_MAX_NEW_TOKENS: re-exported
    AUTO,
    AUTO_PREFILL,
    FREE_TEXT_MAX_NEW_TOKENS,
    INVALID_RULES,
    TextInterface,
)
from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.types import Decision, Generation, StepContext

log = logging.getLogger(__name__)


class LLMAgent(Agent):
    """Acts with a language model: one batched backend call per step for all active episodes."""

    name = "llm"

    def __init__(
        self,
        interface: TextInterface,
        backend: Backend,
        sampling: SamplingConfig | None = None,
        *,
        decision: str = "generate",
        score_normalization: str = "word",
    ):
        self.interface = interface
        self.backend = backend
        self.sampling = sampling or SamplingConfig()
        # decision=score: TWOSOME, every valid action scored by the model (agents/scoring.py)
        self.decision, self.score_normalization = decision, score_normalization
        if decision not in ("generate", "score"):
            raise UnknownChoiceError("agent.decision", decision, ("generate", "score"))
        if decision == "score":
            from agentrl.agents.scoring import check_scoring_backend, normalizers

            check_scoring_backend(backend)
            normalizers([], [], score_normalization)  # an unknown normalisation fails here, not mid-run

    def configured(
        self,
        *,
        sampling: SamplingConfig | None = None,
        invalid_penalty: float | None = None,
        decision: str | None = None,
    ) -> LLMAgent:
        """The same policy (same backend and model) with other sampling settings, invalid-action penalty or
        decision rule: training rolls out and evaluates through two such views and never changes this one;
        `algo.demonstrations=scored` plays through a scoring one."""
        interface = self.interface
        if invalid_penalty is not None:
            interface = dataclasses.replace(interface, invalid_penalty=float(invalid_penalty))
        return LLMAgent(
            interface,
            self.backend,
            sampling or self.sampling,
            decision=decision or self.decision,
            score_normalization=self.score_normalization,
        )

    def with_backend(self, backend: Backend) -> LLMAgent:
        """The same policy (interface, sampling, decision) generating through `backend`: training rollouts
        from vLLM or from a copy of the model in another dtype."""
        return LLMAgent(
            self.interface,
            backend,
            self.sampling,
            decision=self.decision,
            score_normalization=self.score_normalization,
        )

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
        if self.decision == "score":
            from agentrl.agents.scoring import score_decisions

            return score_decisions(self, contexts)
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
            answer = self.interface.prefill + completion_text
            if getattr(ctx.env, "free_text_action", False):
                decision = self.interface.decide_text(ctx, self.interface.extract_text(answer))
            else:
                valid = ctx.info.get("valid_actions") or ctx.env.valid_actions()
                name, untagged = self.interface.parse_answer(answer, valid)
                decision = self.interface.decide(ctx, name)
                decision.untagged = untagged
            if self.interface.cot:
                decision.rationale = self.interface.has_rationale(answer)
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


def sampling_from_cfg(
    agent_cfg: Any, interface: TextInterface | None = None, max_new_tokens: int | None = None
) -> SamplingConfig:
    """`agent.sampling`; `max_new_tokens` (the resolved interface's) replaces the configured value;
    null -> 32 without chain-of-thought, 256 with it."""
    sampling_cfg = agent_cfg.get("sampling") if agent_cfg is not None else None
    cot = bool(interface.cot) if interface is not None else False
    default_tokens = 256 if cot else 32
    max_new = sampling_cfg.get("max_new_tokens") if sampling_cfg is not None else None
    max_new = max_new_tokens or max_new
    return SamplingConfig.from_cfg(sampling_cfg, max_new_tokens=max_new or default_tokens)


@dataclass(frozen=True)
class ResolvedInterface:
    """What `agent.prefill` and `agent.sampling.max_new_tokens` mean for one env and tokenizer."""

    prefill: str
    max_new_tokens: int | None  # None: the default budget (32, or 256 with cot)
    reason: str
    scored: bool = False  # agent.decision=score: nothing is generated (agents/scoring.py)

    @property
    def one_token(self) -> bool:
        return self.max_new_tokens == 1

    def describe(self) -> str:
        """One line for the log (and `describe_interface`)."""
        answers = "one-token answers" if self.one_token else "free-text answers"
        if self.max_new_tokens and not self.one_token:
            answers += f" (up to {self.max_new_tokens} tokens)"
        if self.scored:
            answers = "every valid action scored (TWOSOME)"
        prefill = f"prefill {self.prefill!r}" if self.prefill else "no prefill"
        return f"LLM interface: {prefill}, {answers} ({self.reason})"


def single_token_after(tokenizer: Any, prefill: str, name: str) -> bool:
    """Whether `name` is one token when it follows `prefill` (after a space unless the prefill ends in
    whitespace or a tag): the prefill's own tokens are unchanged and exactly one token is added."""
    sep = "" if not prefill or prefill[-1].isspace() or prefill.endswith(">") else " "
    base = list(tokenizer(prefill, add_special_tokens=False).input_ids)
    full = list(tokenizer(prefill + sep + name, add_special_tokens=False).input_ids)
    return len(full) == len(base) + 1 and full[: len(base)] == base


def resolve_interface(
    agent_cfg: Any, action_names: list[str], tokenizer: Any, *, free_text: bool = False
) -> ResolvedInterface:
    """Resolve `prefill: auto` for an env whose actions are `action_names`: `AUTO_PREFILL` and one-token
    answers when every action name is one token after it, else free text without a prefill. An explicit
    prefill, an explicit max_new_tokens other than 1, chain-of-thought or no tokenizer to check with (an
    openai model without `model.tokenizer`) all mean the configured settings are used as they are (auto ->
    no prefill). The one-token answer needs no tag: the strict parser takes it as the asked format."""
    prefill = agent_cfg.get("prefill")
    sampling_cfg = agent_cfg.get("sampling")
    max_new = sampling_cfg.get("max_new_tokens") if sampling_cfg is not None else None
    if free_text:  # a free-text env (e.g. code): no action names to prefill or score
        if agent_cfg.get("decision") == "score":
            raise ConfigError("agent.decision=score needs action names; this env's answers are free text")
        budget = max_new or FREE_TEXT_MAX_NEW_TOKENS
        return ResolvedInterface(str(prefill or "") if prefill != AUTO else "", budget, "free-text env")
    if agent_cfg.get("decision") == "score":  # the scored answer follows the opening tag (scoring.py)
        tag = agent_cfg.get("answer_tag") or "action"
        head = "" if prefill in (None, AUTO) else str(prefill)
        if not head.rstrip().endswith(f"<{tag}>"):  # a preset's prefill may already open the tag
            head += f"<{tag}>"
        return ResolvedInterface(head, None, f"decision=score: NAME</{tag}> after it", True)
    if prefill != AUTO:
        return ResolvedInterface(str(prefill or ""), max_new, "set by agent.prefill")
    if agent_cfg.get("cot"):
        return ResolvedInterface("", max_new, "auto: chain-of-thought answers are free text")
    if max_new not in (None, 1):
        return ResolvedInterface("", max_new, "auto: agent.sampling.max_new_tokens is set")
    if tokenizer is None:
        return ResolvedInterface("", max_new, "auto: no tokenizer to check the action names with")
    longer = [name for name in action_names if not single_token_after(tokenizer, AUTO_PREFILL, name)]
    if longer:
        shown = ", ".join(longer[:3]) + (" ..." if len(longer) > 3 else "")
        return ResolvedInterface("", max_new, f"auto: {shown} not one token after {AUTO_PREFILL!r}")
    return ResolvedInterface(AUTO_PREFILL, 1, "auto: every action name is one token after the prefill")


#: resets whose action names the auto interface checks: some envs draw their names per seed (the
#: bandit's button colours), and one multi-token name among them would make every one-token answer in
#: those episodes invalid
PROBE_RESETS = 16


def env_action_names(cfg: Any) -> list[str]:
    """Every action name the env of `cfg.env` shows, at construction and after resets with seeds
    0..PROBE_RESETS-1."""
    import agentrl.envs

    env = agentrl.envs.env_factory(cfg.env)()
    try:
        names = dict.fromkeys(env.action_names)
        for seed in range(PROBE_RESETS):
            env.reset(seed=seed)
            names.update(dict.fromkeys(env.action_names))
        return list(names)
    finally:
        env.close()


def env_free_text(cfg: Any) -> bool:
    """Whether the env of `cfg.env` takes free-text answers (`TextEnv.free_text_action`)."""
    import agentrl.envs

    env = agentrl.envs.env_factory(cfg.env)()
    env.close()
    return bool(getattr(env, "free_text_action", False))


def build_llm_agent(cfg: Any, **kwargs: Any) -> LLMAgent:
    """Build the LLM agent from the full config (cfg.agent, cfg.model, cfg.env, cfg.seed): the backend,
    then the interface resolved for the env and the backend's tokenizer (`resolve_interface`, logged).
    A torch model built here on the CPU runs with `console.set_torch_threads` (the free cores, unless
    `algo.torch_threads` or $OMP_NUM_THREADS says otherwise).

    kwargs: `backend=` (use it as is), or `model=`/`tokenizer=` (a preloaded policy, e.g. training's) and
    `share_prompts=` (the hf backend's prompt sharing: each distinct prompt of a batch runs once). Its
    default is on for greedy sampling, where copies of a prompt get the same answer anyway (a greedy eval
    on a fixed map plays the same episode in every row), and off otherwise.
    """
    backend = kwargs.pop("backend", None)
    decision = str(cfg.agent.get("decision") or "generate")
    if backend is None and decision == "score" and cfg.model.get("backend", "hf") != "hf":
        raise ConfigError(
            f"agent.decision=score needs model.backend=hf (it scores every valid action with the model's "
            f"log-probs); the {cfg.model.backend} backend only generates"
        )
    if backend is None:
        share = kwargs.pop("share_prompts", None)
        if share is None:
            sampling_cfg = cfg.agent.get("sampling")
            share = not float((sampling_cfg.get("temperature") if sampling_cfg is not None else 0) or 0)
        backend = build_backend(
            cfg.model,
            model=kwargs.pop("model", None),
            tokenizer=kwargs.pop("tokenizer", None),
            seed=int(cfg.get("seed", 0) or 0),
            share_prompts=bool(share),
        )
        _cpu_threads(cfg, backend)
    if kwargs:
        log.debug("build_llm_agent ignores %s", sorted(kwargs))
    resolved = resolve_interface(
        cfg.agent, env_action_names(cfg), backend.tokenizer, free_text=env_free_text(cfg)
    )
    log.info("%s", resolved.describe())
    interface = TextInterface.from_cfg(cfg.agent, prefill=resolved.prefill)
    sampling = sampling_from_cfg(cfg.agent, interface, resolved.max_new_tokens)
    normalization = str(cfg.agent.get("score_normalization") or "word")
    return LLMAgent(interface, backend, sampling, decision=decision, score_normalization=normalization)


def demonstration_answer(
    interface: TextInterface, action: str, valid_actions: list[str], facts: str | None = None
) -> str:
    """The completion (the text after the prefill) a demonstration writes for `action`: exactly the format
    the strict parser reads. `<tag>NAME</tag>`; with `cot` a short templated rationale first (the
    options, the state's `facts` when given, and the choice); after a prefill, the rest of that answer,
    or, for a prefill that is not the start of it ("Move:", "I move"), the action name after a space (the
    one-token answers)."""
    tag = interface.answer_tag
    answer = f"<{tag}>{action}</{tag}>"
    if interface.cot:
        options = ", ".join(valid_actions)
        reason = f" {facts}" if facts else ""
        answer = f"<think>The valid actions are {options}.{reason} I choose {action}.</think>\n{answer}"
    prefill = interface.prefill
    if answer.startswith(prefill):
        return answer[len(prefill) :]
    if interface.cot:
        raise ConfigError(
            f"agent.prefill={prefill!r} with agent.cot=true: a demonstration starts with <think>; use no "
            "prefill or one the demonstration starts with"
        )
    return ("" if prefill[-1].isspace() else " ") + action


def warn_if_lenient(cfg: Any) -> bool:
    """A training run with `agent.lenient=true` says so in its log, at the start: its answers without a
    usable tag are played, so its results count only under the lenient parser. Returns whether it is."""
    if cfg.agent.get("name", "llm") != "llm" or not cfg.agent.get("lenient", False):
        return False
    log.warning(
        "agent.lenient=true: answers without a usable <%s> tag play the last valid action they name "
        "(counted in untagged_rate); the default, strict parsing, makes them invalid",
        cfg.agent.get("answer_tag") or "action",
    )
    return True


def _cpu_threads(cfg: Any, backend: Backend) -> None:
    model = getattr(backend, "model", None)
    parameters = getattr(model, "parameters", None)
    if parameters is None or next(parameters()).device.type != "cpu":
        return
    from agentrl.console import set_torch_threads

    algo = cfg.get("algo")
    explicit = algo.get("torch_threads") if algo is not None else None
    log.info("torch threads: %d", set_torch_threads(explicit))


def _preview_tokenizer(cfg: Any) -> Any:
    from agentrl.models import load_tokenizer, model_config

    model = model_config(cfg.model)
    if model.backend != "openai":
        return load_tokenizer(model)
    if model.tokenizer:
        return load_tokenizer(dataclasses.replace(model, name_or_path=model.tokenizer))
    return None


def describe_interface(cfg: Any, tokenizer: Any = None) -> str:
    """The line `build_llm_agent` logs: the prefill and answer mode chosen for cfg's env and model."""
    if tokenizer is None:
        tokenizer = _preview_tokenizer(cfg)
    free_text = env_free_text(cfg)
    return resolve_interface(cfg.agent, env_action_names(cfg), tokenizer, free_text=free_text).describe()


def format_prompt_preview(cfg: Any) -> str:
    """The exact prompt the model sees for the env's first observation (seed cfg.seed), with the
    resolved prefill (`describe_interface` says which answer mode goes with it)."""
    import agentrl.envs

    tokenizer = _preview_tokenizer(cfg)
    resolved = resolve_interface(cfg.agent, env_action_names(cfg), tokenizer, free_text=env_free_text(cfg))
    env = agentrl.envs.env_factory(cfg.env)()
    interface = TextInterface.from_cfg(cfg.agent, prefill=resolved.prefill)
    seed = int(cfg.seed)
    observation, info = env.reset(seed=seed)
    ctx = StepContext(env, observation, info, [], np.random.default_rng(seed), 0)
    env.close()
    return interface.render(interface.messages(ctx), tokenizer)


__all__ = [
    "AUTO",
    "AUTO_PREFILL",
    "INVALID_RULES",
    "LLMAgent",
    "ResolvedInterface",
    "TextInterface",
    "build_llm_agent",
    "demonstration_answer",
    "describe_interface",
    "env_action_names",
    "format_prompt_preview",
    "resolve_interface",
    "sampling_from_cfg",
    "single_token_after",
    "warn_if_lenient",
]
