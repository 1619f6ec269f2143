"""What scoring needs of an LLM agent (a structural type), so that agents/scoring.py does not import
agents/llm.py, which calls into it: the two modules no longer import each other."""

from __future__ import annotations

from typing import Any, Protocol


class ScoringAgent(Protocol):
    """The parts of `LLMAgent` that `scoring.score_decisions` reads."""

    interface: Any  # agents/interface.py TextInterface: prompts and answer format
    backend: Any  # agents/backends: the HF model that scores
    sampling: Any  # SamplingConfig: its temperature divides the scores
    score_normalization: str

    @property
    def tokenizer(self) -> Any: ...

    def prompt_ids(self, prompt_texts: list[str]) -> list[list[int]]: ...
