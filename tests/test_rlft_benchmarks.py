"""The RLFT benchmark scripts' summary code (benchmarks/rlft_bandit.py, benchmarks/rlft_tictactoe.py) on
hand-made eval.json files: no model, no training."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import rlft_bandit  # noqa: E402
import rlft_tictactoe  # noqa: E402


def _bandit_eval(coverage: list[float], regret: list[float], seed: int = 0) -> dict:
    """An eval.json of len(coverage) episodes of 2 presses whose final coverage/regret are the lists."""
    n = len(coverage)

    def ms(values: list[float]) -> tuple[float, float]:
        return rlft_bandit.mean_stderr(values)

    cov_m, cov_s = ms(coverage)
    reg_m, reg_s = ms(regret)
    return {
        "episodes": n,
        "seed": seed,
        "mean_return": 1.0,
        "return_stderr": 0.1,
        "invalid_rate": 0.0,
        "diagnostics": {
            "curves": {
                "step": [1, 2],
                "episodes": [n, n],
                "coverage_mean": [0.2, cov_m],
                "coverage_stderr": [0.0, cov_s],
                "regret_mean": [0.1, reg_m],
                "regret_stderr": [0.01, reg_s],
            },
            "final_coverage": {"mean": cov_m, "stderr": cov_s},
            "final_regret": {"mean": reg_m, "stderr": reg_s},
            "greediness": {"cases": n, "greedy": 1, "share": 0.5},
            "frequency_bias": {"cases": n, "repeats": 1, "share": 0.4, "chance_share": 0.3},
            "knowing_doing": {"knowing_rate": 0.25, "doing_given_knowing": 0.5},
        },
    }


def _write(path: Path, data: dict, status: str = "complete") -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "eval.json").write_text(json.dumps(data))
    (path / "status.json").write_text(json.dumps({"status": status}))


def test_bandit_summary_targets_and_files(tmp_path: Path) -> None:
    _write(tmp_path / "base", _bandit_eval([0.2, 0.4, 0.2, 0.4], [3.0, 4.0, 3.0, 4.0]))
    _write(
        tmp_path / "train", {**_bandit_eval([0.8, 1.0, 0.8, 1.0], [1.0, 2.0, 1.0, 2.0]), "train_time_s": 60.0}
    )
    (tmp_path / "train" / "metrics.jsonl").write_text(
        json.dumps({"iteration": 1, "time_s": 30.0})
        + "\n"
        + json.dumps({"iteration": 2, "time_s": 60.0})
        + "\n"
    )
    _write(tmp_path / "planner", _bandit_eval([1.0] * 4, [0.5] * 4))
    _write(tmp_path / "random", _bandit_eval([0.9, 1.0, 1.0, 0.9], [2.0, 2.5, 2.0, 2.5]))
    results = tmp_path / "results"
    summary = rlft_bandit.summarize(tmp_path, results)
    cov = summary["targets"]["coverage_rises (base)"]
    assert cov["change"] == pytest.approx(0.6)
    assert cov["stderr_of_change"] == pytest.approx(math.sqrt(2) * 0.057735, rel=1e-4)
    assert cov["met"] and summary["targets"]["regret_falls (base)"]["met"]
    assert "coverage_rises (warmup)" not in summary["targets"]  # no warm-up run here
    assert summary["training"]["iterations"] == 2 and summary["training"]["train_minutes"] == 1.0
    md = (tmp_path / "summary.md").read_text()
    assert "| RLFT-trained | 4 | 0.900 ± 0.058 |" in md
    assert "coverage rises" in md and "| yes |" in md
    for name in ("rlft_bandit.md", "rlft_bandit.json", "rlft_bandit.png"):
        assert (results / name).stat().st_size > 0
    assert "curve" not in json.loads((results / "rlft_bandit.json").read_text())["training"]
    assert (tmp_path / "rlft_bandit.png").stat().st_size > 10_000


def test_bandit_summary_refuses_mismatched_seeds(tmp_path: Path) -> None:
    _write(tmp_path / "base", _bandit_eval([0.2, 0.4], [3.0, 4.0], seed=0))
    _write(tmp_path / "random", _bandit_eval([0.2, 0.4], [3.0, 4.0], seed=1))
    with pytest.raises(rlft_bandit.BenchmarkError, match="seed"):
        rlft_bandit.summarize(tmp_path)


def test_bandit_summary_compares_with_the_warmup_and_needs_the_coverage_gain(tmp_path: Path) -> None:
    _write(tmp_path / "base", _bandit_eval([0.9, 1.0, 0.9, 1.0], [3.0, 4.0, 3.0, 4.0]))
    _write(tmp_path / "warmup", _bandit_eval([0.2, 0.2, 0.2, 0.4], [5.0, 5.0, 5.0, 5.5]))
    _write(tmp_path / "train", _bandit_eval([0.4, 0.4, 0.4, 0.4], [3.0, 3.0, 3.0, 3.0]))
    _write(tmp_path / "bc_ucb", _bandit_eval([1.0] * 4, [1.0] * 4))
    summary = rlft_bandit.summarize(tmp_path)
    targets = summary["targets"]
    assert not targets["coverage_rises (base)"]["met"]  # 0.95 -> 0.40
    assert targets["coverage_rises (warmup)"]["change"] == pytest.approx(0.15)
    assert targets["coverage_rises (warmup)"]["met"] and targets["regret_falls (warmup)"]["met"]
    assert set(summary["agents"]) == {"base", "warmup", "trained", "bc_ucb"}
    md = (tmp_path / "summary.md").read_text()
    assert "| format warm-up (random presses) | 4 |" in md and "| behaviour cloning on UCB1 | 4 |" in md
    # the same rise made by invalid answers (the random fallback's presses) does not count
    _write(tmp_path / "train", {**_bandit_eval([0.4, 0.4, 0.4, 0.4], [3.0] * 4), "invalid_rate": 0.3})
    summary = rlft_bandit.summarize(tmp_path)
    assert not summary["targets"]["coverage_rises (warmup)"]["met"]
    assert "random fallback" in summary["targets"]["coverage_rises (warmup)"]["why"]
    assert "no (the trained row's invalid rate 0.300" in (tmp_path / "summary.md").read_text()
    # a rise smaller than the 0.1 target is not met however small its stderr
    small = rlft_bandit.change({"mean": 0.5, "stderr": 0.0}, {"mean": 0.59, "stderr": 0.001}, +1, minimum=0.1)
    assert not small["met"]


def test_change_needs_more_than_the_stderr() -> None:
    before, after = {"mean": 0.5, "stderr": 0.1}, {"mean": 0.6, "stderr": 0.1}
    assert not rlft_bandit.change(before, after, +1)["met"]  # 0.1 < sqrt(0.02)
    assert rlft_bandit.change(before, {"mean": 0.8, "stderr": 0.1}, +1)["met"]
    assert not rlft_bandit.change(before, {"mean": 0.8, "stderr": 0.1}, -1)["met"]


def test_split_overrides_routes_and_rejects() -> None:
    routed = rlft_bandit.split_overrides(["env.arms=5", "agent.sampling.max_new_tokens=32", "algo.beta=0.1"])
    assert routed["all"] == ["env.arms=5"]
    assert routed["llm"] == ["env.arms=5", "agent.sampling.max_new_tokens=32"]
    assert routed["train"] == ["env.arms=5", "agent.sampling.max_new_tokens=32", "algo.beta=0.1"]
    with pytest.raises(rlft_bandit.BenchmarkError, match="Hydra overrides"):
        rlft_bandit.split_overrides(["--minuets", "3"])


def test_preset_env_overrides_match_the_presets() -> None:
    bandit = rlft_bandit.preset_env_overrides("rlft_bandit")
    assert bandit[0] == "env=bandit" and "env.arms=5" in bandit
    ttt = rlft_bandit.preset_env_overrides("rlft_tictactoe")
    assert ttt[0] == "env=tictactoe" and "env.opponent=random" in ttt


def _ttt_eval(win: float, draw: float, loss: float, n: int = 50, invalid: float = 0.0) -> dict:
    return {
        "episodes": n,
        "seed": 0,
        "mean_return": win - loss - 5 * invalid,
        "return_stderr": 0.1,
        "invalid_rate": invalid,
        "mean_win_rate": win,
        "mean_draw_rate": draw,
        "mean_loss_rate": loss,
    }


def _fake_ttt_steps(monkeypatch) -> dict[str, list[str]]:
    """rlft_tictactoe.run_step replaced by one that records each step's arguments and writes a complete
    run with an eval.json; returns the record."""
    calls: dict[str, list[str]] = {}

    def fake_run_step(name: str, args: list[str], out: Path, threads: int) -> Path:
        calls[name] = args
        _write(out / name, _ttt_eval(0.5, 0.2, 0.3))
        (out / name / "status.json").write_text(json.dumps({"status": "complete"}))
        return out / name

    monkeypatch.setattr(rlft_tictactoe, "run_step", fake_run_step)
    return calls


def test_tictactoe_game_return_stderr_matches_the_games() -> None:
    games = [1] * 30 + [0] * 5 + [-1] * 15  # w=0.6, d=0.1, l=0.3
    mean, stderr = rlft_bandit.mean_stderr([float(g) for g in games])
    got = rlft_tictactoe.game_return(_ttt_eval(0.6, 0.1, 0.3))
    assert got["mean"] == pytest.approx(mean) and got["stderr"] == pytest.approx(stderr)


def test_tictactoe_summary(tmp_path: Path) -> None:
    _write(tmp_path / "base_random", _ttt_eval(0.4, 0.1, 0.5, invalid=0.02))
    _write(tmp_path / "train", _ttt_eval(0.7, 0.1, 0.2))
    _write(tmp_path / "base_mcts", _ttt_eval(0.0, 0.1, 0.9))
    _write(tmp_path / "trained_mcts", _ttt_eval(0.0, 0.15, 0.85))
    summary = rlft_tictactoe.summarize(tmp_path, tmp_path / "results")
    targets = summary["targets"]
    assert targets["game_return_vs_random_rises"]["change"] == pytest.approx(0.6)
    assert targets["game_return_vs_random_rises"]["met"]
    assert not targets["game_return_vs_mcts_rises"]["met"]
    assert set(summary["missing"]) == {"random_random", "random_mcts", "warmup"}
    md = (tmp_path / "summary.md").read_text()
    assert "| RLFT-trained | random | 50 |" in md
    assert (tmp_path / "results" / "rlft_tictactoe.png").stat().st_size > 10_000


def test_tictactoe_training_starts_from_a_complete_warmup(tmp_path: Path, monkeypatch) -> None:
    """The train step runs `init_from=<out>/warmup` when the warm-up run is complete, and without it
    otherwise (the warm-up row is then missing from the table)."""
    calls = _fake_ttt_steps(monkeypatch)
    assert rlft_tictactoe.main(["--out", str(tmp_path / "a"), "--steps", "train"]) == 0
    assert not any(a.startswith("init_from=") for a in calls["train"])
    assert rlft_tictactoe.main(["--out", str(tmp_path / "b"), "--steps", "warmup", "train"]) == 0
    assert "experiment=rlft_tictactoe_warmup" in calls["warmup"]
    assert f"init_from={tmp_path / 'b' / 'warmup'}" in calls["train"]
    assert "| format warm-up | random | 50 |" in (tmp_path / "b" / "summary.md").read_text()


def test_tictactoe_summary_shows_the_move_diagnostics_and_dashes_for_old_evals(tmp_path: Path) -> None:
    kd = {"judged": 40, "knowing_rate": 0.5, "doing_given_knowing": 0.25, "reads_board_rate": 0.9}
    base = {**_ttt_eval(0.4, 0.1, 0.5), "diagnostics": {"optimal_move_rate": 0.3, "knowing_doing": kd}}
    _write(tmp_path / "base_random", base)
    _write(
        tmp_path / "random_random", {**_ttt_eval(0.5, 0.2, 0.3), "diagnostics": {"optimal_move_rate": 0.35}}
    )
    _write(tmp_path / "train", _ttt_eval(0.7, 0.1, 0.2))  # an eval.json written before the diagnostics
    summary = rlft_tictactoe.summarize(tmp_path)
    assert summary["runs"]["base_random"]["reads_board_rate"] == 0.9
    assert summary["runs"]["train"]["optimal_move_rate"] is None
    md = (tmp_path / "summary.md").read_text()
    assert "| optimal moves | knowing | doing given knowing |" in md
    assert "| base model | random | 50 |" in md and "| 0.300 | 0.500 | 0.250 | - | - |\n" in md
    assert "| random agent | random | 50 |" in md and "| 0.350 | - | - | - | - |\n" in md
    assert "| - | - | - |\n" in md.split("| RLFT-trained | random |")[1]


def test_tictactoe_rows_take_a_re_evaluation_when_there_is_one(tmp_path: Path) -> None:
    _write(tmp_path / "warmup", _ttt_eval(0.5, 0.2, 0.3))
    assert rlft_tictactoe.run_eval_path(tmp_path, "warmup") == tmp_path / "warmup" / "eval.json"
    _write(tmp_path / "warmup_random", _ttt_eval(0.6, 0.2, 0.2))
    assert rlft_tictactoe.run_eval_path(tmp_path, "warmup") == tmp_path / "warmup_random" / "eval.json"
    assert rlft_tictactoe.summarize(tmp_path)["runs"]["warmup"]["win_rate"] == 0.6


def test_tictactoe_trained_against_mcts(tmp_path: Path, monkeypatch) -> None:
    """`--train-opponent mcts` trains against MCTS; the summary reads the opponent from the train run's
    config: its own eval is the row against MCTS, `trained_random/` the row against the random opponent,
    and the targets compare each with the base model against the same opponent."""
    calls = _fake_ttt_steps(monkeypatch)
    rlft_tictactoe.main(["--out", str(tmp_path / "a"), "--steps", "train", "--train-opponent", "mcts"])
    assert "env.opponent=mcts" in calls["train"] and "env.opponent=random" not in calls["train"]

    out = tmp_path / "b"
    _write(out / "base_random", _ttt_eval(0.4, 0.1, 0.5))
    _write(out / "base_mcts", _ttt_eval(0.0, 0.1, 0.9))
    _write(out / "train", _ttt_eval(0.1, 0.5, 0.4))
    (out / "train" / ".hydra").mkdir()
    (out / "train" / ".hydra" / "config.yaml").write_text("env:\n  name: tictactoe\n  opponent: mcts\n")
    _write(out / "trained_random", _ttt_eval(0.6, 0.1, 0.3))
    summary = rlft_tictactoe.summarize(out)
    assert summary["train_opponent"] == "mcts"
    assert summary["runs"]["train"]["opponent"] == "mcts"
    assert summary["runs"]["trained_random"]["opponent"] == "random"
    assert summary["targets"]["game_return_vs_mcts_rises"]["change"] == pytest.approx(0.6)
    assert summary["targets"]["game_return_vs_random_rises"]["change"] == pytest.approx(0.4)
    md = (out / "summary.md").read_text()
    assert "trained against the mcts opponent" in md
    assert "| RLFT-trained vs mcts | mcts | 50 |" in md and "| RLFT-trained vs mcts | random | 50 |" in md


def test_credit_snr_sees_the_bonus_and_the_discount() -> None:
    """benchmarks/rlft_credit_snr.py through the preset's credit code: without a bonus a new button's
    press earns nothing over a repeat; with one it does, and more clearly the less the -5 penalties of
    later steps are carried back (smaller gamma)."""
    import numpy as np
    import rlft_credit_snr

    def snr(gamma: float, bonus: float) -> float:
        rng = np.random.default_rng(0)
        return rlft_credit_snr.measure(rng, 60, gamma, bonus, explore=0.1, invalid=0.2)["gap_over_std"]

    assert abs(snr(1.0, 0.0)) < 0.05
    assert snr(0.0, 3.0) > 0.5 > snr(1.0, 3.0) > snr(1.0, 1.0) > 0.02


def test_results_none_means_no_copy() -> None:
    """`--results none` writes no copy in all three benchmarks, never into a directory named none."""
    assert rlft_bandit.results_dir("none") is None
    assert rlft_bandit.results_dir("None") is None
    assert rlft_bandit.results_dir("benchmarks/results") == Path("benchmarks/results")
    parser = rlft_tictactoe.runner_parser(None, "rlft_tictactoe", ("train",), (), "games per row")
    assert parser.parse_args(["--results", "none"]).results is None
    assert rlft_tictactoe.runner_parser is rlft_bandit.runner_parser
    import learn_snake

    assert learn_snake.results_dir is rlft_bandit.results_dir


def test_tictactoe_rationale_rate_from_eval_json_or_older_transcripts(tmp_path: Path) -> None:
    """An eval.json that carries `rationale_rate` is taken as it is; an older one gets the share from
    its transcripts (answers with a closed, non-empty <think>), and `-` where neither exists."""
    _write(tmp_path / "base_random", {**_ttt_eval(0.4, 0.1, 0.5), "rationale_rate": 0.9})
    _write(tmp_path / "train", _ttt_eval(0.7, 0.1, 0.2))
    asked = "First think step by step inside <think>...</think>, then answer with one action as <action>NAME</action>."
    rows = [
        {"prompt": asked, "completion": "<think>the centre wins</think>\n<action>5</action>"},
        {"prompt": asked, "completion": "<action>1</action>"},
        {"prompt": asked, "completion": "<action>2</action>"},
        {"prompt": asked, "completion": "<think></think><action>3</action>"},
    ]
    (tmp_path / "train" / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _write(tmp_path / "base_mcts", _ttt_eval(0.0, 0.1, 0.9))  # no transcripts
    runs = rlft_tictactoe.summarize(tmp_path)["runs"]
    assert runs["base_random"]["rationale_rate"] == 0.9
    assert runs["train"]["rationale_rate"] == pytest.approx(0.25)
    assert runs["base_mcts"]["rationale_rate"] is None
    md = (tmp_path / "summary.md").read_text()
    assert "| untagged rate | rationale |" in md
    assert "| 0.250 |" in md.split("| RLFT-trained | random |")[1].splitlines()[0]


def test_tictactoe_trained_against_a_weaker_mcts(tmp_path: Path, monkeypatch) -> None:
    """`--train-mcts-simulations 10` gives only training the weaker opponent: the evals against MCTS (the
    trained model's included, through from_run, which would keep the run's env) play the preset's MCTS,
    and the row against MCTS is that eval, never training's own (which played MCTS-10)."""
    calls = _fake_ttt_steps(monkeypatch)
    argv = ["--out", str(tmp_path / "a"), "--train-opponent", "mcts", "--train-mcts-simulations", "10"]
    assert rlft_tictactoe.main([*argv, "--steps", "train", "trained_mcts"]) == 0
    assert calls["train"][-1] == "env.mcts_simulations=10"
    assert (
        "env.mcts_simulations=100" in calls["trained_mcts"] and "env.opponent=mcts" in calls["trained_mcts"]
    )
    assert (
        rlft_tictactoe.main(["--out", str(tmp_path / "c"), "--train-mcts-simulations", "10"]) == 1
    )  # random

    out = tmp_path / "b"
    _write(out / "base_random", _ttt_eval(0.4, 0.1, 0.5))
    _write(out / "base_mcts", _ttt_eval(0.0, 0.1, 0.9))
    _write(out / "train", _ttt_eval(0.3, 0.2, 0.5))  # against MCTS-10
    (out / "train" / ".hydra").mkdir()
    (out / "train" / ".hydra" / "config.yaml").write_text(
        "env:\n  name: tictactoe\n  opponent: mcts\n  mcts_simulations: 10\n"
    )
    _write(out / "trained_random", _ttt_eval(0.6, 0.1, 0.3))
    summary = rlft_tictactoe.summarize(out)
    assert summary["train_mcts_simulations"] == 10
    assert "train" not in summary["runs"] and "trained_mcts" in summary["missing"]
    assert "game_return_vs_mcts_rises" not in summary["targets"]
    _write(out / "trained_mcts", _ttt_eval(0.1, 0.3, 0.6))  # against the full MCTS
    summary = rlft_tictactoe.summarize(out)
    assert summary["runs"]["trained_mcts"]["opponent"] == "mcts"
    assert summary["targets"]["game_return_vs_mcts_rises"]["change"] == pytest.approx(0.4)
    assert summary["targets"]["game_return_vs_random_rises"]["change"] == pytest.approx(0.4)
    md = (out / "summary.md").read_text()
    assert "MCTS with 10 simulations a move" in md
    assert (
        "| RLFT-trained vs MCTS-10 | mcts | 50 |" in md and "| RLFT-trained vs MCTS-10 | random | 50 |" in md
    )


def test_bandit_state_facts_reach_the_demonstrations_only(tmp_path: Path, monkeypatch) -> None:
    calls: dict[str, list[str]] = {}

    def fake_run_step(name: str, args: list[str], out: Path, threads: int) -> Path:
        calls[name] = args
        (out / name).mkdir(parents=True)
        return out / name

    monkeypatch.setattr(rlft_bandit, "run_step", fake_run_step)
    monkeypatch.setattr(rlft_bandit, "summarize", lambda *args: None)
    argv = [
        "--out",
        str(tmp_path),
        "--state-facts",
        "env.view=summary",
        "--steps",
        "warmup",
        "bc_ucb",
        "train",
    ]
    assert rlft_bandit.main(argv) == 0
    assert "algo.state_facts=true" in calls["warmup"] and "algo.state_facts=true" in calls["bc_ucb"]
    assert "algo.state_facts=true" not in calls["train"] and "env.view=summary" in calls["train"]
    calls.clear()
    assert rlft_bandit.main(["--out", str(tmp_path / "plain"), "--steps", "warmup"]) == 0
    assert not any("state_facts" in a or "algo.episodes" in a or "max_updates" in a for a in calls["warmup"])
    calls.clear()
    argv = ["--out", str(tmp_path / "more"), "--warmup-episodes", "48", "--warmup-updates", "120"]
    assert rlft_bandit.main([*argv, "--steps", "warmup", "bc_ucb", "train"]) == 0
    for step in ("warmup", "bc_ucb"):
        assert "algo.episodes=48" in calls[step] and "algo.max_updates=120" in calls[step]
    assert not any("algo.episodes" in a or "max_updates" in a for a in calls["train"])


def test_rows_say_how_they_were_made(tmp_path: Path) -> None:
    """The summary names each row's command and answer parsing from the run's saved Hydra files."""

    def hydra(run: Path, overrides: list[str], agent: dict[str, Any]) -> None:
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        (run / ".hydra" / "config.yaml").write_text(json.dumps({"agent": agent}))  # JSON is YAML

    hydra(tmp_path / "a", ["task=eval", "agent=random", "seed=0"], {"name": "random"})
    hydra(tmp_path / "b", ["task=train", "experiment=rlft_bandit", "agent.lenient=true"], {"lenient": True})
    hydra(tmp_path / "c", ["task=train", "experiment=rlft_bandit_warmup"], {"name": "llm", "lenient": False})
    assert rlft_bandit.provenance(tmp_path / "a") == {
        "command": "agentrl eval agent=random seed=0",
        "parsing": "-",
    }
    assert rlft_bandit.provenance(tmp_path / "b")["parsing"] == "lenient"
    assert rlft_bandit.provenance(tmp_path / "c") == {
        "command": "agentrl train experiment=rlft_bandit_warmup",
        "parsing": "strict",
    }
    assert rlft_bandit.provenance(tmp_path / "none") == {}
    runs = {name: {"made_by": rlft_bandit.provenance(tmp_path / name)} for name in ("a", "c", "none")}
    lines = rlft_bandit.provenance_lines(runs, {"a": "random", "c": "format warm-up"})
    assert lines[-2:] == [
        "- random (a classic agent: no parsing): `agentrl eval agent=random seed=0`",
        "- format warm-up (strict parsing): `agentrl train experiment=rlft_bandit_warmup`",
    ]


def test_tictactoe_state_facts_reach_the_warmup(tmp_path: Path, monkeypatch) -> None:
    calls = _fake_ttt_steps(monkeypatch)
    assert rlft_tictactoe.main(["--out", str(tmp_path), "--state-facts", "--steps", "warmup", "train"]) == 0
    assert "algo.state_facts=true" in calls["warmup"] and "algo.state_facts=true" not in calls["train"]
    calls.clear()
    argv = ["--out", str(tmp_path / "more"), "--warmup-episodes", "128", "--warmup-updates", "60"]
    assert rlft_tictactoe.main([*argv, "--steps", "warmup", "train"]) == 0
    assert "algo.episodes=128" in calls["warmup"] and "algo.max_updates=60" in calls["warmup"]
    assert not any("algo.episodes" in a or "max_updates" in a for a in calls["train"])


def test_untried_choices_count_presses_of_new_buttons_and_exact_untried_lists(tmp_path: Path) -> None:
    prompt = "Round 1 of 3. Buttons: red, blue, green.\n"
    steps = [  # (episode, step, action, valid, completion)
        (0, 0, "red", True, "<think>Not pressed yet: red, blue, green. I choose red.</think>"),
        (0, 1, "red", True, "<think>Not pressed yet: blue, green. I choose red.</think>"),  # exact; not new
        (0, 2, "blue", False, "<think>Not pressed yet: red. I choose x.</think>"),  # invalid: no chance
        (1, 0, "green", True, "no list"),
        (1, 1, "blue", True, "<think>Not pressed yet: red, blue. I choose blue.</think>"),  # exact; new
    ]
    (tmp_path / "transcripts.jsonl").write_text(
        "".join(
            json.dumps({"episode": e, "step": t, "action": a, "valid": v, "prompt": prompt, "completion": c})
            + "\n"
            for e, t, a, v, c in steps
        )
    )
    counts = rlft_bandit.untried_choices(tmp_path)
    assert counts == {"chances": 2, "untried": 1, "listed": 4, "listed_exact": 3}
    assert rlft_bandit.untried_cells(counts) == "1/2 | 3/4"
    assert (
        rlft_bandit.untried_choices(tmp_path / "none") is None and rlft_bandit.untried_cells(None) == "- | -"
    )


def test_fact_use_reads_the_board_of_the_prompt_and_checks_the_stated_cells(tmp_path: Path) -> None:
    def prompt(rows: list[str]) -> str:
        board = "\n---+---+---\n".join(f" {a} | {b} | {c}" for a, b, c in rows)
        return f"<|im_start|>user\nObservation:\n{board}\nYou play X.\nLegal moves: ...<|im_end|>\n"

    threat = prompt(["XX3", "OO6", "789"])  # X wins at 3, O's threat is blocked at 6
    quiet = prompt(["X23", "4O6", "789"])  # nothing completes a line
    lines = [  # (prompt, completion, action, valid)
        (threat, "<think>Winning cells for X: 3. Cells that block O: 6. I choose 3.</think>", "3", True),
        (threat, "<think>Winning cells for X: 7. I choose 6.</think>", "6", True),
        (threat, "<think>The valid actions are 3, 6.</think>", "3", False),
        (quiet, "<think>No line can be completed on this move. I choose 9.</think>", "9", True),
        (quiet, "<think>Cells that block O: 4. I choose 4.</think>", "4", True),
    ]
    path = tmp_path / "transcripts.jsonl"
    path.write_text(
        "".join(
            json.dumps({"episode": 0, "step": i, "prompt": p, "completion": c, "action": a, "valid": v})
            + "\n"
            for i, (p, c, a, v) in enumerate(lines)
        )
    )
    # stated: lines 1, 2, 4, 5; exact: 1 (3 and 6) and 4 (none); chances: the valid answers on the threat
    # board (1, 2); taken: 1 (the win; 6 only blocks while 3 wins)
    assert rlft_tictactoe.fact_use(path) == {"stated": 4, "exact": 2, "chances": 2, "taken": 1}
    assert rlft_tictactoe.fact_cells(rlft_tictactoe.fact_use(path)) == "2/4 | 1/2"
    assert rlft_tictactoe.fact_use(tmp_path / "none.jsonl") is None


def test_kitchen_warmup_takes_the_env_and_agent_overrides_only(tmp_path: Path, monkeypatch) -> None:
    """poad_vs_ntpo.py --warmup: the warm-up writes its demonstrations through the runs' env and agent
    settings (`env.actions=feasible` changes the prompt's action list), not their algo settings."""
    import poad_vs_ntpo

    calls: dict[str, list[str]] = {}

    def fake_run_step(name: str, args: list[str], out: Path, threads: int) -> Path:
        calls[name] = args
        run = out / name
        run.mkdir(parents=True, exist_ok=True)
        times = {"first_started": "2026-01-01T00:00:00", "ended": "2026-01-01T00:06:00"}
        (run / "status.json").write_text(json.dumps(times))
        return run

    monkeypatch.setattr(rlft_bandit, "run_step", fake_run_step)
    extra = ["env.actions=feasible", "+agent.history=2", "algo.learning_rate=1e-5", "seed=3"]
    assert poad_vs_ntpo.warmup(tmp_path, 0, 2, extra) == pytest.approx(6.0)
    assert calls["warmup"][:2] == ["train", "experiment=kitchen_warmup"]
    assert "env.actions=feasible" in calls["warmup"] and "+agent.history=2" in calls["warmup"]
    assert not any(a.startswith(("algo.learning_rate", "seed=3", "algo.episodes")) for a in calls["warmup"])
    poad_vs_ntpo.warmup(tmp_path / "more", 0, 2, [], episodes=24, updates=48, demonstrations="scored")
    assert calls["warmup"][-3:] == ["algo.episodes=24", "algo.max_updates=48", "algo.demonstrations=scored"]


def test_kitchen_policy_reads_every_valid_answer_along_the_optimal_play(tmp_path: Path, capsys) -> None:
    """benchmarks/kitchen_policy.py on the tiny model: one row per state of the planner's play (four on the
    tomato salad), each valid action's answer probability (a distribution over more answers than these,
    so the sum is at most 1), and the table names the most likely action."""
    import kitchen_policy

    overrides = ["experiment=kitchen_learn", "env.actions=feasible", "model=tiny-random"]
    out = tmp_path / "policy.json"
    assert kitchen_policy.main(["builtin:tiny-random", *overrides, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["planner"] for r in rows] == [
        "pick up the tomato",
        "chop the tomato",
        "put the tomato on the plate",
        "deliver the plate",
    ]
    assert list(rows[1]["p"]) == ["chop the tomato", "deliver the plate"]  # the state's listed actions
    for r in rows:
        assert all(0 < p < 1 for p in r["p"].values()) and sum(r["p"].values()) <= 1
    printed = capsys.readouterr().out
    assert "| You hold: a whole tomato. Plate: nothing. | chop the tomato |" in printed


def test_kitchen_summary_reads_the_task_and_the_time_to_target(tmp_path: Path) -> None:
    """poad_vs_ntpo.py's summary: the task and its optimal return from the runs' saved config, the first
    greedy eval at the target per algorithm, the first from which it stays there, and the NTPO/POAD ratios."""
    import poad_vs_ntpo

    for algo, evals in {"poad": [0.0, 1.0, 1.0, 1.0], "ntpo": [1.0, 0.0, 1.0, 1.0]}.items():
        run = tmp_path / algo
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "config.yaml").write_text("env:\n  name: kitchen\n  task: tomato_lettuce_salad\n")
        rows = [
            {
                "iteration": 2 * (k + 1),
                "time_s": 120.0 * (k + 1),
                "eval/success_rate": s,
                "eval/mean_return": s,
            }
            for k, s in enumerate(evals)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert poad_vs_ntpo.task_of(tmp_path, ["poad"]) == ("tomato_lettuce_salad", pytest.approx(1.793))
    summary = poad_vs_ntpo.summarize(tmp_path, ["poad", "ntpo"], 0.8)
    assert summary["task"] == "tomato_lettuce_salad"
    poad, ntpo = summary["runs"]["poad"], summary["runs"]["ntpo"]
    # NTPO reaches the target first but loses it again: it holds it only from its third eval
    assert poad["target_iteration"] == 4 and ntpo["target_iteration"] == 2
    assert poad["held_iteration"] == 4 and ntpo["held_iteration"] == 6
    assert summary["ntpo/poad_iterations"] == pytest.approx(0.5)
    assert summary["ntpo/poad_held_iterations"] == pytest.approx(1.5)
    assert poad_vs_ntpo.held_from([(2, 1.0, 1.0, 0.0), (4, 2.0, 0.0, 0.0)], 0.8) == (None, None)
    assert "kitchen tomato lettuce salad" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "learning_curves.png").is_file()


def test_the_step_runner_keeps_complete_runs_and_resumes_killed_training(tmp_path, monkeypatch):
    """A benchmark run again into the same --out: a complete step is skipped, a killed training step
    continues with `agentrl train --resume <run>` (not a new run that Hydra would refuse in a used
    directory), and an unfinished evaluation stops with a message instead of mixing two runs."""
    launched: list[list[str]] = []

    class FakeProcess:
        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            launched.append(cmd[3:])
            run = Path(cmd[-1].split("=", 1)[1]) if cmd[-1].startswith("hydra.run.dir=") else Path(cmd[-1])
            run.mkdir(parents=True, exist_ok=True)
            (run / "eval.json").write_text("{}")

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(rlft_bandit.subprocess, "Popen", FakeProcess)
    done = tmp_path / "done"
    done.mkdir()
    (done / "eval.json").write_text("{}")
    (done / "status.json").write_text(json.dumps({"status": "complete"}))
    assert rlft_bandit.run_step("done", ["train", "x=1"], tmp_path, 1) == done
    assert launched == []  # kept

    killed = tmp_path / "killed"
    (killed / "checkpoint-4").mkdir(parents=True)
    assert rlft_bandit.run_step("killed", ["train", "x=1"], tmp_path, 1) == killed
    assert launched == [["train", "--resume", str(killed)]]

    assert rlft_bandit.run_step("fresh", ["train", "x=1"], tmp_path, 1) == tmp_path / "fresh"
    assert launched[-1] == ["train", "x=1", f"hydra.run.dir={tmp_path / 'fresh'}"]

    (tmp_path / "half_eval").mkdir()
    (tmp_path / "half_eval" / "run.log").write_text("...")
    with pytest.raises(rlft_bandit.BenchmarkError, match="unfinished run"):
        rlft_bandit.run_step("half_eval", ["eval", "x=1"], tmp_path, 1)
