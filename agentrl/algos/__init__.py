"""Credit assignment, one short module per algorithm (pure functions over Episodes, equations beside the
code), and the registry the trainer reads: each LLM algorithm is a small spec of its config dataclass,
its credit-assignment function and what it needs from the engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.algos import msgrpo
from agentrl.algos.msgrpo import Credit
from agentrl.types import Episode

CreditFn = Callable[[Sequence[Episode], Any, np.random.Generator], Credit]


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the trainer needs to know about an LLM algorithm."""

    name: str
    config: str  # its config dataclass in agentrl.config (named, so this module needs no Hydra import)
    assign_credit: CreditFn
    critic: bool = False  # needs a value head
    chain_of_thought: bool = False  # rolls out with reasoning before the answer
    ppo_epochs: int = 1  # optimisation passes over one iteration's rows

    def needs_reference(self, algo: Any) -> bool:
        """A frozen reference policy is needed when the KL coefficient is positive."""
        return float(getattr(algo, "beta", 0.0)) > 0


LLM_ALGORITHMS: dict[str, AlgorithmSpec] = {
    "msgrpo": AlgorithmSpec("msgrpo", "MSGRPOConfig", msgrpo.assign_credit),
}

__all__ = ["LLM_ALGORITHMS", "AlgorithmSpec", "Credit", "CreditFn"]
