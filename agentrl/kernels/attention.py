"""Attention for models on a CPU: transformers' SDPA, with the query heads packed over the key/value heads.

Models with grouped query attention (SmolLM2: 9 query heads over 3 key/value heads; Qwen2.5) share each
key/value head among several query heads. Given a mask (every padded batch, every row past a shared
head), transformers' SDPA either copies each key/value head to its query heads (`repeat_kv`) or asks
SDPA to group them (`enable_gqa`); on a CPU both run the flash kernel over short query blocks, one per
query head, and its backward is the slowest operator of a Frozen Lake update. Packing the query heads of
one key/value head into one longer block, `(B, H, L, D) -> (B, KV, H/KV * L, D)` with the mask repeated
to match, asks for the same attention (the same kernel, the same outputs) with a third of the blocks,
each three times longer: transformers' `pack_gqa` for one-token decode steps, extended to any query
length. Forward + backward of one layer on the 2-core EPYC (bf16, ad hoc timings): 11 rows x 105
queries over 275 keys (a Frozen Lake update) 35.8 ms grouped by SDPA, 24.4 ms packed; 28 x 213 over 505
(Snake) 199 and 187 ms; 8 x 150 over 340 (RLFT) 48 and 33 ms. Two matmuls and a softmax were faster still
at the small sizes (16.5 ms), but under autocast they round the scores to bf16, where the flash kernel
keeps them in fp32: twice the error, so not used.

Decode steps (one query token) are packed too, also where the batch has no padding: transformers then
passes no mask and asks SDPA for `enable_gqa`, which on this CPU took 1.5 ms a layer where the packed
query takes 0.25 ms (8 rows over 351 keys, bf16, a replay of a decode step's tensors).

`load_model` selects this implementation (`IMPLEMENTATION`) for models on the CPU whose config asks for
sdpa; what it does not handle (several query tokens without a mask, one causal block; another device,
dropout while training, attention sinks, soft-capping) goes to transformers' own SDPA function unchanged.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

#: the name the implementation is registered under with transformers' attention and mask interfaces
IMPLEMENTATION = "agentrl_sdpa"


@functools.cache
def register() -> str:
    """Register the implementation with transformers (once per process) and return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, packed_query_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)  # the boolean masks SDPA takes
    return IMPLEMENTATION


def packed_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (B, H, L, D) queries over (B, KV, S, D) keys and
    values -> ((B, L, H, D) output, no weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    if (
        query.device.type != "cpu"
        or heads == kv_heads
        # without a mask only one query token (a decode step past every key) needs none after packing
        or (attention_mask is None and length > 1)
        or (
            attention_mask is not None
            and (attention_mask.dtype != torch.bool or attention_mask.shape[1] != 1)
        )
        or (dropout > 0 and module.training)
        or any(kwargs.get(k) is not None for k in ("position_bias", "softcap", "s_aux", "sinks"))
        or kwargs.get("output_attentions")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    groups = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5
    # query head h belongs to key/value head h // groups (repeat_kv's order): rows g * L + l of a group
    packed = query.reshape(batch, kv_heads, groups * length, dim)
    mask = attention_mask
    if mask is not None:
        mask = _packed_mask(mask, (batch, groups, length, keys), _sdpa_dtype(query, key, value))
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scale)
    out = out.reshape(batch, heads, length, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


def _sdpa_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.dtype | None:
    """The dtype SDPA computes in here (None where autocast would cast the inputs to another)."""
    dtype = query.dtype
    if key.dtype != dtype or value.dtype != dtype or not dtype.is_floating_point:
        return None
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") != dtype:
        return None
    return dtype


#: the last boolean mask packed: (a weak reference to it, its version, the packing, the packed mask)
_last_packed: tuple[Any, ...] | None = None


def _packed_mask(
    mask: torch.Tensor, shape: tuple[int, int, int, int], dtype: torch.dtype | None
) -> torch.Tensor:
    """`mask` (B, 1, L, S) repeated over the G query heads packed into one block, (B, 1, G * L, S): in
    `dtype` as additive 0 / -inf (what SDPA converts a boolean mask into, at every call), else boolean.

    A model's forward hands every layer the same mask: it is packed and converted once per forward
    (converting it in every layer costs a tenth of a layer's attention on Snake's 500-key rows)."""
    global _last_packed
    batch, groups, length, keys = shape
    # tensors made under inference mode keep no version counter: for them the mask's identity (a live
    # weak reference) is the key; transformers makes a new mask every forward and never edits one
    memo = (None if mask.is_inference() else mask._version, shape, dtype)
    last = _last_packed
    if last is not None and last[0]() is mask and last[1] == memo:
        return last[2]
    packed = mask.expand(batch, 1, length, keys)[:, :, None]
    packed = packed.expand(batch, 1, groups, length, keys).reshape(batch, 1, groups * length, keys)
    if dtype is not None:
        packed = torch.zeros(packed.shape, dtype=dtype, device=packed.device).masked_fill_(
            packed.logical_not(), float("-inf")
        )

    def forget(_: Any) -> None:
        global _last_packed
        if _last_packed is not None and _last_packed[2] is packed:
            _last_packed = None

    _last_packed = (weakref.ref(mask, forget), memo, packed)
    return packed


__all__ = ["IMPLEMENTATION", "packed_query_attention", "register"]
