"""The shared-prefix log-prob kernel: exact against a per-row forward (values and gradients) and against
TRL's fused LM head."""

from __future__ import annotations

from typing import Any

import torch

from agentrl.config import compose_config
from agentrl.trainers.logps import shared_prefix_logps
from agentrl.trainers.packing import pack_samples
from agentrl.types import StepSample


def tiny_model_cfg() -> Any:
    return compose_config(["model=tiny-random"]).model


def test_completion_logprobs_match_trl_fused_head():
    """Our CPU shortcut (LM head on the completion positions only) equals a plain full-logits forward
    exactly, and TRL's fused tiled head up to that kernel's own rounding (~1e-3 on CPU)."""
    from trl import GRPOConfig

    from agentrl.models import load_model
    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    model, tokenizer = load_model(tiny_model_cfg(), for_training=True)
    args = GRPOConfig(
        output_dir="/tmp/unused",
        per_device_train_batch_size=2,
        num_generations=2,
        use_cpu=True,
        report_to="none",
        temperature=1.3,
        max_steps=1,
        activation_checkpointing=False,
    )
    trainer = MultiStepTrainer(
        model=model,
        reward_funcs=[lambda **kw: [0.0]],
        args=args,
        processing_class=tokenizer,
        collect=lambda i: ([], {}),
    )
    ids = torch.randint(0, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ours, ours_entropy, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, 4, compute_entropy=True
    )
    parent = super(type(trainer), trainer)._get_per_token_logps_and_entropies
    theirs, their_entropy, _ = parent(model, ids, mask, 4, compute_entropy=True)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float() / 1.3, -1)
    exact = full[:, -5:-1].gather(-1, ids[:, -4:, None]).squeeze(-1)
    assert ours.shape == theirs.shape == (3, 4)
    assert torch.allclose(ours, exact, atol=1e-5)
    assert torch.allclose(ours, theirs, atol=5e-3)
    assert torch.allclose(ours_entropy, their_entropy, atol=5e-3)


def test_shared_prefix_logps_equal_per_row_forward_values_and_gradients():
    from agentrl.models import load_model

    # the kernel serves the CPU (logps.kernel_applies): its values on the CPU, whatever else is visible
    model, _ = load_model(tiny_model_cfg(), device="cpu", for_training=True)
    system = list(range(100, 120))  # a common prefix long enough for its own pass (MIN_SHARED_PREFIX)
    prompts = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [9, 10]]  # 2 distinct prompts
    check_rows(model, prompts)
    check_rows(model, [system + p for p in prompts])
    check_rows(model, [system + p for p in prompts[:1]])  # one row only


def check_rows(model: Any, prompts: list[list[int]], completions: list[list[int]] | None = None) -> None:
    model.zero_grad()
    completions = completions or [[11, 12, 13], [14, 15], [16, 17, 18], [11], [19, 20, 21]][: len(prompts)]
    samples = [
        StepSample(p, c, None, 1.0, i, 0) for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    batch = pack_samples(samples, pad_id=0, device="cpu")
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].size(1)
    logps, entropy = shared_prefix_logps(model, ids, mask, width, temperature=0.7, compute_entropy=True)
    loss = (logps * batch["completion_mask"]).sum()
    loss.backward()
    ours_grad = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    reference = 0.0
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float() / 0.7
        row_logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        assert torch.allclose(logps[row, : len(c)], row_logps, atol=1e-5), row
        reference = reference + row_logps.sum()
    reference.backward()
    for name, param in model.named_parameters():
        if param.grad is not None:
            assert torch.allclose(ours_grad[name], param.grad, rtol=1e-3, atol=1e-4), (
                name,
                (ours_grad[name] - param.grad).abs().max(),
            )
    assert entropy.shape == logps.shape


def test_identical_rows_run_once_with_the_gradients_of_every_copy():
    """A group's episodes often repeat a (state, answer) pair: the kernel runs each distinct row once and
    still returns every row's log-probs, with each copy's gradient counted."""
    from agentrl.models import load_model

    model, _ = load_model(tiny_model_cfg(), device="cpu", for_training=True)  # the kernel's device
    system = list(range(100, 120))
    prompts = [system + [5, 6, 7, 8]] * 3 + [system + [9, 10]] * 2
    completions = [[11, 12, 13]] * 3 + [[14, 15]] * 2
    rows: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].size(0)), with_kwargs=True
    )
    try:
        check_rows(model, prompts, completions)  # values and gradients equal one forward per row
    finally:
        hook.remove()
    ours = rows[: len(rows) - len(prompts)]  # the reference forwards of check_rows run one row each
    assert max(ours) <= 2, ours  # 2 distinct rows, not 5


def test_multi_token_forwards_on_the_cpu_pack_the_query_heads(monkeypatch):
    """On a CPU the model's attention (kernels/attention.py) packs the query heads of each key/value head
    into one SDPA block in masked multi-token forwards (the update's kernel, prefills): no `repeat_kv`
    copies, no `enable_gqa`, the values and gradients of per-row forwards (check_rows); one-token decode
    steps pack their query heads the same way."""
    import torch.nn.functional as F
    from helpers import fast_paths
    from transformers.integrations import sdpa_attention

    from agentrl.agents.backends.base import SamplingConfig
    from agentrl.agents.backends.hf import HFBackend
    from agentrl.kernels.attention import IMPLEMENTATION
    from agentrl.models import load_model

    fast_paths(monkeypatch)  # packed attention on (tests/test_attention.py switches it off)
    model, tokenizer = load_model(tiny_model_cfg(), device="cpu", for_training=True)  # the kernel's device
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    assert heads > kv_heads and model.config._attn_implementation == IMPLEMENTATION
    sdpa: list[tuple[int, int, bool, bool]] = []  # (query heads, query tokens, enable_gqa, masked)
    copies: dict[str, list[int]] = {"repeat_kv": [], "pack_gqa": []}
    real_sdpa = F.scaled_dot_product_attention

    def counted_sdpa(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        sdpa.append(
            (
                query.shape[1],
                query.shape[2],
                kwargs.get("enable_gqa", False),
                kwargs.get("attn_mask") is not None,
            )
        )
        return real_sdpa(query, key, value, *args, **kwargs)

    def spy(name: str) -> Any:
        real = getattr(sdpa_attention, name)

        def counted(x: Any, n: int) -> Any:
            if x is not None:
                copies[name].append(x.shape[2])
            return real(x, n)

        return counted

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted_sdpa)
    for name in copies:
        monkeypatch.setattr(sdpa_attention, name, spy(name))
    system = list(range(100, 120))
    check_rows(model, [system + p for p in ([5, 6, 7, 8], [9, 10], [5, 6, 7, 8])])  # padded rows: masked
    masked = [call for call in sdpa if call[3]]
    assert masked, sdpa
    # kv_heads blocks of (heads / kv_heads) x tokens queries each, and nothing grouped or copied
    assert all(
        h == kv_heads and tokens % (heads // kv_heads) == 0 and not gqa for h, tokens, gqa, _ in masked
    )
    assert copies == {"repeat_kv": [], "pack_gqa": []}

    sdpa.clear()
    backend = HFBackend(model, tokenizer, share_prompts=True)
    backend.generate(
        [system + [5, 6, 7], system + [9]], SamplingConfig(temperature=1.0, max_new_tokens=3), seed=0
    )
    assert copies == {"repeat_kv": [], "pack_gqa": []}
    # decode steps: the query heads of a key/value head as that many queries; the prefill packed too
    groups = heads // kv_heads
    assert any(call == (kv_heads, groups, False, True) for call in sdpa)
    assert any(h == kv_heads and tokens > groups for h, tokens, _, _ in sdpa)
    # only the shared head's own pass (one row, causal, no mask) is left to transformers
    assert all(not gqa for _, tokens, gqa, masked in sdpa if masked or tokens <= groups)


def _plain_logps(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logps, -(log_probs.exp() * log_probs).sum(-1).detach()


def test_target_logps_in_blocks_equal_the_plain_log_softmax(monkeypatch):
    """`completion_logps` with targets runs a few positions at a time (several blocks here) and gives the
    plain form's log-probs, entropies and logits gradients, in fp32 and from bf16 logits (the gradient then
    in bf16, as autocast's would be), at any temperature; a repeated target, an empty batch."""
    import agentrl.trainers.logps as logps_module
    from agentrl.trainers.logps import completion_logps

    monkeypatch.setattr(logps_module, "BLOCK_ELEMENTS", 3 * 50)  # blocks of 3 positions
    torch.manual_seed(0)
    targets = torch.randint(0, 50, (4, 5))
    targets[1, 2] = targets[1, 3]
    upstream = torch.randn(4, 5)
    for dtype, temperature in ((torch.float32, 1.0), (torch.float32, 0.7), (torch.bfloat16, 0.7)):
        base = (3 * torch.randn(4, 5, 50)).to(dtype)
        got_in, expected_in = base.clone().requires_grad_(), base.clone().requires_grad_()
        got, entropy = completion_logps(got_in, targets, temperature, compute_entropy=True)
        expected, expected_entropy = _plain_logps(expected_in, targets, temperature)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=1e-5)
        assert not entropy.requires_grad
        (got * upstream).sum().backward()
        (expected * upstream).sum().backward()
        assert got_in.grad.dtype == dtype
        torch.testing.assert_close(
            got_in.grad, expected_in.grad, atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=1e-5
        )
    logps, none = completion_logps(torch.zeros(0, 3, 50), torch.zeros(0, 3, dtype=torch.long), 1.0, False)
    assert logps.shape == (0, 3) and none is None


def test_under_accelerates_mixed_precision_the_completion_logits_stay_bf16(monkeypatch):
    """accelerate wraps the forward in bf16 autocast and upcasts its outputs to fp32; the kernel runs the
    completions' forward without the upcast (the logits reach `TargetLogps` in bf16) and gets the same
    log-probs and gradients as through the wrapped forward."""
    import types

    from accelerate.utils import convert_outputs_to_fp32

    import agentrl.trainers.logps as logps_module
    from agentrl.models import load_model

    model, _ = load_model(tiny_model_cfg(), device="cpu", for_training=True)  # the kernel's device
    model._original_forward = model.forward  # what accelerate's prepare_model does under bf16
    model.forward = types.MethodType(
        torch.autocast("cpu", dtype=torch.bfloat16)(model.forward.__func__), model
    )
    model.forward = types.MethodType(convert_outputs_to_fp32(model.forward.__func__), model)
    ids = torch.tensor([[100, 101, 102, 5, 6, 11, 12, 13], [100, 101, 102, 9, 10, 14, 15, 16]])
    mask = torch.ones_like(ids)
    seen = []
    forward = logps_module.TargetLogps.forward

    def spy(ctx, logits, *args):
        seen.append(logits.dtype)
        return forward(ctx, logits, *args)

    monkeypatch.setattr(logps_module.TargetLogps, "forward", staticmethod(spy))

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logps, _ = shared_prefix_logps(model, ids, mask, 3, temperature=0.7)
        logps.sum().backward()
        return logps.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ours, our_grads = run()
    assert seen == [torch.bfloat16]
    monkeypatch.setattr(logps_module, "_keeping_output_dtype", lambda m: m)  # through accelerate's upcast
    theirs, their_grads = run()
    assert seen[-1] == torch.float32
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    for ours_grad, their_grad in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(ours_grad, their_grad, atol=1e-6, rtol=1e-3)
