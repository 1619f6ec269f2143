"""The vLLM training path's GPU defects, on the CPU (issue 22): TRL's real `VLLMGeneration` code driven with a
fake `vllm.LLM` (A8 memory and tensor parallelism, B2 LoRA sync without touching the base, B3 processed
log-probs on the trainer's side, B6 the server's log-prob mode, C3 one weight sync per rollout in sleep
mode), and the CUDA log-prob dispatch (C2) and ZeRO-3 adapter dtype (A6)."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch

from agentrl.agents.backends import SamplingConfig
from agentrl.agents.backends.trl_vllm import (
    TRLVLLMBackend,
    colocate_memory,
    colocate_memory_utilization,
    generation_class,
    kv_bytes_per_token,
    merged_lora_weights,
    training_state_bytes,
    vllm_generation_kwargs,
)
from agentrl.config import compose_config, typed
from agentrl.errors import BackendError, ConfigError
from agentrl.models import apply_lora, load_model, model_config
from agentrl.trainers.logps import kernel_applies, processed_logps
from tests.test_trl_vllm import ACCELERATOR, FakeVLLMGeneration, _prompts

torch.set_num_threads(1)
GIB = 2**30


@pytest.fixture(scope="module")
def tiny():
    return load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")


@pytest.fixture(scope="module")
def trl_generation():
    """TRL's VLLMGeneration module (its import takes a few seconds)."""
    import trl.generation.vllm_generation as module

    return module


# ---- A8: colocate memory and tensor parallelism ---------------------------------------------------------
QWEN_3B = {"parameters": 3_085_938_688, "kv_bytes_per_token": 2 * 36 * 2 * 128 * 2, "max_model_length": 32768}


def test_colocate_refuses_tensor_parallelism():
    algo = typed(compose_config(["algo=msgrpo"]).algo)
    with pytest.raises(ConfigError, match=r"model.vllm.tensor_parallel_size=2: colocate mode"):
        vllm_generation_kwargs(algo, {"vllm": {"tensor_parallel_size": 2}}, 8)
    server = vllm_generation_kwargs(algo, {"vllm": {"mode": "server", "tensor_parallel_size": 2}}, 8)
    assert server["tensor_parallel_size"] == 2  # the server's own


def test_colocate_memory_is_sized_per_model_and_checked():
    full_ft = 16 * QWEN_3B["parameters"]  # fp32 weights, gradients, AdamW moments: ~46 GiB
    ref = 4 * QWEN_3B["parameters"]  # TRL's fp32 reference model (beta > 0)
    h100 = 80 * GIB
    sizes = dict(max_num_seqs=16, **QWEN_3B)
    # TRL's old default 0.3 of an 80 GB card plus the training state (and activations) does not fit
    with pytest.raises(
        ConfigError, match=r"model.vllm.gpu_memory_utilization=0.30: the engine .* leave less"
    ):
        colocate_memory_utilization(0.3, gpu_bytes=h100, training_bytes=full_ft + ref, **sizes)
    # unset: sized from the model (bf16 weights 5.7 GiB + KV cache + overhead)
    sized = colocate_memory_utilization(None, gpu_bytes=h100, training_bytes=full_ft, **sizes)
    assert 0.1 < sized < 0.2
    assert sized * h100 >= 2 * QWEN_3B["parameters"] + QWEN_3B["kv_bytes_per_token"] * 32768
    # too small for the weights and one max_model_length sequence
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=0.05: the colocated engine needs"):
        colocate_memory_utilization(0.05, gpu_bytes=h100, training_bytes=full_ft, **sizes)
    # 72B on one GPU (TP 1): no share of a 141 GB GPU holds 145 GB of bf16 weights
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        colocate_memory_utilization(
            None,
            gpu_bytes=141 * GIB,
            training_bytes=20 * GIB,
            parameters=72_700_000_000,
            kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
            max_model_length=32768,
            max_num_seqs=16,
        )
    algo = typed(compose_config(["algo=msgrpo"]).algo)
    kwargs = vllm_generation_kwargs(algo, {}, 8, memory=dict(gpu_bytes=h100, training_bytes=full_ft, **sizes))
    assert kwargs["gpu_memory_utilization"] == sized


def test_training_state_and_kv_sizes(tiny):
    model, _ = tiny
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert training_state_bytes(model) == 4 * weights  # weight, gradient, two AdamW moments
    frozen = copy.deepcopy(model).requires_grad_(False)
    assert training_state_bytes(model, frozen, None) == 5 * weights
    config = SimpleNamespace(
        num_attention_heads=16, hidden_size=2048, num_key_value_heads=2, num_hidden_layers=36
    )
    assert kv_bytes_per_token(config) == QWEN_3B["kv_bytes_per_token"]


# ---- B2: LoRA weights reach vLLM merged out of place ----------------------------------------------------
def _lora_bf16(tiny):
    model, _ = tiny
    cfg = model_config({"name": "t", "name_or_path": "builtin:tiny-random", "lora": {"r": 4, "alpha": 8}})
    return apply_lora(copy.deepcopy(model).to(torch.bfloat16), cfg.lora)


def _engine_shell(cls, model, **attributes):
    """A VLLMGeneration of class `cls` without vLLM: TRL's methods, a fake engine (`llm`)."""
    gen = object.__new__(cls)
    gen.model, gen.accelerator, gen.mode = model, ACCELERATOR, "colocate"
    gen._dist = SimpleNamespace(
        is_fsdp=False, fsdp_version=None, gather_params=lambda p: contextlib.nullcontext()
    )
    for key, value in attributes.items():
        setattr(gen, key, value)
    return gen


def _randomise_adapters(model, generator):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


def test_lora_sync_never_changes_the_base(tiny, trl_generation):
    peft_model = _lora_bf16(tiny)
    base = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}
    base_model = copy.deepcopy(tiny[0]).to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    # TRL's own sync merges into the bf16 base and unmerges: the base drifts (the defect)
    trl_shell = _engine_shell(trl_generation.VLLMGeneration, copy.deepcopy(peft_model))
    for _ in range(5):
        _randomise_adapters(trl_shell.model, generator)
        list(trl_shell._iter_named_params())
    drifted = {n: p for n, p in trl_shell.model.named_parameters() if "lora_" not in n}
    assert any(not torch.equal(drifted[n], base[n]) for n in base)
    # agentrl's: bit-identical after many syncs, and what it sends is base + B A scaling
    shell = _engine_shell(generation_class(trl_generation.VLLMGeneration), peft_model)
    for _ in range(50):
        _randomise_adapters(peft_model, generator)
        sent = dict(shell._iter_named_params())
    now = {n: p for n, p in peft_model.named_parameters() if "lora_" not in n}
    assert all(torch.equal(now[n], base[n]) for n in base)
    merged = copy.deepcopy(peft_model).merge_and_unload()
    assert set(sent) == set(dict(merged.named_parameters()))
    for name, value in merged.named_parameters():
        torch.testing.assert_close(sent[name], value.detach(), atol=1e-2, rtol=1e-2)
    # the engine's model (a plain model with the sent weights) computes what PEFT's merged model computes
    engine = copy.deepcopy(merged)
    engine.load_state_dict(sent, strict=False)  # lm_head is tied to the embedding
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        gap = (engine(ids).logits.float() - merged(ids).logits.float()).abs()
        moved = (engine(ids).logits.float() - base_model(ids).logits.float()).abs()
    assert gap.mean() < 0.1 * moved.mean()  # bf16 rounding, against what the adapters change
    assert list(merged_lora_weights(peft_model))[0][0] == next(iter(sent))


# ---- C3: sleep mode syncs once per rollout -----------------------------------------------------------
class FakeLLM:
    """`vllm.LLM`'s surface TRL's colocate code calls: generate (one token per prompt), sleep/wake_up,
    reset_prefix_cache and the driver worker's `load_weights` (counted)."""

    def __init__(self):
        self.loaded = 0
        self.events: list[str] = []
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load))
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))
        )

    def _load(self, weights):
        self.loaded += len(weights)

    def sleep(self, level):
        self.events.append(f"sleep{level}")

    def wake_up(self, tags):
        self.events.append("wake:" + ",".join(tags))

    def reset_prefix_cache(self):
        pass

    def generate(self, prompts, sampling_params, use_tqdm):
        self.events.append("generate")
        logprob = SimpleNamespace(rank=1, logprob=-0.5)
        out = SimpleNamespace(token_ids=[7], logprobs=[{7: logprob}])
        return [SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[out]) for p in prompts]


def test_sleep_mode_sends_the_weights_once_per_rollout(tiny, trl_generation, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(trl_generation, "SamplingParams", dict, raising=False)
    llm = FakeLLM()
    gen = _engine_shell(
        generation_class(trl_generation.VLLMGeneration),
        model,
        llm=llm,
        enable_sleep_mode=True,
        _llm_weights_sleeping=True,
        tensor_parallel_size=1,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        max_completion_length=1,
        logprobs=0,
        generation_kwargs={},
        structured_outputs_regex=None,
    )
    backend = TRLVLLMBackend(gen, tokenizer, eos_token_ids=[tokenizer.eos_token_id])
    n_params = len(list(model.named_parameters()))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=1)
    for iteration in range(2):
        backend.sync_weights(step=iteration)
        for _ in range(4):  # four env steps of one rollout
            assert backend.generate(_prompts(tokenizer, 2), sampling)[0] == ([7], [-0.5])
        backend.end_rollout()
        backend.weights_changed()  # the update
    assert llm.loaded == 2 * n_params  # once per weights version, not once per generate call
    assert llm.events.count("generate") == 8 and llm.events.count("sleep2") == 2
    assert llm.events[-1] == "sleep2" and gen._llm_weights_sleeping  # asleep through the update


# ---- B6: the server's log-prob mode -------------------------------------------------------------------
def test_a_server_without_processed_logprobs_is_refused(tiny):
    model, tokenizer = tiny

    def server(mode):
        fake = FakeVLLMGeneration(model, ACCELERATOR, tokenizer, mode="server")
        info = {"model_config": {"logprobs_mode": mode}}
        fake.vllm_client = SimpleNamespace(get_server_info=lambda: info)
        return fake

    with pytest.raises(BackendError, match="--logprobs-mode raw_logprobs.*trl vllm-serve"):
        TRLVLLMBackend(server("raw_logprobs"), tokenizer)
    TRLVLLMBackend(server("processed_logprobs"), tokenizer)


# ---- B3: the trainer's log-probs of the truncated distribution --------------------------------------
@pytest.mark.parametrize(("top_k", "top_p"), [(3, 1.0), (0, 0.8), (5, 0.9)])
def test_processed_logps_equal_the_engines_on_identical_weights(tiny, top_k, top_p):
    model, tokenizer = tiny
    fake = FakeVLLMGeneration(
        model, ACCELERATOR, tokenizer, temperature=1.3, top_k=top_k, top_p=top_p, max_completion_length=6
    )
    backend = TRLVLLMBackend(fake, tokenizer)
    backend.sync_weights()
    prompts = _prompts(tokenizer, 3)
    sampling = SamplingConfig(temperature=1.3, top_k=top_k, top_p=top_p, max_new_tokens=6)
    completions = backend.generate(prompts, sampling)
    width = max(len(ids) for ids, _ in completions)
    length = max(len(p) for p in prompts)
    rows, masks, sampled = [], [], []
    for prompt, (ids, lps) in zip(prompts, completions, strict=True):
        pad = width - len(ids)
        rows.append([0] * (length - len(prompt)) + prompt + ids + [0] * pad)
        masks.append([0] * (length - len(prompt)) + [1] * (len(prompt) + len(ids)) + [0] * pad)
        sampled.append(lps + [0.0] * pad)
    mask = torch.tensor(masks)
    train = processed_logps(model, torch.tensor(rows), mask, width, 1.3, top_k, top_p)
    completion_mask = mask[:, -width:]
    corrected = ~torch.isnan(train) & completion_mask.bool()  # NaN: a near-tie decides the kept set
    assert corrected.any()
    log_ratio = torch.nan_to_num((train - torch.tensor(sampled)) * completion_mask, nan=0.0).sum(-1)
    assert torch.allclose(log_ratio.exp(), torch.ones(3), atol=1e-3)  # sequence ratio ~1
    # the plain log_softmax (what the trainer used) is far off: kept mass < 1 on every token
    plain = torch.log_softmax(
        model(torch.tensor(rows), attention_mask=mask).logits[:, -width - 1 : -1].float() / 1.3, -1
    )
    plain = plain.gather(-1, torch.tensor(rows)[:, -width:, None]).squeeze(-1)
    assert ((plain - torch.tensor(sampled)) * completion_mask).sum(-1).max() < -1e-3


@pytest.mark.parametrize(("top_k", "top_p"), [(3, 1.0), (5, 0.9)])
def test_a_bf16_engine_never_zeroes_a_row_of_the_fp32_trainer(tiny, top_k, top_p):
    """vLLM's bf16 weights and the trainer's fp32 master weights under bf16 autocast tie or swap the
    logits at the edge of the top-k / top-p set: a token the engine sampled may lie outside the
    trainer's set, whose log-prob of -inf gave the whole row an importance ratio of 0 (2 of 6 rows
    here). Such tokens, and those whose kept set is a near-tie, carry no correction: no row is 0 or
    inf, and the correction of the others is unbiased (its mean over tokens within 1e-2 of 1)."""
    from agentrl.agents.backends.trl_vllm import importance_ratio

    model, tokenizer = tiny
    fake = FakeVLLMGeneration(
        model, ACCELERATOR, tokenizer, temperature=1.5, top_k=top_k, top_p=top_p, max_completion_length=64
    )
    fake.engine = fake.engine.to(torch.bfloat16)  # the engine's weights, as vLLM loads them
    prompts = _prompts(tokenizer, 6)
    _, completions, logprobs, _ = fake.generate(prompts, None, 1)
    width, length = max(len(c) for c in completions), max(len(p) for p in prompts)
    rows, masks, sampled = [], [], []
    for prompt, ids, lps in zip(prompts, completions, logprobs, strict=True):
        pad, left = width - len(ids), length - len(prompt)
        rows.append([0] * left + prompt + ids + [0] * pad)
        masks.append([0] * left + [1] * (len(prompt) + len(ids)) + [0] * pad)
        sampled.append([lp[0] for lp in lps] + [0.0] * pad)
    mask = torch.tensor(masks)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer's bf16-mixed forward
        train = processed_logps(model, torch.tensor(rows), mask, width, 1.5, top_k, top_p, rows_per_pass=4)
    completion_mask, sampled = mask[:, -width:], torch.tensor(sampled)
    ratio = importance_ratio(train, sampled, completion_mask)  # TRL's default: sequence_mask, cap 3
    assert torch.isfinite(ratio).all() and (ratio > 0).all(), ratio.flatten().tolist()
    per_token = torch.exp(torch.nan_to_num(train - sampled, nan=0.0))[completion_mask.bool()]
    assert float(per_token.mean()) == pytest.approx(1.0, abs=1e-2)
    assert not torch.isinf(train[completion_mask.bool()]).any()


def test_the_processed_log_probs_follow_the_token_budget(tiny):
    """N5: the importance ratio's no-grad forward builds full-vocabulary fp32 logits (and the warpers'
    copies) for every completion token of its rows: it runs in passes of `algo.max_batch_tokens` LM-head
    positions like the update's other forwards (a fixed 8 rows per pass was 5-8 GB at Qwen 3B with
    256-token completions), with the values of one pass."""
    from agentrl.trainers.grpo_trainer import MultiStepTrainer
    from agentrl.trainers.packing import pack_samples
    from agentrl.types import StepSample

    model, tokenizer = tiny
    samples = [StepSample(list(range(10, 20 + k)), list(range(30, 36)), None, 1.0, k, 0) for k in range(6)]
    batch = pack_samples(samples, tokenizer.pad_token_id, "cpu")
    trainer = object.__new__(MultiStepTrainer)
    trainer.model, trainer.temperature, trainer.rollout_top_k, trainer.rollout_top_p = model, 1.3, 3, 1.0
    trainer.compute_loss_context_manager = contextlib.nullcontext
    trainer.budget_completions_only = True
    rows: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda m, a, k: rows.append(k["input_ids"].size(0)), with_kwargs=True
    )
    try:
        trainer.max_batch_tokens = None
        whole = trainer._processed_logps(batch)
        trainer.max_batch_tokens = 12  # two rows of 6 completion tokens a pass
        split = trainer._processed_logps(batch)
    finally:
        hook.remove()
    assert rows == [6, 2, 2, 2]
    assert torch.allclose(split, whole, equal_nan=True, atol=1e-6)


def test_the_kept_sets_edge_is_where_a_near_tie_decides_it():
    """Top-k: the k-th and (k+1)-th logits within a few bf16 steps of each other; top-p: a cumulative
    probability of the kept tokens within as much of top_p. Elsewhere the set is the same on both sides."""
    from agentrl.trainers.logps import kept_set_edge

    logits = torch.tensor([[20.0, 18.0, 16.0, 15.875, 10.0], [20.0, 18.0, 16.0, 12.0, 10.0]])
    assert kept_set_edge(logits, top_k=3).tolist() == [True, False]
    assert kept_set_edge(logits, top_k=4).tolist() == [False, False]
    two = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.45, 0.35, 0.2]]))
    # the first two tokens hold 0.8: a top_p of 0.8 is decided by rounding, 0.9 is not
    assert kept_set_edge(two, top_p=0.8).tolist() == [True, True]
    assert kept_set_edge(two, top_p=0.9).tolist() == [False, False]
    assert not kept_set_edge(logits).any()  # no truncation, no edge


# ---- C2: the CUDA log-prob path ---------------------------------------------------------------------------
def test_cuda_keeps_trls_fused_lm_head(monkeypatch):
    from unittest.mock import MagicMock

    from trl import GRPOTrainer

    from agentrl.trainers import trainer_logps
    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    calls: list[str] = []
    monkeypatch.setattr(
        GRPOTrainer,
        "_get_per_token_logps_and_entropies",
        lambda self, *a, **k: calls.append("trl") or (0, 0, 0),
    )
    kernel = lambda *a, **k: calls.append("kernel") or (torch.zeros(1, 1), None)  # noqa: E731
    monkeypatch.setattr(trainer_logps, "shared_prefix_logps", kernel)
    trainer = object.__new__(MultiStepTrainer)
    trainer.accelerator = SimpleNamespace(num_processes=1)
    trainer.shared_prefix, trainer.trl_logprobs, trainer.temperature = (
        True,
        False,
        1.0,
    )  # algo.shared_prefix on
    for device in ("cuda", "xpu"):
        ids = MagicMock()
        ids.device.type = device
        calls.clear()
        trainer._token_logps(None, ids, ids, 1, None, False, False)
        assert calls == ["trl"], device
    calls.clear()
    trainer._token_logps(None, torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2), 1, None, False, False)
    assert calls == ["kernel"]
    assert kernel_applies("cpu", 1) and not kernel_applies("cpu", 2) and not kernel_applies("cuda", 1)


# ---- A6: ZeRO-3 adapters in the base's dtype ------------------------------------------------------------
def test_zero3_lora_adapters_keep_the_base_dtype(tiny, monkeypatch):
    import transformers.integrations.deepspeed as ds

    base = copy.deepcopy(tiny[0]).to(torch.bfloat16)
    lora = model_config({"name": "t", "name_or_path": "builtin:tiny-random", "lora": {"r": 4}}).lora
    default = apply_lora(copy.deepcopy(base), lora)
    assert {p.dtype for n, p in default.named_parameters() if "lora_" in n} == {
        torch.float32
    }  # PEFT's upcast
    monkeypatch.setattr(ds, "is_deepspeed_zero3_enabled", lambda: True)
    zero3 = apply_lora(copy.deepcopy(base), lora)
    # one dtype across the persistent parameters ZeRO-3 gathers together (DeepSpeed #8072)
    assert {p.dtype for p in zero3.parameters()} == {torch.bfloat16}


def test_tensor_parallel_colocate_is_refused_before_the_run_starts():
    from agentrl.runs.launch import check_job

    base = ["task=train", "algo=msgrpo", "env=frozenlake", "model=tiny-random", "model.backend=vllm"]
    with pytest.raises(ConfigError, match="model.vllm.tensor_parallel_size=2"):
        check_job([*base, "+model.vllm.tensor_parallel_size=2"])
    from agentrl.runs.checks import cuda_available, installed

    if installed("vllm") and cuda_available():
        check_job(base)
    else:  # the settings pass; this machine's missing vllm or GPU is what stops it, in one line
        with pytest.raises(BackendError, match="model.backend=vllm needs"):
            check_job(base)


def test_colocate_memory_is_measured_on_the_trainers_gpu(tiny, monkeypatch):
    """`vllm_rollouts` sizes the engine from this process's GPU (mocked) and models."""
    model, _ = tiny
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cuda", 0), unwrap_model=lambda m: m)
    )
    trainer.model, trainer.ref_model, trainer.actor_critic = model, copy.deepcopy(model), None
    algo = typed(compose_config(["algo=msgrpo"]).algo)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert colocate_memory(trainer, algo, model_config({"name": "t", "name_or_path": "x"})) is None  # no CUDA
    total = {"bytes": 80 * GIB}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=total["bytes"])
    )
    model_cfg = model_config({"name": "t", "name_or_path": "x", "vllm": {"max_model_len": 4096}})
    memory = colocate_memory(trainer, algo, model_cfg)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert memory["training_bytes"] == 5 * weights  # policy x 4 (AdamW) + the fp32 reference
    assert (
        memory["max_model_length"] == 4096
        and memory["max_num_seqs"] == algo.groups_per_iteration * algo.group_size
    )
    share = vllm_generation_kwargs(algo, model_cfg, 8, memory=memory)["gpu_memory_utilization"]
    assert 0 < share < 0.1
    total["bytes"] = 4 * GIB  # the headroom alone is 4 GiB
    with pytest.raises(ConfigError, match="model.vllm.gpu_memory_utilization"):
        vllm_generation_kwargs(algo, model_cfg, 8, memory=colocate_memory(trainer, algo, model_cfg))
