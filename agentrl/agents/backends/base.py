"""The backend interface: `Backend` and the `SamplingConfig` every backend takes."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.errors import BackendError, ConfigError

log = logging.getLogger(__name__)

BACKENDS = ("hf", "openai", "vllm")
#: first wait before retrying a failed openai request; it doubles per retry, up to RETRY_WAIT_MAX_S

#: one completion: (completion token ids, log-prob of each of those tokens or None)
Completion = tuple[list[int], list[float] | None]


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled. `temperature == 0` means greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 32
    stop: tuple[str, ...] = field(default_factory=tuple)  # stop after any of these strings (kept in the text)

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0

    @classmethod
    def from_cfg(cls, cfg: Any, **overrides: Any) -> SamplingConfig:
        """Build from a config mapping (agent.sampling); None values fall back to the defaults."""
        values: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k", "max_new_tokens", "stop"):
            value = cfg.get(name) if cfg is not None else None
            if value is not None:
                values[name] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "stop" in values:
            stop = values["stop"]
            values["stop"] = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
        casts = {"temperature": float, "top_p": float, "top_k": int, "max_new_tokens": int}
        values = {k: casts[k](v) if k in casts else v for k, v in values.items()}
        sampling = cls(**values)
        if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or sampling.top_k < 0:
            raise ConfigError(f"invalid sampling settings: {sampling}")
        if sampling.max_new_tokens < 1:
            raise ConfigError("sampling.max_new_tokens must be >= 1")
        return sampling

    def with_stop(self, *extra: str) -> SamplingConfig:
        """A copy that also stops at `extra` strings."""
        stop = tuple(dict.fromkeys((*self.stop, *(s for s in extra if s))))
        return replace(self, stop=stop)


class Backend(ABC):
    """Turns a batch of prompts into a batch of completions in one call."""

    name: str = "backend"
    #: the tokenizer used to build prompt ids and decode completions (None for openai without one)
    tokenizer: Any = None
    #: True when the backend consumes chat messages (`generate_chat`) instead of token ids
    chat_input: bool = False

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[Completion]:
        """One (completion ids, log-probs) per prompt, in order. `seed` makes sampling reproducible."""

    def generate_chat(
        self,
        conversations: list[list[dict[str, str]]],
        sampling: SamplingConfig,
        *,
        prefill: str = "",
        seed: int | None = None,
    ) -> list[tuple[str, list[int], list[float] | None]]:
        """Chat backends: one (completion text, ids, log-probs) per conversation."""
        raise BackendError(f"the {self.name} backend takes token ids, not chat messages")


def completion_length(tokenizer: Any, eos_ids: Any, ids: list[int], stops: tuple[str, ...]) -> int:
    """Tokens a model really produced of the generated `ids`: through the first stop string, else through
    the first eos (kept, so training sees where the answer ends), else all of them (max_new_tokens)."""
    eos_at = next((k for k, t in enumerate(ids) if t in eos_ids), None)
    before_eos = ids if eos_at is None else ids[:eos_at]
    if stops and before_eos:
        text = tokenizer.decode(before_eos, skip_special_tokens=True)
        if any(s in text for s in stops):
            for k in range(1, len(before_eos) + 1):
                if any(s in tokenizer.decode(before_eos[:k], skip_special_tokens=True) for s in stops):
                    return k
    return len(ids) if eos_at is None else eos_at + 1
