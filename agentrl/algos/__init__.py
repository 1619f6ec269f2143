"""Credit assignment, one short module per algorithm (pure functions over Episodes, equations beside the
code), and the registry the trainer reads: each LLM algorithm is a small spec of its config dataclass,
its credit-assignment function and what it needs from the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.algos import msgrpo, poad, rlft, twosome
from agentrl.algos.msgrpo import Credit

#: (episodes, typed algo config, rng[, values=critic values per episode/step/token]) -> Credit
CreditFn = Callable[..., Credit]


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the trainer needs to know about an LLM algorithm."""

    name: str
    config: str  # its config dataclass in agentrl.config (named, so this module needs no Hydra import)
    assign_credit: CreditFn
    critic: bool = False  # needs a value head: assign_credit gets the critic's values (values=...)
    decision: str = "generate"  # how the policy acts: generate text, or score the valid actions (TWOSOME)

    def needs_reference(self, algo: Any) -> bool:
        """A frozen reference policy is needed when the KL coefficient is positive."""
        return float(getattr(algo, "beta", 0.0)) > 0


LLM_ALGORITHMS: dict[str, AlgorithmSpec] = {
    "msgrpo": AlgorithmSpec("msgrpo", "MSGRPOConfig", msgrpo.assign_credit),
    "poad": AlgorithmSpec("poad", "POADConfig", poad.assign_credit, critic=True),
    # NTPO is POAD with algo.decompose=false (conf/algo/ntpo.yaml): the same spec
    "ntpo": AlgorithmSpec("ntpo", "POADConfig", poad.assign_credit, critic=True),
    # TWOSOME: action-level PPO on the scoring agent's policy (the POAD paper's baseline; algos/twosome.py)
    "twosome": AlgorithmSpec("twosome", "POADConfig", twosome.assign_credit, critic=True, decision="score"),
    # RLFT: the critic is built only with algo.advantage=gae (trainers/multistep.py reads the config)
    "rlft": AlgorithmSpec("rlft", "RLFTConfig", rlft.assign_credit),
}

__all__ = ["LLM_ALGORITHMS", "AlgorithmSpec", "Credit", "CreditFn"]
