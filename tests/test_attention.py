"""The CPU attention (kernels/attention.py): SDPA with the query heads packed over the key/value heads
gives transformers' SDPA's values and gradients, and hands every case it does not handle to it."""

from __future__ import annotations

import types

import pytest
import torch
from helpers import fast_paths
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentrl.config import compose_config
from agentrl.kernels.attention import IMPLEMENTATION, packed_query_attention
from agentrl.models import load_model

BATCH, HEADS, KV_HEADS, QUERIES, HEAD_KEYS, DIM = 4, 6, 2, 7, 5, 16
MODULE = types.SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, training=True, is_causal=True)


def _inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """Rows past a shared head of HEAD_KEYS keys, each left-padded by its own number of positions."""
    g = torch.Generator().manual_seed(0)
    keys = HEAD_KEYS + QUERIES
    q = torch.randn(BATCH, HEADS, QUERIES, DIM, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(BATCH, KV_HEADS, keys, DIM, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(BATCH, KV_HEADS, keys, DIM, generator=g, dtype=dtype, requires_grad=True)
    mask = torch.ones(BATCH, 1, QUERIES, keys, dtype=torch.bool)
    mask[:, :, :, HEAD_KEYS:] = torch.ones(QUERIES, QUERIES, dtype=torch.bool).tril()
    for row in range(BATCH):
        mask[row, :, :, HEAD_KEYS : HEAD_KEYS + row] = False  # its padding
    return q, k, v, mask


def _run(attention, dtype=torch.float32, autocast=False):
    q, k, v, mask = _inputs(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, weights = attention(MODULE, q, k, v, mask, scaling=DIM**-0.5)
    # padded query positions are never read: compare (and backpropagate from) the real ones
    real = torch.stack([torch.arange(QUERIES) >= row for row in range(BATCH)])  # (B, L)
    (out.float()[real] * torch.linspace(-1, 1, DIM)).sum().backward()
    return out[real], weights, q.grad, k.grad, v.grad


def test_packed_queries_give_sdpas_values_and_gradients():
    packed, weights, *packed_grads = _run(packed_query_attention)
    reference, _, *reference_grads = _run(sdpa_attention_forward)  # repeat_kv copies (no env switch)
    assert weights is None and packed.shape == reference.shape
    torch.testing.assert_close(packed, reference, rtol=1e-5, atol=1e-6)
    for got, want in zip(packed_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_under_bf16_autocast_the_packed_kernel_matches_sdpa():
    packed, _, *packed_grads = _run(packed_query_attention, autocast=True)
    reference, _, *reference_grads = _run(sdpa_attention_forward, autocast=True)
    assert packed.dtype == torch.bfloat16
    torch.testing.assert_close(packed.float(), reference.float(), rtol=2e-2, atol=2e-2)
    for got, want in zip(packed_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("case", ["no mask", "heads not grouped", "dropout"])
def test_what_it_does_not_pack_goes_to_transformers_sdpa(monkeypatch, case):
    import transformers.integrations.sdpa_attention as sdpa_module

    calls = []
    real = sdpa_module.sdpa_attention_forward

    def spy(*args, **kwargs):
        calls.append(case)
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa_module, "sdpa_attention_forward", spy)
    q, k, v, mask = _inputs()
    module, dropout = MODULE, 0.0
    if case == "no mask":  # several queries: one causal block, which packing would need a mask for
        mask = None
    elif case == "heads not grouped":
        q = q[:, :KV_HEADS]
        module = types.SimpleNamespace(num_key_value_groups=1, training=True, is_causal=True)
    else:
        dropout = 0.1
    out, _ = packed_query_attention(module, q, k, v, mask, dropout=dropout, scaling=DIM**-0.5)
    assert calls == [case] and out.shape == (BATCH, q.shape[2], q.shape[1], DIM)


def test_models_on_the_cpu_load_with_it_unless_another_kernel_is_asked_for(monkeypatch):
    cfg = compose_config(["model=tiny-random"]).model
    fast_paths(monkeypatch, "packed-attention")  # switched off: transformers' own SDPA
    assert load_model(cfg, device="cpu")[0].config._attn_implementation == "sdpa"
    fast_paths(monkeypatch)
    model, _ = load_model(cfg, device="cpu")
    assert model.config._attn_implementation == IMPLEMENTATION
    eager_cfg = compose_config(["model=tiny-random", "model.attn_implementation=eager"]).model
    eager, _ = load_model(eager_cfg, device="cpu")
    assert eager.config._attn_implementation == "eager"
    # the same logits as transformers' eager attention on a padded batch
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        want = eager(input_ids=ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("masked", [True, False])
def test_a_decode_step_is_packed_with_or_without_a_mask(monkeypatch, masked):
    """One query token a row: the query heads become G queries of their key/value head (no `enable_gqa`,
    which a batch without padding, and so without a mask, would otherwise get), with SDPA's values."""
    import torch.nn.functional as F

    q, k, v, mask = _inputs()
    q, mask = q[:, :, -1:].detach(), (mask[:, :, -1:] if masked else None)
    calls = []
    real = F.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        calls.append((query.shape[1], query.shape[2], kwargs.get("enable_gqa", False)))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out, _ = packed_query_attention(MODULE, q, k, v, mask, scaling=DIM**-0.5)
    assert calls == [(KV_HEADS, HEADS // KV_HEADS, False)]
    monkeypatch.setattr(F, "scaled_dot_product_attention", real)
    reference, _ = sdpa_attention_forward(MODULE, q, k, v, mask, scaling=DIM**-0.5)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_mask_is_packed_and_converted_once_per_forward_as_sdpa_would(monkeypatch, autocast):
    """Every layer of a forward gets the same boolean mask: the packed additive mask is made once and
    gives SDPA's own outputs and gradients for the boolean one bitwise; a mask changed in place is
    packed again."""
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention
    seen = []

    def spy(query, key, value, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return real(query, key, value, attn_mask=attn_mask, **kwargs)

    dtype = torch.bfloat16 if autocast else torch.float32  # a model's q, k, v: its linears' outputs

    def run(attention):
        q, k, v, mask = _inputs(dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            layers = [attention(MODULE, q, k, v, mask, scaling=DIM**-0.5)[0] for _ in range(3)]
        sum(o.float().sum() for o in layers).backward()
        return [o.detach() for o in layers], (q.grad, k.grad, v.grad), mask

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    outs, grads, mask = run(packed_query_attention)
    monkeypatch.setattr(F, "scaled_dot_product_attention", real)
    assert seen[0] is seen[1] is seen[2]  # one packed mask for the three layers
    assert seen[0].dtype == dtype
    boolean = mask.expand(BATCH, 1, QUERIES, mask.shape[-1])[:, :, None]
    boolean = boolean.expand(BATCH, 1, HEADS // KV_HEADS, QUERIES, mask.shape[-1]).flatten(2, 3)
    assert torch.equal(seen[0] == 0, boolean) and torch.equal(seen[0] != 0, seen[0].isneginf())

    def boolean_sdpa(module, q, k, v, m, scaling):  # the packing with SDPA's own conversion
        b, h, length, d = q.shape
        packed = q.reshape(b, KV_HEADS, h // KV_HEADS * length, d)
        out = real(packed, k, v, attn_mask=boolean, scale=scaling)
        return out.reshape(b, h, length, d).transpose(1, 2).contiguous(), None

    want_outs, want_grads, _ = run(boolean_sdpa)
    for got, want in zip([*outs, *grads], [*want_outs, *want_grads], strict=True):
        assert torch.equal(got, want)

    q, k, v, mask = _inputs()
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    seen.clear()
    packed_query_attention(MODULE, q, k, v, mask, scaling=DIM**-0.5)
    mask[0, :, :, -1] = False  # in place: the next layer must see it
    packed_query_attention(MODULE, q, k, v, mask, scaling=DIM**-0.5)
    assert seen[0] is not seen[1] and seen[1][0, :, :, -1].isneginf().all()
