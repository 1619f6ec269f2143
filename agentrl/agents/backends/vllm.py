"""`VLLMBackend`: a thin wrapper over `vllm.LLM` for GPU machines (see the package doc)."""

from __future__ import annotations

import logging
from typing import Any

from agentrl.agents.backends.base import Backend, Completion, SamplingConfig
from agentrl.errors import BackendError

log = logging.getLogger(__name__)


# ---- vLLM ------------------------------------------------------------------------------------------
class VLLMBackend(Backend):
    """Generation with vLLM on GPUs (optional extra: `pip install agentrl[vllm]`). Untested here.

    Log-probs are what vLLM reports for the sampled tokens (by default from the raw logits, before
    temperature; set `logprobs_mode="processed_logprobs"` in newer vLLM to match the HF backend).
    For training, weight syncing into vLLM is the trainer's job (TRL's vLLM integration).
    """

    name = "vllm"

    def __init__(self, name_or_path: str, *, tokenizer: Any = None, seed: int = 0, **engine_kwargs: Any):
        try:
            import vllm
        except ImportError as exc:
            raise BackendError(
                "the vllm backend needs vLLM on a CUDA machine: pip install vllm (or agentrl[vllm])"
            ) from exc
        self._vllm = vllm
        self.llm = vllm.LLM(model=name_or_path, seed=seed, **engine_kwargs)
        self.tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()

    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[Completion]:
        # one SamplingParams per prompt: a shared seed would give every row of a group the same sample
        params = [
            self._vllm.SamplingParams(
                temperature=float(sampling.temperature),
                top_p=float(sampling.top_p),
                top_k=int(sampling.top_k) if sampling.top_k > 0 else -1,
                max_tokens=int(sampling.max_new_tokens),
                stop=list(sampling.stop) or None,
                include_stop_str_in_output=True,
                logprobs=0,  # 0: only the sampled token's log-prob
                seed=None if seed is None else seed + k,
            )
            for k in range(len(prompts))
        ]
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        results: list[Completion] = []
        for output in self.llm.generate(inputs, params, use_tqdm=False):
            out = output.outputs[0]
            ids = list(out.token_ids)
            lps = None
            if out.logprobs is not None:
                lps = [float(step[token].logprob) for step, token in zip(out.logprobs, ids, strict=False)]
            results.append((ids, lps))
        return results
