"""Training rollouts through TRL's own vLLM integration, whose engine receives the trained weights.

`model.backend=vllm` (backends/vllm.py) builds a separate `vllm.LLM` from disk that never sees an optimizer
step: training rollouts through it would silently stay on the base policy. Here the engine is TRL 1.16's
`trl.generation.vllm_generation.VLLMGeneration` (the object `GRPOTrainer` builds when `use_vllm=True`),
built by the trainer around the trained model and its accelerator; `sync_weights()` pushes the current
weights into it (colocate: `load_weights` per parameter; server: NCCL broadcast), then resets its prefix
cache.

- `TRLVLLMBackend` — the `Backend` the training view of the LLM agent generates with. The sampling
  settings of a `VLLMGeneration` are fixed when it is built (temperature, top_k, top_p, min_p,
  repetition_penalty, max_completion_length, its `generation_kwargs`: stop strings), so a request whose
  `SamplingConfig` asks for other ones raises `BackendError` (evaluation keeps the hf backend). A request
  may ask for fewer new tokens or more stop strings than the engine uses: completions are cut exactly
  like the hf backend cuts them (through the first stop string, else through the first eos, kept), and a
  cut never changes the distribution of the kept tokens. `agent.decision=score` is not supported (only
  generation). `sync_weights(step)` forwards and records the push (`sync_count`, `synced_step`,
  `synced`); `weights_changed()` (the `RolloutCacheReset` callback calls it after each optimizer step)
  clears `synced`, and `generate` refuses to run on stale weights.
- `importance_ratio` — TRL 1.16's vLLM importance-sampling correction (truncated / masked IS, per token
  or per sequence), the tensor `GRPOTrainer._compute_loss` multiplies the per-token loss by.
- `vllm_generation_kwargs` — the `VLLMGeneration(...)` keyword arguments for training rollouts, from
  agentrl's algo and model configs (`model.vllm`).

Log-probs. vLLM reports each sampled token's log-prob; TRL builds its colocated engine with
`logprobs_mode="processed_logprobs"` (vllm_generation.py, `_init_vllm`), so they are taken AFTER
temperature and top-k/top-p: with top_k > 0 or top_p < 1 they are log-probs of the truncated, renormalised
distribution. The trainer's side of the importance ratio is taken from the same processed distribution
(`trainers/logps.py` `processed_logps`, renormalised over the kept tokens), so on identical weights the
ratio is 1; the loss itself keeps TRL's log_softmax(logits / temperature). A server must run with
`--logprobs-mode processed_logprobs` (`trl vllm-serve` sets it): the backend asks the server and refuses
one that reports another mode.

Weights. `build_generation` builds `AgentrlVLLMGeneration`, TRL's class with one change: for a PEFT model
it sends each adapted weight as `base + B @ A * scaling` computed out of place, where TRL merges the
adapter into the bf16 base in place and unmerges it after (each merge/unmerge rounds the base: it drifts
sync after sync). Sleep mode (`model.vllm.enable_sleep_mode`): TRL's `generate` puts the engine to sleep
(level 2: weights discarded) after every call and re-sends all weights at the next, i.e. at every env
step, and under ZeRO-3 that gather is a collective whose count differs between processes. Here the engine
is woken once per rollout by `sync_weights`, stays awake through the rollout's `generate` calls, and
`end_rollout` puts it back to sleep before the update: one weight transfer per weights version.

Memory (colocate). The engine shares each training GPU: `colocate_memory_utilization` sizes
`gpu_memory_utilization` from the model (bf16 weights, the KV cache of one `max_model_length` sequence or
a full rollout batch, vLLM's overhead) when it is not set, and refuses a setting (or a model) that leaves
too little room for the training state (weights, gradients, AdamW state, a reference model, a critic's
trunk copy) plus activations. `tensor_parallel_size > 1` is refused in colocate mode: TRL requires it to
divide the number of training processes and then makes `generate` a collective over each group, which
lockstep rollouts (a different number of prompts per process and call) cannot serve.

Seeds. The engine samples from its own generator (seeded once when it is built), so the `seed` an agent
passes per call is ignored: rollouts are not reproducible run to run, unlike the hf backend's. Never put a
`seed` in the engine's generation_kwargs: every call would replay one random stream, and a group's
identical prompts would get identical completions (no advantage signal).

Several processes. `VLLMGeneration.generate` is a collective in server mode (`gather_object`) and with
tensor_parallel_size > 1 (`all_gather_object` over the TP group), and it slices the gathered results
assuming every process passed the same number of prompts. Lockstep rollouts pass a different number of
active episodes per call and per process, and processes finish their rollouts after different numbers of
calls, so server mode works with one process only, and colocate mode with tensor_parallel_size=1 (one
engine per process, no collective in `generate`) with any number. The constructor enforces this.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.agents.backends.base import Backend, Completion, SamplingConfig, completion_length
from agentrl.errors import BackendError, ConfigError

log = logging.getLogger(__name__)

#: `GRPOConfig.vllm_importance_sampling_mode` values of TRL 1.16 (default "sequence_mask")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: the `VLLMGeneration` attributes this backend reads (set in its __init__; the tests check they still exist)
GENERATION_ATTRIBUTES = (
    "accelerator",
    "mode",
    "tensor_parallel_size",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_completion_length",
    "logprobs",
    "generation_kwargs",
)
#: `model.vllm` keys `vllm_generation_kwargs` passes on (VLLMGeneration's engine arguments), with aliases
MODEL_VLLM_KEYS = (
    "mode",
    "server_base_url",
    "server_host",
    "server_port",
    "server_timeout",
    "group_port",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_length",
    "max_num_seqs",
    "enable_sleep_mode",
    "model_impl",
)
MODEL_VLLM_ALIASES = {"max_model_len": "max_model_length", "vllm_mode": "mode"}
#: colocate's gpu_memory_utilization when the GPU and model are unknown (no CUDA: tests, fakes); on a GPU
#: `colocate_memory_utilization` sizes it per model
DEFAULT_GPU_MEMORY_UTILIZATION = 0.3
#: what the training side keeps free beyond its weights and optimizer state: activations, the allocator's
#: fragmentation, CUDA context (a share of the GPU plus a fixed amount)
TRAINING_HEADROOM = (0.10, 4 * 2**30)
#: vLLM's own memory beyond weights and KV cache (CUDA graphs, sampler, the profile run's activations)
ENGINE_OVERHEAD_BYTES = 2 * 2**30
#: prompt + completion tokens per sequence a sized engine keeps KV cache for, for each of max_num_seqs
SIZED_TOKENS_PER_SEQUENCE = 2048
#: generation_kwargs that change what is sampled (set through the algo config, never the engine's kwargs)
_FORBIDDEN_GENERATION_KWARGS = ("seed", "n", "logprobs", "best_of", "use_beam_search", "logits_processors")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    """`cfg.key` for typed configs and `cfg[key]`/`cfg.get(key)` for mappings (DictConfig, dict)."""
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or (hasattr(cfg, "get") and not hasattr(cfg, "__dataclass_fields__")):
        value = cfg.get(key, default)  # dict, DictConfig
    else:
        value = getattr(cfg, key, default)  # typed (dataclass) configs
    return default if value is None else value


def _plain(value: Any) -> dict[str, Any]:
    """A plain dict from a DictConfig / mapping / None."""
    if value is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            return dict(OmegaConf.to_container(value, resolve=True))  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return dict(value)


# ---- the engine's kwargs -------------------------------------------------------------------------------
def vllm_generation_kwargs(
    algo: Any,
    model_cfg: Any,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    memory: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of `VLLMGeneration(model=..., accelerator=..., processing_class=..., **these)` for
    training rollouts. The trainer adds the three it owns: `model=trainer.model` (unwrapped; the engine
    in colocate mode loads `model.name_or_path` from disk, then `sync_weights` overwrites it),
    `accelerator=trainer.accelerator`, `processing_class=trainer.processing_class`.

    - sampling: `temperature`, `top_k`, `top_p` from the algo config (its rollout settings),
      `max_completion_length=max_new_tokens` (the training view's `sampling.max_new_tokens`),
      `min_p=0`, `repetition_penalty=1` (agentrl never uses them), `logprobs=0` (the sampled token's
      log-prob only: what the importance-sampling correction needs);
    - `stop` (the training view's `effective_sampling().stop`, e.g. "</action>") go to vLLM as
      `generation_kwargs={"stop": [...], "include_stop_str_in_output": True}` (SamplingParams in colocate
      mode, the /v1/completions body in server mode) so generation stops there as with the hf backend;
    - engine: the `model.vllm` keys in `MODEL_VLLM_KEYS` (`max_model_len` is accepted for
      `max_model_length`): `mode` colocate (default: vLLM in each training process, sharing its GPU) or
      server (a `vllm serve` started as `trl vllm-serve` does, at `server_base_url` or
      `server_host:server_port`); `tensor_parallel_size` (1; colocate refuses others), `gpu_memory_utilization`
      (colocate with `memory`, the keyword arguments of `colocate_memory_utilization` but the first: sized
      per model when unset, checked when set; else default 0.3), `max_model_length`, `max_num_seqs` (default: one rollout round's episodes,
      `algo.groups_per_iteration * algo.group_size`, the largest lockstep batch), `enable_sleep_mode`
      (offload the engine between rollouts), `model_impl`, `server_timeout`, `group_port`;
      `trust_remote_code` from the model config. Other keys raise ConfigError: they are `vllm.LLM`
      arguments of the separate vllm backend, which VLLMGeneration does not take.
    """
    raw = _plain(_get(model_cfg, "vllm"))
    engine: dict[str, Any] = {}
    unknown = []
    for key, value in raw.items():
        name = MODEL_VLLM_ALIASES.get(key, key)
        if name in MODEL_VLLM_KEYS:
            engine[name] = value
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(
            f"model.vllm key(s) {sorted(unknown)} cannot be passed to TRL's VLLMGeneration (training rollouts); "
            f"it takes {', '.join(MODEL_VLLM_KEYS)} (max_model_len: max_model_length)"
        )
    mode = str(engine.setdefault("mode", "colocate"))
    if mode not in ("colocate", "server"):
        raise ConfigError(f"model.vllm.mode must be colocate or server, not {mode!r}")
    tp = int(engine.setdefault("tensor_parallel_size", 1))
    if mode == "colocate" and tp != 1:
        raise ConfigError(
            f"model.vllm.tensor_parallel_size={tp}: colocate mode runs one engine per training process "
            "(TRL requires tensor_parallel_size to divide the process count and then gathers every process's "
            "prompts, which lockstep rollouts cannot match); use 1, or model.vllm.mode=server with trl vllm-serve"
        )
    if memory is not None and mode == "colocate":
        engine["gpu_memory_utilization"] = colocate_memory_utilization(
            engine.get("gpu_memory_utilization"), **memory
        )
    engine.setdefault("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    groups, group_size = _get(algo, "groups_per_iteration"), _get(algo, "group_size")
    if "max_num_seqs" not in engine and groups and group_size:
        engine["max_num_seqs"] = int(groups) * int(group_size)
    if int(max_new_tokens) < 1:
        raise ConfigError("max_new_tokens must be >= 1")
    stops = [str(s) for s in dict.fromkeys(stop) if s]
    top_k = int(_get(algo, "top_k", 0))
    return {
        **engine,
        "trust_remote_code": bool(_get(model_cfg, "trust_remote_code", False)),
        "temperature": float(_get(algo, "temperature", 1.0)),
        "top_p": float(_get(algo, "top_p", 1.0)),
        "top_k": top_k if top_k > 0 else 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_completion_length": int(max_new_tokens),
        "logprobs": 0,
        "generation_kwargs": {"stop": stops, "include_stop_str_in_output": True} if stops else {},
    }


# ---- colocate memory ---------------------------------------------------------------------------------
def kv_bytes_per_token(config: Any) -> int:
    """bf16 K and V of one token in every layer (GQA: the key-value heads only)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * 2


def colocate_memory_utilization(
    utilization: float | None,
    *,
    gpu_bytes: int,
    training_bytes: int,
    parameters: int,
    kv_bytes_per_token: int,
    max_model_length: int,
    max_num_seqs: int,
) -> float:
    """`gpu_memory_utilization` of a colocated engine on a GPU of `gpu_bytes`, next to a training process
    holding `training_bytes` (weights, gradients, optimizer state, reference model, critic trunk).

    The engine needs its bf16 weights (2 x `parameters`), the KV cache of at least one `max_model_length`
    sequence (vLLM refuses to start with less) and its overhead; unset, it gets that or the KV cache of
    `max_num_seqs` sequences of 2048 tokens, whichever is more (one lockstep step's batch), rounded up to
    0.01. Raises ConfigError when a set value is below the engine's minimum, or when engine and training
    together leave less than the headroom for activations (10% of the GPU + 4 GiB)."""
    gib = 2**30
    weights = 2 * parameters
    minimum = weights + kv_bytes_per_token * max_model_length + ENGINE_OVERHEAD_BYTES
    sized = weights + kv_bytes_per_token * max(max_model_length, max_num_seqs * SIZED_TOKENS_PER_SEQUENCE)
    sized += ENGINE_OVERHEAD_BYTES
    headroom = TRAINING_HEADROOM[0] * gpu_bytes + TRAINING_HEADROOM[1]
    room = gpu_bytes - training_bytes - headroom  # what the engine may take
    fix = (
        "model.lora.r=16, algo.beta=0 or algo.ref_dtype=bfloat16, model.vllm.max_model_length, or mode=server"
    )
    if utilization is None:  # the sized engine if it fits, else the smallest one that starts
        utilization = math.ceil(sized / gpu_bytes * 100) / 100
        if utilization * gpu_bytes > room:
            utilization = math.ceil(minimum / gpu_bytes * 100) / 100
    if not 0 < utilization < 1:
        raise ConfigError(f"model.vllm.gpu_memory_utilization={utilization}: must be in (0, 1)")
    if utilization * gpu_bytes < minimum:
        raise ConfigError(
            f"model.vllm.gpu_memory_utilization={utilization:.2f}: the colocated engine needs "
            f"{minimum / gib:.1f} GiB ({weights / gib:.1f} GiB bf16 weights, the KV cache of one "
            f"{max_model_length}-token sequence, overhead) of the {gpu_bytes / gib:.0f} GiB GPU, and the training "
            f"process holds {training_bytes / gib:.1f} GiB; {fix}"
        )
    if utilization * gpu_bytes > room:
        raise ConfigError(
            f"model.vllm.gpu_memory_utilization={utilization:.2f}: the engine ({utilization * gpu_bytes / gib:.1f} "
            f"GiB) and the training state ({training_bytes / gib:.1f} GiB) leave less than "
            f"{headroom / gib:.1f} GiB of the {gpu_bytes / gib:.0f} GiB GPU for activations; {fix}"
        )
    return utilization


def training_state_bytes(model: Any, *others: Any) -> int:
    """Bytes this process holds for training: every parameter of `model` and `others` (a reference model,
    a critic's trunk copy; None skipped, shared tensors once), plus a gradient and two AdamW moments of each
    trainable parameter of `model` (in its dtype; the others are never stepped, whatever their
    requires_grad). Sharded parameters count their local shard (ZeRO-3's `ds_tensor`, a DTensor's local
    tensor)."""
    seen: set[int] = set()
    total = 0
    for index, module in enumerate((model, *others)):
        if module is None:
            continue
        for param in module.parameters():
            local = getattr(param, "ds_tensor", None)
            if local is None:
                local = param.to_local() if hasattr(param, "to_local") else param
            if local.data_ptr() in seen and local.numel():
                continue
            seen.add(local.data_ptr())
            size = local.numel() * local.element_size()
            total += size * (4 if index == 0 and param.requires_grad else 1)
    return total


def parameter_count(model: Any) -> int:
    """The full model's parameter count (ZeRO-3: `ds_numel`; DTensors: their global size)."""
    return sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in model.parameters())


def colocate_memory(trainer: Any, algo: Any, model_cfg: Any) -> dict[str, Any] | None:
    """What `colocate_memory_utilization` needs, measured on the trainer's GPU and models: the policy, TRL's
    reference model, a critic's trunk copy (None without CUDA: the engine then gets the default share)."""
    import torch

    device = trainer.accelerator.device
    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    critic = trainer.actor_critic.critic if trainer.actor_critic is not None else None
    trunk = critic.trunk if critic is not None and not critic.lora else None
    vllm_cfg = _plain(_get(model_cfg, "vllm"))
    length = vllm_cfg.get("max_model_length") or vllm_cfg.get("max_model_len")
    return {
        "gpu_bytes": torch.cuda.get_device_properties(device).total_memory,
        "training_bytes": training_state_bytes(model, trainer.ref_model, trunk),
        "parameters": parameter_count(model),
        "kv_bytes_per_token": kv_bytes_per_token(model.config),
        "max_model_length": int(length or model.config.max_position_embeddings),
        "max_num_seqs": int(vllm_cfg.get("max_num_seqs") or algo.groups_per_iteration * algo.group_size),
    }


# ---- the engine: TRL's VLLMGeneration, LoRA weights merged out of place --------------------------------
def merged_lora_weights(model: Any, full: Any = None) -> Any:
    """(vLLM name, tensor) of every weight of a PEFT LoRA `model` as vLLM expects them, each adapted weight
    as `base + sum over active adapters of B @ A * scaling`, computed out of place in fp32 and cast to the
    base's dtype: the base is never written. Names as TRL's `_iter_named_params` makes them (the PEFT
    prefixes and `.base_layer` dropped; adapter tensors and `original_module` copies skipped). `full`: maps
    a parameter to its whole tensor (FSDP2: `DTensor.full_tensor`); default: itself."""
    from peft.tuners.lora import Linear, LoraLayer

    full = full or (lambda t: t)
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    other = sorted(name for name, m in layers.items() if not isinstance(m, Linear))
    if other:  # embeddings and convolutions keep their adapters elsewhere (lora_embedding_A, ...)
        raise BackendError(
            f"only Linear LoRA layers can be sent to vLLM merged; {other[:3]} are not (model.lora.target_modules)"
        )
    prefix = getattr(model, "prefix", "lora_")
    for name, param in model.named_parameters():
        if prefix in name or "original_module" in name:
            continue
        vllm_name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        vllm_name = vllm_name.replace("modules_to_save.default.", "").replace(
            "_checkpoint_wrapped_module.", ""
        )
        owner, _, leaf = name.rpartition(".base_layer.")
        layer = layers.get(owner) if leaf == "weight" else None
        value = full(param.detach())
        if layer is not None and not layer.merged and not layer.disable_adapters:
            delta = None
            for adapter in layer.active_adapters:
                if adapter not in layer.lora_A:
                    continue
                if layer.use_dora.get(adapter) or getattr(layer, "lora_bias", {}).get(adapter):
                    raise BackendError(f"{owner}: DoRA / LoRA bias adapters cannot be sent to vLLM merged")
                a = full(layer.lora_A[adapter].weight).float()
                b = full(layer.lora_B[adapter].weight).float()
                step = (b @ a) * layer.scaling[adapter]
                step = step.T if getattr(layer, "fan_in_fan_out", False) else step
                delta = step if delta is None else delta + step
            if delta is not None:
                value = (value.float() + delta.to(value.device)).to(value.dtype)
        yield vllm_name, value


_GENERATION_CLASSES: dict[type, type] = {}


def generation_class(base: type | None = None) -> type:
    """`AgentrlVLLMGeneration`: `base` (TRL's `VLLMGeneration`, read when called) whose weight sync sends a
    PEFT model's adapted weights merged out of place (`merged_lora_weights`) instead of merging the adapter
    into the base and unmerging it, which changes the base by rounding at every sync."""
    if base is None:
        from trl.generation import vllm_generation

        base = vllm_generation.VLLMGeneration
    if base not in _GENERATION_CLASSES:

        class AgentrlVLLMGeneration(base):  # type: ignore[misc, valid-type]
            def _iter_named_params(self) -> Any:
                from accelerate.utils import is_peft_model

                if not is_peft_model(self.model) or getattr(self._dist, "fsdp_version", None) == 1:
                    yield from super()._iter_named_params()
                    return

                def full(t: Any) -> Any:
                    if not hasattr(t, "full_tensor"):
                        return t
                    # FSDP2 with CPU offload keeps shards on the CPU; gather them on the GPU, as TRL does
                    return (t.to(self.accelerator.device) if t.is_cpu else t).full_tensor()

                # ZeRO-3: the whole model at once (a no-op otherwise), as TRL does before merging
                with self._dist.gather_params(list(self.model.parameters())):
                    yield from merged_lora_weights(self.model, full)

        _GENERATION_CLASSES[base] = AgentrlVLLMGeneration
    return _GENERATION_CLASSES[base]


def build_generation(model: Any, accelerator: Any, processing_class: Any, **kwargs: Any) -> Any:
    """The training rollouts' engine: `generation_class()(model=..., accelerator=..., processing_class=...,
    **vllm_generation_kwargs(...))`."""
    return generation_class()(
        model=model, accelerator=accelerator, processing_class=processing_class, **kwargs
    )


# ---- the backend ---------------------------------------------------------------------------------------
class TRLVLLMBackend(Backend):
    """Generation through a `trl.generation.vllm_generation.VLLMGeneration` (see the module doc).

    `generation`: the VLLMGeneration (or anything with its `generate(prompts, images, num_generations,
    profiler=None)` / `sync_weights()` and attributes `GENERATION_ATTRIBUTES`); `tokenizer`: the policy's
    (decodes stop strings; the agent tokenizes prompts with it). `eos_token_ids`: the ids that end a
    completion (default: the tokenizer's eos and the trained model's generation_config eos). With
    `require_sync` (default), `generate` raises until `sync_weights` has run since the last
    `weights_changed()`.
    """

    name = "trl-vllm"

    def __init__(
        self,
        generation: Any,
        tokenizer: Any,
        *,
        eos_token_ids: Sequence[int] | None = None,
        require_sync: bool = True,
    ):
        self.generation = generation
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            eos: set[int] = set()
            if getattr(tokenizer, "eos_token_id", None) is not None:
                eos.add(int(tokenizer.eos_token_id))
            config = getattr(getattr(generation, "model", None), "generation_config", None)
            model_eos = getattr(config, "eos_token_id", None)
            for e in model_eos if isinstance(model_eos, list) else [model_eos]:
                if e is not None:
                    eos.add(int(e))
            eos_token_ids = sorted(eos)
        if not eos_token_ids:
            raise BackendError("the trl-vllm backend needs an eos token id (tokenizer.eos_token_id)")
        self.eos_ids = sorted(int(e) for e in eos_token_ids)
        self.require_sync = require_sync
        self.sync_count = 0  # pushes of the weights into the engine
        self.synced_step: int | None = None  # the `step` given to the last sync_weights
        self.synced = False  # pushed since the last weights_changed()
        self.calls = 0  # generate calls that reached the engine
        self._awake = False  # sleep mode: woken by sync_weights, put back to sleep by end_rollout
        self._warned: set[str] = set()
        self._check_engine()

    # -- the engine's fixed settings ---------------------------------------------------------------------
    def engine_settings(self) -> dict[str, Any]:
        """What the engine samples with: its attributes, overridden by its generation_kwargs (colocate:
        `generation_kwargs.update(...)` before SamplingParams; server: merged into the request body)."""
        gen = self.generation
        extra = dict(getattr(gen, "generation_kwargs", None) or {})
        top_k = extra.get("top_k", gen.top_k)
        stop = extra.get("stop") or ()
        return {
            "temperature": float(extra.get("temperature", gen.temperature)),
            "top_p": float(extra.get("top_p", gen.top_p)),
            "top_k": int(top_k) if top_k is not None and int(top_k) > 0 else 0,  # vLLM: 0 or -1 = off
            "min_p": float(extra.get("min_p", gen.min_p) or 0.0),
            "repetition_penalty": float(extra.get("repetition_penalty", gen.repetition_penalty)),
            "max_new_tokens": int(extra.get("max_tokens", gen.max_completion_length)),
            "stop": (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop),
            "include_stop_str_in_output": bool(extra.get("include_stop_str_in_output", False)),
            "logprobs": extra.get("logprobs", gen.logprobs),
        }

    def _check_engine(self) -> None:
        gen = self.generation
        missing = [a for a in GENERATION_ATTRIBUTES if not hasattr(gen, a)]
        if missing:
            raise BackendError(f"the generation object lacks VLLMGeneration's attribute(s) {missing}")
        extra = dict(gen.generation_kwargs or {})
        bad = sorted(k for k in extra if k in _FORBIDDEN_GENERATION_KWARGS)
        if bad:
            raise BackendError(
                f"VLLMGeneration.generation_kwargs must not set {bad}: per-request seeds would give every row "
                "the same random stream, and n/logprobs/beam search change what this backend reads"
            )
        settings = self.engine_settings()
        if settings["min_p"] > 0 or not math.isclose(settings["repetition_penalty"], 1.0):
            raise BackendError(
                f"VLLMGeneration samples with min_p={settings['min_p']} and repetition_penalty="
                f"{settings['repetition_penalty']}; agentrl's sampling has neither (use min_p=0, "
                "repetition_penalty=1: vllm_generation_kwargs does)"
            )
        if settings["logprobs"] is None:
            raise BackendError("VLLMGeneration was built with logprobs=None: build it with logprobs=0")
        if settings["stop"] and not settings["include_stop_str_in_output"]:
            raise BackendError(
                "VLLMGeneration.generation_kwargs has stop strings without include_stop_str_in_output=True: "
                "the answer's closing tag would be cut from the completion"
            )
        self._check_server_logprobs()
        processes = int(getattr(gen.accelerator, "num_processes", 1) or 1)
        if processes > 1 and (gen.mode == "server" or int(gen.tensor_parallel_size) > 1):
            raise BackendError(
                f"vLLM mode={gen.mode} with tensor_parallel_size={gen.tensor_parallel_size} needs one training "
                f"process ({processes} here): VLLMGeneration.generate is then a collective that assumes every "
                "process passes the same number of prompts, and lockstep rollouts do not. Use "
                "model.vllm.mode=colocate with tensor_parallel_size=1 (one engine per process)"
            )

    def _check_server_logprobs(self) -> None:
        """A server must report processed log-probs (after temperature and top-k/top-p), as the engine TRL
        colocates does: raw ones would bias every importance ratio. TRL's own trainer only warns."""
        gen = self.generation
        client = getattr(gen, "vllm_client", None)
        if gen.mode != "server" or client is None:  # only the main process holds the client
            return
        info = client.get_server_info()
        mode = (info.get("model_config") or {}).get("logprobs_mode")
        if mode != "processed_logprobs":
            raise BackendError(
                f"the vLLM server runs with --logprobs-mode {mode}: training rollouts need processed_logprobs "
                "(restart it with: trl vllm-serve --model <model>, which sets it, or VLLM_SERVER_DEV_MODE=1 vllm "
                'serve <model> --weight-transfer-config \'{"backend": "nccl"}\' --logprobs-mode '
                "processed_logprobs)"
            )

    def check_sampling(self, sampling: SamplingConfig) -> None:
        """Raise BackendError unless the engine samples from the distribution `sampling` asks for."""
        engine = self.engine_settings()
        wrong = []
        if not math.isclose(sampling.temperature, engine["temperature"], rel_tol=1e-6, abs_tol=1e-9):
            wrong.append(f"temperature {sampling.temperature} (engine {engine['temperature']})")
        if not math.isclose(sampling.top_p, engine["top_p"], rel_tol=1e-6, abs_tol=1e-9):
            wrong.append(f"top_p {sampling.top_p} (engine {engine['top_p']})")
        if (sampling.top_k if sampling.top_k > 0 else 0) != engine["top_k"]:
            wrong.append(f"top_k {sampling.top_k} (engine {engine['top_k']})")
        if sampling.max_new_tokens > engine["max_new_tokens"]:
            wrong.append(
                f"max_new_tokens {sampling.max_new_tokens} (engine max_completion_length "
                f"{engine['max_new_tokens']})"
            )
        extra_stops = [s for s in engine["stop"] if s not in sampling.stop]
        if extra_stops:
            wrong.append(f"stop {list(sampling.stop)} (the engine also stops at {extra_stops})")
        if wrong:
            raise BackendError(
                "the trl-vllm backend samples with the settings TRL's VLLMGeneration was built with, and this "
                f"request differs: {'; '.join(wrong)}. Training rollouts must use algo.temperature/top_k/top_p "
                "and the engine's max_completion_length; evaluation keeps the hf backend"
            )
        if sampling.max_new_tokens < engine["max_new_tokens"] and "max_new_tokens" not in self._warned:
            self._warned.add("max_new_tokens")
            log.warning(
                "trl-vllm: the engine generates up to %d tokens, requests ask for %d (cut afterwards; wasted work)",
                engine["max_new_tokens"],
                sampling.max_new_tokens,
            )

    # -- weights ----------------------------------------------------------------------------------------
    def sync_weights(self, step: int | None = None) -> None:
        """Push the trained weights into the engine (`VLLMGeneration.sync_weights`; with several processes
        every process must call it: gathering sharded parameters is a collective). `step`: the trainer's
        `state.global_step`, kept in `synced_step` for the trainer's own checks."""
        self.generation.sync_weights()  # sleep mode: wakes the engine's weights first
        if self._sleeps():
            self.generation.llm.wake_up(tags=["kv_cache"])
            self._awake = True
        self.sync_count += 1
        self.synced_step = step
        self.synced = True

    def weights_changed(self) -> None:
        """The trained weights moved (an optimizer step): the engine is stale until the next sync."""
        self.synced = False

    def end_rollout(self) -> None:
        """The rollout is over: in sleep mode the engine sleeps (level 2: weights and KV cache freed) until
        the next `sync_weights`, so the update has its memory. Otherwise nothing."""
        if self._sleeps() and self._awake:
            self.generation.llm.sleep(level=2)
            self.generation._llm_weights_sleeping = True  # TRL's flag: the weights must be re-sent
            self._awake = False

    def _sleeps(self) -> bool:
        gen = self.generation
        return gen.mode == "colocate" and bool(getattr(gen, "enable_sleep_mode", False))

    def _engine_generate(self, rows: list[list[int]]) -> Any:
        """TRL's `generate`; in sleep mode with the engine held awake (TRL's own `generate` would sleep
        after the call and re-send every weight before the next, i.e. at every env step)."""
        gen = self.generation
        if not self._sleeps():
            return gen.generate(prompts=rows, images=None, num_generations=1)
        if not self._awake:
            self.sync_weights(self.synced_step)
        gen.enable_sleep_mode = False
        try:
            return gen.generate(prompts=rows, images=None, num_generations=1)
        finally:
            gen.enable_sleep_mode = True

    # -- generation -------------------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[Completion]:
        """One (completion ids, log-probs) per prompt. `seed` is ignored (the module doc)."""
        self.check_sampling(sampling)
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise BackendError("empty prompt")
        if self.require_sync and not self.synced:
            raise BackendError(
                "the trl-vllm engine has not received the current weights: call sync_weights() before each "
                "rollout (after every optimizer step)"
            )
        rows = [[int(t) for t in p] for p in prompts]
        _, completion_ids, logprobs, logprob_token_ids = self._engine_generate(rows)
        self.calls += 1
        if len(completion_ids) != len(rows):
            raise BackendError(f"vLLM returned {len(completion_ids)} completions for {len(rows)} prompts")
        results: list[Completion] = []
        for k, ids in enumerate(completion_ids):
            ids = [int(t) for t in ids]
            lps = None
            if logprobs is not None:
                tokens = None if logprob_token_ids is None else logprob_token_ids[k]
                lps = _sampled_logprobs(ids, logprobs[k], tokens)
            ids = ids[: sampling.max_new_tokens]
            end = self._completion_length(ids, sampling.stop)
            results.append((ids[:end], None if lps is None else lps[:end]))
        return results

    def _completion_length(self, ids: list[int], stops: tuple[str, ...]) -> int:
        return completion_length(self.tokenizer, self.eos_ids, ids, stops)  # the hf backend's rule


def _sampled_logprobs(ids: list[int], logprobs: Any, token_ids: Any) -> list[float]:
    """Each sampled token's log-prob from VLLMGeneration's (T, num_logprobs) lists: the entry whose token
    id is the sampled one (with `logprobs=0` the only entry). vLLM's NaN arrives as None: kept as NaN, which
    `importance_ratio` treats as TRL does (no correction on that token)."""
    if len(logprobs) < len(ids):
        raise BackendError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
    values = []
    for t, token in enumerate(ids):
        entries = logprobs[t]
        if token_ids is None:
            value = entries[0]
        else:
            tokens = [int(x) for x in token_ids[t]]
            if token not in tokens:
                raise BackendError(
                    f"vLLM's log-probs at position {t} do not include the sampled token {token}"
                )
            value = entries[tokens.index(token)]
        values.append(float("nan") if value is None else float(value))
    return values


def training_view(agent: Any, backend: TRLVLLMBackend) -> Any:
    """The same LLM agent (interface, sampling, exploration wrappers) generating through `backend`; raises
    BackendError for `agent.decision=score` (TWOSOME scores every valid action with the model's logits in
    this process) and when the agent's sampling is not the engine's."""
    if getattr(agent, "decision", "generate") == "score":
        raise BackendError(
            "agent.decision=score (TWOSOME) scores every valid action with the model in this process; training "
            "rollouts through vLLM only generate: train it with model.backend=hf"
        )
    backend.check_sampling(agent.effective_sampling())
    return agent.with_backend(backend)


# ---- TRL's importance-sampling correction --------------------------------------------------------------
def importance_ratio(
    train_logps: Any,
    sampling_logps: Any,
    mask: Any,
    mode: str = "sequence_mask",
    cap: float | None = 3.0,
    *,
    clip_min: float | None = None,
) -> Any:
    """TRL 1.16's vLLM importance-sampling ratio: `inputs["importance_sampling_ratio"]`, which
    `GRPOTrainer._compute_loss` multiplies the per-token loss by (grpo_trainer.py:3146-3147, only when
    `self.use_vllm and self.vllm_importance_sampling_correction`, every loss type but vespo, whose gamma
    weights read it at :3001-3004); TRL stores it under that key at :2908-2909.

    Reproduces grpo_trainer.py:2660-2708 (`_generate_and_score_completions`), with `train_logps` =
    TRL's `old_per_token_logps` (the training model's no-grad log-probs of the completion tokens) and
    `sampling_logps` = its `sampling_per_token_logps` (vLLM's, NaN where vLLM gave none; padding 0):

        diff = nan_to_num((train - sampling) * mask, nan=0)              # NaN token: no correction
        sequence_*: diff = diff.sum(-1, keepdim=True)                     # one ratio per row
        ratio = exp(diff)
        *_truncate: ratio = clamp(ratio, min=clip_min, max=cap)
        *_mask:     ratio = 0 where ratio < clip_min or ratio > cap       # None: no bound on that side

    `cap` is `GRPOConfig.vllm_importance_sampling_clip_max` (default 3.0; the deprecated
    `vllm_importance_sampling_cap`), `clip_min` its `vllm_importance_sampling_clip_min` (default None);
    `mode` its `vllm_importance_sampling_mode` (default "sequence_mask"). Shape as TRL's: (B, T) for the
    token modes, (B, 1) for the sequence modes (it broadcasts over the per-token loss). Masked-out
    positions of the token modes get ratio 1 (clamped / tested like any other).
    """
    import torch

    if mode not in IS_MODES:
        raise ValueError(f"Unknown vLLM importance sampling mode {mode!r}; valid: {', '.join(IS_MODES)}")
    diff = torch.nan_to_num((train_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence_"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("_truncate"):
        if clip_min is None and cap is None:
            raise ValueError("*_truncate importance sampling needs cap (clip_max) or clip_min")
        return torch.clamp(ratio, min=clip_min, max=cap)
    low = clip_min if clip_min is not None else -math.inf
    high = cap if cap is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def importance_metrics(
    train_logps: Any, sampling_logps: Any, mask: Any, ratio: Any, mode: str = "sequence_mask"
) -> dict[str, float]:
    """TRL's logged statistics of the correction (grpo_trainer.py:2860-2896), for one process's rows:
    |train - sampling| over the valid tokens (NaN skipped) and the ratio's min/mean/max (per token for
    the token modes, per row for the sequence modes)."""
    import torch

    valid = mask.bool()
    delta = torch.abs(train_logps - sampling_logps)
    delta = delta[valid & ~torch.isnan(delta)]
    flat = ratio.flatten() if mode.startswith("sequence_") else ratio[valid]

    def stat(values: Any, fn: Any) -> float:
        return float(fn(values)) if values.numel() else 0.0

    return {
        "sampling/sampling_logp_difference/mean": stat(delta, torch.mean),
        "sampling/sampling_logp_difference/max": stat(delta, torch.max),
        "sampling/importance_sampling_ratio/min": stat(flat, torch.min),
        "sampling/importance_sampling_ratio/mean": stat(flat, torch.mean),
        "sampling/importance_sampling_ratio/max": stat(flat, torch.max),
    }


def sampling_logps_tensor(samples: Sequence[Any], width: int, device: Any = None) -> Any:
    """(B, width) float32 sampling log-probs of `StepSample` rows (`old_logprobs`), right-aligned with the
    packed completions (`pack_samples`): NaN where a row has none (a placeholder or filler row, or a
    backend without log-probs), so `importance_ratio` leaves those rows uncorrected; 0 in the padding."""
    import torch

    out = torch.zeros((len(samples), width), dtype=torch.float32)
    for row, sample in enumerate(samples):
        c = min(len(sample.completion_ids), width)
        if sample.old_logprobs is None or len(sample.old_logprobs) < c:
            out[row, :c] = float("nan")
        else:
            out[row, :c] = torch.tensor([float(x) for x in sample.old_logprobs[:c]], dtype=torch.float32)
    return out.to(device) if device is not None else out


__all__ = [
    "build_generation",
    "colocate_memory",
    "colocate_memory_utilization",
    "generation_class",
    "kv_bytes_per_token",
    "merged_lora_weights",
    "parameter_count",
    "training_state_bytes",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "GENERATION_ATTRIBUTES",
    "IS_MODES",
    "MODEL_VLLM_KEYS",
    "TRLVLLMBackend",
    "importance_metrics",
    "importance_ratio",
    "sampling_logps_tensor",
    "training_view",
    "vllm_generation_kwargs",
]
