"""RLFT decision-making diagnostics (agentrl/diagnostics.py): each figure against hand-computed
sequences, the rationale parser on written rationales, eval.json from the CLI, an LLM agent with
chain-of-thought through evaluation, and the report's plots and tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_title_clear
from PIL import Image
from typer.testing import CliRunner

from agentrl.agents.backends import Backend
from agentrl.agents.llm import LLMAgent, TextInterface
from agentrl.cli import app
from agentrl.diagnostics import (
    decision_diagnostics,
    diagnostics_section,
    empirical_best_arms,
    has_decision_data,
    has_rationale,
    listed_moves,
    most_frequent_arms,
    move_from_rationale,
    parse_rationale,
    tictactoe_diagnostics,
    ucb_arm_from_rationale,
    ucb_optimal_arms,
)
from agentrl.envs import env_factory
from agentrl.evaluation import episode_metrics, evaluate, write_eval
from agentrl.report import build_report, find_runs, load_run, summarise_groups
from agentrl.report.diagnostics import figure_decision_curves, summarise_decisions
from agentrl.types import Episode, Generation, Step

NAMES = ["blue", "green", "red", "yellow", "purple"]


def episode(means: list[float], pulls: list[tuple[int, float] | tuple[int, float, str, bool]]) -> Episode:
    """A played bandit episode: (arm, reward[, completion text, valid]) per step."""
    names = NAMES[: len(means)]
    steps = []
    for pull in pulls:
        arm, reward = pull[0], pull[1]
        text = pull[2] if len(pull) > 2 else None
        gen = Generation("PROMPT", text, [], []) if text is not None else None
        valid = pull[3] if len(pull) > 3 else True
        steps.append(Step("obs", arm, names[arm], valid, reward, reward, gen))
    info = {"arm_means": means, "state": {"names": names, "counts": [], "sums": []}}
    return Episode(seed=0, steps=steps, truncated=True, final_info=info)


# ---- regret, coverage, greediness, frequency bias -----------------------------------------------
def test_always_the_same_arm_is_greedy_frequent_and_covers_one_arm():
    means = [0.3, 0.9, 0.5, 0.1]
    d = decision_diagnostics([episode(means, [(0, r) for r in (1.0, 0.0, 1.0, 0.0, 0.0, 1.0)])])
    # arm 0 is the only arm tried, so it is the empirical best and the most frequent before every pull
    assert d["greediness"] == {"cases": 5, "greedy": 5, "share": 1.0}
    assert d["frequency_bias"]["share"] == 1.0 and d["frequency_bias"]["chance_share"] == 0.25
    assert d["curves"]["coverage_mean"] == [0.25] * 6
    assert d["curves"]["regret_mean"] == pytest.approx([0.6 * t for t in range(1, 7)])
    assert d["final_coverage"] == {"mean": 0.25, "stderr": 0.0}
    assert d["arms"] == 4 and d["episodes"] == 1 and d["steps"] == 6 and "knowing_doing" not in d
    # counts 1, 2-3, 4-7 of arm 0 before pulls 2..6: 1 | 2 3 | 4 5
    bins = {b["bin"]: (b["cases"], b["repeats"]) for b in d["frequency_bias"]["bins"]}
    assert bins == {"1": (1, 1), "2-3": (2, 2), "4-7": (2, 2), "8-15": (0, 0), "16+": (0, 0)}


def test_round_robin_covers_every_arm_after_k_steps_and_regret_sums_the_gaps():
    means = [0.2, 0.5, 0.9]
    d = decision_diagnostics([episode(means, [(t % 3, 0.0) for t in range(6)])])
    assert d["curves"]["step"] == [1, 2, 3, 4, 5, 6]
    assert d["curves"]["coverage_mean"] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0])
    # gaps 0.7, 0.4, 0 per round
    assert d["curves"]["regret_mean"] == pytest.approx([0.7, 1.1, 1.1, 1.8, 2.2, 2.2])
    assert d["final_regret"]["mean"] == pytest.approx(2.2)


def test_mixed_sequence_matches_hand_count_and_the_env():
    # the sequence of test_bandit's episode-metrics test: arm 0 pays 1, the others 0
    d = decision_diagnostics([episode([1.0, 0.0, 0.0], [(1, 0), (2, 0), (1, 0), (0, 1), (0, 1), (0, 1)])])
    # greedy (already tried, best mean so far) at pulls 3, 5, 6; most frequent so far at pulls 3 and 6
    assert d["greediness"]["greedy"] == 3 and d["greediness"]["share"] == pytest.approx(0.6)
    freq = d["frequency_bias"]
    assert freq["repeats"] == 2 and freq["share"] == pytest.approx(0.4)
    bins = {b["bin"]: b for b in freq["bins"]}
    # pulls 2-3: top count 1 (tied arms {1} then {1, 2}); pulls 4-6: top count 2 ({1}, {1}, {0, 1})
    assert (bins["1"]["cases"], bins["1"]["repeats"]) == (2, 1)
    assert bins["1"]["chance_share"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert (bins["2-3"]["cases"], bins["2-3"]["repeats"]) == (3, 1)
    assert bins["2-3"]["chance_share"] == pytest.approx((1 / 3 + 1 / 3 + 2 / 3) / 3)
    assert d["curves"]["regret_mean"][-1] == pytest.approx(3.0)


def test_curves_average_over_episodes_with_stderr():
    a = episode([0.0, 1.0], [(0, 0.0), (0, 0.0)])  # regret 1, 2
    b = episode([0.0, 1.0], [(1, 1.0), (1, 1.0)])  # regret 0, 0
    d = decision_diagnostics([a, b])
    assert d["curves"]["regret_mean"] == [0.5, 1.0]
    assert d["curves"]["regret_stderr"] == pytest.approx([0.5, 1.0])  # sample std / sqrt(2)
    assert d["curves"]["episodes"] == [2, 2] and d["curves"]["coverage_mean"] == [0.5, 0.5]


def test_means_that_change_per_step():
    ep = episode([0.0, 0.0], [(0, 1.0), (1, 0.0), (1, 1.0)])
    # a contextual bandit: the means each pull was drawn from; the final arm_means are the next context's
    ep.final_info = {
        "arm_means": [5.0, 0.0],
        "step_arm_means": [[0.9, 0.1], [0.9, 0.1], [0.2, 0.7]],
        "state": {"arm_names": ["blue", "green"]},
    }
    d = decision_diagnostics([ep])
    assert d["curves"]["regret_mean"] == pytest.approx([0.0, 0.8, 0.8])
    ep.final_info.pop("step_arm_means")  # arm_means of the next context alone: no regret curve to draw
    assert not has_decision_data(ep) and decision_diagnostics([ep]) is None


def test_set_helpers_and_episodes_without_decision_data():
    assert empirical_best_arms([0, 2, 1], [0.0, 1.0, 0.5]) == {1, 2}  # ties count, untried arm 0 never
    assert empirical_best_arms([0, 0], [0.0, 0.0]) == set()
    assert ucb_optimal_arms([1, 0, 2], [1.0, 0.0, 2.0]) == {1}  # an untried arm has infinite UCB
    # t = 4, c = 2: 0.6 + sqrt(2 ln 4 / 2) = 1.777 < 0.5 + sqrt(2 ln 4) = 2.165
    assert ucb_optimal_arms([2, 1, 1], [1.2, 0.5, 0.1], c=2.0) == {1}
    assert ucb_optimal_arms([2, 1, 1], [1.2, 0.5, 0.1], c=0.01) == {0}
    assert most_frequent_arms([1, 2, 1, 0, 0]) == ({0, 1}, 2) and most_frequent_arms([]) == (set(), 0)
    plain = Episode(seed=0, steps=[Step("obs", 0, "left", True, 0.0, 0.0)], final_info={"state": {}})
    assert not has_decision_data(plain) and decision_diagnostics([plain]) is None


# ---- the rationale parser -------------------------------------------------------------------------
RATIONALES = [
    (
        "<think>UCB: blue 0.9, red 1.4, green 1.1. Red has the highest UCB, so I press red.</think>",
        "red",
        "ucb",
    ),
    (
        "<think>Green has the highest UCB (1.6). But blue has the best mean, so I'll press blue.</think>",
        "green",
        "ucb",
    ),
    ("<think>The UCB of yellow is highest right now.</think><action>blue</action>", "yellow", "ucb"),
    ("<think>Purple is untried, so its UCB is infinite. I should try it.</think>", "purple", "ucb"),
    (
        "<think>The arm that maximises the upper confidence bound is purple: 0.5 + 1.07.</think>",
        "purple",
        "ucb",
    ),
    ("<think>The UCB-optimal arm is yellow rather than blue.</think>", "yellow", "ucb"),
    (
        "<think>I should press the green button, not the blue button.</think><action>green</action>",
        "green",
        "intent",
    ),
    ("<think>Blue is not the best button; the best button is green.</think>", "green", "intent"),
    ("I'd go with red instead of green. <action>red</action>", "red", "intent"),
    (
        "<think>Blue paid 1 three times. I should not press red again.</think><action>red</action>",
        "blue",
        "fallback",
    ),
    ("<think>All buttons look similar to me.</think><action>blue</action>", None, "none"),
    ("<think>Not the blue button.</think><action>blue</action>", None, "none"),
    ("<think>Bluebird is not a button.</think>", None, "none"),
]


@pytest.mark.parametrize(("text", "arm", "rule"), RATIONALES)
def test_rationale_parser(text, arm, rule):
    assert parse_rationale(text, NAMES) == (arm, rule)
    assert ucb_arm_from_rationale(text, NAMES) == arm


def test_bare_answers_are_no_rationale():
    assert (
        not has_rationale("blue") and not has_rationale("<action>blue</action>") and not has_rationale(None)
    )
    assert has_rationale("<think>blue</think><action>blue</action>") and has_rationale("I pick blue now")
    plain = episode([0.2, 0.8], [(0, 1.0, "<action>blue</action>"), (1, 0.0, " green")])
    assert "knowing_doing" not in decision_diagnostics([plain])


def test_parser_reads_reasoning_not_the_answer_tag_and_can_skip_the_fallback():
    assert ucb_arm_from_rationale("<action>blue</action>", NAMES) is None
    assert parse_rationale("<think>blue 0.3 and red 0.6", NAMES, fallback=False) == (None, "none")
    assert ucb_arm_from_rationale("<think>RED HAS THE HIGHEST UCB", NAMES) == "red"  # unclosed, any case


# ---- the knowing-doing gap ------------------------------------------------------------------------
def test_knowing_doing_gap_on_a_written_episode():
    # arms blue, green, red; rewards are the arm's fixed payout so UCB1 (c = 2) is computed by hand
    pulls = [
        (0, 0.6, "I'll start with blue."),  # every arm untried: not judged
        (1, 0.5, "Green has not been tried, its UCB is infinite; I should try green."),  # knows, does
        (2, 0.1, "<think>Red is untried so red has the highest UCB.</think><action>red</action>"),  # knows
        # t = 3, all n = 1: UCB arm = empirical best = blue; names green: does not know, does
        (0, 0.6, "<think>green has the highest UCB</think><action>blue</action>"),
        # counts 2,1,1: UCB arm green (2.165 > 1.777, 1.765), empirical best blue: knows, acts greedily
        (0, 0.6, "<think>Green has the highest UCB, but blue has the best mean so I'll press blue.</think>"),
        # counts 3,1,1: green 2.294 > red 1.894 > blue 1.636: knows, does
        (1, 0.5, "<think>The UCB-optimal button is green, not blue.</think>"),
        # counts 3,2,1: red 1.993 > green 1.839 > blue 1.693; nothing named: does not know, does
        (2, 0.1, "<think>All buttons look similar.</think>"),
        (0, 0.6, "I think maybe purple", False),  # invalid: the env played a fallback arm, not judged
    ]
    d = decision_diagnostics([episode([0.6, 0.5, 0.1], pulls)], ucb_c=2.0)
    kd = d["knowing_doing"]
    assert (kd["steps_with_rationale"], kd["judged"], kd["skipped_invalid"]) == (8, 6, 1)
    assert (kd["knowing"], kd["knowing_doing"], kd["knowing_greedy"]) == (4, 3, 1)
    assert (kd["not_knowing"], kd["not_knowing_doing"], kd["parsed"]) == (2, 2, 5)
    assert kd["parsed_by"] == {"ucb": 5, "intent": 0, "fallback": 0}
    assert kd["knowing_rate"] == pytest.approx(4 / 6)
    assert kd["doing_given_knowing"] == pytest.approx(3 / 4)
    assert kd["greedy_given_knowing"] == pytest.approx(1 / 4)
    assert kd["other_given_knowing"] == 0.0 and kd["doing_given_not_knowing"] == 1.0


class KnowsButGreedy(Backend):
    """A chat backend that knows UCB1 and acts greedily: it presses the first button every time, and
    from the second pull on its rationale names the second button, untried and so UCB-optimal."""

    chat_input = True

    def generate(self, prompts, sampling, *, seed=None):
        raise NotImplementedError

    def generate_chat(self, conversations, sampling, *, prefill="", seed=None):
        replies = []
        for system, user in conversations:
            first, second = system["content"].split("buttons labeled ")[1].split(", ")[:2]
            named = first if "No button has been pressed yet" in user["content"] else second
            text = f"<think>The {named} button has the highest UCB.</think><action>{first}</action>"
            replies.append((text, [], None))
        return replies


def test_llm_agent_with_rationales_through_evaluation(tmp_path):
    make_env = env_factory({"name": "bandit", "arms": 3, "horizon": 8})
    agent = LLMAgent(TextInterface(cot=True), KnowsButGreedy())
    metrics, episodes = evaluate(make_env, agent, [11, 12])
    write_eval(tmp_path, metrics, episodes, ucb_c=1.0, env="bandit", agent="llm")
    d = json.loads((tmp_path / "eval.json").read_text())["diagnostics"]
    kd = d["knowing_doing"]
    # pulls 2..8 of both episodes are judged (the first has every arm UCB-optimal)
    assert d["ucb_c"] == 1.0 and kd["judged"] == 2 * 7 and kd["parsed_by"]["ucb"] == 14
    assert (kd["knowing"], kd["knowing_doing"], kd["knowing_greedy"]) == (14, 0, 14)
    assert (
        kd["knowing_rate"] == 1.0 and kd["doing_given_knowing"] == 0.0 and kd["greedy_given_knowing"] == 1.0
    )
    assert kd["doing_given_not_knowing"] is None
    assert d["greediness"]["share"] == 1.0 and d["final_coverage"]["mean"] == pytest.approx(1 / 3)


def test_agrees_with_the_env_episode_metrics():
    from agentrl.agents.baselines import RandomAgent

    metrics, episodes = evaluate(env_factory({"name": "bandit", "horizon": 20}), RandomAgent(), [1, 2, 3, 4])
    d = decision_diagnostics(episodes)
    assert d["final_regret"]["mean"] == pytest.approx(metrics["mean_regret"])
    assert d["final_coverage"]["mean"] == pytest.approx(metrics["mean_action_coverage"])
    # equal-length episodes: the pooled share is the mean of the per-episode shares
    assert d["greediness"]["share"] == pytest.approx(metrics["mean_greedy_share"])
    assert d["frequency_bias"]["share"] == pytest.approx(metrics["mean_frequency_share"])
    assert episode_metrics(episodes) == metrics


# ---- eval.json from the CLI and the report ---------------------------------------------------------
def _eval_cli(run: Path, agent: str) -> dict[str, Any]:
    args = ["eval", "env=bandit", f"agent={agent}", "eval.episodes=3", f"hydra.run.dir={run}"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((run / "eval.json").read_text())


def test_the_decision_plots_title_stays_clear_of_its_legend(tmp_path):
    """A long title (every entry's shared overrides) is wrapped beside the legend, not under it."""
    import matplotlib.pyplot as plt

    shared = ["env.reward=gaussian", "env.gaussian_sd=0.5", "env.horizon=12", "env.history=12"]
    for agent in ("planner", "random"):
        args = ["eval", "env=bandit", f"agent={agent}", *shared, "eval.episodes=2"]
        result = CliRunner().invoke(app, [*args, f"hydra.run.dir={tmp_path / 'runs' / agent}"])
        assert result.exit_code == 0, result.output
    groups = summarise_groups([load_run(p) for p in find_runs([tmp_path / "runs"])])
    fig = figure_decision_curves(summarise_decisions(groups), "bandit")
    try:
        assert "env.gaussian_sd=0.5" in fig.get_suptitle()
        assert_title_clear(fig)
    finally:
        plt.close(fig)


def test_eval_json_and_report(tmp_path):
    data = _eval_cli(tmp_path / "runs" / "planner", "planner")
    _eval_cli(tmp_path / "runs" / "random", "random")
    d = data["diagnostics"]
    assert d["episodes"] == 3 and d["ucb_c"] == 2.0 and len(d["curves"]["regret_mean"]) == 50
    assert d["curves"]["episodes"] == [3] * 50 and "knowing_doing" not in d
    # UCB1 tries each of the 5 arms once first, lowest index first
    assert d["curves"]["coverage_mean"][:6] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert d["final_regret"]["mean"] == pytest.approx(data["mean_regret"])

    report = build_report([tmp_path / "runs"], out_dir=tmp_path / "report")
    png = tmp_path / "report" / "decisions_bandit.png"
    assert png in report.plots
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > 800
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Decision-making diagnostics" in md and "| planner | 3 |" in md  # eval.episodes: no variant

    groups = summarise_groups([load_run(p) for p in find_runs([tmp_path / "runs"])])
    summaries = summarise_decisions(groups)
    fig = figure_decision_curves(summaries, "bandit")
    regret_ax, coverage_ax = fig.axes
    assert "regret" in regret_ax.get_ylabel() and "coverage" in coverage_ax.get_ylabel()
    assert "step" in regret_ax.get_xlabel() and len(regret_ax.lines) == len(coverage_ax.lines) == 2
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(label.startswith("planner") for label in labels) and any("random" in x for x in labels)
    planner = next(s for s in summaries if s.group.agent == "planner")
    assert planner.regret[0][-1] == pytest.approx(d["final_regret"]["mean"])
    assert math.isclose(planner.regret[1][-1], d["final_regret"]["stderr"], rel_tol=1e-5)


# ---- tic-tac-toe: optimal moves and the knowing-doing gap ----------------------------------------
def game(moves: list[tuple[str, int] | tuple[str, int, str, bool]], mark: str = "X") -> Episode:
    """A tic-tac-toe episode: (board before the move as 9 chars, "." empty, cell played 1-9[, completion
    text, valid]) per agent step."""
    steps, boards = [], []
    for move in moves:
        board, cell = move[0], move[1]
        text = move[2] if len(move) > 2 else None
        gen = Generation("PROMPT", text, [], []) if text is not None else None
        valid = move[3] if len(move) > 3 else True
        steps.append(Step("obs", cell - 1, str(cell), valid, 0.0, 0.0, gen))
        boards.append(["" if c == "." else c for c in board])
    info = {"step_boards": boards, "state": {"board": boards[-1], "agent_mark": mark, "to_move": ""}}
    return Episode(seed=0, steps=steps, terminated=True, final_info=info)


#: X (to move) has 1 and 2 and wins at 3; O has 4 and 5 and threatens 6
FORCED_WIN = "XX.OO...."


def test_tictactoe_knows_the_winning_cell_but_plays_another():
    text = "<think>The valid actions are 3, 6, 7, 8, 9. I choose 3.</think>\n<action>6</action>"
    d = tictactoe_diagnostics([game([(FORCED_WIN, 6, text)])])
    kd = d["knowing_doing"]
    assert (d["steps"], d["optimal_moves"], d["optimal_move_rate"]) == (1, 0, 0.0)
    assert (kd["judged"], kd["knowing"], kd["doing"], kd["knowing_doing"], kd["agree"]) == (1, 1, 0, 0, 0)
    assert kd["knowing_rate"] == 1.0 and kd["doing_rate"] == 0.0 and kd["doing_given_knowing"] == 0.0
    assert kd["agreement_rate"] == 0.0 and kd["reads_board_rate"] == 1.0
    assert kd["parsed_by"] == {"intent": 1} and kd["doing_given_not_knowing"] is None


def test_tictactoe_fallback_and_trivial_steps_are_not_judged():
    moves = [
        (".........", 5, "<think>The valid actions are 1, 2, 3. I choose 5.</think>"),  # every move draws
        (FORCED_WIN, 3, "I think maybe the top right corner", False),  # the env played its fallback
    ]
    d = tictactoe_diagnostics([game(moves)])
    kd = d["knowing_doing"]
    assert (kd["steps_with_rationale"], kd["judged"]) == (2, 0)
    assert (kd["skipped_trivial"], kd["skipped_invalid"]) == (1, 1)
    assert kd["knowing_rate"] is None and kd["lists_moves"] == 0
    # the fallback landed on the winning cell, but an invalid answer is no optimal move of the agent
    assert (d["optimal_moves"], d["optimal_move_rate"]) == (1, 0.5)
    assert (d["decisive_steps"], d["decisive_optimal_move_rate"]) == (1, 0.0)


def test_tictactoe_rationale_that_misreads_the_board():
    legal = ["3", "6", "7", "8", "9"]
    wrong = "<think>Legal moves: 3, 4 and 7. I will play 3.</think><action>3</action>"
    assert listed_moves(wrong) == {"3", "4", "7"} and move_from_rationale(wrong, legal) == ("3", "intent")
    assert listed_moves("no list here: 3 is best") is None
    assert move_from_rationale("<think>Maybe 1 or 9, but 7 looks good</think>", legal) == ("7", "fallback")
    moves = [(FORCED_WIN, 3, wrong), (FORCED_WIN, 3, "<think>The best move is 3.</think><action>3</action>")]
    kd = tictactoe_diagnostics([game(moves)])["knowing_doing"]
    assert (kd["judged"], kd["lists_moves"], kd["reads_board"], kd["reads_board_rate"]) == (2, 1, 0, 0.0)
    assert kd["knowing_rate"] == kd["doing_given_knowing"] == kd["agreement_rate"] == 1.0


def test_tictactoe_optimal_move_rate_of_a_game():
    as_x = [
        (".........", 5),  # every opening move draws under perfect play: all are optimal
        ("X.O.X.O..", 2),  # 2 still wins by force, but 9 wins now: a slower win is not optimal
        (FORCED_WIN, 3),  # the win
        (FORCED_WIN, 7),  # O then wins at 6
    ]
    as_o = [("O...X...X", 3), ("O...X...X", 2)]  # 3 and 7 hold the draw; 2 loses
    d = tictactoe_diagnostics([game(as_x), game(as_o, mark="O")])
    assert (d["episodes"], d["steps"], d["optimal_moves"], d["optimal_move_rate"]) == (2, 6, 3, 0.5)
    # the opening is not decisive
    assert (d["decisive_steps"], d["decisive_optimal_moves"], d["decisive_optimal_move_rate"]) == (5, 2, 0.4)
    assert "knowing_doing" not in d
    bandit = episode([0.5, 0.4], [(0, 1.0)])  # no boards: not a game
    assert tictactoe_diagnostics([bandit]) is None and diagnostics_section([game(as_o, mark="O")]) == {
        "episodes": 1,
        "steps": 2,
        "optimal_moves": 1,
        "decisive_steps": 2,
        "decisive_optimal_moves": 1,
        "optimal_move_rate": 0.5,
        "decisive_optimal_move_rate": 0.5,
    }


def test_tictactoe_eval_json_has_the_move_diagnostics(tmp_path):
    from agentrl.agents.baselines import PlannerAgent, RandomAgent

    make_env = env_factory({"name": "tictactoe", "opponent": "random"})
    for name, agent in (("random", RandomAgent()), ("planner", PlannerAgent("tictactoe"))):
        metrics, episodes = evaluate(make_env, agent, [1, 2, 3, 4])
        write_eval(tmp_path / name, metrics, episodes, env="tictactoe", agent=name)
        d = json.loads((tmp_path / name / "eval.json").read_text())["diagnostics"]
        assert d["episodes"] == 4 and d["steps"] == sum(e.length for e in episodes)
        assert "knowing_doing" not in d and "curves" not in d
        if name == "planner":
            assert d["optimal_move_rate"] == 1.0
        else:
            assert 0.0 < d["optimal_move_rate"] < 1.0


class NamesFirstPlaysLast(Backend):
    """A chat backend that reads the legal moves off the board it is shown, writes the warm-up's
    rationale naming the first of them and answers with the last."""

    chat_input = True

    def generate(self, prompts, sampling, *, seed=None):
        raise NotImplementedError

    def generate_chat(self, conversations, sampling, *, prefill="", seed=None):
        replies = []
        for _, user in conversations:
            legal = user["content"].rsplit("Legal moves: ", 1)[1].split("\n")[0].split(", ")
            think = f"<think>The valid actions are {', '.join(legal)}. I choose {legal[0]}.</think>"
            replies.append((f"{think}\n<action>{legal[-1]}</action>", [], None))
        return replies


def test_tictactoe_llm_rationales_through_evaluation(tmp_path):
    agent = LLMAgent(TextInterface(cot=True), NamesFirstPlaysLast())
    metrics, episodes = evaluate(env_factory({"name": "tictactoe"}), agent, [5, 6, 7])
    write_eval(tmp_path, metrics, episodes, env="tictactoe", agent="llm")
    kd = json.loads((tmp_path / "eval.json").read_text())["diagnostics"]["knowing_doing"]
    steps = sum(e.length for e in episodes)
    assert kd["steps_with_rationale"] == steps and kd["skipped_invalid"] == 0
    assert kd["judged"] + kd["skipped_trivial"] == steps and kd["judged"] > 0
    # every list is the board the agent was shown; a pick is never the move when there is a choice
    assert kd["reads_board_rate"] == 1.0 and kd["parsed_by"] == {"intent": kd["judged"]}
    assert kd["agreement_rate"] == 0.0
