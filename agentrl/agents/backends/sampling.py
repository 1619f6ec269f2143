"""The rollout's token sampler: one token per row drawn from the distribution transformers' temperature,
top-k and top-p warpers define, by inverting the kept tokens' cumulative distribution at one uniform number
a row (`torch.multinomial` draws an exponential variable for every vocabulary entry of every row).
`HFBackend._sample` (agents/backends/hf.py) calls it with the distinct contexts of a lockstep step."""

from __future__ import annotations

from typing import Any


def sample_tokens(scaled: Any, top_k: int, top_p: float, generator: Any, rows: Any = None) -> Any:
    """One token for each of `rows` (indices into `scaled`; None: one per row of `scaled`), drawn from the
    softmax of its row of `scaled` (logits already divided by the temperature) over the tokens
    transformers' `TopKLogitsWarper(top_k)` and `TopPLogitsWarper(top_p)` keep (top-k keeps every token
    tied with the k-th; 0 and 1.0 turn them off). Rows that share a row of `scaled` draw independently.

    The distribution is worked out once per row of `scaled` (a lockstep step's distinct contexts), so
    the work per drawn row is one uniform number. With top-k the candidates are the k best scores and a
    few more to see ties (bf16 logits tie often), so the rest of the work is k-sized. The draw inverts
    the candidates' cumulative distribution, summed in float64."""
    import torch
    from transformers import TopPLogitsWarper

    vocab = scaled.size(-1)
    index = None
    values = scaled
    if 0 < top_k < vocab:
        width = min(vocab, top_k + 16)
        best, where = scaled.topk(width, dim=-1)
        kth = best[:, top_k - 1 : top_k]
        if width == vocab or not bool((best[:, -1:] >= kth).any()):
            values, index = best.masked_fill(best < kth, float("-inf")), where
        else:  # more ties with the k-th score than the margin holds: mask the whole vocabulary
            values = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        values = TopPLogitsWarper(top_p)(None, values)
    if rows is None:
        rows = torch.arange(values.size(0), device=values.device)
    probs = torch.softmax(values, dim=-1)
    uniform = torch.rand(len(rows), generator=generator, dtype=torch.float64, device=values.device)
    if probs.size(-1) >= 4 * CDF_BLOCK:
        pick = inverse_cdf_blocks(probs, rows, uniform)
    else:
        pick = inverse_cdf(probs, rows, uniform)
    return index[rows, pick] if index is not None else pick


#: tokens a block when a whole vocabulary is sampled (`inverse_cdf_blocks`)
CDF_BLOCK = 1024


def inverse_cdf(probs: Any, rows: Any, uniform: Any) -> Any:
    """For each of `rows` (indices into `probs`, whose rows sum to 1 up to rounding) the first token whose
    cumulative probability, summed in float64 and normalised, exceeds its `uniform` number: a draw from the
    row's distribution that never lands on a token without mass."""
    import torch

    distinct, width = probs.shape
    cumulative = probs.cumsum(-1, dtype=torch.float64)
    cumulative = cumulative / cumulative[:, -1:]
    # one search for all rows: row u's distribution lies in [2u, 2u + 1] of one increasing sequence
    offsets = 2.0 * torch.arange(distinct, dtype=torch.float64, device=probs.device)
    found = torch.searchsorted((cumulative + offsets[:, None]).flatten(), uniform + offsets[rows], right=True)
    return (found - rows * width).clamp_(0, width - 1)


def inverse_cdf_blocks(probs: Any, rows: Any, uniform: Any, block: int = CDF_BLOCK) -> Any:
    """`inverse_cdf` in two steps, for rows as wide as a vocabulary: the block of `block` tokens the draw
    falls in (from the blocks' float64 sums), then the token within it (a cumulative sum over that block
    only). A float64 cumulative sum over 49,152 tokens is sequential work per row: ~5 ms for 8 rows on a
    2-core CPU, at every decoded token; block sums are one vectorised reduction. The same uniform numbers
    pick the same tokens as `inverse_cdf` up to float64 rounding at a boundary."""
    import torch

    distinct, width = probs.shape
    count = -(-width // block)
    blocks = torch.nn.functional.pad(probs, (0, count * block - width)).view(distinct, count, block)
    cumulative = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # (distinct, count)
    positions = torch.arange(count, device=probs.device)
    # the last block with mass bounds the search: a draw rounded up to the total lands there
    last_block = torch.where(cumulative > torch.nn.functional.pad(cumulative[:, :-1], (1, 0)), positions, 0)
    last_block = last_block.amax(-1)[rows]
    totals = cumulative[rows]
    target = uniform * totals[:, -1]
    chosen = torch.searchsorted(totals, target[:, None], right=True).squeeze(1)
    chosen = torch.minimum(chosen, last_block)
    before = torch.where(chosen > 0, totals.gather(1, (chosen - 1).clamp(min=0)[:, None]).squeeze(1), 0.0)
    inside = blocks[rows, chosen]  # (rows, block)
    found = torch.searchsorted(
        inside.cumsum(-1, dtype=torch.float64), (target - before)[:, None], right=True
    ).squeeze(1)
    # rounding can leave the residual at or past the block's own sum: its last token with mass then
    offsets = torch.arange(block, device=probs.device)
    last_token = torch.where(inside > 0, offsets, 0).amax(-1)
    return chosen * block + torch.minimum(found, last_token)
