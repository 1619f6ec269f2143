"""Settings a training run resolves before the trainer exists: precision, the token budget per pass and
TRL's config.

`resolve_precision` turns `algo.precision=auto` into bf16-mixed or fp32 (on a CPU from its bf16 matrix
instructions and a timing at the model's shapes, kernels/precision.py); `resolve_max_batch_tokens` turns
`algo.max_batch_tokens=auto` into a bound on the LM-head positions per pass from free memory and the
vocabulary, and `auto_prompt_budget` into a bound on the tokens the shared-prefix kernel runs with
gradients per pass from free memory and the model's layer sizes; `grpo_config` maps the typed algo config
onto TRL's `GRPOConfig` (one optimizer step per iteration).

The free memory the budgets share is what is left once every persistent tensor exists: the trainer
plans before its first backward and optimizer step, so the gradients and AdamW moments still to come
(`pending_training_state_bytes`: +34.5 GiB for Qwen2.5-3B) are taken off, and it plans again once a
rollout engine (colocated vLLM, a bf16 copy) holds its memory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig

from agentrl import distributed as dist

log = logging.getLogger(__name__)


def resolve_precision(precision: str, device: str, shapes: tuple[int, int] | None = None) -> str:
    """`algo.precision` on `device`: "auto" is bf16-mixed on CUDA; on a CPU it is bf16-mixed only where the
    CPU has bf16 matrix instructions and bf16 wins at the model's layer `shapes` (agentrl/kernels/precision.py;
    without `shapes`, fp32). Mixed precision keeps fp32 master weights, because a bf16 weight cannot take
    an update below ~1/256 of its own size: at the paper's lr of 1e-6 almost every update would be
    rounded away."""
    if precision != "auto":
        return precision
    if device.startswith("cuda"):
        return "bf16-mixed"
    from agentrl.kernels.precision import cpu_auto_precision

    choice, reason = cpu_auto_precision(shapes)
    log.info("algo.precision=auto on the CPU: %s", reason)
    return choice


# bytes per LM-head position of one pass: fp32 logits, their log-softmax, the gradients of both, and the
# entropy's exp (no grad)
LOGIT_COPIES = 5
AUTO_MEMORY_FRACTION = 0.2  # of the free memory when training starts; the rest: activations, rollouts
# fp32 floats per token and layer that a forward keeps for its backward, in units of the hidden and the MLP
# widths: SmolLM2-135M (30 layers, 576, 1536) measured ~0.7 MB per prompt token with the shared-prefix
# kernel (+6.9 GiB for 32 distinct 258-token rows, +2.8 GiB for 8), against 0.65 MB from 4 x 576 + 2 x 1536
ACTIVATION_HIDDEN, ACTIVATION_MLP = 4, 2
AUTO_ACTIVATION_FRACTION = 0.3  # of the free memory, for one pass's activations
# a padded pass (TRL's forward per row: CUDA, several processes) keeps more than the estimate above: on
# an H200 the 3B full fine-tune's 30% share ran to ~5.6 MB per budgeted token against 4.35 MB (bf16
# autocast keeps bf16 copies beside the fp32 activations, SDPA its own buffers)
PADDED_ACTIVATION_SCALE = 5.6 / 4.35


def free_memory_bytes(device: str) -> int:
    """Memory still free for tensors: the GPU's free memory on CUDA (with what torch's allocator holds
    cached but unused), else the system's available RAM."""
    if device.startswith("cuda"):
        where = torch.device(device)
        cached = torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where)
        return int(torch.cuda.mem_get_info(where)[0]) + max(int(cached), 0)
    import psutil

    return int(psutil.virtual_memory().available)


def pending_training_state_bytes(model: Any, optimizer: Any = None) -> int:
    """Bytes of training state that will exist but does not yet: a gradient for each trainable parameter
    without one, and AdamW's two moments for each the optimizer holds no state for (all of them before
    the optimizer exists), in the parameter's dtype and of this process's shard (ZeRO-3's `ds_tensor`, a
    DTensor's local tensor). Under ZeRO-1/2 each process holds only its share of the moments: an
    overestimate there."""
    state = getattr(optimizer, "state", None) or {}
    total = 0
    for param in model.parameters():
        if not param.requires_grad:
            continue
        local = getattr(param, "ds_tensor", None)
        if local is None:
            local = param.to_local() if hasattr(param, "to_local") else param
        size = local.numel() * local.element_size()
        total += (size if param.grad is None else 0) + (2 * size if param not in state else 0)
    return total


def auto_token_budget(free_bytes: int, vocab_size: int, fraction: float = AUTO_MEMORY_FRACTION) -> int:
    """LM-head positions per pass whose fp32 logits (with their gradients) fill `fraction` of `free_bytes`
    (at least 1: a row larger than the budget still runs, as a pass of its own)."""
    return max(1, int(free_bytes * fraction) // (LOGIT_COPIES * 4 * vocab_size))


def activation_bytes_per_token(model: Any, checkpointing: bool = False) -> int:
    """Bytes a forward keeps per token for the backward, all layers together, in fp32. With gradient
    checkpointing a layer keeps only its input (one hidden vector) and the backward recomputes one layer
    at a time, so a token costs a hidden vector per layer plus one layer's activations: ~10x less for
    Qwen2.5-3B (0.42 MB against 4.35 MB), which lets a pass hold ~10x the tokens."""
    text = model.config.get_text_config()
    hidden = int(text.hidden_size)
    mlp = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    layer = (ACTIVATION_HIDDEN * hidden + ACTIVATION_MLP * mlp) * 4
    layers = int(text.num_hidden_layers)
    return layers * hidden * 4 + layer if checkpointing else layers * layer


def gather_fraction(model: Any, checkpointing: bool = False) -> float:
    """What one row's copy of its prompt costs, per token, as a fraction of `activation_bytes_per_token`.
    A row with a multi-token answer (or several candidates) attends over its own copy of the prompt's KV
    cache (`cache.batch_select_indices`), and attention keeps that copy, repeated to every query head,
    for its backward: layers x 2 x (KV heads + heads) x head width x 4 B. SmolLM2-135M: 184 KB against
    0.65 MB (0.29); measured +118 KB a candidate token-row under bf16 autocast (10 candidates of 2
    450-token prompts against 1)."""
    text = model.config.get_text_config()
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or int(text.hidden_size) // heads)
    gathered = int(text.num_hidden_layers) * 2 * (heads + kv_heads) * head_dim * 4
    return gathered / activation_bytes_per_token(model, checkpointing)


def activation_budget(
    model: Any,
    device: str,
    share: float = 1.0,
    checkpointing: bool = False,
    fraction: float = AUTO_ACTIVATION_FRACTION,
) -> int:
    """Tokens run with gradients whose activations fill `fraction` of `share` of the free memory (>= 1):
    `auto_prompt_budget`'s bound without its log line (`algo.rollout_graph` under max_batch_tokens=null)."""
    free = int(max(free_memory_bytes(device) - pending_training_state_bytes(model), 0) * share)
    return max(1, int(free * fraction) // activation_bytes_per_token(model, checkpointing))


def auto_prompt_budget(
    model: Any,
    device: str,
    fraction: float = AUTO_ACTIVATION_FRACTION,
    share: float = 1.0,
    kernel: bool = True,
    checkpointing: bool = False,
    pending: int = 0,
) -> int:
    """`algo.max_batch_tokens=auto`: tokens run with gradients per pass whose activations fill
    `fraction` of `share` of the free memory (at least one row a pass). Where the shared-prefix kernel
    runs (`kernel`: a CPU, one process) they are each distinct prompt once, every completion, and every
    row's copy of its prompt at `gather_fraction` of a token: rows that share their prompt (a fixed map)
    count it once, rows that all differ (random maps, long histories) are cut into passes that fit.
    Elsewhere (CUDA, several processes) every row runs its own padded prompt, and the budget bounds
    rows x padded width: a 3B model keeps ~5.6 MB a token (`PADDED_ACTIVATION_SCALE`), so one pass over
    128 episodes' steps would not fit on any GPU. `pending`: bytes of persistent state still to be
    allocated (gradients, optimizer moments), taken off the free memory first."""
    free = int(max(free_memory_bytes(device) - pending, 0) * share)
    per_token = activation_bytes_per_token(model, checkpointing)
    if not kernel:
        per_token = int(per_token * PADDED_ACTIVATION_SCALE)
    budget = max(1, int(free * fraction) // per_token)
    what = "distinct prompt and completion tokens" if kernel else "padded prompt and completion tokens"
    log.info(
        "algo.max_batch_tokens=auto: at most %d %s per pass with "
        "gradients (%.1f GiB free%s%s, ~%.2f MB of activations a token%s: %.0f%% of it)",
        budget,
        what,
        free / 2**30,
        _pending_note(pending),
        _share_note(share),
        per_token / 1e6,
        " with gradient checkpointing" if checkpointing else "",
        100 * fraction,
    )
    return budget


def resolve_max_batch_tokens(
    setting: int | str | None, model: Any, device: str, share: float = 1.0, pending: int = 0
) -> int | None:
    """`algo.max_batch_tokens`: a number or null as given; "auto" from the vocabulary and `share` of the
    free memory (`algo.memory_share`: runs side by side on one machine each plan for their part), less
    `pending` bytes of persistent state still to be allocated."""
    if setting != "auto":
        return setting  # type: ignore[return-value]
    vocab = int(model.config.get_text_config().vocab_size)
    free = int(max(free_memory_bytes(device) - pending, 0) * share)
    budget = auto_token_budget(free, vocab)
    log.info(
        "algo.max_batch_tokens=auto: %d LM-head positions per pass (%.1f GiB free%s%s, vocabulary %d: "
        "%.0f%% of it for fp32 logits and their gradients)",
        budget,
        free / 2**30,
        _pending_note(pending),
        _share_note(share),
        vocab,
        100 * AUTO_MEMORY_FRACTION,
    )
    return budget


def _share_note(share: float) -> str:
    return "" if share == 1 else f" in this run's share, algo.memory_share={share:g}"


def _pending_note(pending: int) -> str:
    return f" once {pending / 2**30:.1f} GiB of gradients and optimizer state exist" if pending else ""


def cpu_precision_shapes(model_cfg: Any, algo: Any, device: str, world: int) -> tuple[int, int] | None:
    """The layer sizes `resolve_precision` times bf16 at: only for `auto` on the CPU in one process (the
    launcher of several resolves without a model, to fp32, and every process must agree with it). Logs
    the CPU's bf16 matrix instructions whenever training runs on the CPU."""
    if device.startswith("cuda"):
        return None
    from agentrl.kernels.precision import cpu_flags, describe_cpu, usable_bf16_instructions
    from agentrl.models import model_shapes

    flags = cpu_flags()
    log.info("CPU: %s", describe_cpu(flags))
    if algo.precision in ("bf16-mixed", "bf16-pure") and not usable_bf16_instructions(flags):
        log.warning(
            "algo.precision=%s on a CPU without bf16 matrix instructions: bf16 is likely slower than fp32",
            algo.precision,
        )
    return model_shapes(model_cfg) if algo.precision == "auto" and world == 1 else None


def _reference_init(algo: Any, hub_kernels: bool) -> dict[str, Any] | None:
    """`model_init_kwargs` for the reference model TRL loads itself (a KL term, full fine-tuning); None
    without a KL term, where TRL warns that they are ignored."""
    if not algo.beta:
        return None
    dtype = getattr(algo, "ref_dtype", None)
    return {"use_kernels": hub_kernels, **({"dtype": dtype} if dtype else {})}


def grpo_config(
    algo: Any, run_dir: Path, device: str, seed: int, precision: str = "fp32", hub_kernels: bool = False
) -> GRPOConfig:
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
        # TRL builds its reference model (beta > 0, full fine-tuning) with these, else in the policy's
        # dtype; Hub kernels as the policy has them (model.hub_kernels)
        model_init_kwargs=_reference_init(algo, hub_kernels),
    )
    if cuda and not dist.launched():
        dist.pin_one_device(args, device)
    return args
