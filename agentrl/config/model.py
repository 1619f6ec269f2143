"""`model=` schema: the base model, its backend and dtype, and LoRA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl.config.base import Schema, setting

BACKENDS = ("hf", "openai", "vllm")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # models.resolve_dtype


@dataclass
class LoRAConfig(Schema):
    """`model.lora`: PEFT LoRA for training (r = 0: full fine-tuning)."""

    r: int = setting(0, "LoRA rank; > 0 enables LoRA (PEFT) for training", ge=0)
    alpha: int = setting(16, "LoRA alpha (scaling = alpha / r)", ge=1)
    dropout: float = setting(0.05, "dropout on the LoRA inputs", ge=0, lt=1)
    target_modules: Any = setting("all-linear", "modules that get adapters: all-linear or a list of names")

    def check(self, prefix: str) -> None:
        names = self.target_modules
        if not (
            isinstance(names, str) or (isinstance(names, list) and all(isinstance(n, str) for n in names))
        ):
            self.fail(prefix, "target_modules", "expected a module name or a list of names")


@dataclass
class ModelConfig(Schema):
    """Every conf/model/*.yaml: a Hugging Face model (backend hf or vllm) or an OpenAI-compatible endpoint
    (backend openai); keys a backend does not use are ignored by it."""

    PREFIX: ClassVar[str | None] = "model"

    name: str = setting("model", "short name in run names and reports; backend openai: the served model name")
    name_or_path: str | None = setting(
        None, "builtin:<name> | hub id | local dir (checkpoint or PEFT adapter); backend openai: unused"
    )
    backend: str = setting(
        "hf", "hf (batched generate) | openai (any compatible endpoint) | vllm", choices=BACKENDS
    )
    dtype: str = setting("auto", "auto: bf16 on CUDA, fp32 on CPU; or a dtype name", choices=DTYPES)
    device: str = setting("auto", "auto: cuda if visible, else cpu; or a torch device")
    device_map: Any = setting(None, "e.g. auto: shard across all visible GPUs (accelerate); overrides device")
    attn_implementation: str = setting(
        "sdpa",
        "hf backend: transformers attention kernel: sdpa (torch, any device) | eager | flash_attention_2"
        " (CUDA, needs pip install flash-attn)",
        choices=("sdpa", "eager", "flash_attention_2"),
    )
    trust_remote_code: bool = setting(False, "allow model code from the hub")
    hub_kernels: bool = setting(
        False,
        "transformers' Hub kernels (package kernels): true swaps layers for kernels downloaded from the"
        " Hub when the model is loaded or moved to a GPU (needs the Hub or its cache)",
    )
    prefix_cache: bool = setting(
        True, "hf backend: reuse the shared prompt head's KV states across rows and calls"
    )
    cache_dir: str | None = setting(None, "null: $AGENTRL_CACHE or ~/.cache/agentrl")
    base_url: str = setting("http://localhost:8000/v1", "backend openai: the endpoint's base URL")
    api_key_env: str | None = setting(
        "OPENAI_API_KEY", "backend openai: environment variable holding the API key (may be unset)"
    )
    tokenizer: str | None = setting(
        None, "backend openai: hub id / dir of a tokenizer, for completion token ids"
    )
    timeout: float = setting(120.0, "backend openai: seconds per HTTP request", gt=0)
    max_retries: int = setting(
        2, "backend openai: retries of a request after a connection error, timeout or HTTP 429/5xx", ge=0
    )
    max_concurrency: int = setting(16, "backend openai: parallel requests per batched step", ge=1)
    logprobs: bool = setting(True, "backend openai: ask the server for the sampled tokens' log-probs")
    return_token_ids: bool = setting(False, "backend openai: exact completion token ids (vLLM servers)")
    vllm: dict = setting(factory=dict, help="backend vllm: extra vllm.LLM(...) engine arguments")
    lora: LoRAConfig = setting(factory=LoRAConfig, help="LoRA adapters for training")

    def check(self, prefix: str) -> None:
        if self.backend in ("hf", "vllm") and not self.name_or_path:
            self.fail(
                prefix,
                "name_or_path",
                f"required with backend {self.backend} (a hub id, dir or builtin:<name>)",
            )
        if self.backend == "openai" and not _is_http_url(self.base_url):
            self.fail(prefix, "base_url", "must be an http(s) URL with a host, e.g. http://localhost:8000/v1")


def _is_http_url(url: str) -> bool:
    """An http:// or https:// URL with a host (and, if given, a numeric port)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)
