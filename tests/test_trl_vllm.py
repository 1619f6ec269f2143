"""Training rollouts through TRL's vLLM integration (agents/backends/trl_vllm.py), without vLLM: a fake
with `VLLMGeneration`'s exact method signatures (checked against the real class) samples from the tiny
model with vLLM's "processed" log-probs, and TRL 1.16's importance-sampling ratio against hand-computed
values."""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import inspect
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentrl.agents.backends import HFBackend, SamplingConfig
from agentrl.agents.backends.trl_vllm import (
    GENERATION_ATTRIBUTES,
    IS_MODES,
    TRLVLLMBackend,
    importance_metrics,
    importance_ratio,
    sampling_logps_tensor,
    training_view,
    vllm_generation_kwargs,
)
from agentrl.agents.llm import LLMAgent, build_llm_agent
from agentrl.config import compose_config, typed
from agentrl.envs import env_factory, make_env
from agentrl.errors import BackendError, ConfigError
from agentrl.models import load_model
from agentrl.rollout import rollout
from agentrl.types import StepSample

torch.set_num_threads(1)


# ---- the fake engine ----------------------------------------------------------------------------------
class FakeVLLMGeneration:
    """`VLLMGeneration` without vLLM: its engine is a copy of the model made at construction (colocate mode
    loads the checkpoint from disk), `sync_weights` copies the trained weights into it (vLLM's
    `load_weights`), and `generate` samples one completion per prompt with vLLM's processed log-probs
    (after temperature and top-k/top-p), stopping at eos or at a `generation_kwargs` stop string."""

    def __init__(
        self,
        model,
        accelerator,
        processing_class,
        mode: str = "colocate",
        tensor_parallel_size: int = 1,
        repetition_penalty: float = 1.0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        max_completion_length: int = 16,
        logprobs: int | None = 0,
        generation_kwargs: dict | None = None,
        **engine,
    ):
        self.model, self.accelerator, self.processing_class = model, accelerator, processing_class
        self.mode, self.tensor_parallel_size = mode, tensor_parallel_size
        self.repetition_penalty, self.temperature, self.top_p, self.top_k = (
            repetition_penalty,
            temperature,
            top_p,
            top_k,
        )
        self.min_p, self.max_completion_length, self.logprobs = min_p, max_completion_length, logprobs
        self.generation_kwargs = generation_kwargs or {}
        self.engine_kwargs = engine
        self.engine = copy.deepcopy(model).eval()
        self.generator = torch.Generator().manual_seed(1234)
        self.sync_calls = 0
        self.calls: list[int] = []  # prompts per generate call

    def generate(self, prompts, images, num_generations, profiler=None):
        from transformers import TopKLogitsWarper, TopPLogitsWarper

        assert images is None and num_generations == 1
        self.calls.append(len(prompts))
        eos = self.processing_class.eos_token_id
        stops = self.generation_kwargs.get("stop") or []
        completions, logprobs, token_ids = [], [], []
        with torch.no_grad():
            for prompt in prompts:
                ids, lps = [], []
                for _ in range(self.max_completion_length):
                    # the last position's logits only: the rest would cost a vocabulary-sized head per token
                    row = torch.tensor([prompt + ids], device=self.engine.device)
                    out = self.engine(row, logits_to_keep=1, use_cache=False)
                    logits = out.logits[0, -1].float()
                    if self.temperature > 0:
                        logits = logits / self.temperature
                        if self.top_k > 0:
                            logits = TopKLogitsWarper(self.top_k)(None, logits[None])[0]
                        if self.top_p < 1:
                            logits = TopPLogitsWarper(self.top_p)(None, logits[None])[0]
                    logp = torch.log_softmax(logits, -1)  # processed_logprobs
                    if self.temperature > 0:
                        token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                    else:
                        token = int(logp.argmax())
                    ids.append(token)
                    lps.append(float(logp[token]))
                    text = self.processing_class.decode(ids, skip_special_tokens=True)
                    if token == eos or any(s in text for s in stops):
                        break
                completions.append(ids)
                logprobs.append([[lp] for lp in lps])  # (T, 1): logprobs=0
                token_ids.append([[t] for t in ids])
        return [list(p) for p in prompts], completions, logprobs, token_ids

    def sync_weights(self):
        self.sync_calls += 1
        self.engine.load_state_dict(self.model.state_dict())


ACCELERATOR = SimpleNamespace(num_processes=1, is_main_process=True, process_index=0)


@pytest.fixture(scope="module")
def tiny():
    return load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")


def _parameters(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def _ast_signature(fn: ast.FunctionDef) -> inspect.Signature:
    """The signature of a function definition in source (literal defaults), without importing its module."""
    P, args = inspect.Parameter, fn.args
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs] + [
        (a, P.POSITIONAL_OR_KEYWORD) for a in args.args
    ]
    defaults = [P.empty] * (len(positional) - len(args.defaults)) + [
        ast.literal_eval(d) for d in args.defaults
    ]
    params = [P(a.arg, kind, default=d) for (a, kind), d in zip(positional, defaults, strict=True)]
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(P(a.arg, P.KEYWORD_ONLY, default=P.empty if d is None else ast.literal_eval(d)))
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


@pytest.fixture(scope="module")
def real_class():
    """VLLMGeneration's method signatures and constructor source, read from the installed TRL without
    importing it (the import pulls in datasets, pandas and torch._dynamo: ~10 s of CPU);
    `test_source_signatures_are_the_imported_class_ones` (slow) checks them against `inspect.signature`."""
    root = importlib.util.find_spec("trl").submodule_search_locations[0]
    source = (Path(root) / "generation" / "vllm_generation.py").read_text()
    cls = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "VLLMGeneration"
    )
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    signatures = {name: _ast_signature(methods[name]) for name in ("__init__", "generate", "sync_weights")}
    return signatures, ast.get_source_segment(source, methods["__init__"])


def _engine(tiny, **settings):
    model, tokenizer = tiny
    return FakeVLLMGeneration(model, ACCELERATOR, tokenizer, **settings)


def _prompts(tokenizer, n=3):
    texts = [
        f"<|im_start|>user\nSay something number {k}<|im_end|>\n<|im_start|>assistant\n" for k in range(n)
    ]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]


# ---- the fake is VLLMGeneration's interface -----------------------------------------------------------
def test_fake_has_vllm_generations_exact_interface(real_class):
    signatures, init_source = real_class
    for method in ("generate", "sync_weights"):
        fake = inspect.signature(getattr(FakeVLLMGeneration, method))
        assert _parameters(fake) == _parameters(signatures[method]), method
    real = signatures["__init__"].parameters
    for name, param in inspect.signature(FakeVLLMGeneration.__init__).parameters.items():
        if param.kind is not inspect.Parameter.VAR_KEYWORD:
            assert name in real and param.default == real[name].default, name
    for attribute in GENERATION_ATTRIBUTES:  # every attribute the backend reads is set by the constructor
        assert f"self.{attribute} =" in init_source, attribute


@pytest.mark.slow
def test_source_signatures_are_the_imported_class_ones(real_class):
    from trl.generation.vllm_generation import VLLMGeneration

    signatures, _ = real_class
    for method, signature in signatures.items():
        assert _parameters(inspect.signature(getattr(VLLMGeneration, method))) == _parameters(signature)
    algo = typed(compose_config(["algo=msgrpo"]).algo)
    kwargs = vllm_generation_kwargs(algo, {"vllm": {"mode": "server"}}, 4, ("</action>",))
    inspect.signature(VLLMGeneration.__init__).bind(
        None, model=None, accelerator=None, processing_class=None, **kwargs
    )


# ---- vllm_generation_kwargs --------------------------------------------------------------------------
def test_vllm_generation_kwargs_bind_to_the_real_constructor(real_class):
    algo = typed(compose_config(["algo=msgrpo", "algo.top_k=3", "algo.temperature=1.5"]).algo)
    model_cfg = {
        "trust_remote_code": True,
        "vllm": {"mode": "server", "server_base_url": "http://gpu:8000", "max_model_len": 4096},
    }
    kwargs = vllm_generation_kwargs(algo, model_cfg, 1, ("</action>",))
    real_class[0]["__init__"].bind(None, model=None, accelerator=None, processing_class=None, **kwargs)
    assert kwargs == {
        "mode": "server",
        "server_base_url": "http://gpu:8000",
        "max_model_length": 4096,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.3,
        "max_num_seqs": algo.groups_per_iteration * algo.group_size,
        "trust_remote_code": True,
        "temperature": 1.5,
        "top_p": 1.0,
        "top_k": 3,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_completion_length": 1,
        "logprobs": 0,
        "generation_kwargs": {"stop": ["</action>"], "include_stop_str_in_output": True},
    }
    default = vllm_generation_kwargs(algo, {}, 8)
    assert default["mode"] == "colocate" and default["generation_kwargs"] == {}
    with pytest.raises(ConfigError, match="enforce_eager"):
        vllm_generation_kwargs(algo, {"vllm": {"enforce_eager": True}}, 8)
    with pytest.raises(ConfigError, match="colocate or server"):
        vllm_generation_kwargs(algo, {"vllm": {"mode": "remote"}}, 8)


# ---- the backend -------------------------------------------------------------------------------------
def test_generate_returns_completions_with_the_sampled_tokens_logprobs(tiny):
    model, tokenizer = tiny
    fake = _engine(tiny, temperature=0.9, max_completion_length=6)
    backend = TRLVLLMBackend(fake, tokenizer)
    prompts = _prompts(tokenizer)
    sampling = SamplingConfig(temperature=0.9, max_new_tokens=6)
    with pytest.raises(BackendError, match="sync_weights"):
        backend.generate(prompts, sampling)  # the engine never got the weights
    backend.sync_weights(step=0)
    completions = backend.generate(prompts, sampling, seed=5)
    assert len(completions) == len(prompts) and fake.calls == [len(prompts)]
    for prompt, (ids, lps) in zip(prompts, completions, strict=True):
        assert 1 <= len(ids) <= 6 and len(lps) == len(ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits / 0.9, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(lps), expected, atol=1e-4, rtol=1e-4)
    # fewer new tokens than the engine's budget: cut like the hf backend cuts
    short = backend.generate(prompts, dataclasses.replace(sampling, max_new_tokens=2))
    assert all(1 <= len(ids) <= 2 and len(lps) == len(ids) for ids, lps in short)
    assert backend.generate([], sampling) == []


def test_sampling_that_differs_from_the_engines_raises(tiny):
    _, tokenizer = tiny
    fake = _engine(
        tiny,
        temperature=1.25,
        top_k=3,
        max_completion_length=4,
        generation_kwargs={"stop": ["</action>"], "include_stop_str_in_output": True},
    )
    backend = TRLVLLMBackend(fake, tokenizer)
    backend.sync_weights()
    good = SamplingConfig(temperature=1.25, top_k=3, max_new_tokens=4, stop=("</action>", "\n\n"))
    backend.check_sampling(good)  # more stop strings than the engine: cut afterwards
    for bad, word in [
        (dataclasses.replace(good, temperature=0.0), "temperature"),  # greedy eval
        (dataclasses.replace(good, top_k=0), "top_k"),
        (dataclasses.replace(good, top_p=0.9), "top_p"),
        (dataclasses.replace(good, max_new_tokens=5), "max_new_tokens"),
        (dataclasses.replace(good, stop=()), "stop"),  # the engine would cut at </action>
    ]:
        with pytest.raises(BackendError, match=word):
            backend.generate(_prompts(tokenizer, 1), bad)
    assert fake.calls == []


def test_engines_that_cannot_serve_training_rollouts_are_refused(tiny):
    _, tokenizer = tiny
    with pytest.raises(BackendError, match="seed"):
        TRLVLLMBackend(_engine(tiny, generation_kwargs={"seed": 0}), tokenizer)
    with pytest.raises(BackendError, match="repetition_penalty"):
        TRLVLLMBackend(_engine(tiny, repetition_penalty=1.1), tokenizer)
    with pytest.raises(BackendError, match="include_stop_str_in_output"):
        TRLVLLMBackend(_engine(tiny, generation_kwargs={"stop": ["</action>"]}), tokenizer)
    two = SimpleNamespace(num_processes=2, is_main_process=True, process_index=0)
    model, _ = tiny
    with pytest.raises(BackendError, match="one training"):
        TRLVLLMBackend(FakeVLLMGeneration(model, two, tokenizer, mode="server"), tokenizer)
    TRLVLLMBackend(FakeVLLMGeneration(model, two, tokenizer), tokenizer)  # colocate, TP 1: one engine each


def test_sync_weights_is_forwarded_and_tracked(tiny):
    model, tokenizer = tiny
    trained = copy.deepcopy(model)
    fake = FakeVLLMGeneration(trained, ACCELERATOR, tokenizer, temperature=1.0, max_completion_length=1)
    backend = TRLVLLMBackend(fake, tokenizer)
    assert (backend.synced, backend.sync_count, fake.sync_calls) == (False, 0, 0)
    backend.sync_weights(step=0)
    assert (backend.synced, backend.sync_count, backend.synced_step, fake.sync_calls) == (True, 1, 0, 1)
    with torch.no_grad():  # an optimizer step
        trained.lm_head.weight.add_(0.5)
    backend.weights_changed()  # RolloutCacheReset.on_optimizer_step
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=1)
    with pytest.raises(BackendError, match="current weights"):
        backend.generate(_prompts(tokenizer, 1), sampling)
    assert not torch.equal(fake.engine.lm_head.weight, trained.lm_head.weight)
    backend.sync_weights(step=1)
    assert torch.equal(fake.engine.lm_head.weight, trained.lm_head.weight)
    assert (backend.synced_step, fake.sync_calls) == (1, 2)
    assert len(backend.generate(_prompts(tokenizer, 1), sampling)) == 1


def test_completion_cut_is_the_hf_backends(tiny):
    model, tokenizer = tiny
    hf = HFBackend(model, tokenizer)
    backend = TRLVLLMBackend(_engine(tiny), tokenizer, eos_token_ids=hf.eos_ids)
    word = tokenizer("<action>left</action> more", add_special_tokens=False).input_ids
    eos = tokenizer.eos_token_id
    for ids in ([], word, word + [eos, 5], [eos], word[:3] + [eos] + word):
        for stops in ((), ("</action>",), ("</act",), ("zzz",)):
            assert backend._completion_length(ids, stops) == hf._completion_length(ids, stops)


def test_scoring_is_not_supported(tiny):
    _, tokenizer = tiny
    backend = TRLVLLMBackend(_engine(tiny), tokenizer)
    with pytest.raises(ConfigError, match="model.backend=hf"):
        LLMAgent(SimpleNamespace(), backend, decision="score")
    with pytest.raises(BackendError, match="decision=score"):
        training_view(SimpleNamespace(decision="score"), backend)


def test_rollout_on_frozenlake_through_the_engine(tiny):
    """The LLM agent's training view generates through the backend: one engine call per lockstep step,
    one-token answers after the auto prefill, log-probs equal to a fresh forward pass at the rollout
    temperature (top_k=0, top_p=1: vLLM's processed log-probs are the training forward's)."""
    model, tokenizer = tiny
    cfg = compose_config(["env=frozenlake", "model=tiny-random", "algo=msgrpo"])
    algo = typed(cfg.algo)
    policy = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    train = policy.configured(
        sampling=dataclasses.replace(
            policy.sampling, temperature=algo.temperature, top_k=algo.top_k, top_p=algo.top_p
        )
    )
    kwargs = vllm_generation_kwargs(
        algo, cfg.model, train.sampling.max_new_tokens, train.effective_sampling().stop
    )
    fake = FakeVLLMGeneration(model=model, accelerator=ACCELERATOR, processing_class=tokenizer, **kwargs)
    backend = TRLVLLMBackend(fake, tokenizer)
    agent = training_view(train, backend)
    assert agent.backend is backend and agent.interface is train.interface
    backend.sync_weights(step=0)
    episodes = rollout(lambda: make_env("frozenlake", size=3, max_steps=4), agent, [0, 1])
    steps = [step for episode in episodes for step in episode.steps]
    assert steps and len(fake.calls) == max(e.length for e in episodes)  # one batched call per step
    assert sum(fake.calls) == len(steps)
    for step in steps:
        generation = step.generation
        assert len(generation.completion_ids) == 1 and len(generation.logprobs) == 1
        assert generation.prompt_text.endswith(agent.interface.prefill)
        with torch.no_grad():
            logits = model(torch.tensor([generation.prompt_ids])).logits[0, -1].float()
        expected = torch.log_softmax(logits / algo.temperature, -1)[generation.completion_ids[0]]
        assert math.isclose(generation.logprobs[0], float(expected), abs_tol=1e-4)


# ---- importance sampling ----------------------------------------------------------------------------
TRAIN = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, -4.0]])
SAMPLING = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -1.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# token log-ratios: [[0.5, -1.0, 0.0], [0.0, 0.7, masked]]; sequences: -0.5 and 0.7


@pytest.mark.parametrize(
    ("mode", "cap", "clip_min", "expected"),
    [
        ("token_truncate", 1.5, 0.5, [[1.5, 0.5, 1.0], [1.0, 1.5, 1.0]]),
        ("token_truncate", 3.0, None, [[math.exp(0.5), math.exp(-1.0), 1.0], [1.0, math.exp(0.7), 1.0]]),
        ("token_mask", 1.5, 0.5, [[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]]),
        ("token_mask", None, 0.5, [[math.exp(0.5), 0.0, 1.0], [1.0, math.exp(0.7), 1.0]]),
        ("sequence_truncate", 1.5, 0.7, [[0.7], [1.5]]),
        ("sequence_truncate", 3.0, None, [[math.exp(-0.5)], [math.exp(0.7)]]),
        ("sequence_mask", 1.5, None, [[math.exp(-0.5)], [0.0]]),
        ("sequence_mask", 3.0, 0.7, [[0.0], [math.exp(0.7)]]),
    ],
)
def test_importance_ratio_by_hand(mode, cap, clip_min, expected):
    ratio = importance_ratio(TRAIN, SAMPLING, MASK, mode, cap, clip_min=clip_min)
    torch.testing.assert_close(ratio, torch.tensor(expected))


@pytest.mark.parametrize("mode", IS_MODES)
def test_importance_ratio_is_one_on_policy_and_on_unscored_tokens(mode):
    ones = torch.ones(2, 1) if mode.startswith("sequence") else torch.ones(2, 3)
    torch.testing.assert_close(importance_ratio(TRAIN, TRAIN.clone(), MASK, mode), ones)
    torch.testing.assert_close(importance_ratio(TRAIN, TRAIN.clone(), MASK, mode, 1.5, clip_min=0.5), ones)
    unscored = torch.full_like(TRAIN, float("nan"))  # vLLM's None log-probs: no correction
    torch.testing.assert_close(importance_ratio(TRAIN, unscored, MASK, mode), ones)


def test_importance_ratio_rejects_unknown_modes_and_unbounded_truncation():
    with pytest.raises(ValueError, match="sequence_mask"):
        importance_ratio(TRAIN, SAMPLING, MASK, "token_clip")
    with pytest.raises(ValueError, match="cap"):
        importance_ratio(TRAIN, SAMPLING, MASK, "token_truncate", None)


def test_importance_metrics_and_sampling_logps_tensor():
    ratio = importance_ratio(TRAIN, SAMPLING, MASK, "token_truncate", 3.0)
    metrics = importance_metrics(TRAIN, SAMPLING, MASK, ratio, "token_truncate")
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(1.0)
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(
        (0.5 + 1.0 + 0.0 + 0.0 + 0.7) / 5
    )
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-1.0))
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(0.7))
    rows = [StepSample([1], [2, 3], [-0.5, -1.5], 1.0, 0, 0), StepSample([1], [4], None, 0.0, -1, -1)]
    tensor = sampling_logps_tensor(rows, 2)
    assert tensor[0].tolist() == [-0.5, -1.5] and math.isnan(tensor[1, 0]) and tensor[1, 1] == 0.0


def test_training_with_model_backend_vllm_syncs_the_engine_before_every_rollout(tmp_path, monkeypatch):
    """`agentrl train model.backend=vllm`: rollouts come from TRL's engine (here the fake), which holds the
    trained weights whenever it generates, though they move between rollouts; the rows carry TRL's
    importance-sampling ratio, ~1 as the engine holds the trainer's weights, though the rollouts sample
    top-k (vLLM's log-probs are of the truncated distribution, and so are the trainer's for the ratio;
    without that the ratio of a row is the product of its tokens' kept mass)."""
    import trl.generation.vllm_generation as trl_vllm

    from agentrl.config import compose_config
    from agentrl.trainers.grpo_trainer import MultiStepTrainer
    from agentrl.trainers.multistep import train_llm

    engines: list[FakeVLLMGeneration] = []

    class Recording(FakeVLLMGeneration):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fresh: list[bool] = []  # at each generate: do the engine's weights equal the trainer's?
            self.sums: list[float] = []  # ... and what the trainer's weights were
            engines.append(self)

        def generate(self, prompts, images, num_generations, profiler=None):
            trained = self.model.state_dict()
            self.fresh.append(all(torch.equal(v, trained[k]) for k, v in self.engine.state_dict().items()))
            self.sums.append(sum(float(v.double().sum()) for v in trained.values()))
            return super().generate(prompts, images, num_generations, profiler)

    ratios: list[torch.Tensor] = []
    add_ratio = MultiStepTrainer._add_importance_ratio

    def recording(self, batch, rows):
        add_ratio(self, batch, rows)
        ratios.append(batch["importance_sampling_ratio"])

    monkeypatch.setattr(trl_vllm, "VLLMGeneration", Recording)
    monkeypatch.setattr(MultiStepTrainer, "_add_importance_ratio", recording)
    cfg = compose_config(
        [
            "task=train",
            "algo=msgrpo",
            "env=bandit",
            "env.horizon=4",
            "model=tiny-random",
            "model.backend=vllm",
            "agent.invalid_rule=random",  # the tiny model's noise still pulls arms, so returns vary
            "agent.sampling.max_new_tokens=4",  # the fake engine decodes without a KV cache
            "algo.iterations=3",
            "algo.groups_per_iteration=2",
            "algo.group_size=4",
            "algo.learning_rate=1e-3",
            "algo.eval_before=false",
            "algo.checkpoint_every=0",
            "algo.save_final=false",
            "algo.torch_threads=1",
            "eval.episodes=2",
            "algo.top_k=3",
        ]
    )
    train_llm(cfg, tmp_path, env_factory)
    (engine,) = engines
    assert engine.sync_calls == 3  # one per iteration's rollout
    assert engine.fresh and all(engine.fresh)
    assert len(set(engine.sums)) > 1  # the weights moved between rollouts: the syncs carried the updates
    assert ratios and all(torch.isfinite(r).all() for r in ratios)
    assert all(torch.allclose(r, torch.ones_like(r), atol=1e-3) for r in ratios)  # on-policy, same weights
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sampling/masked_rows"] == 0 and r["sampling/uncorrected_tokens"] >= 0 for r in rows)
