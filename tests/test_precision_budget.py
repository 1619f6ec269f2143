"""`algo.max_batch_tokens=auto` (the default): the per-pass budget of LM-head positions comes from the free
memory and the vocabulary, so that one pass's fp32 logits and their gradients fit; numbers and null work
as before."""

from __future__ import annotations

import logging

import pytest
import torch

import agentrl.trainers.settings as settings
from agentrl.config import compose_config
from agentrl.errors import ConfigError
from agentrl.trainers.grpo_trainer import MultiStepTrainer
from agentrl.trainers.packing import pack_samples, split_by_tokens
from agentrl.trainers.settings import auto_token_budget, resolve_max_batch_tokens
from agentrl.types import StepSample


class _Model:
    class config:  # noqa: N801 - stands in for a transformers config
        @staticmethod
        def get_text_config():
            return type("Text", (), {"vocab_size": 49152})


def test_the_budget_fills_a_fifth_of_free_memory_with_logits_and_their_gradients():
    free = 20 * 2**30
    budget = auto_token_budget(free, 49152)
    per_position = settings.LOGIT_COPIES * 4 * 49152  # bytes: fp32 logits, log-softmax, both grads, exp
    assert budget == int(free * 0.2) // per_position == 4369
    assert budget * per_position <= 0.2 * free < (budget + 1) * per_position
    assert auto_token_budget(free, 2 * 49152) == budget // 2  # twice the vocabulary, half the positions
    assert auto_token_budget(10, 49152) == 1  # never 0: a row still runs, alone


def test_auto_reads_the_free_memory_and_logs_the_choice(monkeypatch, caplog):
    monkeypatch.setattr(settings, "free_memory_bytes", lambda device: 10 * 2**30)
    with caplog.at_level(logging.INFO, logger=settings.log.name):
        assert resolve_max_batch_tokens("auto", _Model(), "cpu") == auto_token_budget(10 * 2**30, 49152)
    assert "max_batch_tokens=auto: 2184 LM-head positions per pass (10.0 GiB free" in caplog.text
    assert resolve_max_batch_tokens(None, _Model(), "cpu") is None
    assert resolve_max_batch_tokens(4096, _Model(), "cpu") == 4096
    assert settings.free_memory_bytes("cpu") > 0


def test_the_auto_budget_counts_lm_head_positions_not_prompts():
    """Long prompts with one-token answers (Frozen Lake) stay one pass: the shared-prefix kernel runs each
    distinct prompt once and scores only completion positions; long completions are split."""
    samples = [StepSample([1] * 300, [2] * c, None, 1.0, k, 0) for k, c in enumerate([1, 1, 1, 8, 8, 8])]
    batch = pack_samples(samples, pad_id=0, device="cpu")
    batch["num_items_in_batch"] = torch.tensor(27.0)
    assert len(split_by_tokens(batch, budget=24, completions_only=True)) == 2  # 3 x 1 + ..., 3 x 8
    assert len(split_by_tokens(batch, budget=24)) == 6  # padded tokens: a row a pass


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("null", None), ("4096", 4096)])
def test_the_setting_takes_auto_null_or_a_number(value, expected):
    cfg = compose_config(["task=train", "algo=rlft", f"algo.max_batch_tokens={value}"])
    assert cfg.algo.max_batch_tokens == expected


def test_auto_is_the_default_and_other_values_are_refused():
    for algo in ("msgrpo", "poad", "rlft", "twosome", "ntpo"):
        assert compose_config(["task=train", f"algo={algo}"]).algo.max_batch_tokens == "auto"
    for bad in ("lots", "0", "true"):
        with pytest.raises(ConfigError, match="max_batch_tokens.*expected auto, null or an integer >= 1"):
            compose_config(["task=train", "algo=msgrpo", f"algo.max_batch_tokens={bad}"])


@pytest.mark.slow  # two RLFT iterations of the tiny model with rationales: ~10 minutes on a loaded machine
@pytest.mark.timeout(3600)
def test_the_rlft_command_without_a_budget_stays_under_6_gb(tmp_path):
    """Issue 23's command, which swung between 7 and 17 GB RSS without a token budget: peak RSS of the
    training process (evaluation cut to one episode, after training only; 10 bandit steps instead of 50:
    the budget bounds each pass whatever the horizon; the issue measured 586 s for one 50-step iteration)."""
    import os
    import resource
    import subprocess
    import sys

    command = [
        sys.executable, "-m", "agentrl.cli", "train", "algo=rlft", "env=bandit", "model=tiny-random",
        "agent.cot=true", "algo.iterations=2", "algo.eval_before=false", "eval.episodes=1", "env.horizon=10",
        f"hydra.run.dir={tmp_path / 'run'}", "algo.torch_threads=1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_NO_PROGRESS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"peak RSS {peak_gib:.2f} GiB")
    assert peak_gib < 6, peak_gib


def test_the_no_grad_log_prob_passes_follow_the_budget():
    """The old, reference and importance-ratio log-probs run over whole micro-batches: as many rows per
    forward as the budget allows (RLFT's reference pass over 100 rows of 256-token rationales held 5 GB
    of fp32 logits and drove issue 23's command to 15 GiB RSS)."""
    from types import SimpleNamespace

    batch = {"prompt_ids": torch.zeros(100, 400), "completion_ids": torch.zeros(100, 256)}
    rows = MultiStepTrainer._rows_per_pass
    assert rows(SimpleNamespace(max_batch_tokens=4096, budget_completions_only=True), batch) == 16
    assert rows(SimpleNamespace(max_batch_tokens=4096, budget_completions_only=False), batch) == 6
    assert rows(SimpleNamespace(max_batch_tokens=10, budget_completions_only=True), batch) == 1
    assert rows(SimpleNamespace(max_batch_tokens=None, budget_completions_only=False), batch) is None


def test_the_auto_prompt_budget_cuts_passes_of_distinct_prompts_not_shared_ones():
    """Rows that share their prompt (a fixed map) stay one pass; rows whose prompts all differ (random
    maps) are cut so that each pass runs at most the budget's distinct prompt and completion tokens."""
    shared = [StepSample([1] * 300, [2, 3], None, 1.0, k, 0) for k in range(8)]
    distinct = [StepSample([1] * 299 + [10 + k], [2, 3], None, 1.0, k, 0) for k in range(8)]
    for samples, passes in ((shared, 1), (distinct, 4)):
        batch = pack_samples(samples, pad_id=0, device="cpu")
        batch["num_items_in_batch"] = torch.tensor(16.0)
        parts = split_by_tokens(batch, budget=10_000, completions_only=True, prompt_budget=700)
        assert len(parts) == passes
        assert sum(len(p["prompt_ids"]) for p in parts) == 8
        for part in parts:  # 2 distinct prompts (600) + 4 completion tokens a pass
            run = {tuple(r.tolist()) for r in part["prompt_ids"]}
            assert len(run) * 300 + 2 * len(part["prompt_ids"]) <= 700
    # a row over the budget on its own still runs, alone
    batch = pack_samples(distinct[:2], pad_id=0, device="cpu")
    assert len(split_by_tokens(batch, budget=10_000, completions_only=True, prompt_budget=10)) == 2


def test_the_auto_prompt_budget_fills_a_share_of_free_memory_with_activations(monkeypatch, caplog):
    Model = _smollm2_shaped  # noqa: N806 - a stand-in class

    per_token = settings.activation_bytes_per_token(Model())
    assert per_token == 30 * (4 * 576 + 2 * 1536) * 4  # ~0.65 MB: SmolLM2-135M measured ~0.7 MB
    monkeypatch.setattr(settings, "free_memory_bytes", lambda device: 10 * 2**30)
    with caplog.at_level(logging.INFO, logger=settings.log.name):
        budget = settings.auto_prompt_budget(Model(), "cpu")
    assert budget == int(10 * 2**30 * settings.AUTO_ACTIVATION_FRACTION) // per_token == 4993
    assert "at most 4993 distinct prompt and completion tokens per pass" in caplog.text


def test_gradient_checkpointing_lets_the_auto_budget_hold_more_tokens(monkeypatch, caplog):
    """With checkpointing a layer keeps only its input for the backward, which recomputes one layer at a
    time: a token costs a hidden vector a layer plus one layer's activations, so a pass holds ~10x the
    tokens of a 3B model (the budget otherwise cuts a checkpointed run into passes it does not need)."""

    class Qwen3B:
        class config:  # noqa: N801 - a stand-in for a PretrainedConfig
            hidden_size, intermediate_size, num_hidden_layers = 2048, 11008, 36
            num_attention_heads, num_key_value_heads = 16, 2

            @classmethod
            def get_text_config(cls):
                return cls

    plain = settings.activation_bytes_per_token(Qwen3B())
    checkpointed = settings.activation_bytes_per_token(Qwen3B(), checkpointing=True)
    assert plain == 36 * (4 * 2048 + 2 * 11008) * 4  # 4.35 MB
    assert checkpointed == 36 * 2048 * 4 + (4 * 2048 + 2 * 11008) * 4  # 0.42 MB
    assert 10 < plain / checkpointed < 11
    monkeypatch.setattr(settings, "free_memory_bytes", lambda device: 100 * 2**30)
    with caplog.at_level(logging.INFO, logger=settings.log.name):
        budget = settings.auto_prompt_budget(Qwen3B(), "cuda", kernel=False, checkpointing=True)
    padded = int(checkpointed * settings.PADDED_ACTIVATION_SCALE)  # TRL's pass per row, as measured
    assert budget == int(100 * 2**30 * settings.AUTO_ACTIVATION_FRACTION) // padded
    assert budget > 10 * settings.auto_prompt_budget(Qwen3B(), "cuda", kernel=False)
    assert "a token with gradient checkpointing" in caplog.text
    # a row's copy of its prompt's KV cache is made outside the checkpointed layers and counts in full:
    # against the smaller token it weighs more
    assert settings.gather_fraction(Qwen3B(), True) > 10 * settings.gather_fraction(Qwen3B())


def test_the_auto_prompt_budget_counts_each_rows_copy_of_its_prompt():
    """Rows with multi-token answers (each TWOSOME candidate too) attend over their own copy of the
    prompt's KV cache, which attention keeps for the backward: 20 kitchen rows of 10 candidates took a
    process to 12 GB. Those copies count at `gather_fraction` of a token; one-token rows have none."""
    from agentrl.trainers.packing import action_rows

    def rows(completion: list[int], candidates: int) -> dict:
        samples = [
            StepSample([1] * 99 + [10 + k], completion, None, 1.0, k, 0, candidates=[completion] * candidates)
            for k in range(4)
        ]
        batch = pack_samples(samples, pad_id=0, device="cpu")
        batch.update(action_rows(samples, "cpu"))
        batch["num_items_in_batch"] = torch.tensor(4.0)
        return batch

    def passes(batch: dict, fraction: float) -> int:
        return len(split_by_tokens(batch, 10**6, True, prompt_budget=900, gather_fraction=fraction))

    scored = rows([2, 3, 4], 10)  # each row: 100 prompt + 30 candidate tokens + 0.3 x 100 x 10 copied
    assert passes(scored, 0.0) == 1  # 4 x 130 = 520 <= 900
    assert passes(scored, 0.3) == 2  # 2 x 430 a pass
    one_token = rows([2], 1)  # the answer's distribution comes from the prompt's last position: no copy
    assert passes(one_token, 0.3) == 1


def test_gather_fraction_from_the_attention_shapes():
    Model = _smollm2_shaped  # noqa: N806 - a stand-in class

    expected = 30 * 2 * (9 + 3) * 64 * 4 / (30 * (4 * 576 + 2 * 1536) * 4)
    assert settings.gather_fraction(Model()) == pytest.approx(expected) == pytest.approx(0.2857, abs=1e-4)


def test_memory_share_divides_the_free_memory_auto_plans_for(monkeypatch, caplog):
    """Runs side by side (benchmarks/poad_vs_ntpo.py: three at once) each see the whole machine free at
    their start; `algo.memory_share=1/N` makes each plan for its part."""

    Model = _smollm2_shaped  # noqa: N806 - a stand-in class

    monkeypatch.setattr(settings, "free_memory_bytes", lambda device: 12 * 2**30)
    whole = settings.auto_prompt_budget(Model(), "cpu")
    with caplog.at_level(logging.INFO, logger=settings.log.name):
        third = settings.auto_prompt_budget(Model(), "cpu", share=1 / 3)
        heads = resolve_max_batch_tokens("auto", Model(), "cpu", 1 / 3)
    assert third == pytest.approx(whole / 3, abs=1)
    assert heads == pytest.approx(resolve_max_batch_tokens("auto", Model(), "cpu") / 3, abs=1)
    assert "4.0 GiB free in this run's share, algo.memory_share=0.333333" in caplog.text
    assert resolve_max_batch_tokens(4096, Model(), "cpu", 0.5) == 4096  # a number is as given
    with pytest.raises(ConfigError, match="memory_share"):
        compose_config(["algo=msgrpo", "algo.memory_share=0"])


class _smollm2_shaped:  # noqa: N801 - a model whose config has SmolLM2-135M's shapes
    class config:  # noqa: N801 - stands in for a transformers config
        @staticmethod
        def get_text_config():
            return type(
                "Text",
                (),
                {
                    "hidden_size": 576,
                    "intermediate_size": 1536,
                    "num_hidden_layers": 30,
                    "num_attention_heads": 9,
                    "num_key_value_heads": 3,
                    "vocab_size": 49152,
                },
            )
