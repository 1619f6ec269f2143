"""The log-probs of completion tokens that `MultiStepTrainer` computes: the training forward's, and the
no-grad ones an iteration's rows carry into the loss.

`TrainerLogps` is a mixin before `GRPOTrainer`. Its override of `_get_per_token_logps_and_entropies`
scores only completion tokens and runs shared prompt text once (trainers/logps.py) on a CPU with one
process, and keeps TRL's fused LM head otherwise (CUDA: the kernel would build full-vocabulary fp32
logits). Before the update each micro-batch gets, as its algorithm needs them: the rollout policy's
log-probs (PPO epochs measure every epoch's ratio against them), the reference policy's (the KL term) and,
for rollouts from another engine (vLLM, a copy in another dtype), TRL's importance-sampling ratio. These
no-grad forwards run a whole micro-batch, so they follow `max_batch_tokens` as the training passes do.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.trainers.logps import Recorded, kernel_applies, shared_prefix_logps
from agentrl.types import StepSample


class TrainerLogps:
    """`MultiStepTrainer`'s log-prob paths: a mixin listed before `GRPOTrainer`, reading the Trainer's
    attributes and the trainer's own ones annotated here."""

    max_batch_tokens: int | None
    budget_completions_only: bool
    trl_logprobs: bool
    rollout_top_k: int
    rollout_top_p: float
    ppo_epochs: int
    actor_critic: Any
    _train_logps: torch.Tensor | None
    _iteration_metrics: dict[str, float]
    #: the rollout's forward kept for the update (trainers/multistep.py `rollout_graph_reason`); None: off
    recorded_logits: Recorded | None = None

    def _add_importance_ratio(self, batch: dict[str, Any], rows: list[StepSample]) -> None:
        """vLLM sampled the rows with the trainer's weights but its own numerics: TRL's importance-sampling
        correction reweights each token's loss by pi_train / pi_vLLM, truncated or masked as its mode and
        cap say (agents/backends/trl_vllm.py). The iteration's metrics count the tokens left uncorrected
        because their top-k / top-p set is a near-tie (`sampling/uncorrected_tokens`) and the rows the
        correction masks (ratio 0: out of its bounds, or a token of zero probability here;
        `sampling/masked_rows`)."""
        from agentrl.agents.backends.trl_vllm import importance_ratio, sampling_logps_tensor

        truncated = self.rollout_top_k > 0 or self.rollout_top_p < 1.0
        # vLLM's log-probs are of the truncated, renormalised distribution it samples from: so are these
        train = self._processed_logps(batch) if truncated else self._rollout_logps(batch)
        width = batch["completion_ids"].size(1)
        sampling = sampling_logps_tensor(rows, width, batch["completion_ids"].device)
        batch["sampling_per_token_logps"] = sampling
        mask = batch["completion_mask"]
        ratio = importance_ratio(
            train,
            sampling,
            mask,
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_max,
            clip_min=self.vllm_importance_sampling_clip_min,
        )
        batch["importance_sampling_ratio"] = ratio
        valid = mask.bool()
        counts = self._iteration_metrics
        uncorrected = int((torch.isnan(train) & valid).sum())
        # one ratio a row (the sequence modes) or a token
        zero = (ratio[:, 0] == 0) & valid.any(-1) if ratio.size(-1) == 1 else ((ratio == 0) & valid).any(-1)
        counts["sampling/uncorrected_tokens"] = counts.get("sampling/uncorrected_tokens", 0) + uncorrected
        counts["sampling/masked_rows"] = counts.get("sampling/masked_rows", 0) + int(zero.sum())
        if self.ppo_epochs > 1 and not truncated:
            batch["old_per_token_logps"] = train  # the same forward the epochs would take

    def _processed_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The rows' completion log-probs under the top-k / top-p distribution the rollouts sampled from."""
        from agentrl.trainers.logps import processed_logps

        ids, mask, width = self._sequences(batch)
        with torch.no_grad(), self.compute_loss_context_manager():
            return processed_logps(
                self.model,
                ids,
                mask,
                width,
                self.temperature,
                self.rollout_top_k,
                self.rollout_top_p,
                rows_per_pass=self._rows_per_pass(batch),
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

    def _reference_logps(self, batch: dict[str, torch.Tensor], rows: list[StepSample]) -> torch.Tensor:
        """Log-probs of the rows' completion tokens under the reference policy (for the KL term): TRL's
        frozen copy under full fine-tuning, the base with the adapter disabled under LoRA. A critic whose
        trunk is that frozen copy scored them already, in the forward that gave its values."""
        from trl.trainer.utils import use_adapter

        critic = self.actor_critic.critic if self.actor_critic is not None else None
        if critic is not None and critic.scores_reference:
            return critic.reference_logps(rows, batch["completion_ids"].size(1))
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
        # the training forward of the policy: one-token answers may take the rollout's logits instead
        recorded = None
        if self.recorded_logits is not None and torch.is_grad_enabled() and model is not self.ref_model:
            recorded = self._recorded
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            logps, entropies = shared_prefix_logps(
                model,
                input_ids[start : start + batch_size],
                attention_mask[start : start + batch_size],
                logits_to_keep,
                self.temperature,
                compute_entropy,
                recorded,
            )
            all_logps.append(logps)
            all_entropies.append(entropies)
        return torch.cat(all_logps), torch.cat(all_entropies) if compute_entropy else None, None

    def _recorded(self, prompts: list[tuple[int, ...]]) -> torch.Tensor | None:
        """The rollout's logits of `prompts` with their graphs (None: the update runs its own forward);
        the iteration's metrics say which it was (`update_reused_rollout`)."""
        assert self.recorded_logits is not None
        logits = self.recorded_logits(prompts)
        self._iteration_metrics["update_reused_rollout"] = float(logits is not None)
        return logits
