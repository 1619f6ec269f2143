"""The one trainer of every LLM algorithm: `MultiStepTrainer(trl.GRPOTrainer)` and `train_llm`.

One TRL "generation" is one iteration of multi-step RL (docs/architecture.md#one-training-iteration):

    rollout      groups of episodes with the current policy (rollout.collect_groups: lockstep, dynamic
                 sampling), through a view of the policy with the training sampling settings
    credit       the algorithm's pure credit assignment (agentrl/algos/<name>.py) -> rows with advantages
    pack         rows -> TRL's tensors: prompt = that step's observation prompt, completion = what the
                 policy generated there, advantages, old log-probs, reference log-probs when beta > 0,
                 and with a critic (trainers/critic.py) its hidden states, old values and value targets
    update       TRL's clipped token-level surrogate, KL, the value loss, optimizer step, scheduler,
                 accumulation; `algo.ppo_epochs` passes with a KL gate on the policy's step
    callbacks    rollout-cache reset, time limit, periodic eval, checkpoints, metrics (callbacks.py)

TRL internals overridden (trl 1.16, pinned in pyproject because these move):

- `_prepare_inputs` (train mode only): TRL's version generates a fixed-size single-turn batch and its
  `split_tensor_dict` drops remainder rows. The row count here varies per iteration (episode lengths,
  sampling), so the rows are built here and split into exactly `steps_per_generation` near-equal
  micro-batches: no row is dropped, none is added. The dataset rows TRL hands in are placeholders.
- `_get_per_token_logps_and_entropies`: on a CPU with one process, `trainers/logps.py` scores only
  completion tokens and runs shared prompt text once (exact). CUDA keeps TRL's fused LM head (the kernel
  would build full-vocabulary fp32 logits); `algo.shared_prefix` then applies to the rollouts.
- `_compute_loss`: TRL's loss, plus the critic's value loss (POAD, TWOSOME, RLFT with GAE); action-level
  rows (TWOSOME) use the clipped surrogate on the candidate-set policy instead of TRL's token loss.
- The value head has its own AdamW (its learning rate, eps 1e-5) and schedule, outside the model's
  optimizer: FSDP's and DeepSpeed's optimizer wrappers hold only the module's own parameters. It steps
  in the pre-optimizer-step hook, and checkpoints carry its state (`value_head_optimizer.pt`).
- `training_step`: with `algo.max_batch_tokens`, a micro-batch above the budget runs as several
  forward/backward passes (`split_by_tokens`); the gradient is the same. The default `auto` bounds the
  LM-head positions per pass by free memory and vocabulary (`resolve_max_batch_tokens`).
- `log`: adds the iteration's rollout metrics to TRL's averaged loss statistics.
- `_save_checkpoint`: writes `checkpoint-<iteration>/` atomically with a manifest of its files (written
  last; resume checks it), then prunes old ones.
- `_load_optimizer_and_scheduler`: a model-only checkpoint (`algo.save_optimizer=false`) resumes with a
  fresh optimizer and the scheduler advanced to the checkpoint's iteration.

Several processes (docs/distributed.md): each rolls out its own groups (the rank is in their seeds), the
token count that divides the loss is summed over processes, every process runs the same passes (blank
ones where it has fewer; TRL's per-row gathers are padded), the value head's gradients are summed, and
process 0 alone writes metrics, eval results and the checkpoints' shared files. Under ZeRO-3/FSDP the
data-dependent forwards (rollouts, evaluation, no-grad log-probs, critic features) run inside
`synced_forwards`. With `model.backend=vllm` the rollouts come from TRL's vLLM engine, synced before each.

SIGTERM, SIGINT and SIGUSR1 during training (signals.py) save the last finished iteration's checkpoint,
then raise `TrainingInterrupted` (the run exits with 128 + the signal number).

The loss type defaults to "dapo": TRL divides by `num_items_in_batch`, set to the completion tokens of
the whole iteration, so the micro-batch losses add up to one token-level mean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from trl import GRPOConfig, GRPOTrainer

from agentrl import distributed as dist
from agentrl.algos import LLM_ALGORITHMS
from agentrl.console import set_torch_threads
from agentrl.errors import ConfigError
from agentrl.rollout import collect_groups, informative_group_count
from agentrl.runlog import (
    MetricsLog,
    manifest_path,
    newest_valid_checkpoint,
    progress,
    prune_checkpoints,
    write_json,
    write_manifest,
)
from agentrl.syncforward import synced_forwards
from agentrl.trainers.callbacks import (
    BeforeTraining,
    CheckpointEvery,
    MetricsWriter,
    PeriodicEval,
    PPOEpochs,
    RolloutCacheReset,
    SignalSafePoints,
    SkipEmptyUpdate,
    TimeLimit,
)
from agentrl.trainers.critic import Critic, clipped_value_loss
from agentrl.trainers.logps import kernel_applies, shared_prefix_logps
from agentrl.trainers.signals import StopSignals, TrainingInterrupted, signal_name
from agentrl.types import Episode, StepSample, TrainResult

log = logging.getLogger(__name__)

TRAIN_SEED_LIMIT = 1_000_000  # training env seeds stay below eval.seed_offset's default
# TRL's metric names -> ours (the rest keep TRL's names: entropy, kl, clip_ratio/...)
METRIC_RENAMES = {"clip_ratio/region_mean": "clip_fraction"}


# ---------------------------------------------------------------------------------------------------------
# pieces that need no trainer
# ---------------------------------------------------------------------------------------------------------
def training_seed(seed: int, iteration: int, group: int, limit: int = TRAIN_SEED_LIMIT) -> int:
    """Deterministic env seed of one group: a hash of (global seed, iteration, group index), below
    `limit`, so a resumed run replays exactly the seeds an uninterrupted run would have used."""
    digest = hashlib.blake2b(f"{seed}:{iteration}:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % limit


def global_group(round_: int, group: int, groups: int, rank: int = 0, world: int = 1) -> int:
    """Index of process `rank`'s group `group` (of `groups` per process) in rollout round `round_`,
    numbered over all `world` processes: one process with 2B groups plays exactly the groups two
    processes with B groups each play, and no two processes play the same one."""
    return (round_ * world + rank) * groups + group


def rollout_metrics(episodes: list[Episode], advantages: list[float]) -> dict[str, float]:
    """Per-iteration statistics of the training rollouts (what the agent did with sampling on)."""
    n = max(len(episodes), 1)
    steps = sum(e.length for e in episodes)
    adv = np.asarray(advantages, dtype=np.float64) if advantages else np.zeros(1)
    groups = len({e.group_id for e in episodes})
    return {
        "train/success_rate": sum(e.success for e in episodes) / n,
        "train/mean_return": sum(e.episode_return for e in episodes) / n,
        "train/mean_length": steps / n,
        "train/invalid_rate": sum(e.invalid_count for e in episodes) / max(steps, 1),
        "train/untagged_rate": sum(e.untagged_count for e in episodes) / max(steps, 1),
        "train/episodes": len(episodes),
        "advantage/mean": float(adv.mean()),
        "advantage/std": float(adv.std()),
        "advantage/abs_mean": float(np.abs(adv).mean()),
        "groups": groups,
        "zero_variance_groups": groups - informative_group_count(episodes),
    }


#: per-process metrics that add up over processes; those in MAX_METRICS take the slowest process's
#: value; the rest (rates, means) are weighted by the process's episodes
SUM_METRICS = frozenset(
    {
        "train/episodes",
        "groups",
        "zero_variance_groups",
        "samples",
        "train_tokens",
        "generated_tokens",
        "episodes_kept",
        "rollout_tokens_per_s",
        "update_tokens_per_s",
    }
)
MAX_METRICS = frozenset({"rollout_rounds", "rollout_s", "update_s", "iteration_s", "update_skipped"})


def merge_process_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """One iteration's metrics from every process's own (rank order) -> the run's: counts and throughputs
    add up, times are the slowest process's, rates and means are weighted by episodes."""
    if len(rows) == 1:
        return rows[0]
    weights = [max(float(r.get("train/episodes", 1)), 1e-9) for r in rows]
    merged: dict[str, float] = {}
    for key in rows[0]:
        values = [r[key] for r in rows if key in r]
        if key in SUM_METRICS:
            merged[key] = sum(values)
        elif key in MAX_METRICS:
            merged[key] = max(values)
        else:
            pairs = [(r[key], w) for r, w in zip(rows, weights, strict=True) if key in r]
            merged[key] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
    return merged


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
    batch: dict[str, Any], budget: int, completions_only: bool = False
) -> list[dict[str, Any]]:
    """A packed micro-batch as consecutive row chunks of at most `budget` padded tokens each (rows x
    (prompt + completion width), times the candidates of action-level rows; `completions_only`: rows x
    completion width, the LM-head positions), each trimmed to its own widths; a row larger than the
    budget is a chunk of its own. Values that are not per row (`num_items_in_batch`) are shared, so the
    chunks' losses add up to the micro-batch's."""
    prompt_mask, completion_mask = batch["prompt_mask"], batch["completion_mask"]
    rows = prompt_mask.size(0)
    prompt_len = prompt_mask.sum(-1).tolist()
    completion_len = completion_mask.sum(-1).tolist()
    candidates = [len(c) for c in batch["candidates"]] if "candidates" in batch else [1] * rows
    chunks: list[tuple[int, int]] = []
    start, width_p, width_c, widest = 0, 0, 0, 1
    for row in range(rows):
        p, c, k = (
            max(width_p, prompt_len[row]),
            max(width_c, completion_len[row]),
            max(widest, candidates[row]),
        )
        if row > start and (row - start + 1) * (c if completions_only else p + c) * k > budget:
            chunks.append((start, row))
            start, p, c, k = row, prompt_len[row], completion_len[row], candidates[row]
        width_p, width_c, widest = p, c, k
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


def _padded_gather(accelerator: Any) -> Callable[[Any], Any]:
    """accelerate's `gather` for tensors whose first dimension differs across processes: each is padded
    to the longest (NaN for floats, which TRL's nanmin/nanmax statistics skip) before the gather."""
    gather = accelerator.gather

    def padded(tensor: Any) -> Any:
        if not torch.is_tensor(tensor) or tensor.dim() == 0:
            return gather(tensor)
        fill = float("nan") if tensor.is_floating_point() else 0
        return gather(accelerator.pad_across_processes(tensor, dim=0, pad_index=fill))

    return padded


@contextlib.contextmanager
def zero_learning_rate(optimizer: Any) -> Any:
    """Every parameter group's learning rate at 0 while inside (AdamW's decoupled weight decay scales with
    it too, so no weight moves); then the saved rates, except where a scheduler set a new one."""
    groups = optimizer.param_groups
    saved = [group["lr"] for group in groups]
    for group in groups:
        group["lr"] = 0.0
    try:
        yield
    finally:
        for group, lr in zip(groups, saved, strict=True):
            if group["lr"] == 0.0:
                group["lr"] = lr


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
#: one iteration's rows and its metrics, built by `collect(iteration)`
Collect = Callable[[int], tuple[list[StepSample], dict[str, float]]]


#: the value head's optimizer and scheduler state in a checkpoint (the model's are the Trainer's files)
HEAD_OPTIMIZER_FILE = "value_head_optimizer.pt"


@dataclasses.dataclass
class ActorCritic:
    """What the engine needs for an algorithm with a critic (POAD): the critic, the value head's learning
    rate (its own optimizer, Adam eps 1e-5 as in the authors' code), and the value loss's coefficient
    and clip."""

    critic: Critic
    learning_rate: float
    value_coef: float = 0.5
    value_clip: float | None = 0.2


class MultiStepTrainer(GRPOTrainer):
    """GRPOTrainer whose generation step is one multi-step RL iteration (see the module doc).

    `collect(iteration)` returns the iteration's rows (with advantages) and metrics; the update's log-probs
    use the shared-prefix kernel on a CPU with one process (`logps.kernel_applies`), TRL's fused LM head
    otherwise; `shared_prefix` is kept as the run's setting; `keep_checkpoints` is the
    number of newest checkpoints kept.

    PPO epochs (`ppo_epochs` > 1): the rows' log-probs are taken once, before the first epoch, and every
    epoch's ratio is measured against them. The first epoch is the Trainer's own optimizer step; each
    further epoch repeats the iteration's micro-batches through `training_step` (the same loss, scaling
    and autocast) and steps again (`_more_epochs`), so one iteration stays one Trainer step (callbacks,
    checkpoints and metrics count iterations). With `target_kl`, an epoch whose approximate KL
    E[(r - 1) - log r] exceeds it skips its actor step. `actor_critic` adds the critic's value loss and
    its parameter group."""

    def __init__(
        self,
        *args: Any,
        collect: Collect,
        shared_prefix: bool = False,
        keep_checkpoints: int = 2,
        actor_critic: ActorCritic | None = None,
        ppo_epochs: int = 1,
        target_kl: float | None = None,
        max_batch_tokens: int | str | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.collect = collect
        self.shared_prefix = shared_prefix
        self.keep_checkpoints = keep_checkpoints
        self.actor_critic = actor_critic
        self.ppo_epochs = ppo_epochs
        self.target_kl = target_kl
        # "auto" bounds the LM-head positions (the logits) per pass; a number bounds padded tokens. Under
        # DeepSpeed a split micro-batch would step the optimizer per pass, so "auto" means no split there.
        if max_batch_tokens == "auto" and self.is_deepspeed_enabled:
            max_batch_tokens = None
        self.budget_completions_only = max_batch_tokens == "auto"
        self.max_batch_tokens = resolve_max_batch_tokens(max_batch_tokens, self.model, str(self.args.device))
        self.head_optimizer, self.head_scheduler = self._head_optimizer()
        self._train_logps: torch.Tensor | None = None  # the last training forward's log-probs (for the KL)
        # rollouts through TRL's vLLM engine (model.backend=vllm): rows get its importance-sampling ratio,
        # taken from the distribution the rollouts sampled from (top-k / top-p truncated)
        self.rollout_backend: Any = None
        self.rollout_top_k, self.rollout_top_p = 0, 1.0
        self._reset_epoch_stats()
        self.trl_logprobs = False  # force TRL's own log-prob path (benchmarks/trainer_overhead.py)
        self._micro_step = 0
        self._buffer: list[dict[str, Any]] | None = None
        self._iteration_metrics: dict[str, float] = {}
        self._iteration_start = self._update_start = time.perf_counter()
        self._empty_iteration = False
        self.last_saved_step: int | None = None  # the iteration of the newest checkpoint this run wrote
        self.add_callback(SkipEmptyUpdate(lambda: self._empty_iteration))
        self.add_callback(PPOEpochs(self._before_optimizer_step, self._after_optimizer_step))
        if self.accelerator.num_processes > 1:
            # each process's micro-batch has its own row count; TRL gathers per-row statistics
            self.accelerator.gather = _padded_gather(self.accelerator)
        if self.is_deepspeed_enabled:
            dist.refuse_under_deepspeed(max_batch_tokens, ppo_epochs)

    # -- DeepSpeed: its engine steps inside the last micro-batch's backward --------------------------
    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """Under DeepSpeed the engine takes its optimizer step inside the backward of the iteration's
        last micro-batch, before any pre-optimizer-step hook: an iteration without rows (whose hook
        would drop the gradients) runs with a learning rate of 0, so the weights stay as they are."""
        if not self.is_deepspeed_enabled:
            return self._training_step(model, inputs, num_items_in_batch)
        model.train()
        inputs = self._prepare_inputs(inputs)  # builds the iteration (and so knows whether it is empty)
        with zero_learning_rate(self.optimizer) if self._empty_iteration else contextlib.nullcontext():
            return self._training_step(model, inputs, num_items_in_batch)

    # -- memory: a token budget per forward/backward ----------------------------------------------------
    def _training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """With `max_batch_tokens`, a micro-batch above the budget runs as several forward/backward passes
        (`split_by_tokens`), so no episode length or batch size can exhaust memory; the gradient and the
        returned loss equal the unsplit ones (every chunk's loss is divided by the iteration's total)."""
        if not self.max_batch_tokens:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()
        parts = split_by_tokens(
            self._prepare_inputs(inputs), self.max_batch_tokens, self.budget_completions_only
        )
        # every process runs as many passes as the one that needs most (each pass holds collectives)
        parts += [blank_rows(parts[-1])] * (int(dist.all_max(len(parts))) - len(parts))
        loss = 0.0
        for k, part in enumerate(parts):
            # processes split differently, so only the last chunk's backward may synchronise gradients
            sync = k == len(parts) - 1
            with contextlib.nullcontext() if sync else self.accelerator.no_sync(model):
                loss = loss + super().training_step(model, part, num_items_in_batch)
        return loss

    # -- generation: one iteration per optimizer step -----------------------------------------------
    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not self.model.training:  # TRL's eval loop is not used (agentrl.evaluation is)
            return super()._prepare_inputs(generation_batch)
        if isinstance(generation_batch, dict) and "completion_ids" in generation_batch:
            return generation_batch  # a packed micro-batch again (PPO epochs after the first)
        parts = self.args.steps_per_generation
        if self._micro_step % parts == 0 or self._buffer is None:
            self._buffer = self._build_iteration(parts)
        inputs = self._buffer[self._micro_step % parts]
        self._micro_step += 1
        return inputs

    def _build_iteration(self, parts: int) -> list[dict[str, Any]]:
        self._iteration_start = time.perf_counter()
        samples, metrics = self.collect(self.state.global_step)  # 0-based index of this iteration
        pad_id = self.processing_class.pad_token_id
        action_level = any(s.candidates is not None for s in samples)
        # the loss is a mean over the iteration's tokens (or actions, for action-level rows) on every
        # process together; an update is skipped only when no process has a row
        local_tokens = len(samples) if action_level else sum(len(s.completion_ids) for s in samples)
        total_tokens, total_rows = dist.all_sum([local_tokens, len(samples)])
        self._empty_iteration = total_rows == 0
        metrics["update_skipped"] = float(self._empty_iteration)
        if not samples:
            # No informative episode (here): a zero-advantage placeholder row keeps the accumulation loop
            # intact (its loss and gradient are exactly 0) and SkipEmptyUpdate skips the step.
            token = [int(pad_id)]
            samples = [StepSample(token, token, None, 0.0, -1, -1)]
        metrics["samples"] = len(samples) if local_tokens else 0
        metrics["train_tokens"] = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        self._iteration_metrics = metrics
        self._reset_epoch_stats()
        # the no-grad forwards below (old, reference and candidate log-probs) depend on the rows: under a
        # sharded engine every process runs as many (synced_forwards; nothing to do otherwise)
        references = [self.ref_model] if self.ref_model is not None else []
        with synced_forwards(self.model, *references):
            batches = self._pack_micro_batches(samples, parts, total_tokens, action_level)
        self._update_start = time.perf_counter()
        return batches

    def _pack_micro_batches(
        self, samples: list[StepSample], parts: int, total_tokens: float, action_level: bool
    ) -> list[dict[str, Any]]:
        """The iteration's rows as `parts` packed micro-batches, with what the loss reads besides them:
        reference and old log-probs, critic features, candidate sets."""
        pad_id = self.processing_class.pad_token_id
        # fewer rows than micro-batches: the empty ones repeat the last row with advantage 0 (no gradient)
        # and no value targets
        filler = dataclasses.replace(samples[-1], advantage=0.0, returns=None, old_values=None)
        device = self.accelerator.device
        batches = []
        for chunk in split_even(samples, parts):
            rows = chunk or [filler]
            batch = pack_samples(rows, pad_id, device, with_old_logprobs=self.num_iterations > 1)
            batch["num_items_in_batch"] = torch.tensor(float(max(total_tokens, 1)), device=device)
            if self.rollout_backend is not None and not action_level:
                self._add_importance_ratio(batch, rows)
            if self.beta != 0.0:
                batch["ref_per_token_logps"] = self._reference_logps(batch)
            if self.ppo_epochs > 1 and "old_per_token_logps" not in batch:
                batch["old_per_token_logps"] = self._rollout_logps(batch)
            if self.actor_critic is not None:
                batch["critic_features"] = self.actor_critic.critic.batch_features(
                    rows, batch["completion_ids"].size(1)
                )
            if action_level:
                batch.update(action_rows(rows, device, filler=not chunk))
                if self.ppo_epochs > 1:
                    with torch.no_grad(), self.compute_loss_context_manager():
                        batch["old_action_logps"] = self._action_log_policy(self.model, batch)[0]
            batches.append(batch)
        return batches

    def _add_importance_ratio(self, batch: dict[str, Any], rows: list[StepSample]) -> None:
        """vLLM sampled the rows with the trainer's weights but its own numerics: TRL's importance-sampling
        correction reweights each token's loss by pi_train / pi_vLLM, truncated or masked as its mode and
        cap say (agents/backends/trl_vllm.py)."""
        from agentrl.agents.backends.trl_vllm import importance_ratio, sampling_logps_tensor

        truncated = self.rollout_top_k > 0 or self.rollout_top_p < 1.0
        # vLLM's log-probs are of the truncated, renormalised distribution it samples from: so are these
        train = self._processed_logps(batch) if truncated else self._rollout_logps(batch)
        width = batch["completion_ids"].size(1)
        sampling = sampling_logps_tensor(rows, width, batch["completion_ids"].device)
        batch["sampling_per_token_logps"] = sampling
        batch["importance_sampling_ratio"] = importance_ratio(
            train,
            sampling,
            batch["completion_mask"],
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_max,
            clip_min=self.vllm_importance_sampling_clip_min,
        )
        if self.ppo_epochs > 1 and not truncated:
            batch["old_per_token_logps"] = train  # the same forward the epochs would take

    def _processed_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The rows' completion log-probs under the top-k / top-p distribution the rollouts sampled from."""
        from agentrl.trainers.logps import processed_logps

        ids, mask, width = self._sequences(batch)
        with torch.no_grad(), self.compute_loss_context_manager():
            return processed_logps(
                self.model, ids, mask, width, self.temperature, self.rollout_top_k, self.rollout_top_p
            )

    @staticmethod
    def _sequences(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        return ids, mask, batch["completion_ids"].size(1)

    def _rollout_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probs of the rows' completion tokens under the weights that generated them, taken once before
        the PPO epochs (with the training forward's numerics: autocast, temperature)."""
        ids, mask, width = self._sequences(batch)
        with torch.no_grad(), self.compute_loss_context_manager():
            return self._get_per_token_logps_and_entropies(
                self.model, ids, mask, width, batch_size=self._rows_per_pass(batch)
            )[0]

    def _rows_per_pass(self, batch: dict[str, torch.Tensor]) -> int | None:
        """Rows per no-grad forward under `max_batch_tokens` (None: all at once). The old, reference and
        importance-ratio log-probs run over a whole micro-batch, so they follow the training passes'
        bound (a 100-row RLFT micro-batch of 256-token completions: 5 GB of fp32 reference logits)."""
        if not self.max_batch_tokens:
            return None
        width = batch["completion_ids"].size(1)
        if not self.budget_completions_only:
            width += batch["prompt_ids"].size(1)
        return max(1, self.max_batch_tokens // max(width, 1))

    def _reference_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probs of the rows' completion tokens under the reference policy (for the KL term): TRL's
        frozen copy under full fine-tuning, the base with the adapter disabled under LoRA."""
        from trl.trainer.utils import use_adapter

        ids, mask, width = self._sequences(batch)
        rows = self._rows_per_pass(batch)
        with torch.no_grad():
            if self.ref_model is not None:
                return self._get_per_token_logps_and_entropies(self.ref_model, ids, mask, width, rows)[0]
            model = self.accelerator.unwrap_model(self.model)
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                return self._get_per_token_logps_and_entropies(self.model, ids, mask, width, rows)[0]

    # -- log-probs of the completion tokens ------------------------------------------------------------
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
        logps, entropies, aux = self._token_logps(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size,
            compute_entropy,
            compute_aux_loss,
            **multimodal,
        )
        if torch.is_grad_enabled():
            self._train_logps = logps.detach()
        return logps, entropies, aux

    def _token_logps(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None,
        compute_entropy: bool,
        compute_aux_loss: bool,
        **multimodal: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if (
            # CUDA: TRL's fused LM head (no full-vocabulary logits); several processes: one forward per pass
            not kernel_applies(input_ids.device.type, self.accelerator.num_processes)
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
            all_entropies.append(entropies)
        return torch.cat(all_logps), torch.cat(all_entropies) if compute_entropy else None, None

    # -- the loss: TRL's clipped surrogate (+ KL, entropy) and the critic's value loss -----------------
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        if "candidates" in inputs:
            loss = self._action_level_loss(model, inputs)
        else:
            # TRL multiplies the per-token loss by the rows' importance-sampling ratio only under use_vllm,
            # which stays off otherwise (with it on, TRL's __init__ would build an engine of its own)
            self.use_vllm = "importance_sampling_ratio" in inputs
            try:
                loss = super()._compute_loss(model, inputs)
            finally:
                self.use_vllm = False
        old = inputs.get("old_per_token_logps")
        if old is not None and self._train_logps is not None and "candidates" not in inputs:
            mask = inputs["completion_mask"]
            log_ratio = self._train_logps - old
            kl = ((torch.exp(log_ratio) - 1) - log_ratio) * mask
            self._kl_window[0] += float(kl.sum())
            self._kl_window[1] += float(mask.sum())
        if self.actor_critic is not None and "returns" in inputs:
            ac = self.actor_critic
            values = ac.critic.head(inputs["critic_features"])
            value_loss = clipped_value_loss(
                values, inputs["old_values"], inputs["returns"], inputs["value_mask"], ac.value_clip
            )
            # like the dapo policy loss: the micro-batch sums add up to one mean over the iteration's tokens
            loss = loss + ac.value_coef * value_loss / inputs["num_items_in_batch"].clamp(min=1.0)
            self._value_window[0] += float(value_loss.detach())
            self._value_window[1] += float(inputs["value_mask"].sum())
        return loss

    def _action_log_policy(self, model: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Action-level rows (TWOSOME): log pi(chosen | s) and the entropy of pi over each row's candidates,
        pi = softmax(log L(a) / (n(a) T)) with T the rollout temperature (agents/scoring.py)."""
        from agentrl.agents.scoring import candidate_logps, twosome_log_policy

        candidates = inputs["candidates"]
        logps, _ = candidate_logps(
            model, inputs["prompt_lists"], candidates, self.processing_class.pad_token_id
        )
        logliks = logps.sum(-1)
        chosen, entropy, start = [], [], 0
        for k, group in enumerate(candidates):
            log_pi = twosome_log_policy(
                logliks[start : start + len(group)], inputs["normalizers"][k], self.temperature
            )
            chosen.append(log_pi[inputs["choice"][k]])
            entropy.append(-(log_pi.exp() * log_pi).sum())
            start += len(group)
        return torch.stack(chosen), torch.stack(entropy)

    def _action_level_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """PPO's clipped surrogate on log pi(a | s) over the candidate set, minus the entropy bonus, summed
        over the micro-batch's actions and divided by the iteration's (so micro-batches add up to a mean)."""
        log_pi, entropy = self._action_log_policy(model, inputs)
        if inputs.get("filler"):  # a placeholder micro-batch: no gradient at all
            return (log_pi * 0.0).sum()
        old = inputs.get("old_action_logps", log_pi.detach())
        log_ratio = log_pi - old
        ratio = torch.exp(log_ratio)
        advantages = inputs["advantages"]
        clipped = ratio.clamp(1 - self.epsilon_low, 1 + self.epsilon_high)
        per_row = -torch.min(ratio * advantages, clipped * advantages) - self.entropy_coef * entropy
        with torch.no_grad():
            self._kl_window[0] += float(((ratio - 1) - log_ratio).sum())
            self._kl_window[1] += float(ratio.numel())
            outside = (ratio < 1 - self.epsilon_low) | (ratio > 1 + self.epsilon_high)
            self._metrics["train"]["clip_ratio/region_mean"].append(float(outside.float().mean()))
            self._metrics["train"]["entropy"].append(float(entropy.mean()))
        # like TRL's dapo loss: the processes' gradients are averaged, so each divides by its share
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        return per_row.sum() / normalizer

    # -- PPO epochs, the KL gate and the value head's optimisation -----------------------------------------
    def _reset_epoch_stats(self) -> None:
        self._kl_window = [0.0, 0.0]  # approximate-KL sum and tokens of the current optimizer step
        self._value_window = [0.0, 0.0]  # value-loss sum and tokens of the iteration
        self._epoch_kls: list[float] = []
        self._actor_skips = 0

    def _head_optimizer(self) -> tuple[Any, Any]:
        """The value head's AdamW and its learning-rate schedule (the policy's schedule, the head's rate).
        It lives outside the model's optimizer, which FSDP and DeepSpeed wrap and shard: they hold only the
        module's own parameters, and the head lives outside the module on every process."""
        if self.actor_critic is None:
            return None, None
        from transformers import get_scheduler

        args = self.args
        optimizer = torch.optim.AdamW(
            self.actor_critic.critic.head.parameters(),
            lr=self.actor_critic.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=1e-5,
            weight_decay=0.0,
        )
        scheduler = get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=args.get_warmup_steps(args.max_steps),
            num_training_steps=args.max_steps,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs,
        )
        return optimizer, scheduler

    def _before_optimizer_step(self, model: Any) -> None:
        """Before each optimizer step (every epoch): the value head's own gradient clipping (the Trainer
        clips only the policy), and the KL gate on the policy's step."""
        kl_sum, kl_tokens = dist.all_sum(self._kl_window)  # the gate decides for every process alike
        self._kl_window = [0.0, 0.0]
        approx_kl = kl_sum / kl_tokens if kl_tokens else 0.0
        self._epoch_kls.append(approx_kl)
        if self.actor_critic is not None:
            head = list(self.actor_critic.critic.head.parameters())
            # the head is outside DDP: each process's gradient is its rows' share of the global mean
            dist.sum_gradients(head)
            if self._empty_iteration:
                for param in head:
                    param.grad = None
            elif self.args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(head, self.args.max_grad_norm)
            self.head_optimizer.step()  # a head without gradients (an empty iteration) stays as it is
            self.head_optimizer.zero_grad(set_to_none=True)
        if self.target_kl is not None and approx_kl > self.target_kl:
            # parameters without a gradient are skipped by torch's optimizers (Adam's moments too)
            for param in (model if model is not None else self.model).parameters():
                param.grad = None
            self._actor_skips += 1

    def _after_optimizer_step(self, model: Any) -> None:
        """After the iteration's optimizer step: its further PPO epochs, then the head's schedule advances
        (once per iteration, as the Trainer's own)."""
        self._more_epochs(model)
        if self.head_scheduler is not None:
            self.head_scheduler.step()

    def _more_epochs(self, model: Any) -> None:
        """PPO epochs 2..K of the iteration (the first was the Trainer's step)."""
        if self.ppo_epochs <= 1 or self._empty_iteration or self._buffer is None:
            return
        for _ in range(1, self.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for batch in self._buffer:
                self.training_step(self.model_wrapped, batch, batch["num_items_in_batch"])
            if self.args.max_grad_norm > 0:
                self._clip_grad_norm(self.model_wrapped)
            self._before_optimizer_step(self.model)
            self.optimizer.step()

    # -- logging ---------------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and self._iteration_metrics:
            now = time.perf_counter()
            extra = dict(self._iteration_metrics)
            if self.ppo_epochs > 1:
                extra["approx_kl"] = self._epoch_kls[-1] if self._epoch_kls else 0.0
                extra["actor_steps_skipped"] = self._actor_skips
            if self._value_window[1]:
                extra["value_loss"] = self._value_window[0] / self._value_window[1]
            extra["update_s"] = now - self._update_start
            extra["iteration_s"] = now - self._iteration_start
            if extra["update_s"] > 0:
                extra["update_tokens_per_s"] = extra.get("train_tokens", 0) / extra["update_s"]
            extra = merge_process_metrics(dist.gather(extra))
            if extra.get("update_skipped"):
                # TRL's entropy and clip statistics would describe the zero-advantage placeholder row
                logs = {k: v for k, v in logs.items() if k != "entropy" and not k.startswith("clip_ratio")}
            logs = {**logs, **extra}
            self._iteration_metrics = {}
        super().log(logs, start_time)

    # -- atomic checkpoints ----------------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        root = Path(self.args.output_dir)
        name = f"checkpoint-{self.state.global_step}"
        # every process writes its part (its RNG state; its shards under ZeRO/FSDP), process 0 the rest
        with dist.shared_atomic_dir(root / name) as staging:
            self.args.output_dir = str(staging)
            try:
                super()._save_checkpoint(model, trial)  # writes staging/<name>/
            finally:
                self.args.output_dir = str(root)
            dist.barrier()
            if dist.is_main():
                for child in (staging / name).iterdir():
                    os.replace(child, staging / child.name)
                (staging / name).rmdir()
                if self.actor_critic is not None:
                    self.actor_critic.critic.save(staging)
                    if not self.args.save_only_model:
                        head_state = {
                            "optimizer": self.head_optimizer.state_dict(),
                            "scheduler": self.head_scheduler.state_dict(),
                        }
                        torch.save(head_state, staging / HEAD_OPTIMIZER_FILE)
                write_manifest(staging, step=self.state.global_step, optimizer=not self.args.save_only_model)
        self.last_saved_step = self.state.global_step
        if not dist.is_main():
            return
        prune_checkpoints(root, self.keep_checkpoints, current=self.state.global_step)
        log.info("Saved %s%s", root / name, " (model only)" if self.args.save_only_model else "")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        self._load_head_optimizer(checkpoint)
        if checkpoint is None or has_optimizer_state(Path(checkpoint)):
            return super()._load_optimizer_and_scheduler(checkpoint)
        # A model-only checkpoint: Adam's moments restart from zero; the learning-rate schedule continues
        # from the checkpoint's iteration.
        log.warning(
            "%s has no optimizer state (saved with algo.save_optimizer=false): resuming with a fresh optimizer",
            Path(checkpoint).name,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
            for _ in range(self.state.global_step):
                self.lr_scheduler.step()

    def _load_head_optimizer(self, checkpoint: str | None) -> None:
        """The value head's optimizer and schedule from a checkpoint that has them; without (a model-only
        checkpoint) the head's Adam restarts and its schedule continues from the checkpoint's iteration."""
        if checkpoint is None or self.head_optimizer is None:
            return
        path = Path(checkpoint, HEAD_OPTIMIZER_FILE)
        if path.is_file():
            # saved from process 0's device: loaded on the CPU, the optimizer moves it to the head's
            state = torch.load(path, map_location="cpu", weights_only=True)
            self.head_optimizer.load_state_dict(state["optimizer"])
            self.head_scheduler.load_state_dict(state["scheduler"])
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
            for _ in range(self.state.global_step):
                self.head_scheduler.step()


# ---------------------------------------------------------------------------------------------------------
# the training run
# ---------------------------------------------------------------------------------------------------------
def has_optimizer_state(checkpoint: Path) -> bool:
    """Whether a checkpoint holds the optimizer's state, as its manifest says (written with
    `algo.save_optimizer`): the files differ by engine (`optimizer.pt`; FSDP's `optimizer.bin` or
    `optimizer_0/`; DeepSpeed's `global_step*/`), and the Trainer's own loader finds each."""
    manifest = manifest_path(checkpoint)
    if manifest.is_file():
        return bool(json.loads(manifest.read_text()).get("optimizer", True))
    names = ("optimizer.pt", "optimizer.bin", "optimizer_*", "global_step*")
    return any(any(checkpoint.glob(name)) for name in names)


def resolve_precision(precision: str, device: str, shapes: tuple[int, int] | None = None) -> str:
    """`algo.precision` on `device`: "auto" is bf16-mixed on CUDA; on a CPU it is bf16-mixed only where the
    CPU has bf16 matrix instructions and bf16 wins at the model's layer `shapes` (agentrl/trainers/precision.py;
    without `shapes`, fp32). Mixed precision keeps fp32 master weights, because a bf16 weight cannot take
    an update below ~1/256 of its own size: at the paper's lr of 1e-6 almost every update would be
    rounded away."""
    if precision != "auto":
        return precision
    if device.startswith("cuda"):
        return "bf16-mixed"
    from agentrl.trainers.precision import cpu_auto_precision

    choice, reason = cpu_auto_precision(shapes)
    log.info("algo.precision=auto on the CPU: %s", reason)
    return choice


# bytes per LM-head position of one pass: fp32 logits, their log-softmax, the gradients of both, and the
# entropy's exp (no grad)
LOGIT_COPIES = 5
AUTO_MEMORY_FRACTION = 0.2  # of the free memory when training starts; the rest: activations, rollouts


def free_memory_bytes(device: str) -> int:
    """Memory still free for tensors: the GPU's free memory on CUDA, else the system's available RAM."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    import psutil

    return int(psutil.virtual_memory().available)


def auto_token_budget(free_bytes: int, vocab_size: int, fraction: float = AUTO_MEMORY_FRACTION) -> int:
    """LM-head positions per pass whose fp32 logits (with their gradients) fill `fraction` of `free_bytes`
    (at least 1: a row larger than the budget still runs, as a pass of its own)."""
    return max(1, int(free_bytes * fraction) // (LOGIT_COPIES * 4 * vocab_size))


def resolve_max_batch_tokens(setting: int | str | None, model: Any, device: str) -> int | None:
    """`algo.max_batch_tokens`: a number or null as given; "auto" from free memory and the vocabulary."""
    if setting != "auto":
        return setting  # type: ignore[return-value]
    vocab = int(model.config.get_text_config().vocab_size)
    free = free_memory_bytes(device)
    budget = auto_token_budget(free, vocab)
    log.info(
        "algo.max_batch_tokens=auto: %d LM-head positions per pass (%.1f GiB free, vocabulary %d: "
        "%.0f%% of it for fp32 logits and their gradients)",
        budget,
        free / 2**30,
        vocab,
        100 * AUTO_MEMORY_FRACTION,
    )
    return budget


def cpu_precision_shapes(model_cfg: Any, algo: Any, device: str, world: int) -> tuple[int, int] | None:
    """The layer sizes `resolve_precision` times bf16 at: only for `auto` on the CPU in one process (the
    launcher of several resolves without a model, to fp32, and every process must agree with it). Logs
    the CPU's bf16 matrix instructions whenever training runs on the CPU."""
    if device.startswith("cuda"):
        return None
    from agentrl.trainers.precision import bf16_instructions, cpu_flags, describe_cpu, model_shapes

    flags = cpu_flags()
    log.info("CPU: %s", describe_cpu(flags))
    if algo.precision in ("bf16-mixed", "bf16-pure") and not bf16_instructions(flags):
        log.warning(
            "algo.precision=%s on a CPU without bf16 matrix instructions: bf16 is likely slower than fp32",
            algo.precision,
        )
    return model_shapes(model_cfg) if algo.precision == "auto" and world == 1 else None


def grpo_config(algo: Any, run_dir: Path, device: str, seed: int, precision: str = "fp32") -> GRPOConfig:
    """TRL GRPOConfig from the typed algo config: one optimizer step per iteration, no TRL-side logging."""
    scheduler = algo.lr_scheduler
    if scheduler == "constant" and algo.warmup_steps > 0:
        scheduler = "constant_with_warmup"  # transformers' "constant" ignores warmup_steps silently
    cuda = device.startswith("cuda")
    parts = algo.gradient_accumulation_steps
    args = GRPOConfig(
        # TRL turns gradient checkpointing on by default; on CPU it costs a second forward and disables
        # the KV cache that the shared-prefix log-prob kernel relies on
        activation_checkpointing=algo.gradient_checkpointing,
        output_dir=str(run_dir),
        max_steps=algo.iterations,
        per_device_train_batch_size=2,  # placeholder rows; real rows come from rollouts
        gradient_accumulation_steps=parts,
        steps_per_generation=parts,
        num_generations=2,
        num_iterations=1,
        learning_rate=algo.learning_rate,
        lr_scheduler_type=scheduler,
        warmup_steps=algo.warmup_steps,
        weight_decay=algo.weight_decay,
        max_grad_norm=algo.max_grad_norm,
        adam_beta1=algo.adam_beta1,
        adam_beta2=algo.adam_beta2,
        beta=algo.beta,
        epsilon=algo.epsilon,
        epsilon_high=algo.epsilon_high,
        loss_type=algo.loss_type,
        entropy_coef=algo.entropy_coef,
        # TRL recomputes log-probs as log_softmax(logits / temperature), like the sampler: keep them equal
        temperature=algo.temperature,
        bf16=precision == "bf16-mixed",  # autocast over fp32 weights (CPU autocast too)
        use_cpu=not cuda,
        logging_steps=1,
        save_strategy="no",  # CheckpointEvery asks for saves at our cadence
        report_to="none",
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        remove_unused_columns=False,
        log_completions=False,
        dataloader_num_workers=0,
        save_only_model=not algo.save_optimizer,
        # DDP: every trainable parameter takes part in each forward (frozen layers do not require grad)
        ddp_find_unused_parameters=False,
        ddp_timeout=dist.PROCESS_GROUP_TIMEOUT_S,  # the process group already has it (ensure_process_group)
        # TRL builds its reference model (beta > 0, full fine-tuning) with these, else in the policy's dtype
        model_init_kwargs={"dtype": algo.ref_dtype} if getattr(algo, "ref_dtype", None) else None,
    )
    if cuda and not dist.launched():
        dist.pin_one_device(args, device)
    return args


def train_llm(cfg: DictConfig, run_dir: Path, resume: bool = False) -> TrainResult:
    """Train the LLM policy with the algorithm `cfg.algo.name`; write metrics.jsonl, checkpoints and
    final/ into `run_dir` (eval.json is the runner's). With `resume`, continue from the newest checkpoint
    in `run_dir`."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from agentrl.agents.llm import build_llm_agent, warn_if_lenient
    from agentrl.config import typed
    from agentrl.diagnostics import diagnostics_section
    from agentrl.envs import env_factory
    from agentrl.evaluation import episode_metrics, eval_seeds, evaluate
    from agentrl.models import freeze_layers, load_model, model_config, resolve_device

    dist.ensure_process_group()  # before the model loads: each process on its own device
    rank, world = dist.rank(), dist.world_size()
    main = dist.is_main()
    if not main:
        os.environ["AGENTRL_NO_PROGRESS"] = "1"  # one progress display: the main process's
    spec = LLM_ALGORITHMS[cfg.algo.name]
    algo = typed(cfg.algo)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    set_torch_threads(algo.torch_threads)
    checkpoint = newest_valid_checkpoint(run_dir, kind="dir") if resume else None
    if checkpoint is not None:
        log.info("Resuming from %s", checkpoint)
    elif resume:
        log.warning("No usable checkpoint in %s: starting from the beginning", run_dir)

    # -- the policy and its two views: training rollouts and evaluation --
    model_cfg = model_config(cfg.model)
    device = resolve_device(model_cfg.device)
    precision = resolve_precision(
        algo.precision, device, cpu_precision_shapes(cfg.model, algo, device, world)
    )
    if precision == "bf16-pure":
        log.warning(
            "algo.precision=bf16-pure: updates smaller than bf16's resolution are lost (use bf16-mixed)"
        )
    # the trainable weights are fp32 unless bf16-pure; under LoRA only the adapters train (PEFT keeps them
    # fp32), so the frozen base can stay bf16 with mixed precision
    lora_base = precision == "bf16-mixed" and model_cfg.lora.r > 0
    dtype = "bfloat16" if precision == "bf16-pure" or lora_base else "float32"
    # TRL's config first: under ZeRO-3 (and FSDP's RAM-efficient loading) building it tells transformers
    # to load the weights already sharded, instead of a full copy per process
    args = grpo_config(algo, run_dir, device, int(cfg.seed), precision)
    model, tokenizer = load_model(dataclasses.replace(model_cfg, dtype=dtype), for_training=True)
    log.info("Precision: %s (weights %s)", precision, dtype)
    log.info("Trainable parameters: %d", freeze_layers(model, algo.trainable_layers))
    # the critic's trunk is the initial policy: taken now, before any update (or a resume's weights)
    # (RLFT needs one only for its GAE advantage: algo.advantage=gae)
    # the value head on this process's device: under ZeRO-3/FSDP the model is not placed there until the
    # Trainer prepares it
    needs_critic = spec.critic or getattr(algo, "advantage", "") == "gae"
    critic = Critic(model, device=args.device) if needs_critic else None
    if critic is not None:
        if checkpoint is not None and not critic.load(checkpoint):
            log.warning("%s has no value head: the critic starts untrained", checkpoint.name)
        dist.broadcast_parameters(critic.head)  # outside DDP: every process starts from process 0's head
        log.info("Critic: value head on the frozen %s", "LoRA base" if critic.lora else "initial weights")
    warn_if_lenient(cfg)
    if spec.name == "rlft" and not cfg.agent.get("cot", False):
        log.warning("algo=rlft trains rationales: set agent.cot=true (the presets experiment=rlft_* do)")
    if spec.decision != cfg.agent.get("decision", "generate"):
        # the algorithm decides how its policy acts (TWOSOME's scores every valid action)
        cfg = OmegaConf.merge(cfg, {"agent": {"decision": spec.decision}})
        log.info("agent.decision=%s (algo=%s)", spec.decision, spec.name)
    # model.backend=vllm trains with rollouts from TRL's vLLM engine (built with the trainer, below); the
    # policy's own view (evaluation, the critic) is the HF model
    policy_cfg = OmegaConf.merge(cfg, {"model": {"backend": "hf"}}) if model_cfg.backend == "vllm" else cfg
    policy = build_llm_agent(policy_cfg, model=model, tokenizer=tokenizer, share_prompts=algo.shared_prefix)
    max_new = algo.max_new_tokens or policy.sampling.max_new_tokens
    train_agent = policy.configured(
        sampling=dataclasses.replace(
            policy.sampling,
            temperature=algo.temperature,
            top_k=algo.top_k,
            top_p=algo.top_p,
            max_new_tokens=max_new,
        ),
        invalid_penalty=algo.invalid_penalty,
    )
    eval_agent = policy.configured(
        sampling=dataclasses.replace(
            policy.sampling, temperature=algo.eval_temperature, max_new_tokens=max_new
        )
    )

    # -- environments: evaluation is always the standard task --
    eval_env = env_factory(cfg.env)
    train_env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    if algo.max_steps is not None:
        train_env_cfg["max_steps"] = algo.max_steps
    train_env = env_factory(train_env_cfg)
    reset_options = None
    if algo.curriculum.random_start > 0:
        probe = train_env()
        if "random_start" not in probe.reset_option_names:
            raise ConfigError(
                f"algo.curriculum.random_start needs an env with a random start; {cfg.env.name} has none"
            )
        probe.close()
        reset_options = {"random_start": algo.curriculum.random_start}
    seeds_eval = eval_seeds(cfg)
    seed = int(cfg.seed)

    def run_eval(description: str, episodes: int | None = None) -> tuple[dict[str, Any], list[Episode]]:
        seeds = seeds_eval[: episodes or None]
        if world == 1:
            return evaluate(
                eval_env,
                eval_agent,
                seeds,
                lockstep=cfg.eval.lockstep,
                description=description,
                agent_seed=seed,
            )
        # every process plays every world-th seed; the episodes come back in seed order on all of them
        mine = seeds[rank::world]
        with synced_forwards(model):  # every process enters, even one without seeds
            played = (
                evaluate(
                    eval_env,
                    eval_agent,
                    mine,
                    lockstep=cfg.eval.lockstep,
                    description=description,
                    agent_seed=seed,
                )[1]
                if mine
                else []
            )
        shards = dist.gather(played)
        ordered = [shards[k % world][k // world] for k in range(len(seeds))]
        return episode_metrics(ordered), ordered

    # -- the evaluation before training (kept across resumes) --
    before_path = run_dir / "eval_before.json"
    before: dict[str, Any] | None = None
    if before_path.is_file():
        before = json.loads(before_path.read_text())

    def eval_before() -> None:
        """Runs when training begins (`BeforeTraining`): the engine has prepared the model by then (ZeRO-3's
        partitions, FSDP's shards on this process's device, mixed precision's autocast around `forward`),
        so the evaluations before and after training run the same model the same way."""
        nonlocal before
        before, played = run_eval("eval before training")
        # a bandit-like env: the decision diagnostics before training too (eval.json has them after)
        diagnostics = diagnostics_section(played)
        if diagnostics is not None:
            before["diagnostics"] = diagnostics
        if main:
            write_json(before_path, before)
        log.info("Before training: success %.3f return %.3f", before["success_rate"], before["mean_return"])

    wants_before = before is None and algo.eval_before and checkpoint is None
    # -- one iteration's rows --
    seed_limit = int(cfg.eval.seed_offset)
    groups = algo.groups_per_iteration  # per process: each process rolls out its own groups

    def group_index(round_: int, group: int) -> int:
        return global_group(round_, group, groups, rank, world)

    def collect(iteration: int) -> tuple[list[StepSample], dict[str, float]]:
        start = time.perf_counter()
        if trainer.rollout_backend is not None:
            # the engine gets the trained weights before every rollout (also the first: a resumed run's
            # engine loaded the base weights from disk)
            trainer.rollout_backend.sync_weights(step=iteration)
        with synced_forwards(model):  # a sharded model: every process makes as many forward calls
            episodes, rounds = collect_groups(
                train_env,
                train_agent,
                group_seeds=lambda r: [
                    training_seed(seed, iteration, group_index(r, g), seed_limit) for g in range(groups)
                ],
                group_size=algo.group_size,
                agent_seed=lambda r: training_seed(seed, iteration, 10_000 + r * world + rank),
                min_informative=algo.min_informative_groups,
                max_rounds=algo.max_rollout_rounds,
                reset_options=reset_options,
            )
        if hasattr(trainer.rollout_backend, "end_rollout"):
            trainer.rollout_backend.end_rollout()  # vLLM sleep mode: the engine frees its memory for the update
        rollout_s = time.perf_counter() - start
        rng = np.random.default_rng([seed, iteration, 7])
        if critic is not None:
            values = critic.evaluate(episodes, tokenizer.pad_token_id)
            credit = spec.assign_credit(episodes, algo, rng, values=values)
        else:
            credit = spec.assign_credit(episodes, algo, rng)
        generated = sum(len(s.completion_ids) for e in episodes for s in e.steps)
        prompts = sum(len(s.prompt_ids) for e in episodes for s in e.steps)
        metrics = rollout_metrics(episodes, credit.advantages)
        metrics.update(
            rollout_rounds=rounds,
            episodes_kept=len(credit.kept),
            rollout_s=rollout_s,
            rollout_tokens_per_s=(generated + prompts) / max(rollout_s, 1e-9),
            generated_tokens=generated,
            **credit.stats,
        )
        return credit.samples, metrics

    # -- TRL --
    trainer = MultiStepTrainer(
        model=model,
        reward_funcs=[_unused_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["<rollout>"] * (2 * args.steps_per_generation)}),
        processing_class=tokenizer,
        collect=collect,
        shared_prefix=algo.shared_prefix,
        keep_checkpoints=algo.keep_checkpoints,
        actor_critic=None
        if critic is None
        else ActorCritic(critic, algo.critic_learning_rate, algo.value_coef, algo.value_clip),
        ppo_epochs=getattr(algo, "ppo_epochs", 1),
        target_kl=getattr(algo, "target_kl", None),
        max_batch_tokens=algo.max_batch_tokens,
    )
    if model_cfg.backend == "vllm":
        train_agent = vllm_rollouts(trainer, train_agent, algo, model_cfg, tokenizer)
    elif algo.rollout_dtype:
        train_agent = copy_rollouts(trainer, train_agent, model, algo, dtype)
    trainer.remove_callback(PrinterCallback)  # the progress bar and metrics.jsonl replace its prints
    trainer.remove_callback(ProgressCallback)
    pending: dict[str, Any] = {}
    minutes = algo.time_limit_minutes
    metrics_log = MetricsLog(run_dir, resume=resume) if main else None
    done_before = trainer_step(checkpoint)
    # several processes stop together: a signal only marks the stop, and every iteration's start asks all
    stop = StopSignals(collective=world > 1)

    def periodic_eval(step: int) -> dict[str, Any]:
        if dist.any_true(stop.stopping):  # a signal held during this iteration: the checkpoint comes first
            return {}
        return run_eval(f"eval @ {step}", algo.periodic_eval_episodes)[0]

    start = time.perf_counter()
    with stop:
        try:
            with progress(cfg.algo.name, total=algo.iterations) as bar:
                if done_before:
                    bar.advance(n=done_before)
                for callback in (
                    BeforeTraining(eval_before) if wants_before else None,
                    RolloutCacheReset(policy.backend, trainer.rollout_backend),
                    TimeLimit(minutes * 60 if minutes else None),
                    PeriodicEval(algo.eval_every, periodic_eval, pending),
                    CheckpointEvery(algo.checkpoint_every),
                    MetricsWriter(metrics_log, bar, pending, METRIC_RENAMES) if main else None,
                    SignalSafePoints(stop),  # after MetricsWriter: a held signal waits for the row
                ):
                    if callback is not None:
                        trainer.add_callback(callback)
                trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        except (TrainingInterrupted, KeyboardInterrupt) as exc:
            signum = exc.signum if isinstance(exc, TrainingInterrupted) else int(signal.SIGINT)
            raise _save_on_stop(trainer, run_dir, signum, done_before) from None
        finally:
            if metrics_log is not None:
                metrics_log.close()
    train_time = time.perf_counter() - start

    if algo.save_final:
        with dist.shared_atomic_dir(run_dir / "final") as tmp:
            trainer.save_model(str(tmp))  # every process: ZeRO-3/FSDP gather the weights
            if main:
                tokenizer.save_pretrained(str(tmp))
                if critic is not None:
                    critic.save(tmp)
    final, episodes = run_eval("eval after training")
    log.info("After training: success %.3f return %.3f", final["success_rate"], final["mean_return"])
    extra: dict[str, Any] = {"iterations": algo.iterations, "train_time_s": round(train_time, 3)}
    if before is not None:
        extra["before"] = before
    return TrainResult(final, episodes, extra)


def vllm_rollouts(trainer: MultiStepTrainer, agent: Any, algo: Any, model_cfg: Any, tokenizer: Any) -> Any:
    """`agent` generating through TRL's vLLM engine (`VLLMGeneration`, colocated or a server; built after
    the Trainer, as TRL builds it), which the trainer syncs with the trained weights before every rollout
    and corrects for with importance sampling; `trainer.rollout_backend` is set."""
    from agentrl.agents.backends import trl_vllm

    sampling = agent.effective_sampling()
    kwargs = trl_vllm.vllm_generation_kwargs(
        algo,
        model_cfg,
        sampling.max_new_tokens,
        sampling.stop,
        memory=trl_vllm.colocate_memory(trainer, algo, model_cfg),
    )
    log.info("vLLM engine: %s", {k: v for k, v in kwargs.items() if k != "generation_kwargs"})
    generation = trl_vllm.build_generation(
        trainer.model, trainer.accelerator, trainer.processing_class, **kwargs
    )
    trainer.rollout_backend = trl_vllm.TRLVLLMBackend(generation, tokenizer)
    trainer.rollout_top_k, trainer.rollout_top_p = sampling.top_k, sampling.top_p
    return trl_vllm.training_view(agent, trainer.rollout_backend)


def copy_rollouts(trainer: MultiStepTrainer, agent: Any, model: Any, algo: Any, weights_dtype: str) -> Any:
    """`agent` generating through a copy of `model` in `algo.rollout_dtype` (agents/backends/hf.py
    `HFCopyBackend`), which the trainer syncs before every rollout and corrects for with importance
    sampling, as for vLLM; `trainer.rollout_backend` is set."""
    import torch

    from agentrl.agents.backends.hf import HFCopyBackend

    if getattr(agent, "decision", "generate") == "score":
        raise ConfigError(
            "algo.rollout_dtype: agent.decision=score (TWOSOME) scores every valid action with the trained "
            "model; the copy only generates. Leave algo.rollout_dtype null"
        )
    if algo.rollout_dtype == weights_dtype:
        raise ConfigError(
            f"algo.rollout_dtype={algo.rollout_dtype}: the trained weights are already {weights_dtype} "
            "(algo.precision=bf16-pure or a LoRA base); leave algo.rollout_dtype null"
        )
    backend = HFCopyBackend(
        model,
        agent.backend.tokenizer,
        getattr(torch, algo.rollout_dtype),
        prefix_cache=agent.backend.prefix_cache,
        share_prompts=agent.backend.share_prompts,
    )
    log.info("Rollouts: a %s copy of the policy, synced before every rollout", algo.rollout_dtype)
    trainer.rollout_backend = backend
    return agent.with_backend(backend)


def _save_on_stop(
    trainer: MultiStepTrainer, run_dir: Path, signum: int, done_before: int
) -> TrainingInterrupted:
    """Save the last finished iteration (unless this run already saved it), and say so in the exception
    the run exits with. The iteration in progress is lost: its rollouts are redone on resume."""
    step = trainer.state.global_step
    name = signal_name(signum)
    if step > done_before and trainer.last_saved_step != step:
        log.warning("%s: saving checkpoint-%d (the last finished iteration) before exiting", name, step)
        trainer._save_checkpoint(trainer.model, None)
    if step == 0:
        return TrainingInterrupted(signum, f"stopped by {name} before the first iteration finished")
    return TrainingInterrupted(
        signum,
        f"stopped by {name} after iteration {step}: checkpoint-{step} is saved;"
        f" continue with: agentrl train resume={run_dir}",
    )


def trainer_step(checkpoint: Path | None) -> int:
    """The iteration a checkpoint was saved at (0 without one)."""
    return int(checkpoint.name.split("-")[1]) if checkpoint else 0


def _unused_reward(*args: Any, **kwargs: Any) -> list[float]:
    """GRPOTrainer requires a reward function; here rewards come from the environment."""
    raise RuntimeError("not called: MultiStepTrainer scores episodes itself")


__all__ = [
    "ActorCritic",
    "split_by_tokens",
    "MultiStepTrainer",
    "global_group",
    "grpo_config",
    "pack_samples",
    "rollout_metrics",
    "split_even",
    "train_llm",
    "training_seed",
]
