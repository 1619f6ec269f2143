"""FLOPs a decoder-only transformer executes in agentrl's update, for MFU figures that are not overstated.

The usual "6 x parameters x tokens" counts every prompt token of every row through the whole model and the
LM head at every position, with no attention term. The update does less and more than that:

- the shared-prefix kernel (trainers/logps.py, the CPU default) runs each distinct prompt once and only the
  completion tokens per row; TRL's fused path (CUDA) runs every row's prompt and completion;
- the LM head runs only where a completion token is scored (the fused head skips the prompt positions; the
  kernel scores the first completion token once per distinct prompt);
- attention adds 4 x layers x (heads x head_dim) FLOPs per (query, key) pair, forward (QK^T and AV);
- the backward pass costs 2x the forward where weights train (activation and weight gradients) and 1x
  where they are frozen (activation gradients only: a LoRA base, the LM head under LoRA); attention's
  backward is 2x its forward either way.

Matmul FLOPs are 2 per multiply-add. Embedding lookups, norms, activations and the softmax are not
counted (a few percent at these sizes), nor is recomputation under gradient checkpointing (model FLOPs,
not hardware FLOPs), nor padding. `benchmarks/gpu_check.py` uses this for its MFU; so may a CPU MFU
benchmark (give it the same rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: the projections PEFT's "all-linear" targets in a Llama/Qwen2 decoder layer
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Shape:
    """What the FLOP count needs of a decoder-only model (Llama/Qwen2-like: GQA attention, gated MLP)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> Shape:
        """From a transformers config (its text config for multimodal ones)."""
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            layers=int(config.num_hidden_layers),
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            intermediate=int(config.intermediate_size),
            vocab=int(config.vocab_size),
        )

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one decoder layer."""
        q, kv, h, m = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.intermediate,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, m),
            "up_proj": (h, m),
            "down_proj": (m, h),
        }

    @property
    def layer_params(self) -> int:
        """Matmul weights of the decoder layers (no embeddings, norms, biases or LM head)."""
        return self.layers * sum(i * o for i, o in self.linears().values())

    def lora_params(self, rank: int, targets: Iterable[str] = LINEAR_NAMES) -> int:
        """LoRA A and B weights of rank `rank` on `targets` in every layer."""
        linears = self.linears()
        return self.layers * sum(rank * (linears[t][0] + linears[t][1]) for t in targets if t in linears)


def attention_pairs(new_tokens: int, context: int = 0) -> int:
    """(query, key) pairs of `new_tokens` causal tokens after `context` cached ones."""
    return new_tokens * context + new_tokens * (new_tokens + 1) // 2


def forward_flops(
    shape: Shape, new_tokens: int, context: int = 0, scored: int = 0, lora_rank: int = 0
) -> float:
    """One forward of `new_tokens` tokens after `context` cached ones, the LM head at `scored` positions."""
    matmul = 2 * (shape.layer_params + shape.lora_params(lora_rank)) * new_tokens
    attention = 4 * shape.layers * shape.heads * shape.head_dim * attention_pairs(new_tokens, context)
    return float(matmul + attention + 2 * shape.hidden * shape.vocab * scored)


def _segments(rows: Sequence[tuple[Sequence[int], int]], shared_prefix: bool) -> list[tuple[int, int, int]]:
    """(new tokens, context, scored positions) of each forward segment of the update's rows."""
    if not shared_prefix:  # TRL: each row's prompt and completion in one pass, scored on the completion
        return [(len(p) + c, 0, c) for p, c in rows if c > 0]
    prompts = {tuple(int(t) for t in p) for p, c in rows if c > 0}
    # the kernel: each distinct prompt once, scored at its last position (the first completion token) ...
    segments = [(len(p), 0, 1) for p in prompts]
    # ... then each row's completion but its last token, scored at every position
    segments += [(c - 1, len(p), c - 1) for p, c in rows if c > 1]
    return segments


def update_flops(
    shape: Shape,
    rows: Sequence[tuple[Sequence[int], int]],
    *,
    shared_prefix: bool,
    lora_rank: int = 0,
    backward: bool = True,
) -> float:
    """FLOPs of one training forward (and backward) over `rows`: (prompt token ids, completion length)
    each. `shared_prefix`: the shared-prefix kernel's passes, else TRL's one pass per row. `lora_rank` > 0:
    the base is frozen and rank-r adapters on every projection train. `backward=False`: forward only (the
    no-grad reference / old log-prob passes)."""
    total = 0.0
    for new, context, scored in _segments(rows, shared_prefix):
        if new <= 0:
            continue
        forward = forward_flops(shape, new, context, scored, lora_rank)
        if not backward:
            total += forward
            continue
        base = 2 * shape.layer_params * new
        head = 2 * shape.hidden * shape.vocab * scored
        adapters = 2 * shape.lora_params(lora_rank) * new
        attention = forward - base - head - adapters
        if lora_rank > 0:  # frozen base and head: activation gradients only; adapters: both
            total += forward + base + head + 2 * adapters + 2 * attention
        else:
            total += 3 * forward
    return total


def mfu(flops: float, seconds: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: flops / seconds / peak (None without a peak or a time)."""
    if not peak_tflops or seconds <= 0:
        return None
    return flops / seconds / (peak_tflops * 1e12)


__all__ = ["LINEAR_NAMES", "Shape", "attention_pairs", "forward_flops", "mfu", "update_flops"]
