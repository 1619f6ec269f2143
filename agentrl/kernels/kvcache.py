"""KV-cache helpers shared by generation (agents/backends/) and training (trainers/logps.py).

Prompts of one env share a long head (chat template + the env's instructions), and in a lockstep batch
many rows share a whole prompt (the episodes of a group start from one observation; a small grid has few
states). These helpers run shared text once and hand its key/value states out to every row. Rows are
laid out as ``shared prefix + left padding + own remainder``; the attention mask hides the padding and
positions follow the mask, so each row sees exactly its own prompt at positions 0..len-1, as if it had
run alone. Gathering states is an index op, so gradients flow back into the shared computation and add
up exactly as if every row had its own copy.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

#: shortest common prompt prefix worth a separate pass (below it the extra call costs more than it saves)
MIN_SHARED_PREFIX = 16


def output_cache(out: Any) -> Any:
    """The KV cache of a model output (`cache` in newer transformers, `past_key_values` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def cache_kwarg(model: Any) -> str:
    """Name of the forward argument that takes a KV cache (transformers renamed it to `cache`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def common_prefix_length(sequences: list[list[int]]) -> int:
    """Length of the longest common prefix of token sequences."""
    if not sequences:
        return 0
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for other in sequences[1:]:
        k = 0
        while k < length and other[k] == first[k]:
            k += 1
        length = k
    return length


def expand_states(states: list[tuple[torch.Tensor, torch.Tensor]], length: int, batch: int) -> Any:
    """A fresh DynamicCache holding the first `length` positions of batch-1 `states`, for `batch` rows."""
    from transformers import DynamicCache

    return DynamicCache(
        [
            (k[:, :, :length].expand(batch, -1, -1, -1), v[:, :, :length].expand(batch, -1, -1, -1))
            for k, v in states
        ]
    )


def preallocate(cache: Any, extra_tokens: int) -> Any:
    """`cache` (a DynamicCache of plain layers) with room for `extra_tokens` more positions per layer,
    written in place: a DynamicLayer appends with `torch.cat`, which copies the whole cache at every
    decoded token (on a CPU as much time as the matmuls for a few rows of a few hundred tokens). Layers
    that are not plain dynamic ones are left as they are."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return cache
    growing = _growing_layer_class()
    cache.layers = [growing(layer.keys, layer.values, extra_tokens) for layer in layers]
    return cache


@functools.cache
def _growing_layer_class() -> type:
    """Built on first use: transformers is imported only where a cache is."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are views of a buffer with spare positions: `update`
        writes the new positions in place (the buffer doubles when full), `batch_select_indices` copies
        the buffer once."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra_tokens: int):
            super().__init__()
            self.device, self.is_initialized = keys.device, True
            self.length = keys.shape[-2]
            self._keys = self._buffer(keys, self.length + max(int(extra_tokens), 1))
            self._values = self._buffer(values, self._keys.shape[-2])
            self._views()

        @staticmethod
        def _buffer(states: torch.Tensor, capacity: int) -> torch.Tensor:
            batch, heads, length, dim = states.shape
            buffer = states.new_empty((batch, heads, capacity, dim))
            buffer[:, :, :length] = states
            return buffer

        def _views(self) -> None:
            self.keys = self._keys[:, :, : self.length]
            self.values = self._values[:, :, : self.length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            end = self.length + key_states.shape[-2]
            if end > self._keys.shape[-2]:
                self._keys = self._buffer(self.keys, 2 * end)
                self._values = self._buffer(self.values, 2 * end)
            self._keys[:, :, self.length : end] = key_states
            self._values[:, :, self.length : end] = value_states
            self.length = end
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._views()

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove < 0:
                self.length = max(self.length + tokens_to_remove, 0)
                self._views()
            else:
                super().crop(tokens_to_remove)

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self._views()

    return GrowingLayer


def prefill_shared(
    model: Any,
    prompts: list[list[int]],
    pad_id: int,
    prefix: tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None = None,
    hidden: bool = False,
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run distinct prompts through `model`, computing their longest common prefix once.

    `prefix=(length, states)`: the first `length` tokens of every prompt were computed before with the
    same weights (batch-1 key/value states per layer); they are reused instead of run again. Without it,
    a common prefix of at least MIN_SHARED_PREFIX tokens runs as one row first.

    Returns (KV cache of the prompts, logits at each prompt's last token (U, V) — with `hidden`, the last
    layer's hidden state there (U, H) instead —, attention mask (U, L), position of each prompt's last
    token (U,)).
    """
    device = next(model.parameters()).device
    kwargs: dict[str, Any] = {}
    if prefix is not None:
        common = prefix[0]
        kwargs[cache_kwarg(model)] = expand_states(prefix[1], common, len(prompts))
    else:
        common = common_prefix_length([p[:-1] for p in prompts]) if len(prompts) > 1 else 0
        if common < MIN_SHARED_PREFIX:
            common = 0
        if common:
            # only its keys and values are read: logits for one position, not the head's every token
            out = model(
                input_ids=torch.tensor([prompts[0][:common]], device=device), use_cache=True, logits_to_keep=1
            )
            # every row reads the one row's states through a view: an index copy would run its backward
            # as an index_put that accumulates the rows one by one
            states = [(layer.keys, layer.values) for layer in output_cache(out).layers]
            kwargs[cache_kwarg(model)] = expand_states(states, common, len(prompts))
    remainders = [p[common:] for p in prompts]
    width = max(len(r) for r in remainders)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in remainders], device=device)
    rest_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in remainders], device=device)
    mask = torch.cat([torch.ones((len(prompts), common), dtype=torch.long, device=device), rest_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, common:]
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        output_hidden_states=hidden,
        **kwargs,
    )
    last = out.hidden_states[-1][:, -1, :] if hidden else out.logits[:, -1, :]
    return output_cache(out), last, mask, positions[:, -1]


__all__ = [
    "MIN_SHARED_PREFIX",
    "cache_kwarg",
    "common_prefix_length",
    "expand_states",
    "output_cache",
    "preallocate",
    "prefill_shared",
]
