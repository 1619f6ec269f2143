"""MS-GRPO on TRL: `MultiStepGRPOTrainer(trl.GRPOTrainer)` and `train_msgrpo(cfg, run_dir)`.

One TRL "generation" is one MS-GRPO iteration (ALGORITHMS.md §1): roll out B groups x G episodes with the
current policy (agentrl.rollout in lockstep, LLMAgent over the very model being trained), compute group
advantages over episode returns, AAW-sample episodes, and turn every step of the kept episodes into a
(prompt = that step's observation prompt, completion = what the policy generated, advantage A_i) row.
TRL then supplies the clipped token-level surrogate, KL, entropy bonus, optimizer, scheduler, gradient
accumulation, accelerate/PEFT, checkpoint files and RNG state.

TRL internals overridden (trl 1.16; pinned in pyproject because these move):

- `_prepare_inputs` (train mode only). TRL's version calls `_generate_and_score_completions` on a
  fixed-size generation batch, then `split_tensor_dict` cuts it into `steps_per_generation` equal
  slices and silently drops the remainder rows (DESIGN.md's trap). Our row count varies per iteration
  (episode lengths, AAW), so we build the rows ourselves and split them into exactly
  `steps_per_generation` near-equal micro-batches: no row is dropped, no padding row is added. The
  dataset rows TRL hands in are placeholders and are ignored. `_generate_and_score_completions` is not
  used at all (it is single-turn: one prompt -> one completion -> reward functions).
- `_save_checkpoint`: writes through a staging directory and renames, so `checkpoint-<iteration>/` is
  either complete or absent (resume picks the newest one), then prunes old checkpoints.
- `log`: TRL averages its `_metrics` (clip ratios, entropy, KL) into the log row; we add the rollout
  metrics of the iteration and mirror the row to agentrl's MetricsLog (metrics.jsonl + TensorBoard).
- `_get_per_token_logps_and_entropies` (CPU; CUDA with `algo.shared_prefix`): TRL's fused LM head
  scores every prompt position on non-Triton devices. `shared_prefix_logps` scores only completion
  tokens and runs shared prompt text once (exact: values and gradients match a per-row forward).

Training rollouts use `shared_prefix_backend` (same sampling distribution as the hf backend, prompts
de-duplicated and their common prefix run once): on FrozenLake with the default prompt this makes a
CPU iteration ~3-5x cheaper. GRPOConfig's gradient checkpointing (on by default in TRL) is turned off
unless `algo.gradient_checkpointing` asks for it.

The loss type defaults to "dapo": TRL divides by `num_items_in_batch`, which we set to the number of
completion tokens of the whole iteration, so the micro-batch losses add up to one token-level mean.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from agentrl.algos.msgrpo import StepSample, aaw_sample, group_advantages, step_samples, uniform_sample
from agentrl.errors import ConfigError
from agentrl.rollout import Episode, rollout

log = logging.getLogger(__name__)

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAIN_SEED_LIMIT = 1_000_000  # training env seeds stay below eval.seed_offset's default


# ---------------------------------------------------------------------------------------------------------
# pieces that need no trainer
# ---------------------------------------------------------------------------------------------------------
def training_seed(seed: int, iteration: int, group: int, limit: int = TRAIN_SEED_LIMIT) -> int:
    """Deterministic env seed of one group: a hash of (global seed, iteration, group index), below
    `limit`, so a resumed run replays exactly the seeds an uninterrupted run would have used."""
    digest = hashlib.blake2b(f"{seed}:{iteration}:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % limit


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest iteration (staging dirs are never named checkpoint-N)."""
    best: tuple[int, Path] | None = None
    for path in Path(run_dir).glob("checkpoint-*"):
        match = CHECKPOINT_RE.match(path.name)
        if match and path.is_dir() and (path / "trainer_state.json").is_file():
            if best is None or int(match.group(1)) > best[0]:
                best = (int(match.group(1)), path)
    return best[1] if best else None


def random_start_env(make_env: Callable[[], Any], probability: float) -> Callable[[], Any]:
    """Training curriculum for FrozenLake: with `probability`, an episode starts on a random safe cell
    (drawn from the env's own seeded generator, so a group still shares its start). Evaluation never uses
    it. Envs without a grid position are rejected."""
    if probability <= 0:
        return make_env

    def make() -> Any:
        env = make_env()
        if not hasattr(env, "position") or not hasattr(env, "rows"):
            raise ConfigError(
                f"algo.curriculum.random_start needs a grid env with a start cell, not {env.name!r}"
            )
        original_reset = env._reset

        def _reset(options: dict) -> None:
            original_reset(options)
            if env.np_random.random() < probability:
                cells = [(r, c) for r, row in enumerate(env.rows) for c, ch in enumerate(row) if ch in "SF"]
                env.position = cells[int(env.np_random.integers(len(cells)))]

        env._reset = _reset
        return env

    return make


def freeze_lower_layers(model: Any, trainable_layers: int | None) -> int:
    """Full fine-tuning of the top `trainable_layers` decoder layers (and the final norm) only; embeddings
    and lower layers are frozen, so the backward pass stops early (~3x cheaper with 8 of 30 layers on
    CPU). None or <= 0 leaves the model as it is. Returns the number of trainable parameters."""
    if trainable_layers is None or int(trainable_layers) <= 0:
        return sum(p.numel() for p in model.parameters() if p.requires_grad)
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ConfigError(
            "algo.trainable_layers needs a decoder with model.layers (Llama/Qwen/Mistral style)"
        )
    for param in model.parameters():
        param.requires_grad_(False)
    for layer in list(layers)[-int(trainable_layers) :]:
        for param in layer.parameters():
            param.requires_grad_(True)
    norm = getattr(base, "norm", None)
    if norm is not None:
        for param in norm.parameters():
            param.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def rollout_metrics(episodes: list[Episode], advantages: list[float], zero_groups: int, groups: int) -> dict:
    """Per-iteration training-rollout statistics (what the agent did with sampling on)."""
    n = max(len(episodes), 1)
    steps = sum(e.length for e in episodes)
    adv = np.asarray(advantages, dtype=np.float64) if advantages else np.zeros(1)
    return {
        "train/success_rate": sum(e.success for e in episodes) / n,
        "train/mean_return": sum(e.episode_return for e in episodes) / n,
        "train/mean_length": steps / n,
        "train/invalid_rate": sum(e.invalid_count for e in episodes) / max(steps, 1),
        "train/episodes": len(episodes),
        "advantage/mean": float(adv.mean()),
        "advantage/std": float(adv.std()),
        "advantage/abs_mean": float(np.abs(adv).mean()),
        "groups": groups,
        "zero_variance_groups": zero_groups,
    }


def pack_samples(
    samples: list[StepSample], pad_id: int, device: Any, with_old_logprobs: bool = False
) -> dict[str, torch.Tensor]:
    """Rows -> the tensors `GRPOTrainer._compute_loss` reads: left-padded prompts, right-padded
    completions, masks, (B,) advantages and optionally (B, T) old log-probs."""
    width_p = max(len(s.prompt_ids) for s in samples)
    width_c = max(len(s.completion_ids) for s in samples)
    prompt_ids = torch.full((len(samples), width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(samples), width_p), dtype=torch.long)
    completion_ids = torch.full((len(samples), width_c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(samples), width_c), dtype=torch.long)
    old = torch.zeros((len(samples), width_c), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        prompt_ids[row, width_p - p :] = torch.tensor(s.prompt_ids)
        prompt_mask[row, width_p - p :] = 1
        completion_ids[row, :c] = torch.tensor(s.completion_ids)
        completion_mask[row, :c] = 1
        if with_old_logprobs and s.old_logprobs is not None:
            old[row, :c] = torch.tensor(s.old_logprobs[:c])
    batch = {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
    }
    if with_old_logprobs:
        batch["old_per_token_logps"] = old.to(device)
    return batch


def shared_prefix_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the last `completion_length` tokens of each row, computing each
    distinct prompt only once.

    Rows are left-padded prompts followed by right-padded completions. Many MS-GRPO rows share a prompt
    (the G episodes of a group start from the same observation; a small grid has few states), and the
    prompt is ~25x longer than a 4-token answer. So the distinct prompts run once, their KV cache is
    gathered out to all rows (an index op: gradients flow back into the shared prompt computation and add
    up, exactly as if every row had its own copy), and only the completions run per row. Only completion
    positions go through the LM head. Positions follow the attention mask, as in generation.
    """
    prompt_length = input_ids.size(1) - completion_length
    prompt_ids, prompt_mask = input_ids[:, :prompt_length], attention_mask[:, :prompt_length]
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers < 5.2x
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing and model.training:
        # Checkpointed layers return no KV cache: one plain forward, LM head on the completion only.
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            logits_to_keep=completion_length + 1,
            use_cache=False,
        ).logits[:, :-1, :]
        return _completion_logps(logits, input_ids[:, prompt_length:], temperature, compute_entropy)
    pad_id = 0  # any id: padding is masked
    rows = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask, strict=True)]
    keys: dict[tuple[int, ...], int] = {}
    inverse = torch.tensor([keys.setdefault(tuple(r), len(keys)) for r in rows], device=input_ids.device)
    cache, first_logits, mask, last_position = prefill_shared(model, [list(k) for k in keys], pad_id)
    # the first completion token's distribution depends on the prompt only: normalise once per distinct
    # prompt, then pick each row's token (no (rows x vocab) tensor; one-token answers end here)
    targets = input_ids[:, prompt_length:]
    first_logps, first_entropy = _completion_logps(
        first_logits[:, None, :], None, temperature, compute_entropy
    )
    logps = [first_logps[inverse, 0, targets[:, 0]][:, None]]
    entropies = [first_entropy[inverse]] if compute_entropy else []
    if completion_length > 1:
        cache.batch_select_indices(inverse)
        completion_mask = attention_mask[:, prompt_length:-1]
        rest = model(
            input_ids=input_ids[:, prompt_length:-1],
            attention_mask=torch.cat([mask[inverse], completion_mask], dim=1),
            position_ids=last_position[inverse][:, None] + completion_mask.long().cumsum(-1).clamp(min=1),
            use_cache=True,
            **{_cache_kwarg(model): cache},
        )
        rest_logps, rest_entropy = _completion_logps(
            rest.logits, targets[:, 1:], temperature, compute_entropy
        )
        logps.append(rest_logps)
        entropies.append(rest_entropy)
    return torch.cat(logps, dim=1), torch.cat(entropies, dim=1) if compute_entropy else None


#: shortest common prompt prefix worth a separate pass (below it the extra call costs more than it saves)
MIN_SHARED_PREFIX = 16


def prefill_shared(
    model: Any, prompts: list[list[int]], pad_id: int, prefix: tuple[int, list] | None = None
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run distinct prompts through `model`, computing their longest common prefix (the system message
    and instructions, typically most of the prompt) once: the prefix runs as one row, its KV cache is
    gathered out to every prompt, then each prompt's remainder runs on top of it, left-padded between
    prefix and remainder (masked; positions follow the mask, so each row sees exactly its own prompt at
    positions 0..len-1, as if it had run alone). Gradients flow through the shared parts and add up.

    `prefix=(length, [(keys, values) per layer])`: the first `length` tokens of every prompt were computed
    before (same weights: HFBackend's kept prefix states); they are reused instead of run again.

    Returns (KV cache of the U prompts, logits at each prompt's last token (U, V), attention mask (U, L),
    position of each prompt's last token (U,)).
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    if prefix is not None:
        common = prefix[0]
    else:
        shortest = min(len(p) for p in prompts)
        common = 0
        if len(prompts) > 1:
            while common < shortest - 1 and all(p[common] == prompts[0][common] for p in prompts):
                common += 1
        if common < MIN_SHARED_PREFIX:
            common = 0
    kwargs: dict[str, Any] = {}
    prefix_mask = torch.ones((len(prompts), common), dtype=torch.long, device=device)
    if prefix is not None:
        kwargs[_cache_kwarg(model)] = DynamicCache(
            [
                (
                    k[:, :, :common].expand(len(prompts), -1, -1, -1),
                    v[:, :, :common].expand(len(prompts), -1, -1, -1),
                )
                for k, v in prefix[1]
            ]
        )
    elif common:
        out = model(input_ids=torch.tensor([prompts[0][:common]], device=device), use_cache=True)
        cache = _output_cache(out)
        cache.batch_select_indices(torch.zeros(len(prompts), dtype=torch.long, device=device))
        kwargs[_cache_kwarg(model)] = cache
    remainders = [p[common:] for p in prompts]
    width = max(len(r) for r in remainders)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in remainders], device=device)
    rest_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in remainders], device=device)
    mask = torch.cat([prefix_mask, rest_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, common:]
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **kwargs
    )
    return _output_cache(out), out.logits[:, -1, :], mask, positions[:, -1]


def _completion_logps(
    logits: torch.Tensor, targets: torch.Tensor | None, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits / T) at the target tokens (targets None: the whole distribution), and
    (no-grad) entropies, per position."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    logps = log_probs if targets is None else log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropies = None
    if compute_entropy:
        with torch.no_grad():
            entropies = -(log_probs.exp() * log_probs).sum(-1)
    return logps, entropies


def shared_prefix_backend(backend: Any) -> Any:
    """An `HFBackend` whose `generate` runs each distinct prompt of a batch once (see below); other
    backends are returned unchanged."""
    from agentrl.agents.backends import HFBackend

    if type(backend) is not HFBackend:
        return backend

    class SharedPrefixHFBackend(HFBackend):
        """Sampling with prompt de-duplication: the G episodes of a group start from one observation and a
        small grid has few states, so a lockstep batch holds many copies of few prompts. Distinct prompts
        are prefilled once, their KV cache is gathered out to all rows, then every row samples its own
        continuation. Same distribution, log-probs (log_softmax(logits / T) of the sampled token, before
        top-k/top-p, like HFBackend) and trimming as HFBackend; only the random stream differs."""

        #: single-token answers: first-token logits of every prompt seen since the weights last changed
        _memo: dict[tuple[int, ...], torch.Tensor]
        _memo_key: tuple[int, int, int] | None = None

        def generate(self, prompts: list[list[int]], sampling: Any, *, seed: int | None = None) -> list[Any]:
            if not prompts:
                return []
            if sampling.max_new_tokens == 1:
                return self._generate_one(prompts, sampling, seed)
            keys: dict[tuple[int, ...], int] = {}
            inverse = torch.tensor(
                [keys.setdefault(tuple(p), len(keys)) for p in prompts], device=self.device
            )
            device = self.device
            generator = None
            if seed is not None and sampling.do_sample:
                generator = torch.Generator(device=device).manual_seed(int(seed))
            eos = torch.tensor(self.eos_ids, device=device)
            was_training = self.model.training
            self.model.eval()
            try:
                with torch.no_grad():
                    cache, logits, mask, position = self._prefill([list(k) for k in keys])
                    cache.batch_select_indices(inverse)
                    logits, mask, position = logits[inverse], mask[inverse], position[inverse]
                    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
                    tokens, logps = [], []
                    for step in range(sampling.max_new_tokens):
                        chosen, logp = _sample(logits.float(), sampling, generator)
                        chosen = torch.where(done, torch.full_like(chosen, self.pad_id), chosen)
                        tokens.append(chosen)
                        logps.append(logp)
                        done |= torch.isin(chosen, eos)
                        if sampling.stop:
                            tails = torch.stack(tokens[-8:], 1).tolist()
                            texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
                            done |= torch.tensor(
                                [any(s in t for s in sampling.stop) for t in texts], device=device
                            )
                        if bool(done.all()) or step + 1 == sampling.max_new_tokens:
                            break
                        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                        position = position + 1
                        out = self.model(
                            input_ids=chosen[:, None],
                            attention_mask=mask,
                            position_ids=position[:, None],
                            **{_cache_kwarg(self.model): cache},
                            use_cache=True,
                        )
                        cache = _output_cache(out)
                        logits = out.logits[:, -1, :]
            finally:
                self.model.train(was_training)
            return self._trim(torch.stack(tokens, 1), torch.stack(logps, 1), sampling)

        def _generate_one(self, prompts: list[list[int]], sampling: Any, seed: int | None) -> list[Any]:
            """One-token answers (an action word after a prefill) need no KV cache, only each prompt's
            next-token logits, and those stay valid until the weights change. In a lockstep rollout on a
            small grid the same few observations recur at every step, so each distinct prompt is run once
            per rollout instead of once per step. Exact: the memo is dropped when any parameter changes."""
            key = self._weights_key()
            if self._memo_key != key:
                self._memo, self._memo_key = {}, key
            missing = list(dict.fromkeys(tuple(p) for p in prompts if tuple(p) not in self._memo))
            if missing:
                was_training = self.model.training
                self.model.eval()
                try:
                    with torch.no_grad():
                        _, logits, _, _ = self._prefill([list(k) for k in missing])
                finally:
                    self.model.train(was_training)
                self._memo.update(zip(missing, logits.float(), strict=True))
            scores = torch.stack([self._memo[tuple(p)] for p in prompts])
            generator = None
            if seed is not None and sampling.do_sample:
                generator = torch.Generator(device=scores.device).manual_seed(int(seed))
            chosen, logp = _sample(scores, sampling, generator)
            return self._trim(chosen[:, None], logp[:, None], sampling)

        def _prefill(self, prompts: list[list[int]]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
            """`prefill_shared` on top of HFBackend's kept KV states of the prompts' shared head (chat
            template + instructions), computed once per weights instead of once per call."""
            shared = self._shared_prefix(prompts)
            return prefill_shared(
                self.model, prompts, self.pad_id, (shared, self._prefix_states) if shared else None
            )

        def _trim(self, tokens: torch.Tensor, logps: torch.Tensor, sampling: Any) -> list[Any]:
            results = []
            for row, lps in zip(tokens.tolist(), logps.cpu().tolist(), strict=True):
                end = self._completion_length(row, sampling.stop)
                results.append((row[:end], lps[:end]))
            return results

    return SharedPrefixHFBackend(backend.model, backend.tokenizer)


def _output_cache(out: Any) -> Any:
    """The KV cache of a model output (`cache` in transformers >= 5.2x, `past_key_values` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _cache_kwarg(model: Any) -> str:
    """Name of the forward argument that takes a KV cache (transformers renamed it to `cache`)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def _sample(scores: torch.Tensor, sampling: Any, generator: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row (top-k/top-p sampling, or greedy), and its log_softmax(scores / T) before
    top-k/top-p, as HFBackend records it."""
    temperature = sampling.temperature if sampling.do_sample else 1.0
    log_probs = torch.log_softmax(scores / temperature, dim=-1)
    if sampling.do_sample:
        warped = _top_k_top_p(scores / temperature, sampling.top_k, sampling.top_p)
        chosen = torch.multinomial(torch.softmax(warped, -1), 1, generator=generator).squeeze(1)
    else:
        chosen = scores.argmax(-1)
    return chosen, log_probs.gather(1, chosen[:, None]).squeeze(1)


def _top_k_top_p(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k and outside the smallest set with probability >= top_p."""
    if top_k and top_k > 0:
        kth = torch.topk(scores, min(int(top_k), scores.size(-1)), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_scores, -1).cumsum(-1)
        remove = cumulative - torch.softmax(sorted_scores, -1) > top_p  # keep the token that crosses top_p
        scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return scores


def split_even(items: list[Any], parts: int) -> list[list[Any]]:
    """`parts` consecutive chunks whose sizes differ by at most one (none dropped)."""
    base, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        chunks.append(items[start : start + size])
        start += size
    return chunks


# ---------------------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------------------
def _trainer_class() -> type:
    """Defined lazily: importing trl costs seconds and this module is imported by the CLI."""
    from trl import GRPOTrainer

    class MultiStepGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose generation step is a multi-step MS-GRPO iteration (see the module doc)."""

        def __init__(
            self, *args: Any, iteration_fn: Callable[[int], tuple[list[StepSample], dict]], **kwargs
        ):
            super().__init__(*args, **kwargs)
            self.iteration_fn = iteration_fn
            self._micro_step = 0
            self._buffer: list[dict[str, Any]] | None = None
            self._iteration_metrics: dict[str, float] = {}
            self._iteration_start = time.perf_counter()
            self.metrics_sink: Callable[[int, dict], None] | None = None
            self.keep_checkpoints = 2
            self.shared_prefix = False  # on CUDA too (on CPU always)
            self.trl_logprobs = False  # force TRL's own log-prob path (benchmarks/trainer_overhead.py)

        # -- generation: one MS-GRPO iteration per optimizer step ---------------------------------
        def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
            if not self.model.training:  # TRL's eval loop is not used by agentrl (evaluation.py is)
                return super()._prepare_inputs(generation_batch)
            parts = self.args.steps_per_generation
            if self._micro_step % parts == 0 or self._buffer is None:
                self._buffer = self._build_iteration(parts)
            inputs = self._buffer[self._micro_step % parts]
            self._micro_step += 1
            return inputs

        def _build_iteration(self, parts: int) -> list[dict[str, Any]]:
            self._iteration_start = time.perf_counter()
            iteration = self.state.global_step  # 0-based index of the iteration being built
            samples, metrics = self.iteration_fn(iteration)
            self._iteration_metrics = metrics
            device = self.accelerator.device
            pad_id = self.processing_class.pad_token_id
            with_old = self.num_iterations > 1
            total_tokens = sum(len(s.completion_ids) for s in samples)
            if not samples:
                # No informative episode: a zero-advantage placeholder row keeps the accumulation loop
                # intact; its loss and gradient are exactly 0.
                metrics["update_skipped"] = 1.0
                token = [int(pad_id)]
                samples = [StepSample(token, token, None, 0.0, -1, -1)]
            else:
                metrics["update_skipped"] = 0.0
            metrics["samples"] = len(samples) if total_tokens else 0
            metrics["train_tokens"] = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
            chunks = split_even(samples, parts)
            # Fewer rows than micro-batches: repeat the last row with advantage 0 (no gradient).
            filler = dataclasses.replace(samples[-1], advantage=0.0)
            batches = []
            for chunk in chunks:
                batch = pack_samples(chunk or [filler], pad_id, device, with_old_logprobs=with_old)
                batch["num_items_in_batch"] = torch.tensor(float(max(total_tokens, 1)), device=device)
                batches.append(batch)
            self._update_start = time.perf_counter()
            return batches

        # -- log-probs of the completion tokens ------------------------------------------------
        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            compute_aux_loss: bool = False,
            **multimodal: Any,
        ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
            # On devices without Triton (CPU), TRL's fused LM head projects EVERY position (prompt included)
            # through the vocabulary, in Python-level tiles, forward and backward: with ~100-token prompts
            # and ~4-token answers that is most of the update time. `shared_prefix_logps` sends only the
            # completion positions through the head and runs each distinct prompt once (exact, see its
            # doc). CUDA/XPU (`algo.shared_prefix` there), multimodal inputs and MoE aux losses keep TRL's
            # path.
            if (
                (input_ids.device.type in ("cuda", "xpu") and not self.shared_prefix)
                or self.trl_logprobs
                or compute_aux_loss
                or any(v is not None for v in multimodal.values())
            ):
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=compute_aux_loss,
                    **multimodal,
                )
            batch_size = batch_size or input_ids.size(0)
            all_logps, all_entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                logps, entropies = shared_prefix_logps(
                    model,
                    input_ids[start : start + batch_size],
                    attention_mask[start : start + batch_size],
                    logits_to_keep,
                    self.temperature,
                    compute_entropy,
                )
                all_logps.append(logps)
                if compute_entropy:
                    all_entropies.append(entropies)
            return torch.cat(all_logps), torch.cat(all_entropies) if compute_entropy else None, None

        # -- logging ---------------------------------------------------------------------------
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self.model.training and self._iteration_metrics:
                now = time.perf_counter()
                update_s = now - getattr(self, "_update_start", now)
                extra = dict(self._iteration_metrics)
                extra["update_s"] = update_s
                extra["iteration_s"] = now - self._iteration_start
                if update_s > 0:
                    extra["update_tokens_per_s"] = extra.get("train_tokens", 0) / update_s
                if extra.get("update_skipped"):
                    # TRL's entropy and clip stats would describe the zero-advantage placeholder row
                    logs = {
                        k: v for k, v in logs.items() if k != "entropy" and not k.startswith("clip_ratio")
                    }
                logs = {**logs, **extra}
                self._iteration_metrics = {}
            super().log(logs, start_time)
            if self.metrics_sink is not None and "train_runtime" not in logs:
                self.metrics_sink(self.state.global_step, logs)

        # -- atomic checkpoints ------------------------------------------------------------------
        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            final_root = Path(self.args.output_dir)
            name = f"checkpoint-{self.state.global_step}"
            staging = final_root / f".staging-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            self.args.output_dir = str(staging)
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self.args.output_dir = str(final_root)
            target = final_root / name
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging / name, target)
            shutil.rmtree(staging, ignore_errors=True)
            self._prune_checkpoints(final_root)
            log.info("Saved %s", target)

        def _prune_checkpoints(self, root: Path) -> None:
            found = sorted(
                (int(m.group(1)), p) for p in root.glob("checkpoint-*") if (m := CHECKPOINT_RE.match(p.name))
            )
            for _, path in found[: max(len(found) - max(self.keep_checkpoints, 1), 0)]:
                shutil.rmtree(path, ignore_errors=True)

    return MultiStepGRPOTrainer


def __getattr__(name: str) -> Any:
    # `from agentrl.trainers.multistep_grpo import MultiStepGRPOTrainer` works without importing trl at
    # module import time.
    if name == "MultiStepGRPOTrainer":
        return _trainer_class()
    raise AttributeError(name)


# ---------------------------------------------------------------------------------------------------------
# the training run
# ---------------------------------------------------------------------------------------------------------
def _algo(cfg: DictConfig, key: str, default: Any = None) -> Any:
    value = OmegaConf.select(cfg, f"algo.{key}", default=default)
    return default if value is None else value


def grpo_config(cfg: DictConfig, run_dir: Path, device: str) -> Any:
    """TRL GRPOConfig from algo.*: one optimizer step per iteration, no TRL-side logging backends."""
    from trl import GRPOConfig

    parts = int(_algo(cfg, "gradient_accumulation_steps", 1))
    if parts < 1:
        raise ConfigError("algo.gradient_accumulation_steps must be >= 1")
    scheduler = str(_algo(cfg, "lr_scheduler", "constant"))
    if scheduler == "constant" and int(_algo(cfg, "warmup_steps", 0)) > 0:
        scheduler = "constant_with_warmup"  # transformers' "constant" ignores warmup_steps silently
    cuda = device.startswith("cuda")
    dtype = str(OmegaConf.select(cfg, "model.dtype", default="auto") or "auto")
    bf16 = cuda and dtype in ("auto", "bf16", "bfloat16")
    return GRPOConfig(
        # transformers 5's name for gradient checkpointing; TRL turns it on by default, which on CPU costs
        # a second forward and disables the KV cache that shared_prefix_logps relies on.
        activation_checkpointing=bool(_algo(cfg, "gradient_checkpointing", False)),
        output_dir=str(run_dir),
        max_steps=int(_algo(cfg, "iterations")),
        per_device_train_batch_size=2,  # placeholder rows; real rows come from rollouts
        gradient_accumulation_steps=parts,
        steps_per_generation=parts,
        num_generations=2,
        num_iterations=1,
        learning_rate=float(_algo(cfg, "learning_rate")),
        lr_scheduler_type=scheduler,
        warmup_steps=int(_algo(cfg, "warmup_steps", 0)),
        weight_decay=float(_algo(cfg, "weight_decay", 0.0)),
        max_grad_norm=float(_algo(cfg, "max_grad_norm", 1.0)),
        adam_beta1=float(_algo(cfg, "adam_beta1", 0.9)),
        adam_beta2=float(_algo(cfg, "adam_beta2", 0.999)),
        beta=float(_algo(cfg, "beta", 0.0)),
        epsilon=float(_algo(cfg, "epsilon", 0.2)),
        epsilon_high=_algo(cfg, "epsilon_high"),
        loss_type=str(_algo(cfg, "loss_type", "dapo")),
        entropy_coef=float(_algo(cfg, "entropy_coef", 0.0)),
        # TRL recomputes log-probs as log_softmax(logits / temperature), like our sampler: keep them equal.
        temperature=float(_algo(cfg, "temperature", 1.0)),
        bf16=bf16,
        use_cpu=not cuda,
        logging_steps=1,
        save_strategy="no",  # we save from a callback at our cadence (atomic, see _save_checkpoint)
        report_to="none",
        disable_tqdm=True,
        seed=int(cfg.seed),
        data_seed=int(cfg.seed),
        remove_unused_columns=False,
        log_completions=False,
        dataloader_num_workers=0,
        save_only_model=False,
    )


def train_msgrpo(cfg: DictConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Train with MS-GRPO as `cfg` says; write metrics.jsonl, checkpoints, final/ and eval.json into
    `run_dir`. With `resume`, continue from the newest complete checkpoint in `run_dir`. Returns the final
    evaluation metrics (also in eval.json, beside `before` and `train_time_s`)."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from agentrl.agents.llm import build_llm_agent
    from agentrl.evaluation import env_factory, eval_seeds, evaluate, write_eval
    from agentrl.models import load_model
    from agentrl.runlog import MetricsLog, atomic_dir, progress, write_json

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    threads = _algo(cfg, "torch_threads")
    if threads:
        torch.set_num_threads(int(threads))
    iterations = int(_algo(cfg, "iterations"))
    checkpoint = None
    if resume:
        checkpoint = newest_checkpoint(run_dir)
        if checkpoint is None:
            log.warning("No complete checkpoint in %s: starting from the beginning", run_dir)
        else:
            log.info("Resuming from %s", checkpoint)

    model, tokenizer = load_model(cfg.model, for_training=True)
    device = str(next(model.parameters()).device)
    trainable = _algo(cfg, "trainable_layers")
    if trainable and int(OmegaConf.select(cfg, "model.lora.r", default=0) or 0) > 0:
        raise ConfigError("algo.trainable_layers is for full fine-tuning; with LoRA set model.lora.r=0")
    n_trainable = freeze_lower_layers(model, trainable)
    log.info("Trainable parameters: %d", n_trainable)
    agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    shared_prefix = bool(_algo(cfg, "shared_prefix", True))
    if shared_prefix:
        agent.backend = shared_prefix_backend(agent.backend)
    base_sampling = agent.sampling
    overrides = {"max_new_tokens": _algo(cfg, "max_new_tokens")}
    train_sampling = dataclasses.replace(
        base_sampling,
        temperature=float(_algo(cfg, "temperature", 1.0)),
        top_k=int(_algo(cfg, "top_k", 0)),
        top_p=float(_algo(cfg, "top_p", 1.0)),
        **{k: int(v) for k, v in overrides.items() if v is not None},
    )
    eval_sampling = dataclasses.replace(
        base_sampling,
        temperature=float(_algo(cfg, "eval_temperature", 0.0)),
        **{k: int(v) for k, v in overrides.items() if v is not None},
    )

    eval_env = env_factory(cfg.env)
    train_env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    if _algo(cfg, "max_steps") is not None:
        train_env_cfg["max_steps"] = int(_algo(cfg, "max_steps"))
    train_env = random_start_env(
        env_factory(train_env_cfg), float(_algo(cfg, "curriculum.random_start", 0.0))
    )
    seeds_eval = eval_seeds(cfg)
    seed_limit = int(OmegaConf.select(cfg, "eval.seed_offset", default=TRAIN_SEED_LIMIT))

    periodic_episodes = _algo(cfg, "periodic_eval_episodes")

    def run_eval(description: str, episodes: int | None = None) -> tuple[dict, list[Episode]]:
        agent.sampling = eval_sampling
        try:
            return evaluate(
                eval_env,
                agent,
                seeds_eval[: episodes or None],
                lockstep=bool(cfg.eval.lockstep),
                description=description,
                agent_seed=int(cfg.seed),
            )
        finally:
            agent.sampling = train_sampling

    # -- before-training eval (kept across resumes) --
    before_path = run_dir / "eval_before.json"
    before: dict[str, Any] | None = None
    if before_path.is_file():
        import json

        before = json.loads(before_path.read_text())
    elif bool(_algo(cfg, "eval_before", True)) and checkpoint is None:
        before, _ = run_eval("eval before training")
        write_json(before_path, before)
        log.info("Before training: success %.3f return %.3f", before["success_rate"], before["mean_return"])

    group_size = int(_algo(cfg, "group_size"))
    groups = int(_algo(cfg, "groups_per_iteration"))
    if group_size < 2 or groups < 1:
        raise ConfigError("algo.group_size must be >= 2 and algo.groups_per_iteration >= 1")
    min_informative = int(_algo(cfg, "min_informative_groups", 1))
    max_rounds = max(int(_algo(cfg, "max_rollout_rounds", 1)), 1)
    aaw_enabled = bool(_algo(cfg, "aaw.enabled", True))
    aaw_fraction = _algo(cfg, "aaw.fraction")
    aaw_count = _algo(cfg, "aaw.count")
    aaw_eps = float(_algo(cfg, "aaw.eps", 1e-3))
    normalize_std = bool(_algo(cfg, "normalize_std", True))
    adv_eps = float(_algo(cfg, "eps", 1e-6))

    eval_penalty = agent.interface.invalid_penalty
    train_penalty = None if _algo(cfg, "invalid_penalty") is None else float(_algo(cfg, "invalid_penalty"))

    def iteration_fn(iteration: int) -> tuple[list[StepSample], dict]:
        """Roll out, score, AAW-sample: the rows of one update (and the iteration's metrics)."""
        agent.sampling = train_sampling
        if train_penalty is not None:  # training-only reward shaping knob; evaluation keeps the agent's
            agent.interface.invalid_penalty = train_penalty
        start = time.perf_counter()
        episodes: list[Episode] = []
        rounds = 0
        informative = 0
        while rounds < max_rounds:
            seeds = [
                training_seed(int(cfg.seed), iteration, rounds * groups + g, seed_limit)
                for g in range(groups)
            ]
            group_ids = [rounds * groups + g for g in range(groups) for _ in range(group_size)]
            batch = rollout(
                train_env,
                agent,
                [s for s in seeds for _ in range(group_size)],
                group_ids,
                agent_seed=training_seed(int(cfg.seed), iteration, 10_000 + rounds),
            )
            episodes.extend(batch)
            rounds += 1
            informative = len({e.group_id for e in episodes}) - len(_zero_groups(episodes))
            if informative >= min_informative:
                break
        rollout_s = time.perf_counter() - start
        advantages = group_advantages(episodes, normalize_std=normalize_std, eps=adv_eps)
        rng = np.random.default_rng([int(cfg.seed), iteration, 7])
        if aaw_enabled:
            keep = aaw_sample(
                episodes, advantages, fraction=aaw_fraction, count=aaw_count, rng=rng, eps=aaw_eps
            )
        else:
            keep = uniform_sample(episodes, fraction=aaw_fraction, count=aaw_count, rng=rng)
        samples = step_samples(episodes, advantages, keep)
        agent.interface.invalid_penalty = eval_penalty
        gen_tokens = sum(len(s.completion_ids) for e in episodes for s in e.steps)
        prompt_tokens = sum(len(s.prompt_ids) for e in episodes for s in e.steps)
        metrics = rollout_metrics(
            episodes, advantages, len(_zero_groups(episodes)), len({e.group_id for e in episodes})
        )
        metrics.update(
            {
                "rollout_rounds": rounds,
                "episodes_kept": len(keep),
                "rollout_s": rollout_s,
                "rollout_tokens_per_s": (gen_tokens + prompt_tokens) / max(rollout_s, 1e-9),
                "generated_tokens": gen_tokens,
            }
        )
        return samples, metrics

    # -- TRL trainer --
    args = grpo_config(cfg, run_dir, device)
    placeholder = Dataset.from_dict({"prompt": ["<rollout>"] * (2 * args.steps_per_generation)})
    trainer_cls = _trainer_class()
    trainer = trainer_cls(
        model=model,
        reward_funcs=[_unused_reward],
        args=args,
        train_dataset=placeholder,
        processing_class=tokenizer,
        iteration_fn=iteration_fn,
    )
    trainer.keep_checkpoints = int(_algo(cfg, "keep_checkpoints", 2))
    trainer.shared_prefix = shared_prefix
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)  # our progress bar and metrics.jsonl replace its prints
    trainer.remove_callback(ProgressCallback)
    metrics_log = MetricsLog(run_dir, resume=resume)
    eval_every = int(_algo(cfg, "eval_every", 0))
    checkpoint_every = int(_algo(cfg, "checkpoint_every", 0))
    time_limit = float(_algo(cfg, "time_limit_minutes", 0.0)) * 60
    pending_eval: dict[str, Any] = {}
    curve: list[dict[str, Any]] = []

    def sink(step: int, logs: dict[str, Any]) -> None:
        row = {_metric_name(k): v for k, v in logs.items()}
        row.update(pending_eval)
        pending_eval.clear()
        metrics_log.log(step, row)
        curve.append({"iteration": step, **row})

    trainer.metrics_sink = sink

    class Cadence(TrainerCallback):
        """Periodic held-out eval and checkpoints, at our iteration cadence, plus the progress line."""

        def __init__(self, bar: Any):
            self.bar = bar

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            step = state.global_step
            if time_limit and time.perf_counter() - start >= time_limit:
                log.info("Time limit reached after iteration %d: stopping", step)
                control.should_training_stop = True
                return control
            if eval_every and step % eval_every == 0 and step < iterations:
                metrics, _ = run_eval(f"eval @ {step}", periodic_episodes)
                pending_eval.update({f"eval/{k}": v for k, v in metrics.items()})
            return control

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            # the rollout backend's caches (prefix KV, one-token memo) hold the old weights' outputs; the
            # fused CPU AdamW does not move parameter version counters, so say it explicitly
            changed = getattr(agent.backend, "weights_changed", None)
            if changed is not None:
                changed()
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
            step = state.global_step
            if checkpoint_every and step % checkpoint_every == 0 and step < iterations:
                trainer._save_checkpoint(trainer.model, None)
            if logs and "train_runtime" not in logs:
                line = (
                    f"success {logs.get('train/success_rate', 0):.2f} return {logs.get('train/mean_return', 0):.2f}"
                    f" zero-var {logs.get('zero_variance_groups', 0)}/{logs.get('groups', 0)}"
                    f" kept {logs.get('episodes_kept', 0)} loss {logs.get('loss', 0):.4f}"
                )
                self.bar.advance(line)
            return control

    start = time.perf_counter()
    done_before = int(checkpoint.name.split("-")[1]) if checkpoint else 0
    try:
        with progress("msgrpo", total=iterations) as bar:
            if done_before:
                bar.advance(n=done_before)
            trainer.add_callback(Cadence(bar))
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except KeyboardInterrupt:
        # Ctrl-C: keep what was learned up to the last finished iteration, then let the CLI exit.
        if (
            trainer.state.global_step > done_before
            and not (run_dir / f"checkpoint-{trainer.state.global_step}").exists()
        ):
            log.warning("Interrupted: saving checkpoint-%d before exiting", trainer.state.global_step)
            trainer._save_checkpoint(trainer.model, None)
        metrics_log.close()
        raise
    train_time = time.perf_counter() - start
    metrics_log.close()

    if bool(_algo(cfg, "save_final", True)):
        with atomic_dir(run_dir / "final") as tmp:
            trainer.save_model(str(tmp))
            tokenizer.save_pretrained(str(tmp))
    final, episodes = run_eval("eval after training")
    extra: dict[str, Any] = {"algo": "msgrpo", "iterations": iterations, "train_time_s": round(train_time, 3)}
    if before is not None:
        extra["before"] = before
    write_eval(run_dir, final, episodes, transcripts=bool(cfg.eval.transcripts), **extra)
    log.info("After training: success %.3f return %.3f", final["success_rate"], final["mean_return"])
    return {**final, "before": before, "train_time_s": round(train_time, 3)}


def _zero_groups(episodes: list[Episode]) -> list[int]:
    from agentrl.algos.msgrpo import zero_variance_groups

    return zero_variance_groups(episodes)


def _unused_reward(*args: Any, **kwargs: Any) -> list[float]:
    """GRPOTrainer requires a reward function; MS-GRPO's rewards come from the environment instead."""
    raise RuntimeError("not called: MultiStepGRPOTrainer scores episodes itself")


# TRL's names -> the names the issue asks for (the rest keep TRL's names: entropy, kl, clip_ratio/...).
_RENAMES = {"clip_ratio/region_mean": "clip_fraction"}


def _metric_name(key: str) -> str:
    return _RENAMES.get(key, key)


__all__ = [
    "grpo_config",
    "newest_checkpoint",
    "pack_samples",
    "random_start_env",
    "split_even",
    "train_msgrpo",
    "training_seed",
]
