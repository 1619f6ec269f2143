"""Linear layers with their weights packed once for oneDNN, for the no-grad forwards of a CPU model.

torch's CPU linear prepares its weight on every call: in bf16 it reorders the weight into oneDNN's
blocked layout, in fp32 it hands the plain matrix to MKL. At the few rows of a decode step that costs
as much as the product itself. While the weights stay the same (a rollout, an evaluation, a frozen
trunk), each `nn.Linear`'s weight can be reordered once (`torch.ops.mkldnn._reorder_linear_weight`, what
torch.compile's CPU freezing pass does) and its forward call `torch.ops.mkldnn._linear_pointwise` on it.
On the 2-core EPYC (avx512_bf16, 2 threads, ad hoc timings, bf16): 8 rows x 576 -> 1536 took 123 us
with torch's linear and 95 us packed, the 576 -> 49152 LM head 4.2 ms and 2.0 ms; at 500 rows and more
the two are within 5%. In bf16 the outputs are bitwise those of autocast's linear (same kernel, same
layout, same accumulation); in fp32 they differ from MKL's by fp32 rounding.

Only plain float `nn.Linear` layers with plain tensor weights on the CPU are packed (not subclasses:
quantised layers are `nn.Linear` subclasses; not sharded weights: FSDP's are DTensors). A forward that
needs a gradient takes the layer's own forward, so a packed model can still be trained inside `active()`;
the packs do not follow later weight changes, so their owner rebuilds them when the weights change
(`PackedLinears.key`). `AGENTRL_CPU_FEATURES=no-packs` (kernels/features.py) makes `build` pack nothing:
every forward then takes the layer's own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from agentrl.kernels.features import fast_path, requested

log = logging.getLogger(__name__)

#: the packed copies may take at most this share of the memory available when they are made
MEMORY_SHARE = 0.25


def supported(dtype: torch.dtype) -> bool:
    """Whether this torch build packs and runs linear weights of `dtype` with oneDNN on this CPU (bf16: not
    under `AGENTRL_CPU_FEATURES=plain`, which answers as a CPU without oneDNN's bf16 kernels)."""
    if dtype == torch.bfloat16 and requested().plain:
        return False
    return _library_supports(dtype)


@functools.cache
def _library_supports(dtype: torch.dtype) -> bool:
    """oneDNN's answer for `dtype`, by running a tiny packed product (follows ONEDNN_MAX_CPU_ISA)."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16 and not ops._is_mkldnn_bf16_supported():
        return False
    try:  # a build can list the ops and still lack the kernels
        x, w = torch.ones(2, 8, dtype=dtype), torch.ones(4, 8, dtype=dtype)
        packed = ops._reorder_linear_weight(w, 2)
        out = ops._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.equal(out.float(), torch.full((2, 4), 8.0)))
    except (RuntimeError, NotImplementedError):
        return False


def _packable(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module) is nn.Linear
        and type(weight) in (torch.Tensor, nn.Parameter)  # not a shard (DTensor) or other subclass
        and weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
    )


class PackedLinears:
    """Every packable `nn.Linear` of `model` with its weight (and bias) in `dtype` (None: each layer's
    own), packed now; `active()` routes their no-grad forwards through the packs. `key` is whatever the
    owner uses to tell whether the weights changed since (it is only stored).

    Build with `PackedLinears.build`, which returns None where packing does not apply."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None, key: Any = None):
        self.key = key
        self.layers: list[tuple[nn.Module, torch.Tensor, torch.Tensor | None, torch.dtype]] = []
        packs: dict[int, torch.Tensor] = {}  # tied weights (an LM head and the embeddings) pack once
        with torch.no_grad():
            for module in model.modules():
                if not _packable(module):
                    continue
                weight, bias = module.weight, module.bias
                compute = dtype or weight.dtype
                if id(weight) not in packs:
                    packs[id(weight)] = torch.ops.mkldnn._reorder_linear_weight(
                        weight.detach().to(compute).contiguous(), 8
                    )
                cast_bias = None if bias is None else bias.detach().to(compute)
                self.layers.append((module, packs[id(weight)], cast_bias, compute))
        self.bytes = sum(p.numel() * p.element_size() for p in packs.values())

    @classmethod
    def build(
        cls, model: nn.Module, dtype: torch.dtype | None = None, key: Any = None
    ) -> PackedLinears | None:
        """The packs of `model`, or None where they do not apply: switched off (`AGENTRL_CPU_FEATURES=
        no-packs`), no packable layer, a dtype this CPU or torch build cannot pack, or packs that would take
        more than MEMORY_SHARE of the available memory."""
        import psutil

        if not fast_path("packs"):
            return None
        layers = [m for m in model.modules() if _packable(m)]
        dtypes = {dtype or m.weight.dtype for m in layers}
        if not layers or not all(supported(d) for d in dtypes):
            return None
        seen: set[int] = set()
        size = 0
        for m in layers:
            if id(m.weight) not in seen:
                seen.add(id(m.weight))
                size += m.weight.numel() * (dtype or m.weight.dtype).itemsize
        available = psutil.virtual_memory().available
        if size > MEMORY_SHARE * available:
            log.debug(
                "linear weights not packed: %.0f MB of %.0f MB available", size / 2**20, available / 2**20
            )
            return None
        return cls(model, dtype, key)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The packed layers' forwards use their packs inside (where no gradient is needed)."""
        previous = []
        for module, packed, bias, dtype in self.layers:
            previous.append(vars(module).get("forward"))
            module.forward = functools.partial(_packed_forward, module, previous[-1], packed, bias, dtype)
        try:
            yield
        finally:
            for (module, *_), forward in zip(self.layers, previous, strict=True):
                if forward is None:
                    vars(module).pop("forward", None)
                else:
                    module.forward = forward


def _packed_forward(
    module: nn.Module,
    own: Any,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    x: torch.Tensor,
) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad):
        return own(x) if own is not None else type(module).forward(module, x)
    return torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed, bias, "none", [], "")


__all__ = ["MEMORY_SHARE", "PackedLinears", "supported"]
