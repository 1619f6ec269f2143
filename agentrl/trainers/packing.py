"""Packing one iteration's rows into the tensors TRL's loss reads, and cutting them into passes.

`pack_samples` turns rows (`StepSample`s) into left-padded prompts, right-padded completions, masks,
advantages, old log-probs and, with a critic, value targets; `action_rows` adds what the action-level loss
(TWOSOME) reads. `split_even` deals an iteration's rows into micro-batches without dropping any;
`split_by_tokens` cuts a packed micro-batch into passes under a token budget, and `blank_rows` makes a pass
that learns nothing (for processes with fewer passes than others).
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.types import StepSample


def pack_samples(
    samples: list[StepSample], pad_id: int, device: Any, with_old_logprobs: bool = False
) -> dict[str, torch.Tensor]:
    """Rows -> the tensors `GRPOTrainer._compute_loss` reads: left-padded prompts, right-padded
    completions, masks, (B,) advantages (or (B, T) when rows carry one advantage per token) and
    optionally (B, T) old log-probs; rows with value targets (a critic) add (B, T) returns, old values
    and the mask of the tokens that have them."""
    width_p = max(len(s.prompt_ids) for s in samples)
    width_c = max(len(s.completion_ids) for s in samples)
    rows = len(samples)
    prompt_ids = torch.full((rows, width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, width_p), dtype=torch.long)
    completion_ids = torch.full((rows, width_c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((rows, width_c), dtype=torch.long)
    old = torch.zeros((rows, width_c), dtype=torch.float32)
    per_token = any(isinstance(s.advantage, list) for s in samples)
    advantages = torch.zeros((rows, width_c) if per_token else (rows,), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        prompt_ids[row, width_p - p :] = torch.tensor(s.prompt_ids)
        prompt_mask[row, width_p - p :] = 1
        completion_ids[row, :c] = torch.tensor(s.completion_ids)
        completion_mask[row, :c] = 1
        if with_old_logprobs and s.old_logprobs is not None:
            old[row, :c] = torch.tensor(s.old_logprobs[:c])
        if per_token:
            advantages[row, :c] = torch.as_tensor(s.advantage, dtype=torch.float32).expand(c)
        else:
            advantages[row] = float(s.advantage)
    batch = {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "advantages": advantages.to(device),
    }
    if with_old_logprobs:
        batch["old_per_token_logps"] = old.to(device)
    if any(s.returns is not None for s in samples):
        returns = torch.zeros((rows, width_c), dtype=torch.float32)
        old_values = torch.zeros((rows, width_c), dtype=torch.float32)
        value_mask = torch.zeros((rows, width_c), dtype=torch.float32)
        for row, s in enumerate(samples):
            if s.returns is not None and s.old_values is not None:
                c = len(s.returns)
                returns[row, :c] = torch.tensor(s.returns)
                old_values[row, :c] = torch.tensor(s.old_values)
                value_mask[row, :c] = 1.0
        batch["returns"] = returns.to(device)
        batch["old_values"] = old_values.to(device)
        batch["value_mask"] = value_mask.to(device)  # rows without targets (placeholders) train no value
    return batch


def action_rows(samples: list[StepSample], device: Any, filler: bool = False) -> dict[str, Any]:
    """What the action-level loss reads besides `pack_samples`: each row's prompt ids, its candidates'
    token ids and normalisers (lists: their lengths vary) and the chosen candidate's index."""
    return {
        "prompt_lists": [list(s.prompt_ids) for s in samples],
        "candidates": [s.candidates or [list(s.completion_ids)] for s in samples],
        "normalizers": [s.normalizers or [1] * len(s.candidates or [0]) for s in samples],
        "choice": [int(s.choice or 0) for s in samples],
        "filler": filler,
    }


#: keys of a packed batch whose second dimension is the prompt's (left-padded) or the completion's columns
PROMPT_COLUMNS = ("prompt_ids", "prompt_mask")
COMPLETION_COLUMNS = (
    "completion_ids",
    "completion_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
    "returns",
    "old_values",
    "value_mask",
    "critic_features",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)


def split_by_tokens(
    batch: dict[str, Any],
    budget: int,
    completions_only: bool = False,
    prompt_budget: int | None = None,
    gather_fraction: float = 0.0,
    padded_budget: int | None = None,
) -> list[dict[str, Any]]:
    """A packed micro-batch as consecutive row chunks of at most `budget` padded tokens each (rows x
    (prompt + completion width), times the candidates of action-level rows; `completions_only`: rows x
    completion width, the LM-head positions), each trimmed to its own widths; a row larger than the
    budget is a chunk of its own. `prompt_budget` also bounds what the shared-prefix kernel runs with
    gradients in one pass: each distinct prompt's tokens once, plus every row's completion tokens, plus
    `gather_fraction` of a token for each prompt token that a row (each of its candidates) attends over
    from its own copy of the prompt's KV cache (rows with more than one answer token). `padded_budget`
    bounds what a plain forward runs with gradients in one pass, where every row runs its own padded
    prompt: rows x (prompt + completion width) x candidates. Values
    that are not per row (`num_items_in_batch`) are shared, so the chunks' losses add up to the
    micro-batch's."""
    prompt_mask, completion_mask = batch["prompt_mask"], batch["completion_mask"]
    rows = prompt_mask.size(0)
    prompt_len = prompt_mask.sum(-1).tolist()
    completion_len = completion_mask.sum(-1).tolist()
    candidates = [len(c) for c in batch["candidates"]] if "candidates" in batch else [1] * rows
    prompts = None
    if prompt_budget:
        prompts = [
            tuple(ids[m.bool()].tolist()) for ids, m in zip(batch["prompt_ids"], prompt_mask, strict=True)
        ]
    chunks: list[tuple[int, int]] = []
    start, width_p, width_c, widest = 0, 0, 0, 1
    seen: set[tuple[int, ...]] = set()
    run_tokens = 0  # distinct prompts' tokens plus completion tokens of the current chunk
    for row in range(rows):
        p, c, k = (
            max(width_p, prompt_len[row]),
            max(width_c, completion_len[row]),
            max(widest, candidates[row]),
        )
        new_prompt = prompts is not None and prompts[row] not in seen
        gathers = completion_len[row] > 1 or candidates[row] > 1
        copies = gather_fraction * prompt_len[row] * candidates[row] if gathers else 0.0
        adds = (prompt_len[row] if new_prompt else 0) + completion_len[row] * candidates[row] + copies
        over = (row - start + 1) * (c if completions_only else p + c) * k > budget
        over = over or (prompts is not None and run_tokens + adds > prompt_budget)
        over = over or (padded_budget is not None and (row - start + 1) * (p + c) * k > padded_budget)
        if row > start and over:
            chunks.append((start, row))
            start, p, c, k = row, prompt_len[row], completion_len[row], candidates[row]
            seen, run_tokens = set(), 0
            adds = prompt_len[row] + completion_len[row] * candidates[row] + copies
        width_p, width_c, widest = p, c, k
        if prompts is not None:
            seen.add(prompts[row])
            run_tokens += adds
    chunks.append((start, rows))
    if len(chunks) == 1:
        return [batch]
    parts = []
    for lo, hi in chunks:
        p = max(int(max(prompt_len[lo:hi])), 1)
        c = max(int(max(completion_len[lo:hi])), 1)
        part: dict[str, Any] = {}
        for key, value in batch.items():
            if torch.is_tensor(value) and value.dim() >= 1 and value.size(0) == rows:
                value = value[lo:hi]
                if key in PROMPT_COLUMNS:
                    value = value[:, value.size(1) - p :]
                elif key in COMPLETION_COLUMNS and value.dim() >= 2:
                    value = value[:, :c]
            elif isinstance(value, list) and len(value) == rows:
                value = value[lo:hi]
            part[key] = value
        parts.append(part)
    return parts


def blank_rows(batch: dict[str, Any]) -> dict[str, Any]:
    """`batch` with no token to learn from (masks and advantages zero): a pass that computes what a real
    one does (the same collectives) and adds nothing to the loss or the gradient."""
    blank = dict(batch)
    for key in ("completion_mask", "advantages", "value_mask"):
        if key in blank:
            blank[key] = torch.zeros_like(blank[key])
    if "candidates" in blank:
        blank["filler"] = True
    return blank


def split_even(items: list[Any], parts: int) -> list[list[Any]]:
    """`parts` consecutive chunks whose sizes differ by at most one (none dropped)."""
    base, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        chunks.append(items[start : start + size])
        start += size
    return chunks
