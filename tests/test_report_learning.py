"""`agentrl report DIR --table learning`: one row per complete training run with its answer format,
the env's primary metric before and after, untagged share, minutes and command, equal to the source
files; learning.md and learning.csv."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.console import console


def _run(
    root: Path,
    name: str,
    env: str,
    algo: str,
    overrides: list[str],
    ev: dict | None,
    agent: dict | None = None,
    prompt: str | None = None,
) -> Path:
    path = root / name
    (path / ".hydra").mkdir(parents=True)
    cfg = {
        "task": "train",
        "seed": 0,
        "env": {"name": env},
        "agent": {
            "name": "llm",
            "prefill": "auto",
            "cot": False,
            "lenient": True,
            "sampling": {},
            **(agent or {}),
        },
        "model": {"name": "smollm2-135m"},
        "algo": {"name": algo},
    }
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump(["task=train", *overrides, "hydra.run.dir=x"])
    )
    if ev is not None:
        (path / "eval.json").write_text(json.dumps(ev))
    if prompt is not None:
        (path / "transcripts.jsonl").write_text(json.dumps({"episode": 0, "prompt": prompt}) + "\n")
    return path


def _diag(coverage: float, regret: float) -> dict:
    return {
        "episodes": 50,
        "curves": {},
        "final_coverage": {"mean": coverage, "stderr": 0.02},
        "final_regret": {"mean": regret, "stderr": 0.5},
    }


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    _run(
        root,
        "a_frozenlake",
        "frozenlake",
        "msgrpo",
        ["experiment=frozenlake_learn", "seed=0"],
        {
            "episodes": 20,
            "success_rate": 0.95,
            "mean_return": 0.95,
            "return_stderr": 0.05,
            "untagged_rate": 0.0,
            "invalid_rate": 0.0,
            "train_time_s": 600.0,
            "iterations": 40,
            "before": {"episodes": 20, "success_rate": 0.0, "mean_return": -0.5, "untagged_rate": 0.0},
        },
        prompt="<|im_start|>user\nYou are on a frozen lake.<|im_end|>\n<|im_start|>assistant\nMove:",
    )
    _run(
        root,
        "b_tictactoe",
        "tictactoe",
        "rlft",
        ["experiment=rlft_tictactoe", "agent.cot=true", "algo.learning_rate='1e-5'"],
        {
            "episodes": 40,
            "success_rate": 0.75,
            "mean_return": 0.6,
            "return_stderr": 0.1,
            "mean_win_rate": 0.75,
            "untagged_rate": 0.02,
            "train_time_s": 3000.0,
            "before": {"episodes": 40, "success_rate": 0.15, "mean_return": -0.5, "mean_win_rate": 0.15},
        },
        agent={"cot": True},
    )
    _run(
        root,
        "c_bandit",
        "bandit",
        "rlft",
        ["experiment=rlft_bandit"],
        {
            "episodes": 50,
            "success_rate": 0.3,
            "mean_return": 20.0,
            "return_stderr": 1.0,
            "mean_action_coverage": 0.7,
            "diagnostics": _diag(0.74, 6.0),
            "untagged_rate": 0.888,
            "train_time_s": 120.0,
            "before": {
                "episodes": 50,
                "success_rate": 0.2,
                "mean_return": 10.0,
                "diagnostics": _diag(0.86, 5.85),
            },
        },
        agent={"prefill": ""},
    )
    _run(
        root,
        "d_snake",
        "snake",
        "dqn",
        ["env=snake", "algo=dqn"],
        {"episodes": 50, "success_rate": 0.1, "mean_return": 7.5, "return_stderr": 2.1, "train_time_s": 90.0},
    )
    _run(  # an old run: no untagged_rate, strict tagged answers
        root,
        "e_kitchen",
        "kitchen",
        "poad",
        ["env=kitchen", "algo=poad", "agent.lenient=false"],
        {"episodes": 10, "success_rate": 0.0, "mean_return": 0.2, "return_stderr": 0.0, "train_time_s": 30.0},
        agent={"lenient": False},
    )
    _run(root, "f_unfinished", "frozenlake", "msgrpo", [], None)
    evaluation = root / "g_eval"
    (evaluation / ".hydra").mkdir(parents=True)
    (evaluation / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump({"task": "eval", "env": {"name": "frozenlake"}, "agent": {"name": "random"}})
    )
    (evaluation / "eval.json").write_text(
        json.dumps({"episodes": 4, "success_rate": 0.0, "mean_return": 0.0})
    )
    return root


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as fh:
        return {Path(r["run"]).name: r for r in csv.DictReader(fh)}


def test_learning_table_through_the_cli(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(console, "width", 80)
    out = tmp_path / "rep"
    result = CliRunner().invoke(app, ["report", str(runs), "--table", "learning", "--out", str(out)])
    assert result.exit_code == 0, result.output
    tables = result.output.partition("Wrote:\n")[0]
    assert max(map(len, tables.splitlines())) <= 80
    assert "1 training run(s) not complete were left out" in result.output
    rows = _rows(out / "learning.csv")
    assert set(rows) == {"a_frozenlake", "b_tictactoe", "c_bandit", "d_snake", "e_kitchen"}  # training only

    fl = rows["a_frozenlake"]
    assert (fl["env"], fl["algo"], fl["model"]) == ("frozenlake", "msgrpo", "smollm2-135m")
    assert fl["answer_format"] == 'one token after "Move:"'
    assert (fl["metric"], float(fl["before"]), float(fl["after"])) == ("success_rate", 0.0, 0.95)
    assert float(fl["after_stderr"]) == pytest.approx(math.sqrt(0.95 * 0.05 / 19))
    assert (fl["untagged_rate"], fl["minutes"], fl["iterations"]) == ("0.0", "10.0", "40")
    assert fl["command"] == "agentrl train experiment=frozenlake_learn seed=0"

    ttt = rows["b_tictactoe"]
    assert ttt["answer_format"] == "rationale + <action> tag (cot), lenient"
    assert (ttt["metric"], float(ttt["before"]), float(ttt["after"]), float(ttt["after_stderr"])) == (
        "mean_return",
        -0.5,
        0.6,
        0.1,
    )
    assert (ttt["second_metric"], float(ttt["second_before"]), float(ttt["second_after"])) == (
        "win_rate",
        0.15,
        0.75,
    )
    assert (
        ttt["command"]
        == "agentrl train experiment=rlft_tictactoe agent.cot=true \"algo.learning_rate='1e-5'\""
    )

    bandit = rows["c_bandit"]
    assert bandit["answer_format"] == "<action> tag, lenient"
    assert (bandit["metric"], float(bandit["before"]), float(bandit["after"])) == ("coverage", 0.86, 0.74)
    assert float(bandit["after_stderr"]) == 0.02 and bandit["second_metric"] == "regret"
    assert (float(bandit["second_before"]), float(bandit["second_after"])) == (5.85, 6.0)

    snake = rows["d_snake"]
    assert (snake["answer_format"], snake["model"], snake["before"]) == ("numeric observation", "-", "")
    assert (float(snake["after"]), float(snake["after_stderr"])) == (7.5, 2.1)

    kitchen = rows["e_kitchen"]
    assert (kitchen["answer_format"], kitchen["untagged_rate"]) == ("<action> tag", "")

    md = (out / "learning.md").read_text()
    assert (
        '| frozenlake | msgrpo | smollm2-135m | one token after "Move:" | success_rate | – | – | – | base model 0.000 '
        "| 0.950 ± 0.050 | – |" in md
    )
    assert "`agentrl train experiment=frozenlake_learn seed=0`" in md
    assert (
        "| kitchen | poad | smollm2-135m | <action> tag | success_rate | – | – | – | base model – | 0.000 ± 0.000 "
        "| – |  | – | 0.50 |" in md
    )
    assert "| base model 0.860 | 0.740 ± 0.020 | – | regret 5.850 → 6.000 | 0.888 | 2.0 |" in md
    assert "| base model 0.000 | 0.950 ± 0.050 | – |  | 0.000 | 10.0 |" in md
    assert "| untrained network – | 7.500 ± 2.100 |" in md
    # every row shows on the terminal with its env and algo
    for env, algo in (("frozenlake", "msgrpo"), ("tictactoe", "rlft"), ("bandit", "rlft"), ("snake", "dqn")):
        assert any(line.split()[1:3] == [env, algo] for line in tables.splitlines()), (env, algo)


def test_learning_table_without_training_runs(tmp_path):
    root = tmp_path / "outputs"
    (root / "e" / ".hydra").mkdir(parents=True)
    (root / "e" / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump({"task": "eval", "env": {"name": "snake"}})
    )
    result = CliRunner().invoke(app, ["report", str(root), "--table", "learning"])
    assert result.exit_code != 0 and "no complete training runs" in result.output


def _config(path: Path, cfg: dict) -> None:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"task={cfg['task']}"]))


def test_learning_rows_pair_the_start_and_find_baselines_on_the_same_instances(tmp_path):
    root = tmp_path / "outputs"
    env = {"name": "frozenlake", "map": "random", "size": 4, "max_steps": None}
    agent = {"name": "llm", "prefill": "", "cot": False, "lenient": False, "sampling": {"max_new_tokens": 8}}
    model = {"name": "smollm2-135m", "name_or_path": "builtin:smollm2-135m"}
    evals = {"episodes": 4, "seed_offset": 1000000}
    seeds = [1000000, 1000001, 1000002, 1000003]

    def per(success: list[int]) -> dict:
        return {"seed": seeds, "return": [float(s) for s in success], "success": success}

    trained = root / "rl"
    _config(
        trained,
        {
            "task": "train",
            "seed": 0,
            "env": env,
            "agent": agent,
            "model": model,
            "algo": {"name": "msgrpo"},
            "eval": evals,
            "init_from": "/gone/bc",
        },
    )
    after = [1, 1, 0, 1]
    before = {"episodes": 4, "success_rate": 0.25, "mean_return": 0.25, "per_episode": per([0, 1, 0, 0])}
    (trained / "eval.json").write_text(
        json.dumps(
            {
                "episodes": 4,
                "success_rate": 0.75,
                "mean_return": 0.75,
                "return_stderr": 0.25,
                "untagged_rate": 0.0,
                "per_episode": {**per(after), "seed": seeds[::-1], "success": after[::-1]},  # paired by seed
                "start": {"label": "planner BC", "run": "/gone/bc"},
                "before": before,
            }
        )
    )
    # eval runs: the three baselines on the same instances, and runs that must not count as them
    found = {"random": 0.0, "planner": 1.0, "llm": 0.05}
    for name, success in found.items():
        _config(
            root / name,
            {
                "task": "eval",
                "seed": 0,
                "env": env,
                "model": model,
                "eval": evals,
                "agent": agent if name == "llm" else {"name": name},
            },
        )
        (root / name / "eval.json").write_text(json.dumps({"episodes": 4, "success_rate": success}))
    others = {
        "random_other_seed": ({"name": "random"}, {"seed": 1}),
        "planner_fixed_map": ({"name": "planner"}, {"env": {**env, "map": "4x4"}}),
        "llm_other_format": ({**agent, "prefill": "I move"}, {}),
    }
    for name, (their_agent, changes) in others.items():
        cfg = {"task": "eval", "seed": 0, "env": env, "model": model, "eval": evals, "agent": their_agent}
        _config(root / name, {**cfg, **changes})
        (root / name / "eval.json").write_text(json.dumps({"episodes": 4, "success_rate": 0.5}))

    out = tmp_path / "rep"
    result = CliRunner().invoke(app, ["report", str(root), "--table", "learning", "--out", str(out)])
    assert result.exit_code == 0, result.output
    row = _rows(out / "learning.csv")["rl"]
    assert (row["random"], row["planner"], row["base_model"], row["start"]) == (
        "0.0",
        "1.0",
        "0.05",
        "planner BC",
    )
    assert (float(row["before"]), float(row["after"])) == (0.25, 0.75)
    # differences 1, 0, 0, 1: mean 0.5, sample std 0.577, stderr 0.289
    assert float(row["gain"]) == 0.5 and row["gain_pairs"] == "4"
    assert float(row["gain_stderr"]) == pytest.approx(math.sqrt(1 / 3) / 2)
    md = (out / "learning.md").read_text()
    assert "| 0.000 | 1.000 | 0.050 | planner BC 0.250 | 0.750 ± 0.250 | +0.500 ± 0.289 (n=4) |" in md


def test_best_rows_keep_one_run_per_env_algorithm_and_answer_format(runs, tmp_path):
    """`--best`: of two frozenlake msgrpo runs in one answer format the higher `after` is kept (whatever
    order they are found in), a run in another answer format keeps its own row, and every other group's
    single run stays; the markdown says how many runs each row was chosen from."""
    better = {
        "episodes": 20,
        "success_rate": 1.0,
        "mean_return": 1.0,
        "return_stderr": 0.0,
        "untagged_rate": 0.0,
        "train_time_s": 60.0,
        "before": {"episodes": 20, "success_rate": 0.0, "mean_return": 0.0},
    }
    prompt = "<|im_start|>assistant\nMove:"
    _run(runs, "0_frozenlake_better", "frozenlake", "msgrpo", ["seed=1"], better, prompt=prompt)
    _run(runs, "z_frozenlake_tagged", "frozenlake", "msgrpo", ["seed=2"], better, agent={"prefill": ""})
    out = tmp_path / "best"
    result = CliRunner().invoke(
        app, ["report", str(runs), "--table", "learning", "--best", "--out", str(out)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    rows = _rows(out / "learning.csv")
    assert set(rows) == {
        "0_frozenlake_better",
        "z_frozenlake_tagged",
        "b_tictactoe",
        "c_bandit",
        "d_snake",
        "e_kitchen",
    }
    md = (out / "learning.md").read_text()
    assert md.count("| frozenlake | msgrpo (best of 2) |") == 1 and md.count("(best of 1)") == 5
    everything = CliRunner().invoke(
        app, ["report", str(runs), "--table", "learning", "--out", str(tmp_path / "all")]
    )
    assert everything.exit_code == 0 and len(_rows(tmp_path / "all" / "learning.csv")) == 7


def test_best_is_refused_outside_the_learning_table(runs):
    result = CliRunner().invoke(app, ["report", str(runs), "--best"])
    assert result.exit_code == 2 and "--best applies to --table learning only" in result.output


def test_runs_from_before_observation_last_ask_as_observation_last_false():
    """A base-model eval kept from before `agent.observation_last` existed pairs with a run that sets it
    false, and not with one that sets it true: the prompt differs."""
    from agentrl.report.learning import _interface

    agent = {"history": 0, "prefill": "I move", "sampling": {"max_new_tokens": 1}}
    old = _interface({"agent": agent, "model": {"name_or_path": "m"}})
    off = _interface({"agent": {**agent, "observation_last": False}, "model": {"name_or_path": "m"}})
    on = _interface({"agent": {**agent, "observation_last": True}, "model": {"name_or_path": "m"}})
    assert old == off != on
