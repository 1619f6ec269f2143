"""benchmarks/learn_from_bc.py and benchmarks/kept_runs.py: the baselines play the presets' own held-out
instances and are asked in their format, the targets' verdicts, and kept runs that `agentrl report --table
learning` reads back."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import compose_config

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import kept_runs  # noqa: E402
import learn_from_bc as bench  # noqa: E402


def test_the_baselines_play_the_presets_task_and_are_asked_in_its_format():
    env = bench.preset_block("frozenlake_maps", "env")
    assert env == [
        "env.map=random",
        "env.size=4",
        "env.p=0.8",
        "env.slippery=false",
        "env.max_steps=null",
        "env.view=board",
    ]
    agent = bench.preset_block("frozenlake_maps", "agent")
    assert agent == ["agent.prefill=''", "agent.sampling.max_new_tokens=8"]
    trained = compose_config(["task=train", "experiment=frozenlake_maps"])
    for extra in (["agent=random"], agent):
        baseline = compose_config(["task=eval", *extra, *env, "eval.episodes=100"])
        assert baseline.env == trained.env and baseline.eval == trained.eval
    base = compose_config(["task=eval", *env, *agent])
    assert (base.agent.prefill, base.agent.sampling.max_new_tokens) == ("", 8)
    bc = compose_config(["task=train", "experiment=frozenlake_maps_bc"])
    assert bc.env == trained.env and bc.agent.prefill == "" and bc.algo.demonstrations == "planner"


@pytest.mark.parametrize("preset", sorted(bench.PRESETS))
def test_every_step_plays_the_same_held_out_instances(preset, tmp_path):
    args = argparse.Namespace(preset=preset, seed=2, episodes=None)
    steps = bench.commands(args, tmp_path, ["algo.iterations=3"])
    composed = {
        name: compose_config([f"task={argv[0]}", *argv[1:]])
        for name, argv in steps.items()
        if "init_from" not in " ".join(argv)  # the RL steps need the BC run on disk to compose
    }
    episodes = f"eval.episodes={bench.PRESETS[preset][1]}"
    trained = compose_config(["task=train", f"experiment={preset}", "seed=2", episodes])
    for name, cfg in composed.items():
        assert cfg.env == trained.env and cfg.eval == trained.eval and cfg.seed == 2, name
    base, bc = composed["base"], composed["bc"]
    for key in ("prefill", "cot", "invalid_rule", "invalid_penalty"):
        assert base.agent[key] == bc.agent[key] == trained.agent[key], key
    assert base.agent.sampling.max_new_tokens == trained.agent.sampling.max_new_tokens
    assert bc.algo.demonstrations == "planner" and composed["dqn"].algo.name == "dqn"
    assert steps["rl"][-1] == "algo.iterations=3" and steps["uniform"][-1] == "algo.aaw.enabled=false"


def _evaluated(run: Path, data: dict) -> None:
    run.mkdir(parents=True)
    (run / "eval.json").write_text(json.dumps(data))


def test_the_verdict_needs_success_untagged_and_the_paired_gain(tmp_path):
    seeds = [1, 2, 3, 4, 5]
    before = {"success_rate": 0.4, "per_episode": {"seed": seeds, "success": [1, 1, 0, 0, 0]}}

    def trained(success: list[int], untagged: float = 0.0) -> dict:
        return {
            "success_rate": sum(success) / 5,
            "untagged_rate": untagged,
            "iterations": 3,
            "train_time_s": 60,
            "per_episode": {"seed": seeds, "success": success},
            "before": before,
        }

    _evaluated(tmp_path / "random", {"success_rate": 0.0})
    _evaluated(tmp_path / "base", {"success_rate": 0.0, "invalid_rate": 1.0})
    _evaluated(tmp_path / "rl", trained([1, 1, 1, 0, 0]))
    (line,) = bench.verdict(tmp_path)
    assert "**not met**" in line and "success_rate 0.600 >= 0.8 (no)" in line
    assert "gain over the start +0.200 ± 0.200 (n=5) > +0.1 (yes)" in line
    (tmp_path / "rl" / "eval.json").write_text(json.dumps(trained([1, 1, 1, 1, 1])))
    assert "**met**" in bench.verdict(tmp_path)[0]
    (tmp_path / "rl" / "eval.json").write_text(json.dumps(trained([1, 1, 1, 1, 1], untagged=0.01)))
    assert "**not met**" in bench.verdict(tmp_path)[0]
    # Snake's target: the paired gain above 2 standard errors (+0.200 ± 0.200 is not)
    snake = {**trained([1, 1, 1, 0, 0]), "mean_return": 0.6}
    snake["per_episode"]["return"], snake["before"]["per_episode"]["return"] = (
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
    )
    (tmp_path / "rl" / "eval.json").write_text(json.dumps(snake))
    (line,) = bench.verdict(tmp_path, "snake_summary")
    assert "**not met**" in line and "gain over the start +0.200 ± 0.200 (n=5) > 2 SE (no)" in line


def test_the_bandit_verdict_needs_coverage_up_regret_down_and_few_invalid_answers(tmp_path):
    seeds = list(range(6))

    def played(coverage: list[float], regret: list[float]) -> dict:
        mean = sum(coverage) / len(coverage)
        return {
            "diagnostics": {"final_coverage": {"mean": mean, "stderr": 0.01}},
            "per_episode": {"seed": seeds, "coverage": coverage, "regret": regret},
        }

    start = played([0.2] * 6, [6.0] * 6)

    def trained(coverage: list[float], regret: list[float], invalid: float) -> dict:
        return {**played(coverage, regret), "untagged_rate": 0.0, "invalid_rate": invalid, "before": start}

    _evaluated(tmp_path / "random", played([1.0] * 6, [5.8] * 6))
    _evaluated(tmp_path / "rl", trained([0.4, 0.6] * 3, [5.0, 4.0] * 3, invalid=0.02))
    (line,) = bench.verdict(tmp_path, "rlft_bandit")
    assert "**met**" in line and "start 0.200, random 1.000, base model -" in line
    assert "regret change -1.500 ± 0.224 (n=6) < -2 SE (yes)" in line
    # more invalid answers than 5%: their random presses would explain the coverage
    (tmp_path / "rl" / "eval.json").write_text(json.dumps(trained([0.4, 0.6] * 3, [5.0, 4.0] * 3, 0.2)))
    assert "**not met**" in bench.verdict(tmp_path, "rlft_bandit")[0]
    # coverage up but regret not down
    (tmp_path / "rl" / "eval.json").write_text(json.dumps(trained([0.4, 0.6] * 3, [6.0, 6.5] * 3, 0.0)))
    (line,) = bench.verdict(tmp_path, "rlft_bandit")
    assert "**not met**" in line and "< -2 SE (no)" in line


def test_a_kept_run_is_read_back_by_the_learning_table(tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["eval", "agent=random", "eval.episodes=2", f"hydra.run.dir={run}"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (run / "final").mkdir()  # weights a kept run leaves behind
    (run / "final" / "model.safetensors").write_text("weights")
    kept = kept_runs.keep_run(run, tmp_path / "kept" / "random")
    assert sorted(p.name for p in kept.iterdir()) == [".hydra", "eval.json", "status.json"]
    assert json.loads((kept / "eval.json").read_text()) == json.loads((run / "eval.json").read_text())
    with pytest.raises(FileNotFoundError, match="no eval.json"):
        kept_runs.keep_run(tmp_path / "missing", tmp_path / "kept" / "x")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "kept")], catch_exceptions=False)
    assert result.exit_code == 0 and "complete" in result.output


@pytest.mark.slow  # a short BC run, 2 MS-GRPO iterations and 4 evaluations of 20 maps (~10 min loaded)
def test_the_frozen_lake_recipe_end_to_end_at_a_small_budget(tmp_path, monkeypatch):
    """The frozenlake_maps recipe end to end at a small budget: BC on the planner (32 maps, 12 updates)
    makes every answer a tagged valid move where the base model's are all invalid (solving held-out maps
    takes the preset's 72 updates: benchmarks/learn_from_bc.py); MS-GRPO starts from it, evaluates it on
    the same 20 maps before its first update (eval.json `before` equals the BC run's own eval) and the
    learning table pairs the two."""
    out = tmp_path / "fl"
    overrides = [
        "algo.iterations=2",
        "algo.groups_per_iteration=4",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
    ]
    # the overrides go first: `--steps` takes every word after it
    argv = [
        "learn_from_bc.py",
        *overrides,
        "--out",
        str(out),
        "--episodes",
        "20",
        "--steps",
        "random",
        "base",
    ]
    argv += ["bc", "rl"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(bench, "PRESETS", {**bench.PRESETS})
    bc_args = ["algo.episodes=32", "algo.epochs=1", "algo.batch_size=16"]  # 12 updates
    original = bench.commands

    def small_bc(args: argparse.Namespace, out: Path, overrides: list[str]) -> dict[str, list[str]]:
        steps = original(args, out, overrides)
        return {**steps, "bc": [*steps["bc"], *bc_args]}

    monkeypatch.setattr(bench, "commands", small_bc)
    bench.main()
    random, base, bc, rl = (bench.eval_json(out / name) for name in ("random", "base", "bc", "rl"))
    assert random["success_rate"] == base["success_rate"] == 0.0 and base["invalid_rate"] == 1.0
    assert bc["untagged_rate"] == bc["invalid_rate"] == 0.0
    assert rl["before"]["per_episode"] == bc["per_episode"]  # the start, on the same maps
    assert rl["start"]["label"] == "planner BC" and rl["untagged_rate"] == 0.0
    with (out / "report" / "learning.csv").open() as fh:
        row = next(r for r in csv.DictReader(fh) if r["algo"] == "msgrpo")
    assert (row["random"], row["base_model"], row["start"], row["gain_pairs"]) == (
        "0.0",
        "0.0",
        "planner BC",
        "20",
    )
