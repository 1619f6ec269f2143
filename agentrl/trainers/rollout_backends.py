"""Where training rollouts come from when the trained model does not generate them itself.

`vllm_rollouts` (`model.backend=vllm`): TRL's vLLM engine, colocated or a server; `copy_rollouts`
(`algo.rollout_dtype`): a copy of the policy in another dtype (agents/backends/hf.py `HFCopyBackend`).
Either becomes `trainer.rollout_backend`, which the trainer syncs with the trained weights before every
rollout and corrects for with importance sampling (`MultiStepTrainer._add_importance_ratio`). Either
takes memory the trainer's token budgets counted as free: the trainer plans them again once it exists.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError

if TYPE_CHECKING:
    from agentrl.trainers.grpo_trainer import MultiStepTrainer

log = logging.getLogger(__name__)


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
    trainer.plan_memory()  # a colocated engine holds its share of the GPU now
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
    trainer.plan_memory()  # the copy's weights are allocated now
    return agent.with_backend(backend)
