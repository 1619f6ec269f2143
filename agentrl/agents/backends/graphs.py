"""The rollout's forward, kept with its autograd graph for the update (one-token answers on a CPU).

With one-token answers (an action word after a prefill) the update's loss needs, for each row,
log_softmax(logits / T) at its prompt's last position under the weights that generated it: the very
logits the rollout computed to sample the token. The update's own forward over the iteration's distinct
prompts repeats that computation with the same weights (on Frozen Lake ~1,100 tokens, about a third of
the update). Recording the rollout's prefills with autograd on and handing their logits to the update
removes the second forward; the backward runs through the same computation (the shared head once, each
distinct prompt once), so the gradient is the one the update's forward would give, up to the rounding of
another batching of the same prompts.

The trainer decides where this applies (trainers/rollout_graph.py); `HFBackend` records inside
`recording_graphs()`. The graphs hold the activations of every prompt the rollout ran until the update's
backward frees them, so a token budget bounds them: past it the rollout drops what it kept and the update
runs its own forward.
"""

from __future__ import annotations

from typing import Any


class RolloutGraphs:
    """Next-token logits with their graphs, per distinct prompt, of one rollout (one weights version).

    `budget`: the most tokens the rollout may run with a graph (None: no bound). Recording stops for good
    at the first forward that does not record (over budget, or any other forward in the rollout): a weight
    cast made without a graph would be reused by autocast's cache in a later forward and silently cut the
    gradient off the weights."""

    def __init__(self, budget: int | None = None):
        self.budget = budget
        self.tokens = 0  # tokens run with a graph so far
        self.logits: dict[tuple[int, ...], Any] = {}
        self.weights: Any = None  # the backend's weights key when recorded
        self.recording = True
        self.overflowed = False  # the budget stopped this rollout's recording

    def admit(self, tokens: int) -> bool:
        """Whether a forward of `tokens` more tokens records (False also stops recording for good)."""
        if not self.recording:
            return False
        if self.budget is not None and self.tokens + tokens > self.budget:
            self.overflowed = True
            self.stop()
            return False
        self.tokens += tokens
        return True

    def stop(self) -> None:
        """No more recording in this rollout; what was kept is dropped (its memory freed)."""
        self.recording = False
        self.logits = {}

    def keep(self, prompts: list[tuple[int, ...]], logits: Any, weights: Any) -> None:
        """The recorded forward's next-token logits (one row per prompt), under the weights `weights`."""
        if self.weights is not None and self.weights != weights:
            raise RuntimeError("the weights changed during a rollout that records its forward")
        self.weights = weights
        self.logits.update(zip(prompts, logits, strict=True))

    def take(self, prompts: list[tuple[int, ...]], weights: Any) -> Any:
        """The kept logits of `prompts` stacked (U, V), with their graphs; None unless every prompt was
        recorded under `weights`. Either way the store is emptied: the first backward through it frees the
        shared head's graph, so nothing in it could be used twice."""
        import torch

        kept, self.logits = self.logits, {}
        if self.weights != weights or any(p not in kept for p in prompts):
            return None
        return torch.stack([kept[p] for p in prompts])


__all__ = ["RolloutGraphs"]
