"""Log-probs of completion tokens for the update, running each distinct prompt once.

Training rows are left-padded prompts followed by right-padded completions. Many rows share a prompt
(the G episodes of a group start from the same observation; a small grid has few states), and a prompt
is often ~25x longer than a few-token answer. So the distinct prompts run once (kernels/kvcache.py), their
KV cache is gathered out to all rows, and only the completions run per row. Only completion positions go
through the LM head. Values and gradients equal a plain per-row forward (tests/test_logps.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agentrl.kernels.kvcache import cache_kwarg, prefill_shared
from agentrl.kernels.precision import autocast_wrapped


def completion_logps(
    logits: torch.Tensor, targets: torch.Tensor | None, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits / T) at the target tokens (targets None: the whole distribution), and
    (no-grad) entropies, per position. With targets, the fp32 work runs a few positions at a time
    (`TargetLogps`): no positions x vocabulary fp32 tensor is made."""
    if targets is not None:
        return TargetLogps.apply(logits, targets, float(temperature), compute_entropy)
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    entropies = None
    if compute_entropy:
        with torch.no_grad():
            entropies = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs, entropies


#: fp32 elements per block of positions in `TargetLogps` (8 MB: a block's temporaries come from the heap
#: and stay in cache, where a whole update's (positions, vocabulary) fp32 tensors are fresh pages)
BLOCK_ELEMENTS = 2**21


class TargetLogps(torch.autograd.Function):
    """log_softmax(logits / T) at the targets, and the entropy (no gradient), from (..., V) logits.

    The plain form, `log_softmax(logits.float() / T).gather(...)`, makes several fp32 tensors of the
    logits' size and keeps one for the backward: at 32 rows x 63 tokens x 49,152 that is ~400 MB each,
    fresh pages every update. Here a block of positions at a time is upcast, its logsumexp kept (one
    float per position), and the backward recomputes each block's softmax from the logits (kept in their
    own dtype, bf16 under autocast) and the logsumexp:

        logp_t = z_t - lse(z),  z = logits / T;   d logp_t / d logits_j = (1[j = t] - softmax(z)_j) / T
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature, compute_entropy):
        flat, picked = logits.reshape(-1, logits.size(-1)), targets.reshape(-1, 1)
        lse = torch.empty(flat.size(0), dtype=torch.float32, device=logits.device)
        logps = torch.empty_like(lse)
        entropies = torch.empty_like(lse) if compute_entropy else None
        for start, stop in _blocks(flat):
            z = flat[start:stop].float() / temperature
            lse[start:stop] = torch.logsumexp(z, dim=-1)
            logq = z.sub_(lse[start:stop, None])
            logps[start:stop] = logq.gather(-1, picked[start:stop]).squeeze(-1)
            if entropies is not None:
                entropies[start:stop] = -(logq.exp() * logq).sum(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        if entropies is None:
            return logps.view(targets.shape), None
        entropies = entropies.view(targets.shape)
        ctx.mark_non_differentiable(entropies)
        return logps.view(targets.shape), entropies

    @staticmethod
    def backward(ctx, grad_logps, _grad_entropies):
        logits, targets, lse = ctx.saved_tensors
        flat, picked = logits.reshape(-1, logits.size(-1)), targets.reshape(-1, 1)
        grad, upstream = torch.empty_like(flat), grad_logps.reshape(-1, 1).float()
        for start, stop in _blocks(flat):
            z = flat[start:stop].float() / ctx.temperature
            block = z.sub_(lse[start:stop, None]).exp_().mul_(-upstream[start:stop])  # -g * softmax
            block.scatter_add_(-1, picked[start:stop], upstream[start:stop])
            grad[start:stop] = block.div_(ctx.temperature)
        return grad.view(logits.shape), None, None, None


def _blocks(flat: torch.Tensor) -> list[tuple[int, int]]:
    rows = max(1, BLOCK_ELEMENTS // max(flat.size(-1), 1))
    return [(s, min(s + rows, flat.size(0))) for s in range(0, flat.size(0), rows)]


#: the rollout's next-token logits of distinct prompts, with their graphs (`HFBackend.recorded_logits`)
Recorded = Callable[[list[tuple[int, ...]]], "torch.Tensor | None"]


def shared_prefix_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    recorded: Recorded | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the last `completion_length` tokens of each row (B, T).

    Identical rows (the same prompt and answer, common when a group's episodes visit the same states and
    answer alike) run once; indexing the results back out sums their gradients as separate rows would.
    One-token answers take their prompts' logits from `recorded` where it has them all: the rollout's
    forward with its graph (agents/backends/graphs.py), instead of running the prompts again.
    """
    unique, inverse = torch.unique(
        torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1), dim=0, return_inverse=True
    )
    if len(unique) == len(input_ids):
        return _distinct_rows_logps(
            model, input_ids, attention_mask, completion_length, temperature, compute_entropy, recorded
        )
    width = input_ids.size(1)
    logps, entropies = _distinct_rows_logps(
        model,
        unique[:, :width],
        unique[:, width:].to(attention_mask.dtype),
        completion_length,
        temperature,
        compute_entropy,
        recorded,
    )
    return logps[inverse], entropies[inverse] if entropies is not None else None


def _distinct_rows_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float,
    compute_entropy: bool,
    recorded: Recorded | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`shared_prefix_logps` of rows that are all different."""
    prompt_length = input_ids.size(1) - completion_length
    prompt_ids, prompt_mask = input_ids[:, :prompt_length], attention_mask[:, :prompt_length]
    targets = input_ids[:, prompt_length:]
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # older transformers
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing and model.training:
        # Checkpointed layers return no KV cache: one plain forward, LM head on the completion only.
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            logits_to_keep=completion_length + 1,
            use_cache=False,
        ).logits[:, :-1, :]
        return completion_logps(logits, targets, temperature, compute_entropy)
    rows = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask, strict=True)]
    keys: dict[tuple[int, ...], int] = {}
    inverse = torch.tensor([keys.setdefault(tuple(r), len(keys)) for r in rows], device=input_ids.device)
    first_logits = recorded(list(keys)) if recorded is not None and completion_length == 1 else None
    if first_logits is None:
        cache, first_logits, mask, last_position = prefill_shared(model, [list(k) for k in keys], pad_id=0)
    # The first completion token's distribution depends on the prompt only: normalise once per distinct
    # prompt, then pick each row's token (no rows x vocab tensor; one-token answers end here).
    first_logps, first_entropy = completion_logps(
        first_logits[:, None, :], None, temperature, compute_entropy
    )
    logps = [first_logps[inverse, 0, targets[:, 0]][:, None]]
    entropies = [first_entropy[inverse]] if compute_entropy else []
    if completion_length > 1:
        cache.batch_select_indices(inverse)
        completion_mask = attention_mask[:, prompt_length:-1]
        rest = _keeping_output_dtype(model)(
            input_ids=input_ids[:, prompt_length:-1],
            attention_mask=torch.cat([mask[inverse], completion_mask], dim=1),
            position_ids=last_position[inverse][:, None] + completion_mask.long().cumsum(-1).clamp(min=1),
            use_cache=True,
            **{cache_kwarg(model): cache},
        )
        rest_logps, rest_entropy = completion_logps(rest.logits, targets[:, 1:], temperature, compute_entropy)
        logps.append(rest_logps)
        entropies.append(rest_entropy)
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1) if compute_entropy else None


def _keeping_output_dtype(model: Any) -> Callable[..., Any]:
    """`model`'s forward, without the upcast of its outputs to fp32 that accelerate's mixed precision adds
    after its autocast: the completions' (rows, tokens, vocabulary) logits stay bf16 (`TargetLogps` upcasts
    a block at a time) instead of a second, fp32 copy of them (and a bf16 one of its gradient)."""
    if not autocast_wrapped(model):
        return model
    forward = model._original_forward  # the forward accelerate wrapped (TRL's fused-head patch, if any)

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(kwargs["input_ids"].device.type, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    return autocast_forward


def kernel_applies(device_type: str, processes: int) -> bool:
    """Whether the update's log-probs go through `shared_prefix_logps`: on a CPU with one process. On CUDA
    (and XPU) TRL's fused LM head scores the completion positions in tiles; the kernel would build
    full-vocabulary fp32 logits (and entropies) for every completion token instead: ~5 GB per copy at 32
    rows x 256 tokens x 151,936 for Qwen2.5. With several processes every forward is a collective and
    the kernel's count depends on the rows."""
    return device_type not in ("cuda", "xpu") and processes == 1


def truncate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """`logits` with the tokens top-k / top-p sampling drops set to -inf (transformers' warpers, in vLLM's
    order: top-k, then top-p over what is left), over the last dimension."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    shape = logits.shape
    flat = logits.reshape(-1, shape[-1])
    if top_k and top_k > 0:
        flat = TopKLogitsWarper(int(top_k))(None, flat)
    if top_p < 1.0:
        flat = TopPLogitsWarper(float(top_p))(None, flat)
    return flat.reshape(shape)


#: bf16 steps (at the logit's size) within which two logits may swap places on an engine with other
#: numerics: vLLM's bf16 weights against fp32 master weights under bf16 autocast tie or swap the k-th and
#: (k+1)-th logits at a few % of positions. Measured with SmolLM2-135M (a pure-bf16 copy sampling top-k 3
#: at T 1.5, 683 tokens, against the fp32 weights under autocast): with 2 steps no row's ratio is 0 and
#: the tokens' mean ratio is 0.999, 41% of the tokens left uncorrected; with 0 (exact ties only) a row
#: still leaves the ratio's bounds.
EDGE_BF16_STEPS = 2


def bf16_step(values: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at each of `values`' sizes (8 significant bits)."""
    return torch.exp2(torch.floor(torch.log2(values.abs().clamp(min=2.0**-126))) - 7)


def kept_set_edge(
    logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0
) -> torch.Tensor:
    """Where the set of tokens top-k / top-p keep from `logits` (before the temperature; (..., vocab))
    hangs on a near-tie that changes the sampled token's log-prob beyond the engines' numerical noise
    (`EDGE_BF16_STEPS` bf16 steps of the logits): top-k's k-th and (k+1)-th logits that close (bf16
    ties make an engine keep every tied token); top-p's cumulative probability that close to `top_p` at a
    token whose own probability is more than that noise of the kept mass (a token of a flat tail moves
    the normalisation by less). An engine with other numerics may keep another set there. Returns a bool
    tensor of `logits`' shape without the vocabulary."""
    edge = torch.zeros(logits.shape[:-1], dtype=torch.bool, device=logits.device)
    vocab = logits.size(-1)
    if 0 < top_k < vocab:
        best = logits.topk(top_k + 1, dim=-1).values
        kth, after = best[..., top_k - 1], best[..., top_k]
        edge |= kth - after <= EDGE_BF16_STEPS * bf16_step(kth)
    if top_p < 1.0:
        width = top_k if 0 < top_k < vocab else vocab
        best = logits.topk(width, dim=-1).values
        probs = torch.softmax(best / temperature, dim=-1)
        before = probs.cumsum(-1) - probs  # the mass of the tokens ranked above each
        # relative noise of a probability: that of its logit, after the temperature
        noise = (EDGE_BF16_STEPS * bf16_step(best[..., :1]) / temperature) * top_p
        edge |= (((before - top_p).abs() <= noise) & (probs > noise)).any(-1)
    return edge


@torch.no_grad()
def processed_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rows_per_pass: int | None = None,
) -> torch.Tensor:
    """No-grad log-probs of the last `completion_length` tokens of each row under the distribution a
    top-k / top-p sampler draws from: log_softmax over the kept tokens of logits / temperature, as vLLM's
    `processed_logprobs` report them. NaN (no importance correction, as TRL treats a token vLLM gave no
    log-prob) where the kept set's edge is a near-tie (`kept_set_edge`) and where the sampled token lies
    outside this side's kept set although the full distribution gives it mass: the engine, with its own
    numerics, kept it, and -inf there would zero the row's importance ratio. -inf only for a token of
    zero probability. `rows_per_pass` rows per forward (None: all) bound the (rows, completion, vocab)
    logits."""
    out = []
    step = rows_per_pass or input_ids.size(0)
    for start in range(0, input_ids.size(0), step):
        ids = input_ids[start : start + step]
        mask = attention_mask[start : start + step]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            logits_to_keep=completion_length + 1,
        ).logits[:, :-1, :]
        logits = logits.float()
        targets = ids[:, -completion_length:].unsqueeze(-1)
        kept = truncate_logits(logits / temperature, top_k, top_p)
        logps = torch.log_softmax(kept, dim=-1).gather(-1, targets).squeeze(-1)
        possible = torch.isfinite(logits.gather(-1, targets).squeeze(-1))
        unsure = kept_set_edge(logits, top_k, top_p, temperature) | (torch.isinf(logps) & possible)
        out.append(logps.masked_fill(unsure, float("nan")))
    return torch.cat(out)


__all__ = [
    "EDGE_BF16_STEPS",
    "TargetLogps",
    "completion_logps",
    "kernel_applies",
    "kept_set_edge",
    "processed_logps",
    "shared_prefix_logps",
    "truncate_logits",
]
