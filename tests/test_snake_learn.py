"""Snake training that a CPU can run: the token budget bounds an update's memory at the default
`env=snake algo=msgrpo` config, and the tuned preset `experiment=snake_learn` composes, dry-runs and
trains one iteration with the tiny test model.

The memory check runs one MS-GRPO update on real Snake prompts (~505 tokens each, every row a different
board, as in Snake training) in a fresh subprocess, so the process's peak resident set
(`ru_maxrss`) measures that update alone: its growth over the resident set just before the update."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import compose_config

runner = CliRunner()
ROWS = 160  # rows of one iteration (the default config's 2 x 16 episodes pass this within ~5 moves each)
BUDGET = 2048  # tokens per forward/backward: ~4 Snake rows
MOVES = ("up", "down", "left", "right")


def snake_update_growth(budget: int | None, tmp: Path, rows_n: int = ROWS) -> dict[str, Any]:
    """One update on `rows_n` Snake rows at the default config, in this process: resident-set growth (MB)
    from just before `trainer.train()` to the process's peak."""
    import resource

    import numpy as np
    import psutil
    import torch
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from agentrl.agents.llm import build_llm_agent
    from agentrl.config import typed
    from agentrl.envs import env_factory
    from agentrl.models import load_model
    from agentrl.trainers.grpo_trainer import MultiStepTrainer
    from agentrl.trainers.settings import grpo_config
    from agentrl.types import StepContext, StepSample

    torch.set_num_threads(1)
    overrides = ["task=train", "env=snake", "algo=msgrpo", "model=tiny-random", "algo.iterations=1"]
    if budget:
        overrides.append(f"algo.max_batch_tokens={budget}")
    cfg = compose_config(overrides)
    algo = typed(cfg.algo)
    torch.manual_seed(0)
    model, tokenizer = load_model(cfg.model, device="cpu", for_training=True)  # the process's RSS is measured
    agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    prefill = agent.interface.prefill
    make_env = env_factory(cfg.env)
    answers = [tokenizer(f"{prefill} {m}", add_special_tokens=False).input_ids[-1] for m in MOVES]
    rows = []
    for k in range(rows_n):
        env = make_env()
        obs, info = env.reset(seed=k)
        ctx = StepContext(env, obs, info, [], np.random.default_rng(0), 0)
        text = agent.interface.render(agent.interface.messages(ctx), tokenizer)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        rows.append(StepSample(ids, [answers[k % 4]], None, 1.0 if k % 2 else -1.0, k, 0))
    args = grpo_config(algo, tmp, "cpu", 0, "fp32")
    trainer = MultiStepTrainer(
        model=model,
        reward_funcs=[lambda **kw: [0.0]],
        args=args,
        processing_class=tokenizer,
        collect=lambda iteration: (list(rows), {}),
        shared_prefix=algo.shared_prefix,
        max_batch_tokens=algo.max_batch_tokens,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    before = psutil.Process().memory_info().rss
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "growth_mb": max(peak - before, 0) / 2**20,
        "prompt_tokens": sum(len(r.prompt_ids) for r in rows) / len(rows),
        "accumulation": algo.gradient_accumulation_steps,
    }


def _measure(budget: int | None, tmp: Path, rows_n: int = ROWS) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, str(budget or 0), str(tmp), str(rows_n)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "AGENTRL_NO_PROGRESS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # three model processes (~80 s); its RSS figures vary with what the machine runs
def test_token_budget_bounds_a_snake_update_s_memory(tmp_path):
    # measured: no budget 258 MB (160 rows) -> 467 MB (320 rows); budget 2048: 162 MB -> 164 MB
    unbounded = _measure(None, tmp_path / "none", 2 * ROWS)
    bounded = _measure(BUDGET, tmp_path / "budget", ROWS)
    bounded_twice = _measure(BUDGET, tmp_path / "budget2", 2 * ROWS)
    assert bounded["prompt_tokens"] > 400  # real Snake prompts
    # under the budget the update's memory does not grow with the rows of the iteration ...
    assert bounded_twice["growth_mb"] - bounded["growth_mb"] < 40, (bounded, bounded_twice)
    # ... while 80 rows per micro-batch (default accumulation 4) without it hold far more
    assert bounded_twice["growth_mb"] < 0.5 * unbounded["growth_mb"], (bounded_twice, unbounded)
    assert bounded_twice["growth_mb"] < 250, bounded_twice


def test_snake_learn_composes_with_its_settings():
    cfg = compose_config(["task=train", "experiment=snake_learn"])
    assert cfg.env.name == "snake" and cfg.env.max_steps == 100  # evaluation: the full game
    assert cfg.algo.name == "msgrpo" and cfg.algo.max_steps == 8  # training: 8-move episodes
    assert cfg.agent.prefill == "The snake moves" and cfg.agent.sampling.max_new_tokens == 1
    assert cfg.algo.max_batch_tokens and cfg.algo.top_k == 0 and cfg.eval.episodes >= 50
    assert not cfg.algo.rollout_graph  # the update keeps a sixth of the rollout's prompts


def test_snake_moves_are_one_token_after_the_preset_s_prefill():
    from agentrl.agents.llm import single_token_after
    from agentrl.models import load_model

    _, tokenizer = load_model(compose_config(["model=tiny-random"]).model)  # SmolLM2's tokenizer
    assert all(single_token_after(tokenizer, "The snake moves", m) for m in MOVES)


def test_snake_learn_dry_runs_with_the_tiny_model(tmp_path):
    result = runner.invoke(app, ["train", "experiment=snake_learn", "model=tiny-random", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run: agentrl train" in result.output and "snake" in result.output
    assert not (tmp_path / "outputs").exists()


def test_snake_learn_trains_one_iteration_with_the_tiny_model(run_dir):
    result = runner.invoke(
        app,
        [
            "train",
            "experiment=snake_learn",
            "model=tiny-random",
            "algo.iterations=1",
            "algo.torch_threads=1",
            "algo.eval_before=false",
            "algo.save_final=false",
            "eval.episodes=2",
            f"hydra.run.dir={run_dir}",
        ],
    )
    assert result.exit_code == 0, result.output
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert row["train/episodes"] >= 32 and row["train/mean_length"] <= 8  # 8-move training episodes
    assert json.loads((run_dir / "eval.json").read_text())["episodes"] == 2


def test_the_benchmarks_trained_model_is_a_run_the_transfer_presets_evaluate(tmp_path):
    """benchmarks/learn_snake.py writes the run's .hydra/ beside its trained model: `agentrl eval
    experiment=transfer_snake_to_frozenlake from_run=<out>/llm` plays that model with its own prefill."""
    from agentrl.runs.trained import trained_model

    bench = _learn_snake_module()
    overrides = ["task=train", "algo=msgrpo", "experiment=snake_learn", "model=tiny-random", "seed=0"]
    llm = tmp_path / "llm"
    bench.save_run_config(llm, compose_config(overrides), overrides)
    (llm / "final").mkdir()
    (llm / "final" / "config.json").write_text("{}")  # a dry run never loads the weights
    assert trained_model(llm).path == llm / "final"
    args = ["eval", "experiment=transfer_snake_to_frozenlake", f"from_run={llm}", "--dry-run"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "frozenlake" in result.output and "prefill='The snake moves'" in result.output


def _learn_snake_module():
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "learn_snake.py"
    spec = importlib.util.spec_from_file_location("learn_snake", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_snake_target_needs_two_standard_errors_over_random_and_always_up():
    bench = _learn_snake_module()

    def agent(mean, stderr):
        return {"mean_return": mean, "return_stderr": stderr}

    rnd, up = agent(-1.06, 0.052), agent(-0.985, 0.034)
    # beats random by more than its stderr but is "always up": the old rule's letter, not the target
    ok, text = bench.verdict({"llm_after": agent(-0.985, 0.034), "random": rnd, "always_up": up})
    assert ok is False and "NOT MET" in text
    # 2 SE of the difference to always-up is 2 * hypot(0.05, 0.034) = 0.121
    ok, _ = bench.verdict({"llm_after": agent(-0.87, 0.05), "random": rnd, "always_up": up})
    assert ok is False
    ok, text = bench.verdict({"llm_after": agent(-0.85, 0.05), "random": rnd, "always_up": up})
    assert ok is True and text.startswith("MET")
    assert bench.verdict({"random": rnd})[0] is None


def test_snake_summary_preset_keeps_the_game_and_changes_the_observation():
    summary = compose_config(["task=train", "experiment=snake_summary"])
    board = compose_config(["task=train", "experiment=snake_learn"])
    assert summary.env.view == "summary" and board.env.view == "board"
    for key in ("size", "opponent", "max_steps", "step_penalty", "apples", "poison_apples"):
        assert summary.env[key] == board.env[key], key
    assert summary.eval.episodes == board.eval.episodes == 50
    assert summary.agent.prefill == board.agent.prefill == "The snake moves"
    assert summary.agent.invalid_rule == "random"


if __name__ == "__main__":  # the subprocess of _measure
    budget_arg, tmp_arg, rows_arg = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(snake_update_growth(budget_arg or None, tmp_arg, rows_arg)))
