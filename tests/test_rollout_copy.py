"""`algo.rollout_dtype`: training rollouts from a copy of the trained model in bf16 (agents/backends/hf.py
`HFCopyBackend`), synced before every rollout, with TRL's importance-sampling ratio in the loss."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrl.agents.backends import HFBackend, HFCopyBackend, SamplingConfig
from agentrl.agents.exploration import EpsilonGreedy, TryAll, apply_exploration, unwrap
from agentrl.agents.llm import LLMAgent, TextInterface
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.errors import BackendError, ConfigError
from agentrl.models import apply_lora, load_model
from agentrl.trainers.grpo_trainer import MultiStepTrainer
from agentrl.trainers.multistep import train_llm


@pytest.fixture(scope="module")
def tiny():
    return load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")


def _prompts(tokenizer, n=3):
    texts = [f"<|im_start|>user\nPress button {k}<|im_end|>\n<|im_start|>assistant\n" for k in range(n)]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]


def _holds(backend: HFCopyBackend, source) -> bool:
    """Every tensor of the copy equals the source's, cast to the copy's dtype."""
    copies = [*backend.model.parameters(), *backend.model.buffers()]
    trained = [*source.parameters(), *source.buffers()]
    return all(torch.equal(c, t.to(c.dtype)) for c, t in zip(copies, trained, strict=True))


def test_the_copy_generates_only_with_the_current_weights(tiny):
    model, tokenizer = tiny
    source = copy.deepcopy(model)
    backend = HFCopyBackend(source, tokenizer, torch.bfloat16)
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    assert next(source.parameters()).dtype == torch.float32  # the trained weights are untouched
    assert not any(p.requires_grad for p in backend.model.parameters())
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4)
    with pytest.raises(BackendError, match="sync_weights"):
        backend.generate(_prompts(tokenizer), sampling)
    backend.sync_weights(step=0)
    assert _holds(backend, source) and (backend.synced_step, backend.sync_count) == (0, 1)
    completions = backend.generate(_prompts(tokenizer), sampling, seed=3)
    assert len(completions) == 3
    assert all(1 <= len(ids) <= 4 and len(lps) == len(ids) for ids, lps in completions)
    assert all(torch.isfinite(torch.tensor(lps)).all() for _, lps in completions)

    with torch.no_grad():  # an optimizer step on the trained weights
        source.lm_head.weight.add_(0.5)
    backend.weights_changed()  # RolloutCacheReset.on_optimizer_step
    assert not _holds(backend, source)
    with pytest.raises(BackendError, match="current trained weights"):
        backend.generate(_prompts(tokenizer), sampling)
    backend.sync_weights(step=1)
    assert _holds(backend, source) and (backend.synced_step, backend.sync_count) == (1, 2)


def _patched_source(model):
    """A trained model as GRPOTrainer leaves it: TRL's fused LM head bound onto the instance's forward."""
    from trl.trainer.utils import add_fused_lm_head

    source = copy.deepcopy(model)
    add_fused_lm_head(source, outputs=("log_probs", "entropy"))
    return source


def _logits(module, ids):
    with torch.no_grad():
        return module(input_ids=ids).logits


IDS = torch.tensor([[5, 17, 3, 42, 9, 11]])


def test_zeroing_the_source_leaves_the_copy_unchanged_until_the_next_sync(tiny):
    model, tokenizer = tiny
    source = _patched_source(model)
    backend = HFCopyBackend(source, tokenizer, torch.bfloat16)
    backend.sync_weights()
    before = _logits(backend.model, IDS)
    with torch.no_grad():
        for p in source.parameters():
            p.zero_()
    assert torch.equal(_logits(backend.model, IDS), before)  # a separate model, not a view of the source
    backend.weights_changed()
    backend.sync_weights()
    assert torch.count_nonzero(_logits(backend.model, IDS)) == 0  # zero weights: zero logits
    shared = {p.data_ptr() for p in source.parameters()} & {p.data_ptr() for p in backend.model.parameters()}
    assert not shared


def test_the_copy_computes_in_bf16(tiny):
    model, tokenizer = tiny
    backend = HFCopyBackend(_patched_source(model), tokenizer, torch.bfloat16)
    backend.sync_weights()
    assert _logits(backend.model, IDS).dtype == torch.bfloat16
    # the copy's own forward: the fused LM head scores log-probs with the source only
    assert "forward" not in vars(backend.model)


def test_the_sync_copies_the_trained_weights_into_a_bf16_model(tiny):
    """After a sync the copy computes what a bf16 model loaded with the trained weights computes."""
    model, tokenizer = tiny
    source = _patched_source(model)
    backend = HFCopyBackend(source, tokenizer, torch.bfloat16)
    with torch.no_grad():  # an optimizer step on the trained weights
        for p in source.parameters():
            p.mul_(1.5)
    backend.weights_changed()
    backend.sync_weights(step=1)
    reference = copy.deepcopy(model).to(torch.bfloat16)
    reference.load_state_dict({k: v.to(torch.bfloat16) for k, v in source.state_dict().items()})
    assert torch.equal(_logits(backend.model, IDS), _logits(reference, IDS))


def test_greedy_answers_of_the_copy_are_the_bf16_models_of_the_current_weights(tiny):
    """After each sync the copy answers as a bf16 model built from the trained weights would, and a change of
    the trained weights changes its answers' log-probs: the copy is not stuck on the weights it started from."""
    model, tokenizer = tiny
    source = copy.deepcopy(model)
    backend = HFCopyBackend(source, tokenizer, torch.bfloat16)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=3)
    prompts = _prompts(tokenizer, 2)

    def bf16_answers():
        reference = HFBackend(copy.deepcopy(source).to(torch.bfloat16), tokenizer, prefix_cache=False)
        return reference.generate(prompts, greedy)

    backend.sync_weights()
    before = backend.generate(prompts, greedy)
    assert before == bf16_answers()
    with torch.no_grad():
        source.model.norm.weight.mul_(3.0)
    backend.weights_changed()
    backend.sync_weights()
    after = backend.generate(prompts, greedy)
    assert after == bf16_answers()
    assert [lps for _, lps in after] != [lps for _, lps in before]


def test_a_lora_model_and_a_sharded_model(tiny, monkeypatch):
    model, tokenizer = tiny
    lora = apply_lora(copy.deepcopy(model), compose_config(["model.lora.r=4"]).model.lora)
    backend = HFCopyBackend(lora, tokenizer, torch.bfloat16)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.add_(0.25)  # trained adapters
    backend.sync_weights()
    assert _holds(backend, lora)
    assert len(backend.generate(_prompts(tokenizer, 1), SamplingConfig(max_new_tokens=2))) == 1

    import agentrl.agents.backends.hf as hf

    monkeypatch.setattr(hf, "is_sharded", lambda m: True)
    with pytest.raises(BackendError, match="sharded"):
        HFCopyBackend(model, tokenizer, torch.bfloat16)


def test_with_backend_keeps_the_interface_sampling_and_exploration_wrappers(tiny):
    model, tokenizer = tiny
    agent = LLMAgent(
        TextInterface(invalid_penalty=-5.0), HFBackend(model, tokenizer), SamplingConfig(temperature=0.7)
    )
    wrapped = apply_exploration(agent, {"try_all": True, "epsilon": 0.2, "self_consistency": 1})
    other = HFBackend(model, tokenizer)
    view = wrapped.with_backend(other)
    assert isinstance(view, TryAll) and isinstance(view.inner, EpsilonGreedy) and view.inner.epsilon == 0.2
    inner = unwrap(view)
    assert inner.backend is other and inner.interface is agent.interface and inner.sampling == agent.sampling
    assert unwrap(wrapped).backend is agent.backend  # the original is unchanged


def _train_cfg(*extra, algo="rlft"):
    return compose_config(
        [
            "task=train",
            f"algo={algo}",
            "env=bandit",
            "env.horizon=4",
            "model=tiny-random",
            "agent.cot=true",
            "agent.invalid_rule=random",  # the tiny model's noise still presses buttons, so returns vary
            "agent.invalid_penalty=-5",
            "agent.sampling.max_new_tokens=4",
            "algo.iterations=3",
            "algo.groups_per_iteration=2",
            "algo.group_size=4",
            "algo.learning_rate=1e-3",
            "algo.eval_before=false",
            "algo.checkpoint_every=0",
            "algo.save_final=false",
            "algo.torch_threads=1",
            "eval.episodes=2",
            *extra,
        ]
    )


def test_training_syncs_the_copy_before_every_rollout_and_corrects_with_the_ratio(tmp_path, monkeypatch):
    """`agentrl train algo.rollout_dtype=bfloat16`: every training rollout comes from the bf16 copy, which
    holds the current trained weights whenever it generates, though they move between rollouts; the rows
    carry TRL's importance-sampling ratio from the copy's own log-probs."""
    copies: list[HFCopyBackend] = []
    fresh: list[bool] = []
    sums: list[float] = []
    generate = HFCopyBackend.generate

    def recording(self, prompts, sampling, *, seed=None):
        if self not in copies:
            copies.append(self)
        fresh.append(self.synced and _holds(self, self.source))
        sums.append(sum(float(p.detach().double().sum()) for p in self.source.parameters()))
        return generate(self, prompts, sampling, seed=seed)

    ratios: list[torch.Tensor] = []
    add_ratio = MultiStepTrainer._add_importance_ratio

    def recording_ratio(self, batch, rows):
        add_ratio(self, batch, rows)
        ratios.append(batch["importance_sampling_ratio"])

    monkeypatch.setattr(HFCopyBackend, "generate", recording)
    monkeypatch.setattr(MultiStepTrainer, "_add_importance_ratio", recording_ratio)
    train_llm(_train_cfg("algo.rollout_dtype=bfloat16"), tmp_path, env_factory)
    (backend,) = copies
    assert backend.sync_count == 3  # one per iteration's rollout
    assert fresh and all(fresh)
    assert len(set(sums)) == 3  # the trained weights moved between rollouts: the syncs carried the updates
    assert ratios and all(torch.isfinite(r).all() for r in ratios)
    # the copy's bf16 log-probs are not the fp32 weights' (so a ratio is not exactly 1), but close
    assert any(bool((r != 1).any()) for r in ratios)
    assert all(bool(((r - 1).abs() < 0.1).all()) for r in ratios)


@pytest.mark.parametrize(
    ("algo", "extra", "message"),
    [
        ("rlft", "algo.precision=bf16-pure", "already bfloat16"),
        ("twosome", "agent.cot=false", "decision=score"),
    ],
)
def test_settings_the_copy_cannot_serve_are_refused(tmp_path, algo, extra, message):
    cfg = _train_cfg("algo.rollout_dtype=bfloat16", extra, algo=algo)
    with pytest.raises(ConfigError, match=message):
        train_llm(cfg, tmp_path, env_factory)


def test_rollout_dtype_benchmark_compares_the_two_dtypes(tmp_path, monkeypatch):
    """benchmarks/rollout_dtype.py on the tiny model: both arms play the same steps, every bf16 row is
    compared with the fp32 weights, and the gap is small but not zero (the copy really is bf16)."""
    import json
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "rollout_dtype.py"
    out = tmp_path / "rollout_dtype.json"
    argv = [str(script), "--model", "tiny-random", "--horizon", "2", "--episodes", "2", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--threads", "1", "--device", "cpu", "--out", str(out)])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)  # the script sets the process's thread count
    result = json.loads(out.read_text())
    assert result["steps_per_rollout"] == {"fp32": 4, "bf16_copy": 4}
    assert result["rows"] == 4
    assert 0.0 < result["mean_abs_logp_difference"] < 0.05
    assert result["rows_outside_ratio_bounds"] == 0
