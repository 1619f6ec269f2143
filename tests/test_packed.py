"""Linear weights packed for oneDNN in no-grad CPU forwards (agentrl/kernels/packed.py): the same outputs as
the layers' own forwards (bitwise under bf16 autocast), gradients untouched, packs that follow the
weights, and their use by the HF backend's generation and the critic's frozen trunk."""

from __future__ import annotations

import types

import pytest
import torch
from helpers import autocast_like_accelerate, bf16_packs_reason, fast_paths
from torch import nn

from agentrl.agents.backends.base import SamplingConfig
from agentrl.agents.backends.hf import HFBackend
from agentrl.kernels.packed import PackedLinears, supported

pytestmark = pytest.mark.skipif(
    not supported(torch.float32), reason="oneDNN fp32 linear: not in this torch build"
)


@pytest.fixture(autouse=True)
def _packs_on(monkeypatch):
    """These tests are of the packs: on, whatever AGENTRL_CPU_FEATURES the suite runs under (the suite's
    `plain` is kept: bf16 packs then skip, as on a CPU without them)."""
    fast_paths(monkeypatch)


def _qwen_shaped(seed: int = 0) -> nn.Module:
    """A tiny Qwen2 (grouped-query attention, biased q/k/v projections, untied LM head)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # biases off zero, so a dropped bias shows
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_()
    return model.eval()


def _count_packings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the PackedLinears made from now on."""
    calls: list[int] = []
    init = PackedLinears.__init__

    def counted(self, *args, **kwargs):
        calls.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(PackedLinears, "__init__", counted)
    return calls


IDS = torch.tensor([[3, 9, 27, 81, 5, 7, 11], [2, 4, 8, 16, 32, 64, 1]])


def test_packed_layers_give_the_layers_own_outputs():
    """bf16 autocast: bitwise the same logits; fp32: the same up to fp32 rounding."""
    model = _qwen_shaped()
    for dtype in (torch.float32, torch.bfloat16):
        if not supported(dtype):
            continue
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16):
            expected = model(IDS).logits
            packs = PackedLinears.build(model, dtype)
            assert packs is not None and len(packs.layers) == 2 * 7 + 1
            with packs.active():
                got = model(IDS).logits
        assert got.dtype == expected.dtype
        if dtype == torch.bfloat16:
            assert torch.equal(got, expected)
        else:
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_the_packs_are_what_the_layers_run():
    """A pack made before a weight changes keeps the old weight: the packed forward really reads the pack
    (so the owner must rebuild it when the weights change)."""
    model = _qwen_shaped()
    packs = PackedLinears.build(model, torch.float32)
    with torch.no_grad():
        before = model(IDS).logits
        model.lm_head.weight.mul_(2.0)
        moved = model(IDS).logits
        with packs.active():
            stale = model(IDS).logits
    assert not torch.allclose(moved, before)
    torch.testing.assert_close(stale, before, atol=1e-5, rtol=1e-4)


def test_a_forward_that_needs_a_gradient_takes_the_layers_own_forward():
    model = _qwen_shaped().train()
    expected = torch.autograd.grad(model(IDS).logits.square().mean(), list(model.parameters()))
    packs = PackedLinears.build(model, torch.float32)
    with packs.active():
        got = torch.autograd.grad(model(IDS).logits.square().mean(), list(model.parameters()))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_leaving_restores_the_forwards_and_tied_weights_pack_once():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    own = object()
    model.model.layers[0].mlp.up_proj.forward = own  # an instance forward someone else set
    packs = PackedLinears.build(model, torch.float32)
    params = sum(
        p.numel() for p in model.parameters() if p.dim() == 2 and p is not model.model.embed_tokens.weight
    )
    assert packs.bytes == 4 * (params + model.lm_head.weight.numel())  # the head's weight once
    with packs.active():
        assert all("forward" in vars(m) for m, *_ in packs.layers)
    assert model.model.layers[0].mlp.up_proj.forward is own
    assert sum("forward" in vars(m) for m, *_ in packs.layers) == 1


def test_only_plain_float_linears_on_the_cpu_are_packed(monkeypatch):
    class Quantised(nn.Linear):  # quantised layers subclass nn.Linear
        pass

    class Shard(torch.Tensor):  # a weight of a tensor subclass, as FSDP's DTensor shards are
        pass

    sharded = nn.Linear(8, 8)
    sharded.weight = nn.Parameter(sharded.weight.detach().as_subclass(Shard))
    model = nn.Sequential(nn.Linear(8, 8), Quantised(8, 8), nn.Linear(8, 8).to(torch.float16), sharded)
    packs = PackedLinears.build(model, None)
    assert [m for m, *_ in packs.layers] == [model[0]]
    assert PackedLinears.build(nn.Sequential(Quantised(8, 8)), None) is None  # nothing to pack
    # packs that would not fit in a quarter of the available memory are not made
    monkeypatch.setattr("psutil.virtual_memory", lambda: types.SimpleNamespace(available=4 * 8 * 8 * 3))
    assert PackedLinears.build(model, None) is None


# ---- the HF backend -----------------------------------------------------------------------------------
def _backend(share: bool, autocast: bool = True) -> tuple[HFBackend, nn.Module]:
    """The HF backend on the tiny model, under accelerate's bf16 autocast (bf16 packs) or in fp32."""
    from agentrl.config import compose_config
    from agentrl.models import load_model

    model, tokenizer = load_model(compose_config(["model=tiny-random"]).model, device="cpu")  # packs: CPU
    if autocast:
        model = autocast_like_accelerate(model)
    model.train()
    return HFBackend(model, tokenizer, share_prompts=share), model


PROMPTS = [list(range(100, 120)) + p for p in ([5, 6, 7, 8], [9, 10], [5, 6, 7, 8])]


@pytest.mark.parametrize("share", [False, True])
def test_generation_with_packed_weights_equals_autocasts(share, monkeypatch):
    """Under bf16 autocast (accelerate's wrapper) the backend generates on packed weights: the same tokens
    and log-probs as without packs, greedy and sampled; the packs are made once per weights version, kept
    across calls, remade after the weights change, and dropped when a rollout ends."""
    if bf16_packs_reason():
        pytest.skip(bf16_packs_reason())
    backend, model = _backend(share)
    calls = _count_packings(monkeypatch)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=6)
    got = [backend.generate(PROMPTS, greedy), backend.generate(PROMPTS, sampled, seed=3)]
    packings = len(calls)
    assert packings > 0 and backend._packs is not None and model.training
    backend.generate(PROMPTS, greedy)
    assert len(calls) == packings  # kept across calls while the weights stay
    assert not any("forward" in vars(m) for m in model.modules() if isinstance(m, nn.Linear))

    monkeypatch.setattr(PackedLinears, "build", classmethod(lambda cls, *a, **k: None))
    backend.weights_changed()
    expected = [backend.generate(PROMPTS, greedy), backend.generate(PROMPTS, sampled, seed=3)]
    assert got == expected
    monkeypatch.undo()

    calls = _count_packings(monkeypatch)
    backend.generate(PROMPTS, greedy)
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # in place: the parameter's version moves
    flipped = backend.generate(PROMPTS, greedy)
    assert len(calls) == 2  # remade for the new weights
    with backend.weight_casts_kept():
        backend.generate(PROMPTS, greedy)
        assert backend._packs is not None
    assert backend._packs is None  # the update runs next
    monkeypatch.setattr(PackedLinears, "build", classmethod(lambda cls, *a, **k: None))
    assert backend.generate(PROMPTS, greedy) == flipped


@pytest.mark.parametrize("share", [False, True])
def test_fp32_generation_samples_the_same_tokens_with_and_without_packs(share, monkeypatch):
    """In fp32 (every CPU with oneDNN) the backend generates on packed weights, and with the packs switched
    off (AGENTRL_CPU_FEATURES=no-packs) on the layers' own: the same tokens for a seed, greedy and sampled,
    and log-probs equal up to fp32 rounding (MKL's and oneDNN's products sum in other orders)."""
    backend, model = _backend(share, autocast=False)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=6)

    def both() -> list:
        return backend.generate(PROMPTS, greedy) + backend.generate(PROMPTS, sampled, seed=3)

    packed = both()
    assert backend._packs is not None and all(p.dtype == torch.float32 for _, p, *_ in backend._packs.layers)
    fast_paths(monkeypatch, "packs")
    backend.weights_changed()
    own = both()
    assert backend._packs is None
    assert [tokens for tokens, _ in packed] == [tokens for tokens, _ in own]
    for (_, got), (_, want) in zip(packed, own, strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_a_recording_rollout_runs_no_packs(autocast):
    """The recorded forwards need the weights' graphs: they run the layers' own forwards, and the packs an
    evaluation made (fp32 or bf16, as the layers compute) are dropped when the rollout ends."""
    if autocast and bf16_packs_reason():
        pytest.skip(bf16_packs_reason())
    backend, model = _backend(share=True, autocast=autocast)
    one = SamplingConfig(temperature=1.0, max_new_tokens=1)
    backend.generate(PROMPTS, SamplingConfig(max_new_tokens=2))  # an eval: packs made
    assert backend._packs is not None
    with backend.recording_graphs(budget=10_000):
        backend.generate(PROMPTS, one, seed=0)
    assert backend._packs is None  # dropped at the rollout's end, as by `weight_casts_kept`
    recorded = backend.recorded_logits([tuple(p) for p in PROMPTS[:2]])
    assert recorded is not None and recorded.requires_grad
    recorded.float().sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


# ---- the critic's frozen trunk ----------------------------------------------------------------------
@pytest.mark.parametrize("pack", [True, False])
def test_the_critic_scores_the_reference_in_the_policys_precision(pack, monkeypatch):
    """With accelerate's bf16 autocast around the reference model (the critic's trunk), the reference
    log-probs equal the policy's own log-probs at the same (initial) weights, computed the way the update
    computes them (bf16 logits), with the trunk's layers packed (made once: it is frozen) or not."""
    import copy

    from agentrl.trainers.critic import Critic
    from agentrl.trainers.logps import shared_prefix_logps
    from agentrl.types import Episode, Generation, Step, StepSample

    if pack and bf16_packs_reason():
        pytest.skip(bf16_packs_reason())
    policy = autocast_like_accelerate(_qwen_shaped())
    reference = autocast_like_accelerate(copy.deepcopy(_qwen_shaped()))
    critic = Critic(policy, reference_trunk=True)
    critic.use_reference(reference, temperature=0.7)

    def step(prompt: list[int], completion: list[int]) -> Step:
        return Step("o", 0, "a", True, 0.0, 0.0, generation=Generation("p", "c", prompt, completion))

    head = list(range(40, 60))
    episodes = [Episode(seed=0, steps=[step(head + [5, 6, 7], [20, 21, 22]), step(head + [9], [23, 24])])]
    if not pack:
        monkeypatch.setattr(PackedLinears, "build", classmethod(lambda cls, *a, **k: None))
    critic.evaluate(episodes, pad_id=0)
    packs = critic._packs
    assert (packs is not None) == pack
    critic.evaluate(episodes, pad_id=0)
    assert critic._packs is packs  # frozen: packed once
    rows = [
        StepSample(s.prompt_ids, s.completion_ids, None, 0.0, 0, t) for t, s in enumerate(episodes[0].steps)
    ]
    got = critic.reference_logps(rows, width=3)
    for r, row in enumerate(rows):
        n = len(row.completion_ids)
        ids = torch.tensor([row.prompt_ids + row.completion_ids])
        with torch.no_grad():
            expected = shared_prefix_logps(policy, ids, torch.ones_like(ids), n, temperature=0.7)[0][0]
        torch.testing.assert_close(got[r, :n], expected, atol=1e-6, rtol=0)
