"""The text interface of the LLM agent: observation -> prompt, completion -> action (`TextInterface`).

In the MS-GRPO paper's terms (docs/algorithms.md#ms-grpo) the environment is a text-mediated game and the agent
is a Language-Agent Policy: the LLM plus this interface. The interface is configured by `conf/agent/
llm.yaml`:

- prompt: the env's instructions (system message), then the current observation, optionally the last
  `history` steps ("action -> reward" lines; MS-GRPO shows no history, RLFT the last C transitions),
  the valid actions and the answer format (`<action>NAME</action>`, or reasoning in
  `<think>...</think>` first when `cot` is on);
- parsing never raises and is strict by default: the last tagged answer naming a valid action wins, and
  with a prefill the text after it being exactly a valid action name is the asked format too (the
  one-token answers). With `lenient` (off by default; training logs a warning), a completion without a
  usable tag falls back to the last valid action named as a whole word (outside `<think>`). Either way an
  answer that names an action only outside the format is counted as untagged (`untagged_rate`): valid
  under `lenient`, invalid otherwise;
- an unparseable or illegal answer is invalid and handled by `invalid_rule`: `penalty_default` executes
  the env's default action and adds `invalid_penalty` (MS-GRPO: default action, reward -1),
  `penalty_end` does the same and ends the episode, `random` executes a random legal action (RLFT);
- `prefill: auto` (the default) picks the answer mode per env and tokenizer (`resolve_interface`): when
  every action name of the env is a single token after `AUTO_PREFILL`, the assistant turn starts with
  it and the model answers with ONE token (a small model mostly echoes the observation when it writes
  free text, and one token per step is the cheapest answer there is); otherwise, and always with `cot`,
  answers are free text with no prefill. An explicit `prefill` or `sampling.max_new_tokens` wins. The
  one-token answer is a format of its own: the strict parser takes it when it is exactly an action name.
- free-text envs (`TextEnv.free_text_action`, e.g. datascicoding): the answer is text, not an action
  name. `extract_text` takes the content of the last non-empty `<action>...</action>` (or an unclosed
  `<action>` at the end), and from it the last fenced block when it holds one; without a tag, the last
  ```python (or plain ```) fenced block, closed or running to the end; text inside `<think>` never
  counts. Nothing extractable is invalid: the env gets "" (it scores an empty answer) and
  `invalid_penalty` is added; `random` has no random text to pick and acts as `penalty_default`. No
  prefill, and `FREE_TEXT_MAX_NEW_TOKENS` unless `sampling.max_new_tokens` is set.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.types import Decision, StepContext

log = logging.getLogger(__name__)

INVALID_RULES = ("penalty_default", "penalty_end", "random")
#: `agent.prefill: auto` resolves per env and tokenizer (see `resolve_interface`)
AUTO = "auto"
#: the prefill of the auto one-token interface. With the embedded SmolLM2-135M it puts 74% of the first
#: token's probability on Frozen Lake's four moves at the start cell (greedy: " right") and 26% on
#: Snake's, against 26% and 7% after "I move" (whose greedy token is " to") and 1% after "<action>".
AUTO_PREFILL = "Move:"
#: the default answer budget of a free-text env (code needs far more than an action name)
FREE_TEXT_MAX_NEW_TOKENS = 1024
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
    lenient: bool = False
    require_rationale: bool = False
    system_prompt: str | None = None
    prefill: str = ""
    invalid_rule: str = "penalty_default"
    invalid_penalty: float = -1.0
    stop_at_answer: bool = True
    observation_last: bool = False

    def __post_init__(self) -> None:
        if self.invalid_rule not in INVALID_RULES:
            raise UnknownChoiceError("agent.invalid_rule", self.invalid_rule, INVALID_RULES)
        if self.history < 0:
            raise ConfigError("agent.history must be >= 0")
        if self.require_rationale and not self.cot:
            raise ConfigError(
                "agent.require_rationale needs agent.cot=true (no rationale is asked for without it)"
            )
        if not re.fullmatch(r"[A-Za-z_][\w-]*", self.answer_tag or ""):
            raise ConfigError(f"agent.answer_tag {self.answer_tag!r} must be a plain tag name like 'action'")
        tag = re.escape(self.answer_tag)
        # closed tags, and an unclosed tag at the very end (generation stopped or truncated)
        self._tagged = re.compile(rf"<{tag}>(.*?)</{tag}>", re.IGNORECASE | re.DOTALL)
        self._open_tail = re.compile(rf"<{tag}>([^<]*)$", re.IGNORECASE)
        self._think = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
        self._open_tag = re.compile(rf"<{tag}>", re.IGNORECASE)
        self._close_tag = re.compile(rf"</{tag}>", re.IGNORECASE)

    @classmethod
    def from_cfg(cls, agent_cfg: Any, prefill: str | None = None) -> TextInterface:
        """Build from `cfg.agent` (agent/llm.yaml); unknown keys are ignored, None means default.
        `prefill` replaces the configured one (the resolved `auto`); an unresolved `auto` means none."""
        fields = cls.__dataclass_fields__
        values = {}
        for key in fields:
            value = agent_cfg.get(key) if agent_cfg is not None else None
            if value is not None:
                values[key] = value
        values["history"] = int(values.get("history", 0))
        values["invalid_penalty"] = float(values.get("invalid_penalty", -1.0))
        if prefill is not None:
            values["prefill"] = prefill
        if "prefill" in values:
            values["prefill"] = "" if values["prefill"] == AUTO else str(values["prefill"])
        return cls(**values)

    # ---- prompting ---------------------------------------------------------------------------------
    @property
    def answer_format(self) -> str:
        tag = self.answer_tag
        if self.cot:
            return f"First think step by step inside <think>...</think>, then answer with one action as <{tag}>NAME</{tag}>."
        return f"Answer with one action as <{tag}>NAME</{tag}>."

    @property
    def free_text_format(self) -> str:
        """The answer format of a free-text env (see `extract_text`)."""
        tag = self.answer_tag
        answer = f"answer with your complete Python code inside <{tag}>...</{tag}>."
        if self.cot:
            return f"First think step by step inside <think>...</think>, then {answer}"
        return answer[0].upper() + answer[1:]

    def no_answer_note(self, empty_reward: float | None) -> str:
        """What a free-text answer without usable text scores: the env's reward for an empty answer plus
        the invalid-answer penalty ("" when the env does not state its reward)."""
        if empty_reward is None:
            return ""
        total = float(empty_reward) + self.invalid_penalty
        return (
            f" An answer without it scores {total:g}: {float(empty_reward):g} for no code, "
            f"{self.invalid_penalty:g} for the invalid answer."
        )

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
        observation = f"Observation:\n{ctx.observation.rstrip()}"
        if getattr(ctx.env, "free_text_action", False):
            ask = self.free_text_format + self.no_answer_note(getattr(ctx.env, "empty_answer_reward", None))
        else:
            ask = f"Valid actions: {', '.join(valid)}\n{self.answer_format}"
        # with the observation last, the prompts of one rollout step share the longest head: the prefix
        # cache and the rollout graph compute it once, and only the observation per distinct prompt
        parts.extend([ask, observation] if self.observation_last else [observation, ask])
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
        return self.parse_answer(text, valid_actions)[0]

    def parse_answer(self, text: str, valid_actions: list[str]) -> tuple[str | None, bool]:
        """(the valid action named by `text` or None, whether the answer is untagged: no answer in the
        asked format, but a valid action named outside it, which only the lenient parser reads: valid
        with `lenient`, invalid without). Never raises."""
        try:
            text, valid = str(text)[-_MAX_PARSE_CHARS:], list(valid_actions)
            name, tagged = self._parse(text, valid)
            if name is not None and self.require_rationale and not self.has_rationale(text):
                return None, False  # the asked format with cot: reasoning first, then the answer
            if name is None and not self.lenient:  # would the lenient parser have read one?
                loose, tagged = self._loose(text, valid, self._answers(text))
                return None, loose is not None and not tagged
        except Exception:  # a parser bug must not crash a rollout: count it as an invalid answer
            log.debug("parse failed on %r", text, exc_info=True)
            return None, False
        return name, name is not None and not tagged

    def _answers(self, text: str) -> list[str]:
        """The contents of the tagged answers, and of an unclosed tag at the end, in order."""
        answers = [m.group(1) for m in self._tagged.finditer(text)]
        tail = self._open_tail.search(text)
        if tail is not None:
            answers.append(tail.group(1))
        return answers

    def _parse(self, text: str, valid_actions: list[str]) -> tuple[str | None, bool]:
        """(action name or None, whether it came from an answer in the asked format)."""
        if not valid_actions:
            return None, False
        by_lower = {a.lower(): a for a in valid_actions}
        answers = self._answers(text)
        for answer in reversed(answers):  # the last answer counts
            name = by_lower.get(answer.strip(_STRIP_CHARS).lower())
            if name is not None:
                return name, True
        if self.prefill:  # the prefilled format: the text after the prefill is exactly an action name
            after = text[len(self.prefill) :] if text.startswith(self.prefill) else text
            name = by_lower.get(after.strip(_STRIP_CHARS).lower())
            if name is not None:
                return name, True
        if not self.lenient:
            return None, False
        return self._loose(text, valid_actions, answers)

    def _loose(self, text: str, valid_actions: list[str], answers: list[str]) -> tuple[str | None, bool]:
        """The lenient reading: (action or None, whether it came from inside a tag)."""
        if not valid_actions:
            return None, False
        # a tagged answer that names exactly one valid action ("<action>move right</action>"), else the
        # last valid action named anywhere after the reasoning
        for answer in reversed(answers):
            named = {m for m in _mentions(answer, valid_actions)}
            if len(named) == 1:
                return named.pop(), True
        visible = self._think.sub(" ", text)
        if "<think>" in visible.lower():  # reasoning never closed: everything is reasoning
            return None, False
        mentions = _mentions(visible, valid_actions)
        return (mentions[-1] if mentions else None), False

    def has_rationale(self, text: str) -> bool:
        """Whether `text` holds the asked rationale: a closed `<think>...</think>` with something in it.
        The strict parser accepts a tagged answer without one, so `rationale_rate` shows a policy that
        learned to skip its reasoning."""
        return any(m.group(0)[7:-8].strip() for m in self._think.finditer(str(text)[-_MAX_PARSE_CHARS:]))

    def extract_text(self, text: str) -> str | None:
        """A free-text env's answer in a completion (module docstring), or None. Never raises."""
        try:
            return self._extract_text(str(text)[-_MAX_PARSE_CHARS:])
        except Exception:  # a parser bug must not crash a rollout: count it as an invalid answer
            log.debug("text extraction failed on %r", text, exc_info=True)
            return None

    def _extract_text(self, text: str) -> str | None:
        if self.require_rationale and not self.has_rationale(text):
            return None
        visible = self._think.sub(" ", text)
        if "<think>" in visible.lower():  # reasoning never closed: everything is reasoning
            return None
        answers = []
        for start in self._open_tag.finditer(visible):
            rest = visible[start.end() :]
            end = self._close_tag.search(rest)
            answers.append(rest[: end.start()] if end else rest)
        for answer in reversed(answers):  # the last non-empty answer counts
            if answer.strip():
                fenced = _fenced_blocks(answer)
                return (fenced[-1] if fenced else answer).strip("\n") + "\n"
        fenced = _fenced_blocks(visible)
        return fenced[-1].strip("\n") + "\n" if fenced else None

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

    def decide_text(self, ctx: StepContext, text: str | None) -> Decision:
        """Decision for a free-text env's extracted answer: the env executes `text`; None is invalid and
        the env gets "" (with the penalty; `random` has no random text and acts as `penalty_default`)."""
        if text is not None:
            return Decision(action=ctx.env.default_action(), valid=True, text=text)
        end = self.invalid_rule == "penalty_end"
        return Decision(
            action=ctx.env.default_action(),
            valid=False,
            penalty=self.invalid_penalty,
            end_episode=end,
            text="",
        )


def _fenced_blocks(text: str) -> list[str]:
    """Non-empty contents of ``` fenced blocks (any language tag), the last one possibly unclosed."""
    blocks = []
    for match in re.finditer(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", text, re.DOTALL):
        if match.group(1).strip():
            blocks.append(match.group(1))
    return blocks


def _mentions(text: str, names: list[str]) -> list[str]:
    """Valid action names mentioned as whole words in `text`, in order of appearance."""
    found: list[tuple[int, str]] = []
    for name in names:
        pattern = rf"(?<![\w-]){re.escape(name)}(?![\w-])"
        found.extend((m.start(), name) for m in re.finditer(pattern, text, re.IGNORECASE))
    return [name for _, name in sorted(found)]
