"""Generation backends with one interface: token-id prompts in, completion ids and log-probs out.

- `HFBackend` — batched generation on a transformers model (left padding, KV cache). Returns the
  sampled ids and each sampled token's log-prob under the sampling distribution, computed like TRL's
  GRPO computes old log-probs: ``log_softmax(logits / temperature)`` of the chosen token, from the raw
  logits (greedy: ``log_softmax(logits)``). Top-k/top-p truncation is not reflected, as in TRL.
  The KV states of the prompts' shared head (chat template + instructions) are computed once and
  reused (prefix caching), so each call prefills only what differs between rows. With
  `share_prompts`, identical prompts in a batch are also prefilled once (training rollouts).
- `HFCopyBackend` (hf.py) — training rollouts with `algo.rollout_dtype`: the HF path on a copy of the
  trained model in bf16 (or fp16), synced before every rollout, with TRL's importance-sampling
  correction in the loss, as for vLLM.
- `OpenAIBackend` — any OpenAI-compatible chat-completions endpoint over HTTP (stdlib urllib). It takes
  chat messages, not token ids (`chat_input = True`); ids come from a tokenizer if one is configured.
  A request waits `model.timeout` seconds and is retried `model.max_retries` times (connection errors,
  timeouts, HTTP 429/5xx) with logged, doubling waits from `RETRY_WAIT_S`; then one BackendError line.
- `VLLMBackend` — thin wrapper over `vllm.LLM` for evaluation on GPU machines; vllm is imported lazily.
  It loads the weights from disk once, so it never sees training's updates.
- `TRLVLLMBackend` (trl_vllm.py) — training rollouts with `model.backend=vllm`: TRL's own vLLM engine
  (`VLLMGeneration`, colocated or a server), synced with the trained weights before every rollout, with
  TRL's importance-sampling correction in the loss. Tested with a fake engine of the same interface.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.agents.backends.base import BACKENDS, Backend, Completion, SamplingConfig
from agentrl.agents.backends.hf import HFBackend, HFCopyBackend
from agentrl.agents.backends.openai import OpenAIBackend
from agentrl.agents.backends.vllm import VLLMBackend
from agentrl.errors import UnknownChoiceError


# ---- construction ----------------------------------------------------------------------------------
def build_backend(
    model_cfg: Any, *, model: Any = None, tokenizer: Any = None, seed: int = 0, share_prompts: bool = False
) -> Backend:
    """The backend named by `model.backend`. A preloaded `model`/`tokenizer` (training's policy) is reused;
    `share_prompts` turns on the hf backend's prompt sharing (training rollouts)."""
    from agentrl.models import (
        check_model_source,
        load_model,
        load_tokenizer,
        model_config,
        resolve_name_or_path,
    )

    cfg = model_config(model_cfg)
    if cfg.backend == "hf":
        if model is None:
            model, loaded_tokenizer = load_model(cfg)
            tokenizer = tokenizer or loaded_tokenizer
        elif tokenizer is None:
            tokenizer = load_tokenizer(cfg)
        return HFBackend(model, tokenizer, prefix_cache=cfg.prefix_cache, share_prompts=share_prompts)
    if cfg.backend == "openai":
        if tokenizer is None and cfg.tokenizer:
            check_model_source(cfg.tokenizer, "model.tokenizer")
            tokenizer = load_tokenizer(dataclasses.replace(cfg, name_or_path=cfg.tokenizer))
        return OpenAIBackend(
            cfg.base_url,
            cfg.name,
            api_key_env=cfg.api_key_env,
            tokenizer=tokenizer,
            timeout=cfg.timeout,
            max_concurrency=cfg.max_concurrency,
            logprobs=cfg.logprobs,
            return_token_ids=cfg.return_token_ids,
            retries=cfg.max_retries,
        )
    if cfg.backend == "vllm":
        return VLLMBackend(
            resolve_name_or_path(cfg),
            tokenizer=tokenizer,
            seed=seed,
            dtype=cfg.dtype,
            trust_remote_code=cfg.trust_remote_code,
            **dict(cfg.vllm),
        )
    raise UnknownChoiceError("model.backend", cfg.backend, BACKENDS)


__all__ = [
    "BACKENDS",
    "Backend",
    "Completion",
    "HFBackend",
    "HFCopyBackend",
    "OpenAIBackend",
    "SamplingConfig",
    "VLLMBackend",
    "build_backend",
]
