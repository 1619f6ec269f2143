"""Model options for GPU machines: `model.attn_implementation`, the Qwen2.5 3B/72B configs and the
commands their comments give, and the `vllm` extra's pin (TRL's supported range)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from agentrl.config import compose_config, typed
from agentrl.errors import ConfigError
from agentrl.models import load_model

ROOT = Path(__file__).resolve().parents[1]
MODEL_CONF = ROOT / "agentrl" / "conf" / "model"


# ---- model.attn_implementation ---------------------------------------------------------------------------
def test_attn_implementation_defaults_to_sdpa_in_every_model_option():
    for path in sorted(MODEL_CONF.glob("*.yaml")):
        cfg = compose_config([f"model={path.stem}"])
        assert cfg.model.attn_implementation == "sdpa", path.name


def test_an_unknown_attn_implementation_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError, match="model.attn_implementation=flash: must be one of: sdpa, eager"):
        compose_config(["model.attn_implementation=flash"])


@pytest.mark.parametrize(("attn", "loaded"), [("sdpa", "agentrl_sdpa"), ("eager", "eager")])
def test_attn_implementation_reaches_the_loaded_model(attn, loaded, monkeypatch):
    """The builtin models load through the same from_pretrained call as hub ids and directories; sdpa on
    a CPU is transformers' SDPA with the query heads packed (kernels/attention.py)."""
    from helpers import fast_paths

    fast_paths(monkeypatch)  # packed attention on (tests/test_attention.py switches it off)
    cfg = compose_config(["model=tiny-random", f"model.attn_implementation={attn}"])
    model, _ = load_model(cfg.model, device="cpu")
    assert model.config._attn_implementation == loaded


def _hide_flash_attn(monkeypatch, present: bool) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "flash_attn":
            return importlib.machinery.ModuleSpec("flash_attn", None) if present else None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_flash_attention_without_the_package_names_the_fix_and_the_alternative(monkeypatch):
    _hide_flash_attn(monkeypatch, present=False)
    cfg = compose_config(["model=tiny-random", "model.attn_implementation=flash_attention_2"])
    with pytest.raises(ConfigError) as info:
        load_model(cfg.model, device="cpu")
    message = str(info.value)
    assert "model.attn_implementation=flash_attention_2" in message
    assert "pip install flash-attn" in message
    assert "model.attn_implementation=sdpa" in message
    assert "\n" not in message


def test_flash_attention_on_the_cpu_is_refused_before_loading(monkeypatch):
    _hide_flash_attn(monkeypatch, present=True)
    cfg = compose_config(["model=tiny-random", "model.attn_implementation=flash_attention_2"])
    with pytest.raises(ConfigError, match="needs a CUDA GPU .*use model.attn_implementation=sdpa"):
        load_model(cfg.model, device="cpu")


# ---- the Qwen2.5 3B and 72B configs -----------------------------------------------------------------------
def test_qwen_72b_trains_lora_r16_without_a_device_map():
    model = typed(compose_config(["model=qwen2.5-72b"]).model)
    assert model.lora.r == 16
    assert model.device_map is None  # accelerate refuses a device_map in distributed training
    assert model.attn_implementation == "sdpa"


def test_qwen_3b_is_full_fine_tuning_on_one_gpu():
    model = typed(compose_config(["model=qwen2.5-3b"]).model)
    assert model.lora.r == 0 and model.device_map is None
    cfg = compose_config(
        ["task=train", "algo=msgrpo", "model=qwen2.5-3b", "algo.gradient_checkpointing=true"]
    )
    assert cfg.algo.gradient_checkpointing is True


def _commands(path: Path) -> list[list[str]]:
    """The `agentrl train|eval ...` commands in a YAML file's comments (a trailing `\\` continues a line;
    a `# ...` after the command is a remark), as compose_config overrides."""
    lines, joined = [], ""
    for line in path.read_text().splitlines():
        text = line.lstrip("#").strip() if line.startswith("#") else ""
        if joined:
            joined += " " + text
        elif text.startswith("agentrl "):
            joined = text
        else:
            continue
        if joined.endswith("\\"):
            joined = joined[:-1].rstrip()
            continue
        lines.append(re.split(r"\s+#", joined)[0])
        joined = ""
    commands = []
    for text in lines:
        words = shlex.split(text.replace("<run>", "run"))
        assert words[1] in ("train", "eval"), text
        commands.append([f"task={words[1]}", *words[2:]])
    return commands


@pytest.mark.parametrize("option", ["qwen2.5-3b", "qwen2.5-72b"])
def test_the_commands_in_the_config_comments_compose(option):
    commands = _commands(MODEL_CONF / f"{option}.yaml")
    assert commands
    for overrides in commands:
        compose_config(overrides)  # a wrong key or option raises ConfigError
    text = (MODEL_CONF / f"{option}.yaml").read_text()
    if option == "qwen2.5-72b":
        assert [
            "task=train",
            "model=qwen2.5-72b",
            "distributed=zero3",
            "distributed.num_processes=8",
        ] == commands[0][:4]
        assert "vllm serve Qwen/Qwen2.5-72B-Instruct --tensor-parallel-size 8" in text
        assert any("model=openai" in c and "model.name=Qwen/Qwen2.5-72B-Instruct" in c for c in commands)
    else:
        assert "algo.gradient_checkpointing=true" in text


# ---- the vllm extra ---------------------------------------------------------------------------------------
def test_the_vllm_extra_pins_the_range_trl_supports():
    """pyproject's `vllm` extra = the range installed TRL declares for its own vllm extra (trl 1.16:
    >=0.22.0,<=0.31.0; trl/import_utils.py is_vllm_available warns outside it)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ours = [Requirement(r) for r in extras["vllm"] if Requirement(r).name == "vllm"]
    assert len(ours) == 1
    trl = [
        Requirement(r)
        for r in importlib.metadata.requires("trl") or []
        if r.startswith("vllm") and 'extra == "vllm"' in r
    ]
    assert trl, "installed trl declares no vllm extra"
    assert ours[0].specifier == trl[0].specifier
    assert str(ours[0].specifier) and "0.22.0" in str(ours[0].specifier)
