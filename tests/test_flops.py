"""agentrl/kernels/flops.py: the update's FLOPs by hand, and its matmul FLOPs against torch's FlopCounterMode on the
passes trainers/logps.py really runs (each distinct prompt once, the LM head on completions only)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from agentrl.kernels.flops import Shape, attention_pairs, forward_flops, mfu, update_flops

torch.set_num_threads(1)

QWEN_3B = Shape(layers=36, hidden=2048, heads=16, kv_heads=2, head_dim=128, intermediate=11008, vocab=151936)
TINY = Shape(layers=1, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)


def test_shape_of_qwen25_3b():
    # decoder matmuls ~2.77B; with the tied 151936 x 2048 embedding (0.31B) and norms: 3.09B parameters
    assert QWEN_3B.layer_params == 36 * (2048 * 2048 * 2 + 2048 * 256 * 2 + 3 * 2048 * 11008)
    assert 2.7e9 < QWEN_3B.layer_params < 2.8e9
    # LoRA r=16 on all linears: ~29.9M
    assert QWEN_3B.lora_params(16) == 36 * 16 * sum(i + o for i, o in QWEN_3B.linears().values())


def test_forward_flops_by_hand():
    # TINY: q 4x4, k 4x2, v 4x2, o 4x4, gate/up 4x8, down 8x4 -> 16+8+8+16+32+32+32 = 144 weights
    assert TINY.layer_params == 144
    assert attention_pairs(3) == 6 and attention_pairs(2, context=5) == 2 * 5 + 3
    # 3 tokens: matmul 2*144*3, attention 4*1*2*2*6, LM head at 2 positions 2*4*10*2
    assert forward_flops(TINY, 3, scored=2) == 864 + 96 + 160


def test_update_flops_counts_each_distinct_prompt_once_and_the_head_on_completions():
    prompt = [1, 2, 3, 4]
    rows = [(prompt, 3)] * 4  # a group: four rows, one prompt
    kernel = update_flops(TINY, rows, shared_prefix=True, backward=False)
    # the prompt once (4 tokens, head at its last position), then 2 tokens per row after 4 cached ones
    expected = forward_flops(TINY, 4, 0, 1) + 4 * forward_flops(TINY, 2, 4, 2)
    assert kernel == expected
    trl = update_flops(TINY, rows, shared_prefix=False, backward=False)
    assert trl == 4 * forward_flops(TINY, 7, 0, 3)  # every row whole, scored on its completion
    assert kernel < trl
    # at Qwen2.5-3B's shape, 8 rows of a 256-token prompt and 4-token answers: "2 x parameters x tokens"
    # (the head at every position) counts ~10% more than TRL's pass and ~8x the kernel's
    rows = [(list(range(256)), 4)] * 8
    naive = 2 * (QWEN_3B.layer_params + QWEN_3B.hidden * QWEN_3B.vocab) * 8 * 260
    trl = update_flops(QWEN_3B, rows, shared_prefix=False, backward=False)
    kernel = update_flops(QWEN_3B, rows, shared_prefix=True, backward=False)
    assert 1.05 < naive / trl < 1.2 and 7 < naive / kernel < 9


def test_backward_multiplies_trained_and_frozen_parts_differently():
    rows = [([1, 2, 3], 2), ([4, 5], 1)]
    forward = update_flops(TINY, rows, shared_prefix=False, backward=False)
    assert update_flops(TINY, rows, shared_prefix=False) == 3 * forward
    lora = update_flops(TINY, rows, shared_prefix=False, lora_rank=2)
    base = 2 * TINY.layer_params * (5 + 3)
    head = 2 * TINY.hidden * TINY.vocab * (2 + 1)
    adapters = 2 * TINY.lora_params(2) * (5 + 3)
    attention = 4 * 1 * 2 * 2 * (attention_pairs(5) + attention_pairs(3))
    assert lora == 2 * (base + head) + 3 * (adapters + attention)
    assert mfu(2e12, 2.0, 1.0) == pytest.approx(1.0) and mfu(1.0, 1.0, None) is None


def _mm_flops(counter: FlopCounterMode) -> int:
    """The linear layers' and LM head's FLOPs (mm/addmm; eager attention's bmm excluded)."""
    counts = counter.get_flop_counts()["Global"]
    return sum(v for op, v in counts.items() if str(op).split(".")[1] in ("mm", "addmm"))


def test_matmul_flops_match_torch_flop_counter_on_the_kernels_passes():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from agentrl.trainers.logps import shared_prefix_logps

    config = Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    shape = Shape.from_config(model.config)
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [3, 4, 5, 6, 7]]  # one length: no padding to count
    completions = [[10, 11, 12], [13, 14, 15], [16, 17, 18]]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p + c for p, c in zip(prompts, completions, strict=True)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + 3) for p in prompts])
    rows = [(p, 3) for p in prompts]
    linear, head = 2 * shape.layer_params, 2 * shape.hidden * shape.vocab  # per token, per scored position
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        shared_prefix_logps(model, ids, mask, 3)
    # two distinct prompts of 5 tokens (head at the last), then 2 more tokens per row (head at each)
    assert _mm_flops(counter) == linear * (10 + 6) + head * (2 + 6)
    attention = update_flops(shape, rows, shared_prefix=True, backward=False) - linear * 16 - head * 8
    assert attention == 4 * 2 * 4 * 4 * (2 * attention_pairs(5) + 3 * attention_pairs(2, context=5))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids[:1], logits_to_keep=3)  # TRL's pass over one row: its head on 3 positions
    assert _mm_flops(counter) == linear * 8 + head * 3
    assert update_flops(shape, rows[:1], shared_prefix=False, backward=False) == forward_flops(shape, 8, 0, 3)
