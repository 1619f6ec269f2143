"""TWOSOME's decision rule: the agent scores every valid action instead of generating text.

Tan, Yan, Zhou, Zhang, Xu, Song, Tuyls, An, "True Knowledge Comes from Practice: Aligning LLMs with
Embodied Environments via Reinforcement Learning", ICLR 2024 (the baseline of the POAD paper;
docs/algorithms.md#scoring-decisions-twosome). Selected with `agent.decision=score`.

What is scored. The prompt is the agent's chat prompt (`TextInterface.render`) whose assistant turn ends
with the opening answer tag, `<action>` (after an explicit `agent.prefill`, if one is set;
`resolve_interface` puts it there). Each candidate is the rest of the answer, `NAME</action>`, for every
valid action NAME. Prompt and candidate are tokenised SEPARATELY and their ids concatenated, and that
id sequence is what is scored: a joint tokenisation could merge tokens across the boundary and would then
score a different prefix for each candidate. The closing tag is scored with the name, so an action that
is a prefix of another ("go" and "go left") pays for ending there.

The policy. With log L(a) = sum_j log p(a_j | prompt, a_<j) the candidate's log-likelihood under the
model and n(a) its normaliser (TWOSOME's word normalisation: the number of whitespace-separated words of
the action name; or its token count, or 1),

    log pi(a | s) = log_softmax over a in valid(s) of ( log L(a) / n(a) ).

Acting samples from softmax(log L(a) / n(a) / T) with the agent's sampling temperature T (T = 0: the
argmax, ties to the first valid action; top-k and top-p do not apply), so the agent never plays an
invalid action. `candidate_logps` is a pure, differentiable function of (model, ids): a trainer can
optimise the action-level policy through it and `twosome_log_policy`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from agentrl.agents.protocols import ScoringAgent
from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.kernels.kvcache import cache_kwarg, prefill_shared
from agentrl.types import Decision, Generation, StepContext

DECISIONS = ("generate", "score")
NORMALIZATIONS = ("word", "token", "none")


class CandidateScore(NamedTuple):
    """One candidate's log-probs under the model: one per token, and their sum (log L(a))."""

    token_logprobs: list[float]
    loglik: float


# ---- the differentiable core -------------------------------------------------------------------------
def candidate_logps(
    model: Any,
    prompts: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[Sequence[int]]],
    pad_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of every candidate continuation of every prompt, each prompt run once.

    `candidates[i]` lists the candidate token ids of `prompts[i]`. Rows of the result are all candidates
    flattened in order (prompt 0's candidates first); columns are candidate tokens, right-padded.
    Returns (log-probs (N, T), float32, 0 at padding; mask (N, T), True at real tokens).

    Each distinct prompt is prefilled once (`prefill_shared`; a long common head of the prompts runs once
    more), its KV cache is gathered out to its candidates, and only the candidate tokens run per row. The
    values equal a plain forward of prompt + candidate per row; under autograd the gradients do too (the
    cache gather is an index op), so the same function serves acting (under no_grad) and training.
    """
    if len(prompts) != len(candidates):
        raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
    device = next(model.parameters()).device
    owners = [i for i, group in enumerate(candidates) for _ in group]
    flat = [list(ids) for group in candidates for ids in group]
    if not flat:
        empty = torch.zeros((0, 0), device=device)
        return empty, empty.bool()
    if any(len(ids) == 0 for ids in flat) or any(len(prompts[i]) == 0 for i in owners):
        raise ValueError("prompts and candidates must not be empty")
    width = max(len(ids) for ids in flat)
    targets = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids in flat], device=device)
    mask = torch.tensor([[True] * len(ids) + [False] * (width - len(ids)) for ids in flat], device=device)
    if _checkpointing(model):
        logps = _plain_candidate_logps(model, [list(prompts[i]) for i in owners], targets, mask, pad_id)
        return torch.where(mask, logps, torch.zeros_like(logps)), mask
    keys: dict[tuple[int, ...], int] = {}
    distinct = [keys.setdefault(tuple(prompts[i]), len(keys)) for i in owners]
    inverse = torch.tensor(distinct, device=device)
    cache, first_logits, prompt_mask, last_position = prefill_shared(model, [list(k) for k in keys], pad_id)
    # The first token's distribution depends on the prompt only: normalise once per distinct prompt.
    first = torch.log_softmax(first_logits.float(), dim=-1)
    columns = [first[inverse, targets[:, 0]][:, None]]
    if width > 1:
        cache.batch_select_indices(inverse)
        inputs, input_mask = targets[:, :-1], mask[:, :-1].long()
        positions = last_position[inverse][:, None] + torch.arange(1, width, device=device)
        out = model(
            input_ids=inputs,
            attention_mask=torch.cat([prompt_mask[inverse], input_mask], dim=1),
            position_ids=positions,
            use_cache=True,
            **{cache_kwarg(model): cache},
        )
        rest = torch.log_softmax(out.logits.float(), dim=-1)
        columns.append(rest.gather(-1, targets[:, 1:, None]).squeeze(-1))
    logps = torch.cat(columns, dim=1)
    return torch.where(mask, logps, torch.zeros_like(logps)), mask


def _checkpointing(model: Any) -> bool:
    """True when the model recomputes activations in training: its layers then return no KV cache, so
    the shared-prefix path cannot run (as in trainers/logps.py)."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # older transformers
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return bool(checkpointing) and model.training


def _plain_candidate_logps(
    model: Any, prompts: list[list[int]], targets: torch.Tensor, mask: torch.Tensor, pad_id: int
) -> torch.Tensor:
    """`candidate_logps`' (N, T) log-probs from one plain forward of each left-padded prompt followed by
    its right-padded candidate (no cache), the LM head on the candidate positions only."""
    width_p, width = max(len(p) for p in prompts), targets.size(1)
    prompt_ids = torch.tensor([[pad_id] * (width_p - len(p)) + p for p in prompts], device=targets.device)
    prompt_mask = torch.tensor(
        [[0] * (width_p - len(p)) + [1] * len(p) for p in prompts], device=targets.device
    )
    attention = torch.cat([prompt_mask, mask.long()], dim=1)
    logits = model(
        input_ids=torch.cat([prompt_ids, targets], dim=1),
        attention_mask=attention,
        position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
        logits_to_keep=width + 1,
        use_cache=False,
    ).logits[:, :-1, :]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)


def score_candidates(
    model: Any,
    prompts: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[Sequence[int]]],
    pad_id: int = 0,
) -> list[list[CandidateScore]]:
    """`candidate_logps` as Python numbers: per prompt, per candidate, the token log-probs and their sum.
    Runs under whatever grad mode the caller set; the numbers are detached either way."""
    logps, mask = candidate_logps(model, prompts, candidates, pad_id)
    sums = logps.sum(dim=-1).detach().double().cpu().tolist()
    rows = logps.detach().cpu().tolist()
    lengths = mask.sum(dim=-1).cpu().tolist()
    scores = [
        CandidateScore(row[:length], total) for row, length, total in zip(rows, lengths, sums, strict=True)
    ]
    grouped, start = [], 0
    for group in candidates:
        grouped.append(scores[start : start + len(group)])
        start += len(group)
    return grouped


def twosome_log_policy(candidate_logliks: Any, word_counts: Any, temperature: float = 1.0) -> torch.Tensor:
    """TWOSOME's action-level policy over one state's candidates, as log-probabilities:

        log pi(a_k | s) = log_softmax_k( log L(a_k) / (n_k * T) )

    with log L(a_k) the summed token log-probs of candidate k (`candidate_logps(...).sum(-1)`), n_k its
    normaliser (word count for TWOSOME's word normalisation; pass token counts or ones for the other
    schemes, see `normalizers`) and T the temperature (1: the policy itself). Differentiable in
    `candidate_logliks` when it is a tensor; lists are accepted too (float64).
    """
    logliks = torch.as_tensor(
        candidate_logliks, dtype=None if torch.is_tensor(candidate_logliks) else torch.float64
    )
    counts = torch.as_tensor(word_counts, dtype=logliks.dtype, device=logliks.device)
    if counts.shape != logliks.shape:
        raise ValueError(f"{tuple(logliks.shape)} log-likelihoods but {tuple(counts.shape)} normalisers")
    if bool((counts <= 0).any()) or temperature <= 0:
        raise ValueError("normalisers and the temperature must be positive")
    return torch.log_softmax(logliks / (counts * temperature), dim=-1)


def word_count(action: str) -> int:
    """Whitespace-separated words of an action name (at least 1): TWOSOME's normaliser."""
    return max(1, len(action.split()))


def normalizers(actions: Sequence[str], token_counts: Sequence[int], mode: str = "word") -> list[int]:
    """Each candidate's normaliser n(a): its word count (`word`), its scored token count (`token`, the
    closing tag included) or 1 (`none`: the plain log-likelihood)."""
    if mode == "word":
        return [word_count(a) for a in actions]
    if mode == "token":
        return [max(1, int(n)) for n in token_counts]
    if mode == "none":
        return [1] * len(actions)
    raise UnknownChoiceError("agent.score_normalization", mode, NORMALIZATIONS)


# ---- acting ------------------------------------------------------------------------------------------
def candidate_text(action: str, answer_tag: str) -> str:
    """The scored continuation of one valid action: the rest of the tagged answer after `<tag>`."""
    return f"{action}</{answer_tag}>"


def check_scoring_backend(backend: Any) -> None:
    """decision=score needs the model's logits: only the hf backend holds the model in this process."""
    if getattr(backend, "name", None) != "hf" or getattr(backend, "model", None) is None:
        raise ConfigError(
            f"agent.decision=score needs model.backend=hf (it scores every valid action with the model's "
            f"log-probs); the {getattr(backend, 'name', type(backend).__name__)} backend only generates"
        )


@contextlib.contextmanager
def _inference(model: Any) -> Iterator[None]:
    """Eval mode and no autograd, restoring the model's train mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def choose(log_policy: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Index of the chosen candidate: the argmax at temperature 0 (ties to the first), else a draw from
    softmax(log_policy / temperature) with the episode's generator."""
    if temperature <= 0:
        return int(np.argmax(log_policy))
    logits = np.asarray(log_policy, dtype=np.float64) / temperature
    probs = np.exp(logits - logits.max())
    return int(rng.choice(len(probs), p=probs / probs.sum()))


def score_decisions(agent: ScoringAgent, contexts: list[StepContext]) -> list[Decision]:
    """`LLMAgent.act` with decision=score: one scoring pass over every valid action of every context.

    Each Decision is valid; its Generation holds the prompt, the chosen candidate's text and token ids,
    that candidate's per-token log-probs under the model (temperature 1; the sampling temperature
    applies to the action softmax only) and `action_probs`, the policy pi(a | s) over the valid actions.
    """
    interface, tokenizer, backend = agent.interface, agent.tokenizer, agent.backend
    check_scoring_backend(backend)
    prompt_texts = [interface.render(interface.messages(ctx), tokenizer) for ctx in contexts]
    prompt_ids = agent.prompt_ids(prompt_texts)
    valid = [list(ctx.info.get("valid_actions") or ctx.env.valid_actions()) for ctx in contexts]
    texts = list(dict.fromkeys(candidate_text(a, interface.answer_tag) for names in valid for a in names))
    encoded = tokenizer(texts, add_special_tokens=False).input_ids if texts else []
    ids_of = {text: list(ids) for text, ids in zip(texts, encoded, strict=True)}
    candidates = [[ids_of[candidate_text(a, interface.answer_tag)] for a in names] for names in valid]
    with _inference(backend.model):
        scores = score_candidates(backend.model, prompt_ids, candidates, getattr(backend, "pad_id", 0))
    temperature = agent.sampling.temperature
    decisions = []
    for ctx, text, ids, names, options, scored in zip(
        contexts, prompt_texts, prompt_ids, valid, candidates, scores, strict=True
    ):
        if not names:  # nothing to score: the interface's invalid-action rule decides
            decisions.append(interface.decide(ctx, None))
            continue
        norms = normalizers(names, [len(c) for c in options], agent.score_normalization)
        log_policy = twosome_log_policy([s.loglik for s in scored], norms).numpy()
        k = choose(log_policy, temperature, ctx.rng)
        decision = Decision(action=ctx.env.action_index(names[k]), valid=True)
        decision.generation = Generation(
            prompt_text=text,
            completion_text=candidate_text(names[k], interface.answer_tag),
            prompt_ids=ids,
            completion_ids=list(options[k]),
            logprobs=list(scored[k].token_logprobs),
            action_probs={name: float(p) for name, p in zip(names, np.exp(log_policy), strict=True)},
            candidates=[list(c) for c in options],
            normalizers=list(norms),
            choice=k,
        )
        decisions.append(decision)
    return decisions


__all__ = [
    "DECISIONS",
    "NORMALIZATIONS",
    "CandidateScore",
    "candidate_logps",
    "candidate_text",
    "check_scoring_backend",
    "choose",
    "normalizers",
    "score_candidates",
    "score_decisions",
    "twosome_log_policy",
    "word_count",
]
