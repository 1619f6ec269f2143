"""benchmarks/cpu_mfu.py: the FLOP counter and a smoke run on the tiny model."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from agentrl.models import load_model

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_mfu.py"


@pytest.fixture(scope="module")
def bench():
    return runpy.run_path(str(SCRIPT))


def test_the_counter_counts_2n_per_token_forward_and_4n_more_backward(bench):
    model, _ = load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")
    config = model.config
    counter = bench["FlopCounter"]()
    counter.attach(model)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    batch, length = 2, 6
    ids = torch.randint(0, 100, (batch, length))
    attention = 4 * batch * length * length * config.hidden_size * config.num_hidden_layers
    counter.phase = "rollout"
    with torch.no_grad():
        model(input_ids=ids)
    assert counter.flops["rollout"] == 2 * batch * length * linear + attention
    assert counter.tokens["rollout"] == batch * length
    counter.phase = "update"
    model(input_ids=ids, attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]))
    assert counter.flops["update"] == 3 * (2 * batch * length * linear + attention)  # + the backward
    assert (counter.tokens["update"], counter.real_tokens["update"]) == (12, 10)  # 2 padding tokens
    # a rollout that keeps its forward's graph (algo.rollout_graph): the forward is the rollout's, its
    # backward the update's
    counter.phase, before = "rollout", dict(counter.flops)
    model(input_ids=ids)
    forward = 2 * batch * length * linear + attention
    assert counter.flops["rollout"] - before["rollout"] == forward
    assert counter.flops["update"] - before["update"] == 2 * forward
    counter.detach()


@pytest.mark.slow  # a training run and the final evaluation (~30 s idle, ~100 s on the loaded machine)
def test_one_frozen_lake_iteration_on_the_tiny_model(tmp_path, monkeypatch):
    out = tmp_path / "mfu"
    argv = [str(SCRIPT), "--presets", "frozenlake_learn", "--threads", "1", "--peak-seconds", "0.02"]
    overrides = ["model=tiny-random", "algo.group_size=2", "algo.groups_per_iteration=2", "algo.max_steps=2"]
    overrides += ["algo.min_informative_groups=0", "algo.max_rollout_rounds=1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), *overrides])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["peak"]["float32"]["peak_gflops"] > 0 and result["peak"]["bfloat16"]["peak_gflops"] > 0
    (row,) = result["presets"]
    assert row["precision"] == "fp32"  # the tiny model stays fp32 under auto
    assert row["rollout"]["gflop"] > 0 and 0 < row["rollout"]["mfu"] < 2
    assert row["update"]["tokens_run"] >= 1  # the tiny model's returns may all tie: a placeholder row
    assert "| frozenlake_learn | fp32 | update |" in out.with_suffix(".md").read_text()


def test_the_counter_counts_system_prompt_tokens_not_taken_from_a_cache(bench):
    model, tokenizer = load_model(
        {"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu"
    )
    counter = bench["FlopCounter"]()
    counter.attach(model, tokenizer)
    system = "<|im_start|>system\nReach the goal.<|im_end|>\n"
    head = tokenizer(system, add_special_tokens=False).input_ids
    rows = [
        head + tokenizer(f"<|im_start|>user\nstep {k}", add_special_tokens=False).input_ids for k in range(3)
    ]
    length = head.index(tokenizer.convert_tokens_to_ids("<|im_end|>")) + 1  # up to its closing tag
    counter.phase = "rollout"
    with torch.no_grad():
        out = model(input_ids=torch.tensor(rows), use_cache=True)
        assert counter.system_tokens["rollout"] == 3 * length and counter.system_length == length
        model(input_ids=torch.tensor([[5], [6], [7]]), past_key_values=out.past_key_values, use_cache=True)
    assert counter.system_tokens["rollout"] == 3 * length  # the cached head does not run again
    counter.detach()
