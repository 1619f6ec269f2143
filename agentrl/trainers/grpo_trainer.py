"""`MultiStepTrainer(trl.GRPOTrainer)`: the one trainer of every LLM algorithm, as overrides of TRL's.

One TRL "generation" is one iteration of multi-step RL (docs/architecture.md#one-training-iteration): the
trainer's `collect(iteration)` (trainers/iteration.py) returns the iteration's rows with advantages, which
are packed (trainers/packing.py) and trained on with TRL's loss. TRL internals overridden (trl 1.16,
pinned in pyproject because these move):

- `_prepare_inputs` (train mode only): TRL's version generates a fixed-size single-turn batch and its
  `split_tensor_dict` drops remainder rows. The row count here varies per iteration (episode lengths,
  sampling), so the rows are built here and split into exactly `steps_per_generation` near-equal
  micro-batches: no row is dropped, none is added. The dataset rows TRL hands in are placeholders
  (`placeholder_dataset`, sized so that TRL's sampler gives every process a batch at any world size).
- `_get_per_token_logps_and_entropies` (trainers/trainer_logps.py): on a CPU with one process,
  `trainers/logps.py` scores only completion tokens and runs shared prompt text once (exact). CUDA keeps
  TRL's fused LM head (the kernel would build full-vocabulary fp32 logits); `algo.shared_prefix` then
  applies to the rollouts.
- `_compute_loss`: TRL's loss, plus the critic's value loss (POAD, TWOSOME, RLFT with GAE); action-level
  rows (TWOSOME) use the clipped surrogate on the candidate-set policy instead of TRL's token loss.
- The value head has its own AdamW and schedule (trainers/actor_critic.py), stepped in the
  pre-optimizer-step hook; checkpoints carry its state (`value_head_optimizer.pt`).
- `training_step`: with `algo.max_batch_tokens`, a micro-batch above the budget runs as several
  forward/backward passes (`split_by_tokens`); the gradient is the same. The default `auto` bounds the
  LM-head positions per pass by free memory and vocabulary (`settings.resolve_max_batch_tokens`) and the
  tokens run with gradients per pass by free memory and layer sizes (`settings.auto_prompt_budget`):
  where the shared-prefix kernel runs, each distinct prompt once and every completion; elsewhere (CUDA,
  several processes) every row's padded prompt and completion.
- `log`: adds the iteration's rollout metrics to TRL's averaged loss statistics.
- `_save_checkpoint` (trainers/checkpoints.py): writes `checkpoint-<iteration>/` atomically with a
  manifest of its files (written last; resume checks it), then prunes old ones.
- `_load_optimizer_and_scheduler` (trainers/checkpoints.py): a model-only checkpoint
  (`algo.save_optimizer=false`) resumes with a fresh optimizer and the scheduler advanced to the
  checkpoint's iteration.

Several processes (docs/distributed.md): the token count that divides the loss is summed over processes,
every process runs the same passes (blank ones where it has fewer; TRL's per-row gathers are padded), the
value head's gradients are summed, and process 0 alone writes the checkpoints' shared files. Under
ZeRO-3/FSDP the data-dependent no-grad forwards (log-probs, critic features) run inside `synced_forwards`.

The loss type defaults to "dapo": TRL divides by `num_items_in_batch`, set to the completion tokens of
the whole iteration, so the micro-batch losses add up to one token-level mean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from trl import GRPOTrainer

from agentrl import distributed as dist
from agentrl.kernels.precision import weight_casts_shared
from agentrl.kernels.syncforward import synced_forwards
from agentrl.trainers.actor_critic import ActorCritic, head_optimizer, step_value_head
from agentrl.trainers.callbacks import PPOEpochs, SkipEmptyUpdate
from agentrl.trainers.checkpoints import CheckpointsMixin
from agentrl.trainers.iteration import Collect, merge_process_metrics
from agentrl.trainers.logps import kernel_applies
from agentrl.trainers.packing import action_rows, blank_rows, pack_samples, split_by_tokens, split_even
from agentrl.trainers.settings import (
    auto_prompt_budget,
    gather_fraction,
    pending_training_state_bytes,
    resolve_max_batch_tokens,
)
from agentrl.trainers.trainer_logps import TrainerLogps
from agentrl.types import StepSample


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


def placeholder_rows(args: Any) -> int:
    """Rows of the placeholder dataset: TRL's `RepeatSampler` takes `generation_batch_size //
    num_generations` distinct rows per chunk (`world_size * steps_per_generation`, grpo_config.py) and
    drops a chunk it cannot fill, and an epoch without a chunk makes the Trainer stop without a step. So
    at least one full chunk; two iterations' worth on one process."""
    return max(2 * args.steps_per_generation, args.generation_batch_size // args.num_generations)


def placeholder_dataset(args: Any) -> Any:
    """The dataset TRL iterates: one placeholder prompt a row (`placeholder_rows`); the iterations' rows
    come from `collect`."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["<rollout>"] * placeholder_rows(args)})


@contextlib.contextmanager
def _without_log(logger: str, text: str) -> Iterator[None]:
    """Drops the records of `logger` whose message holds `text` while the block runs."""

    def keep(record: logging.LogRecord) -> bool:
        return text not in record.getMessage()

    target = logging.getLogger(logger)
    target.addFilter(keep)
    try:
        yield
    finally:
        target.removeFilter(keep)


@contextlib.contextmanager
def optimizer_step_skipped(optimizer: Any) -> Any:
    """The torch optimizer inside DeepSpeed's wrappers (accelerate's `DeepSpeedOptimizerWrapper`, then
    ZeRO's optimizer: each keeps the next as `.optimizer`) does not step while inside: no weight, Adam
    moment or step count moves, while the engine's own bookkeeping (its step counter, the schedule) goes
    on as for any iteration."""
    inner = optimizer
    while getattr(inner, "optimizer", None) is not None:
        inner = inner.optimizer
    inner.step = lambda *args, **kwargs: None  # shadows the class's step for this instance
    try:
        yield
    finally:
        del inner.step


def sparse_embedding_gradients(model: Any) -> bool:
    """Let the input embedding's backward give only the rows it looked up (a sparse gradient) where its
    weight is also the LM head's; returns whether it was switched on.

    Autograd then adds those rows into the head's dense gradient, where each lookup (the shared head, the
    rows, a recorded rollout) otherwise allocates, zeroes and adds a dense vocabulary x hidden gradient of
    its own (49,152 x 576 fp32 for SmolLM2: 113 MB of fresh pages each). The sum is the same gradient and
    the weight's `.grad` stays dense. An untied or frozen embedding is left alone: an untied one's `.grad`
    would be sparse, which the fused AdamW does not take. `AGENTRL_CPU_FEATURES=no-sparse-embedding` leaves
    every embedding dense."""
    from agentrl.kernels.features import fast_path

    if not fast_path("sparse-embedding"):
        return False
    embedding = model.get_input_embeddings()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    tied = isinstance(embedding, torch.nn.Embedding) and head is not None and head.weight is embedding.weight
    if not tied or not embedding.weight.requires_grad or embedding.sparse:
        return False
    embedding.sparse = True
    return True


class MultiStepTrainer(CheckpointsMixin, TrainerLogps, GRPOTrainer):
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
        model: Any,
        reward_funcs: Any,
        args: Any,
        *,
        collect: Collect,
        shared_prefix: bool = False,
        keep_checkpoints: int = 2,
        actor_critic: ActorCritic | None = None,
        ppo_epochs: int = 1,
        target_kl: float | None = None,
        max_batch_tokens: int | str | None = None,
        memory_share: float = 1.0,
        **kwargs: Any,
    ):
        # TRL builds its reference model (beta > 0, full fine-tuning) with `args.model_init_kwargs`, and
        # also warns that they "will be ignored" because the policy comes as a model: they are not
        with _without_log("trl.trainer.grpo_trainer", "You passed `model_init_kwargs`"):
            super().__init__(
                model, reward_funcs, args=args, train_dataset=placeholder_dataset(args), **kwargs
            )
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
        self.max_batch_tokens_setting, self.memory_share = max_batch_tokens, memory_share
        if kernel_applies(self.args.device.type, self.accelerator.num_processes):
            # one process on a CPU: no DDP/FSDP/DeepSpeed gradient hooks meet a sparse gradient
            sparse_embedding_gradients(self.model)
        self.plan_memory()
        self.head_optimizer, self.head_scheduler = head_optimizer(actor_critic, self.args)
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
            dist.refuse_under_deepspeed(max_batch_tokens, ppo_epochs, not self.args.save_only_model)

    # -- memory: the budgets of `algo.max_batch_tokens=auto` -----------------------------------------
    def plan_memory(self) -> None:
        """The token budgets per pass from the memory left once every persistent tensor exists: the free
        memory now, less the gradients and AdamW moments still to come. Called when the trainer is built
        and again by whatever allocates a rollout engine afterwards (trainers/rollout_backends.py).

        `max_batch_tokens`: a number or null as set; under "auto" the LM-head positions whose fp32
        logits fit. "auto" also bounds the activations a pass keeps for its backward: where the
        shared-prefix kernel runs, the distinct prompts and completions (rows whose prompts all differ,
        random maps or long histories, would otherwise run hundreds of prompts with gradients at once);
        elsewhere every row's padded prompt and completion."""
        setting, device = self.max_batch_tokens_setting, str(self.args.device)
        pending = pending_training_state_bytes(self.model, self.optimizer) if setting == "auto" else 0
        self.max_batch_tokens = resolve_max_batch_tokens(
            setting, self.model, device, self.memory_share, pending
        )
        kernel = kernel_applies(self.args.device.type, self.accelerator.num_processes)
        # the Trainer turns checkpointing on when training starts: read the setting, not the model
        checkpointing = bool(self.args.gradient_checkpointing)
        activations = (
            auto_prompt_budget(
                self.model,
                device,
                share=self.memory_share,
                kernel=kernel,
                checkpointing=checkpointing,
                pending=pending,
            )
            if setting == "auto"
            else None
        )
        self.prompt_budget = activations if kernel else None
        self.padded_budget = None if kernel else activations
        self.gather_fraction = gather_fraction(self.model, checkpointing) if self.prompt_budget else 0.0

    # -- DeepSpeed: its engine steps inside the last micro-batch's backward --------------------------
    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """Under DeepSpeed the engine takes its optimizer step inside the backward of the iteration's
        last micro-batch, before any pre-optimizer-step hook: an iteration without rows on any process
        (whose hook would drop the gradients) runs with the optimizer's step skipped on every process, so
        neither the weights nor Adam's moments and step count move."""
        if not self.is_deepspeed_enabled:
            return self._training_step(model, inputs, num_items_in_batch)
        model.train()
        inputs = self._prepare_inputs(inputs)  # builds the iteration (and so knows whether it is empty)
        with optimizer_step_skipped(self.optimizer) if self._empty_iteration else contextlib.nullcontext():
            return self._training_step(model, inputs, num_items_in_batch)

    # -- memory: a token budget per forward/backward ----------------------------------------------------
    def _training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """With `max_batch_tokens`, a micro-batch above the budget runs as several forward/backward passes
        (`split_by_tokens`), so no episode length or batch size can exhaust memory; the gradient and the
        returned loss equal the unsplit ones (every chunk's loss is divided by the iteration's total).
        Under bf16-mixed the micro-batch's forwards share one bf16 cast of each weight
        (`weight_casts_shared`); the iteration's rollout and no-grad forwards run before it, in
        `_prepare_inputs`."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        parts = [inputs]
        if self.max_batch_tokens:
            parts = split_by_tokens(
                inputs,
                self.max_batch_tokens,
                self.budget_completions_only,
                self.prompt_budget,
                self.gather_fraction,
                self.padded_budget,
            )
            # every process runs as many passes as the one that needs most (each pass holds collectives)
            parts += [blank_rows(parts[-1])] * (int(dist.all_max(len(parts))) - len(parts))
        losses = []
        with weight_casts_shared(self._shares_weight_casts()):
            for k, part in enumerate(parts):
                # processes split differently, so only the last chunk's backward may synchronise gradients
                sync = k == len(parts) - 1
                with contextlib.nullcontext() if sync else self.accelerator.no_sync(model):
                    losses.append(super().training_step(model, part, num_items_in_batch))
        return losses[0] if len(losses) == 1 else sum(losses)

    def _shares_weight_casts(self) -> bool:
        """Whether an update micro-batch's forwards can share autocast's weight casts: accelerate's bf16
        autocast, and no engine that steps the optimizer inside a backward (DeepSpeed) or gathers
        sharded weights per forward (FSDP)."""
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return False
        accelerator = self.accelerator
        return bool(getattr(accelerator, "native_amp", False)) and str(accelerator.mixed_precision) == "bf16"

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
        start = time.perf_counter()
        with synced_forwards(self.model, *references):
            batches = self._pack_micro_batches(samples, parts, total_tokens, action_level)
        self._update_start = time.perf_counter()
        # the no-grad forwards the rows carry into the loss (reference and old log-probs)
        metrics["prepare_s"] = self._update_start - start
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
                batch["ref_per_token_logps"] = self._reference_logps(batch, rows)
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
            value_loss = self.actor_critic.value_loss(inputs)
            # like the dapo policy loss: the micro-batch sums add up to one mean over the iteration's tokens
            items = inputs["num_items_in_batch"].clamp(min=1.0)
            loss = loss + self.actor_critic.value_coef * value_loss / items
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

    def _before_optimizer_step(self, model: Any) -> None:
        """Before each optimizer step (every epoch): the value head's own gradient clipping (the Trainer
        clips only the policy), and the KL gate on the policy's step."""
        kl_sum, kl_tokens = dist.all_sum(self._kl_window)  # the gate decides for every process alike
        self._kl_window = [0.0, 0.0]
        approx_kl = kl_sum / kl_tokens if kl_tokens else 0.0
        self._epoch_kls.append(approx_kl)
        if self.actor_critic is not None:
            step_value_head(
                self.actor_critic, self.head_optimizer, self._empty_iteration, self.args.max_grad_norm
            )
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


def _unused_reward(*args: Any, **kwargs: Any) -> list[float]:
    """GRPOTrainer requires a reward function; here rewards come from the environment."""
    raise RuntimeError("not called: MultiStepTrainer scores episodes itself")
