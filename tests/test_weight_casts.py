"""`kernels/precision.py::weight_casts_shared`: the forwards of one update micro-batch share autocast's
bf16 cast of each weight, with the gradients each pass would get on its own casts."""

from __future__ import annotations

from typing import Any

import torch
from helpers import WeightCasts

from agentrl.kernels.precision import weight_casts_shared


class TwoLayers(torch.nn.Module):
    """Each call enters and leaves its own bf16 autocast, as accelerate wraps a model's forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 4)

    @torch.autocast("cpu", dtype=torch.bfloat16)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _passes(model: TwoLayers, shared: bool, forwards_per_backward: int = 1) -> tuple[int, list[Any]]:
    model.zero_grad(set_to_none=True)
    inputs = torch.randn(3, forwards_per_backward, 5, 16, generator=torch.Generator().manual_seed(1))
    with WeightCasts(model) as casts, weight_casts_shared(shared):
        for batch in inputs:  # three forward/backward passes, as a split micro-batch runs them
            sum(model(x).float().pow(2).sum() for x in batch).backward()
    return casts.most(), [p.grad.clone() for p in model.parameters()]


def test_passes_share_one_cast_of_each_weight_and_get_the_same_gradients():
    model = TwoLayers()
    apart_casts, apart = _passes(model, shared=False)
    shared_casts, shared = _passes(model, shared=True)
    assert (apart_casts, shared_casts) == (3, 1)
    # each backward still runs the cast's backward into the fp32 gradient: the same sums, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(apart, shared, strict=True))


def test_two_forwards_in_one_backward_add_their_gradients_in_bf16():
    model = TwoLayers()
    apart_casts, apart = _passes(model, shared=False, forwards_per_backward=2)
    shared_casts, shared = _passes(model, shared=True, forwards_per_backward=2)
    assert (apart_casts, shared_casts) == (6, 1)
    for a, b in zip(apart, shared, strict=True):
        # bf16 keeps 8 bits: one more rounding of each sum, ~2**-9 of the gradient's size
        assert float((a - b).norm() / a.norm()) < 4e-3


def test_casts_of_older_weights_never_reach_the_update():
    """A cast kept by an autocast still open (as around a rollout) is of the weights before the optimizer
    step; the update's forwards must cast the weights they train."""
    model = TwoLayers()
    x = torch.randn(5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)  # keeps the casts: the outer autocast is still open
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(-1.0)  # an optimizer step
        with weight_casts_shared():
            kept = model(x)
    assert torch.equal(kept, model(x))


def test_nothing_is_kept_after_leaving():
    model = TwoLayers()
    x = torch.randn(5, 16)
    with weight_casts_shared():
        model(x)
    with WeightCasts(model) as casts:
        model(x)
    assert casts.most() == 1  # cast afresh: leaving dropped the kept casts
