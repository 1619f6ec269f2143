"""Kitchen env: the rules on hand-played episodes, the planner, the numeric view, config and the CLI."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from omegaconf import OmegaConf
from typer.testing import CliRunner

from agentrl.agents.baselines import PlannerAgent, RandomAgent
from agentrl.agents.llm import TextInterface
from agentrl.agents.planning_kitchen import kitchen_action
from agentrl.cli import app
from agentrl.config import compose_config, typed
from agentrl.config.env import KITCHEN_TASKS
from agentrl.envs import NumericObservation, env_factory, make_env
from agentrl.envs.kitchen import (
    ACTION_NAMES,
    HELD,
    HELD_CHOPPED,
    PLATE,
    TASK_NAMES,
    KitchenEnv,
    KitchenState,
    action_values,
    optimal_actions,
)
from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.rollout import rollout
from agentrl.types import StepContext

CONF = Path(__file__).resolve().parents[1] / "agentrl" / "conf" / "env"
runner = CliRunner()

# The paper's rewards written out here (not imported), so a changed constant in the env fails a test.
STEP, SUBTASK, SERVE, WRONG = -0.001, 0.2, 1.0, -0.1
RECIPES = {
    "tomato_salad": ["tomato"],
    "tomato_lettuce_salad": ["tomato", "lettuce"],
    "tomato_lettuce_onion_salad": ["tomato", "lettuce", "onion"],
}


def _optimal_script(recipe: list[str]) -> list[str]:
    script = []
    for x in recipe:
        script += [f"pick up the {x}", f"chop the {x}", f"put the {x} on the plate"]
    return [*script, "deliver the plate"]


def _play(env: KitchenEnv, actions: list[str]) -> list[tuple[float, bool, bool, dict]]:
    results = []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        results.append((reward, terminated, truncated, info))
    return results


def _ctx(env: KitchenEnv) -> StepContext:
    return StepContext(env, env.render_text(), env._info(False), [], np.random.default_rng(0), 0)


def _plan_and_play(env: KitchenEnv, limit: int = 30) -> tuple[list[str], float, dict]:
    """Play the planner from the env's current state to the end; (actions, return, final info)."""
    actions, total, info = [], 0.0, {}
    for _ in range(limit):
        action = kitchen_action(_ctx(env), ucb_c=2.0)  # foreign options are ignored
        _, reward, terminated, truncated, info = env.step(action)
        actions.append(ACTION_NAMES[action])
        total += reward
        if terminated or truncated:
            break
    return actions, total, info


# ---- rules ---------------------------------------------------------------------------------------
def test_actions_are_multi_word_phrases_of_different_lengths():
    assert len(ACTION_NAMES) == 10 and len(set(ACTION_NAMES)) == 10
    assert ACTION_NAMES[:3] == ["pick up the tomato", "chop the tomato", "put the tomato on the plate"]
    assert ACTION_NAMES[-1] == "deliver the plate"
    assert {len(a.split()) for a in ACTION_NAMES} == {3, 4, 6}


@pytest.mark.parametrize("task", TASK_NAMES)
def test_optimal_play_earns_every_subtask_and_the_delivery(task):
    recipe = RECIPES[task]
    env = KitchenEnv(task=task)
    env.reset(seed=0)
    results = _play(env, _optimal_script(recipe))
    rewards = [r for r, *_ in results]
    expected = [STEP, STEP + SUBTASK, STEP + SUBTASK] * len(recipe) + [STEP + SERVE]
    assert rewards == pytest.approx(expected, abs=1e-12)
    assert sum(rewards) == pytest.approx(1.0 + 0.4 * len(recipe) - 0.001 * (3 * len(recipe) + 1))
    assert all(not te and not tr for _, te, tr, _ in results[:-1])
    _, terminated, truncated, info = results[-1]
    assert terminated and not truncated and info["success"] and info["event"] == "deliver"
    state = info["state"]
    assert state["delivered"] and state["plate"] == recipe and state["holding"] is None
    assert state["chop_rewarded"] == recipe == state["plate_rewarded"]
    assert info["episode_metrics"] == {"subtask_rate": 1.0, "wrong_deliveries": 0.0}
    assert "The salad is served." in env.render_text()


def test_wrong_delivery_costs_point_one_and_returns_the_plate_whole():
    env = KitchenEnv(task="tomato_lettuce_salad")
    env.reset(seed=0)
    results = _play(env, _optimal_script(["tomato"]))  # only the tomato, then serve
    assert [r for r, *_ in results] == pytest.approx([STEP, STEP + SUBTASK, STEP + SUBTASK, STEP + WRONG])
    _, terminated, truncated, info = results[-1]
    assert not terminated and not truncated and not info["success"] and info["event"] == "wrong_delivery"
    assert info["state"]["ingredients"]["tomato"] == "counter" and info["state"]["plate"] == []
    assert info["state"]["wrong_deliveries"] == 1 and info["episode_metrics"]["wrong_deliveries"] == 1.0
    assert "Wrong delivery" in env.render_text()
    # The tomato is whole again: chopping and plating it a second time pays only the step penalty.
    results = _play(env, _optimal_script(["tomato", "lettuce"]))
    rewards = [r for r, *_ in results]
    assert rewards == pytest.approx([STEP] * 4 + [STEP + SUBTASK] * 2 + [STEP + SERVE])
    assert results[-1][1] and results[-1][3]["success"]


def test_distractor_earns_nothing_and_an_empty_plate_is_a_wrong_delivery():
    env = KitchenEnv(task="tomato_salad")
    env.reset(seed=0)
    rewards = [r for r, *_ in _play(env, ["deliver the plate", *_optimal_script(["onion"])])]
    assert rewards == pytest.approx([STEP + WRONG, STEP, STEP, STEP, STEP + WRONG])
    assert env.state()["wrong_deliveries"] == 2 and env.state()["ingredients"]["onion"] == "counter"


def test_holding_a_chopped_item_survives_a_wrong_delivery():
    env = KitchenEnv(task="tomato_lettuce_salad")
    env.reset(seed=0)
    _play(env, ["pick up the tomato", "chop the tomato"])
    _, reward, *_ = env.step("deliver the plate")
    assert reward == pytest.approx(STEP + WRONG) and env.state()["ingredients"]["tomato"] == HELD_CHOPPED


@pytest.mark.parametrize(
    "setup,useless",
    [
        ([], "chop the tomato"),  # chop without holding
        ([], "put the lettuce on the plate"),  # nothing chopped in hand
        (["pick up the tomato"], "pick up the onion"),  # hands full
        (["pick up the tomato"], "put the tomato on the plate"),  # the tomato is still whole
        (["pick up the tomato"], "chop the lettuce"),  # chop what you do not hold
        (["pick up the tomato", "chop the tomato"], "chop the tomato"),  # already chopped
        (_optimal_script(["tomato"])[:3], "pick up the tomato"),  # the tomato is on the plate
    ],
)
def test_useless_actions_cost_only_the_step_penalty(setup, useless):
    env = KitchenEnv(task="tomato_lettuce_salad")
    env.reset(seed=0)
    _play(env, setup)
    before, numeric = env.state(), env.numeric_observation()
    obs, reward, terminated, truncated, info = env.step(useless)
    assert reward == pytest.approx(STEP) and not terminated and not truncated
    assert info["event"] == "nothing" and "Nothing happened" in obs
    after = env.state()
    assert {**after, "steps_left": None} == {**before, "steps_left": None}
    assert after["steps_left"] == before["steps_left"] - 1
    assert np.array_equal(env.numeric_observation(), numeric)


def test_truncation_at_max_steps():
    env = KitchenEnv(task="tomato_salad", max_steps=3)
    env.reset(seed=0)
    results = _play(env, _optimal_script(["tomato"])[:3])
    assert [(te, tr) for _, te, tr, _ in results] == [(False, False), (False, False), (False, True)]
    assert not results[-1][3]["success"] and results[-1][3]["state"]["steps_left"] == 0
    assert results[-1][3]["episode_metrics"]["subtask_rate"] == 1.0  # chopped and plated, never served
    env = KitchenEnv(task="tomato_salad", max_steps=4)  # exactly enough
    env.reset(seed=0)
    _, terminated, truncated, info = _play(env, _optimal_script(["tomato"]))[-1]
    assert terminated and not truncated and info["success"]


def test_seed_orders_the_counter_only():
    orders, returns = set(), set()
    for seed in range(12):
        env = KitchenEnv(task="tomato_lettuce_salad")
        obs, info = env.reset(seed=seed)
        assert env.reset(seed=seed)[0] == obs  # same seed, same observation
        orders.add(tuple(info["state"]["counter"]))
        returns.add(round(sum(r for r, *_ in _play(env, _optimal_script(["lettuce", "tomato"]))), 9))
    assert len(orders) > 1 and all(sorted(o) == ["lettuce", "onion", "tomato"] for o in orders)
    assert returns == {1.793}


def test_observation_and_instructions_text():
    env = KitchenEnv(task="tomato_lettuce_salad", max_steps=15)
    obs, _ = env.reset(seed=0)
    assert obs.startswith("Recipe: tomato and lettuce salad (chopped tomato, chopped lettuce).")
    assert "You hold: nothing." in obs and "Plate: nothing." in obs
    obs, *_ = env.step("pick up the lettuce")
    assert "You hold: a whole lettuce." in obs and "Last action: pick up the lettuce." in obs
    _play(env, ["chop the lettuce", "put the lettuce on the plate"])
    assert "Plate: chopped lettuce." in env.render_text()
    text = env.instructions
    assert "The onion is not in the recipe." in text and "at most 15 actions" in text
    for phrase in ("+0.2", "+1", "-0.1", "-0.001", *ACTION_NAMES):
        assert phrase in text


def test_stepping_after_the_delivery_changes_nothing():
    env = KitchenEnv()
    env.reset(seed=0)
    _play(env, _optimal_script(["tomato"]))
    _, reward, terminated, _, info = env.step("deliver the plate")
    assert (reward, terminated, info["success"]) == (0.0, True, True)


def test_default_action_is_a_fixed_harmless_pick_up():
    env = KitchenEnv(task="tomato_lettuce_onion_salad")
    env.reset(seed=0)
    assert ACTION_NAMES[env.default_action()] == "pick up the tomato"


@pytest.mark.parametrize(
    "kwargs,error", [({"task": "soup"}, UnknownChoiceError), ({"max_steps": 0}, ConfigError)]
)
def test_bad_arguments_raise_config_errors(kwargs, error):
    with pytest.raises(error):
        make_env("kitchen", **kwargs)


# ---- gymnasium and the numeric view --------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")
@pytest.mark.parametrize("task", TASK_NAMES)
def test_check_env_passes(task):
    check_env(make_env("kitchen", task=task), skip_render_check=True)
    check_env(NumericObservation(make_env("kitchen", task=task)), skip_render_check=True)


def test_numeric_view_follows_the_state():
    env = KitchenEnv(task="tomato_lettuce_salad")
    env.reset(seed=0)
    first = env.numeric_observation()
    assert first.dtype == np.float32 and first.shape == (21,) and env.numeric_space().contains(first)
    rows = first.reshape(3, 7)
    assert rows[:, 0].tolist() == [1, 1, 1] and rows[:, 4].tolist() == [1, 1, 0]  # on counter; in recipe
    seen = {first.tobytes()}
    for action in _optimal_script(["tomato"])[:3]:
        env.step(action)
        seen.add(env.numeric_observation().tobytes())
    assert len(seen) == 4  # every productive step changes the view
    tomato = env.numeric_observation().reshape(3, 7)[0]
    assert tomato.tolist() == [0, 0, 0, 1, 1, 1, 1]  # on the plate, in the recipe, both rewards paid
    wrapped = NumericObservation(KitchenEnv(task="tomato_lettuce_onion_salad"))
    obs, _ = wrapped.reset(seed=0)
    assert wrapped.observation_space.contains(obs) and obs.reshape(3, 7)[:, 4].sum() == 3


# ---- the planner ---------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASK_NAMES)
def test_planner_solves_every_task_optimally(task):
    episodes = rollout(lambda: make_env("kitchen", task=task), PlannerAgent("kitchen", ucb_c=2.0), range(3))
    n = len(RECIPES[task])
    for episode in episodes:
        assert episode.final_info["success"]
        assert episode.episode_return == pytest.approx(1.0 + 0.4 * n - 0.001 * (3 * n + 1))
        assert [s.action_name for s in episode.steps] == _optimal_script(RECIPES[task])


def test_planner_repairs_a_distractor_in_hand():
    env = KitchenEnv(task="tomato_salad")
    env.reset(seed=0)
    env.step("pick up the onion")
    actions, total, info = _plan_and_play(env)
    # The onion leaves the hand only by chopping and plating it; one wrong delivery clears the plate
    # (serving it before or after chopping the tomato costs the same, so ties go to the lower action).
    assert actions[:2] == ["chop the onion", "put the onion on the plate"] and len(actions) == 7
    assert info["state"]["wrong_deliveries"] == 1 and info["success"]
    assert total == pytest.approx(7 * STEP + WRONG + 2 * SUBTASK + SERVE)


def test_planner_serves_the_wrong_plate_before_plating_the_recipe():
    env = KitchenEnv(task="tomato_salad")
    env.reset(seed=0)
    # A chopped lettuce on the plate and a chopped tomato in hand: serving first keeps the tomato chopped.
    env.kitchen = KitchenState(status=(HELD_CHOPPED, PLATE, "counter"), chop_rewarded=frozenset({"tomato"}))
    env.plate_order = ["lettuce"]
    actions, total, info = _plan_and_play(env)
    assert actions == ["deliver the plate", "put the tomato on the plate", "deliver the plate"]
    assert total == pytest.approx(STEP + WRONG + STEP + SUBTASK + STEP + SERVE) and info["success"]


def test_planner_with_too_few_steps_still_collects_subtasks():
    env = KitchenEnv(task="tomato_lettuce_salad", max_steps=3)
    env.reset(seed=0)
    env.kitchen = KitchenState(status=(HELD, "counter", "counter"))
    actions, total, info = _plan_and_play(env)
    # Three steps cannot finish the salad: chop and plate the tomato (+0.4), never a wrong delivery.
    assert (
        actions[:2] == ["chop the tomato", "put the tomato on the plate"]
        and "deliver the plate" not in actions
    )
    assert total == pytest.approx(2 * SUBTASK + 3 * STEP) and not info["success"]


@pytest.mark.parametrize("task", TASK_NAMES)
def test_planner_return_matches_its_value_from_random_states(task):
    """From states reached by random prefixes, the planner's realised return is the value its dynamic
    programme predicts, and with the 19 or more steps left it always serves the salad."""
    rng = np.random.default_rng(1)
    recipe = frozenset(RECIPES[task])
    for _ in range(20):
        env = KitchenEnv(task=task, max_steps=30)
        env.reset(seed=0)
        for action in rng.integers(len(ACTION_NAMES), size=int(rng.integers(0, 12))):
            if env.step(int(action))[2]:
                break
        if env.delivered:
            continue
        predicted = max(action_values(recipe, env.kitchen, env.max_steps - env.steps_taken)) / 1000
        _, total, info = _plan_and_play(env)
        assert total == pytest.approx(predicted) and info["success"]


def test_planner_beats_random():
    make = lambda: make_env("kitchen", task="tomato_lettuce_salad")  # noqa: E731
    planner = rollout(make, PlannerAgent("kitchen"), range(5))
    random = rollout(make, RandomAgent(), range(5))
    assert min(e.episode_return for e in planner) > max(e.episode_return for e in random)


# ---- the LLM interface, config and CLI ------------------------------------------------------------
def test_llm_interface_parses_multi_word_answers():
    interface = TextInterface()
    assert interface.parse("<action>put the lettuce on the plate</action>", ACTION_NAMES) == (
        "put the lettuce on the plate"
    )
    # an untagged answer: invalid under the default strict parser, read by the lenient one
    assert interface.parse("First I will chop the onion.", ACTION_NAMES) is None
    assert TextInterface(lenient=True).parse("First I will chop the onion.", ACTION_NAMES) == "chop the onion"
    assert interface.parse("<action>deliver</action>", ACTION_NAMES) is None


def test_config_matches_the_env():
    assert KITCHEN_TASKS == TASK_NAMES
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "kitchen.yaml"))
    assert cfg.pop("name") == "kitchen"
    cfg.pop("defaults", None)
    params = inspect.signature(KitchenEnv.__init__).parameters
    assert set(cfg) == set(params) - {"self", "render_mode"}
    assert all(params[k].default == v for k, v in cfg.items())
    composed = typed(compose_config(["env=kitchen", "env.task=tomato_lettuce_onion_salad"]))
    assert composed.env.task == "tomato_lettuce_onion_salad" and composed.env.max_steps == 20
    with pytest.raises(ConfigError, match="env.task=soup"):
        compose_config(["env=kitchen", "env.task=soup"])


def test_cli_envs_and_prompt():
    result = runner.invoke(app, ["envs"], catch_exceptions=False)
    assert result.exit_code == 0 and "kitchen" in result.output and "agentrl/Kitchen-v0" in result.output
    result = runner.invoke(app, ["config", "env=kitchen", "--show-prompt"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Make a tomato salad" in result.output and "put the onion on the plate" in result.output
    assert "<action>NAME</action>" in result.output


@pytest.mark.parametrize(
    "agent,task,success,mean_return",
    [("planner", "tomato_lettuce_onion_salad", 1.0, 2.19), ("random", "tomato_salad", None, None)],
)
def test_cli_eval(tmp_path, agent, task, success, mean_return):
    run = tmp_path / agent
    args = ["eval", "env=kitchen", f"env.task={task}", f"agent={agent}", "eval.episodes=4"]
    result = runner.invoke(app, [*args, f"hydra.run.dir={run}"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "eval.json").read_text())
    assert metrics["episodes"] == 4 and "mean_subtask_rate" in metrics
    if success is not None:
        assert metrics["success_rate"] == success and metrics["mean_return"] == pytest.approx(mean_return)


def test_cli_eval_of_the_training_preset_with_scored_decisions(tmp_path):
    """`agentrl eval experiment=kitchen_learn`: the preset's algo keys come without an algo group, and the
    eval names no algo; TWOSOME's scored decisions over the feasible list play only listed actions."""
    run = tmp_path / "scored"
    args = ["eval", "experiment=kitchen_learn", "model=tiny-random", "agent.decision=score"]
    args += ["env.actions=feasible", "env.max_steps=3", "eval.episodes=1", f"hydra.run.dir={run}"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "eval.json").read_text())
    assert "algo" not in metrics and metrics["invalid_rate"] == 0.0 and metrics["episodes"] == 1


def test_cli_tiny_dqn_training(tmp_path):
    run = tmp_path / "dqn"
    args = [
        "train",
        "env=kitchen",
        "algo=dqn",
        "algo.total_timesteps=300",
        "algo.learning_starts=50",
        "algo.log_every=100",
        "algo.checkpoint_every=0",
        "algo.net_arch=[32,32]",
        "eval.episodes=2",
        f"hydra.run.dir={run}",
    ]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "eval.json").read_text())
    assert metrics["algo"] == "dqn" and metrics["env"] == "kitchen" and metrics["total_timesteps"] == 300


def test_random_start_begins_part_way_through_an_optimal_play():
    env = KitchenEnv(task="tomato_lettuce_salad")
    initial = env.reset(seed=0)[0]
    starts, returns = set(), []
    for seed in range(60):
        obs, info = env.reset(seed=seed, options={"random_start": 1.0})
        assert "Counter (whole): tomato, lettuce, onion" not in obs or "You hold: nothing" not in obs
        starts.add(obs.split("\n", 1)[1])
        # the planner finishes the salad from there; only the moves still to make pay
        total, done = 0.0, False
        while not done:
            action = optimal_actions(env._recipe_set, env.kitchen, env.max_steps - env.steps_taken)[0]
            _, reward, done, truncated, info = env.step(action)
            total += reward
            assert not truncated
        assert info["success"]
        returns.append(round(total, 3))
    assert len(starts) >= 5  # k = 1..6 moves into the 2-ingredient plan
    # k = 1 leaves 6 moves (4 subtasks + delivery, 1.8 - 0.006); the full game is 7 moves (1.793)
    assert max(returns) == pytest.approx(1.794)
    assert min(returns) == pytest.approx(1.0 - 0.001)  # only the delivery left
    assert env.reset(seed=0, options={"random_start": 0.0})[0] == initial
    with pytest.raises(ConfigError):
        env.reset(seed=0, options={"random_start": 1.5})


def test_count_start_moves_leaves_the_same_slack_from_every_start():
    # the full lettuce salad takes 7 moves; with max_steps 8 every start leaves 1 move of slack
    env = KitchenEnv(task="tomato_lettuce_salad", max_steps=8)
    options = {"random_start": 1.0, "count_start_moves": True}
    lefts = set()
    for seed in range(60):
        _, info = env.reset(seed=seed, options=options)
        lefts.add(info["state"]["steps_left"])
        # the optimal play from there ends with one move to spare
        done = truncated = False
        while not (done or truncated):
            action = optimal_actions(env._recipe_set, env.kitchen, env.max_steps - env.steps_taken)[0]
            _, _, done, truncated, info = env.step(action)
        assert info["success"] and env.max_steps - env.steps_taken == 1
        # one wasted move then the optimal play still fits; a second does not
        for wasted, succeeds in ((1, True), (2, False)):
            env.reset(seed=seed, options=options)
            for _ in range(wasted):
                _, _, done, truncated, info = env.step("chop the onion")  # a no-op: the onion is never held
            while not (done or truncated):
                action = optimal_actions(env._recipe_set, env.kitchen, env.max_steps - env.steps_taken)[0]
                _, _, done, truncated, info = env.step(action)
            assert info["success"] == succeeds
    assert lefts == {2, 3, 4, 5, 6, 7}  # k = 1..6 moves already played of the 8
    # without the option a late start has the whole budget
    assert env.reset(seed=0, options={"random_start": 1.0})[1]["state"]["steps_left"] == 8
    with pytest.raises(ConfigError, match="count_start_moves must be true or false"):
        env.reset(seed=0, options={"random_start": 1.0, "count_start_moves": "yes"})


def test_count_start_moves_is_a_training_curriculum_option_of_the_kitchen_only():
    from agentrl.trainers.multistep import _train_env

    cfg = compose_config(
        [
            "env=kitchen",
            "algo=poad",
            "algo.curriculum.random_start=0.5",
            "algo.curriculum.count_start_moves=true",
        ]
    )
    _, options = _train_env(cfg, typed(cfg.algo), env_factory)
    assert options == {"random_start": 0.5, "count_start_moves": True}
    alone = compose_config(["env=kitchen", "algo=poad", "algo.curriculum.count_start_moves=true"])
    with pytest.raises(ConfigError, match="needs algo.curriculum.random_start > 0"):
        _train_env(alone, typed(alone.algo), env_factory)
    lake = compose_config(
        [
            "env=frozenlake",
            "algo=msgrpo",
            "algo.curriculum.random_start=0.5",
            "algo.curriculum.count_start_moves=true",
        ]
    )
    with pytest.raises(ConfigError, match="count_start_moves needs an env whose part-way starts are moves"):
        _train_env(lake, typed(lake.algo), env_factory)


# ---- actions="feasible": each state lists the actions that do something ---------------------------
def test_feasible_lists_the_actions_that_do_something_in_each_state():
    env = KitchenEnv(task="tomato_salad", actions="feasible")
    _, info = env.reset(seed=0)
    picks = ["pick up the tomato", "pick up the lettuce", "pick up the onion"]
    assert info["valid_actions"] == [*picks, "deliver the plate"]
    expected = [
        ["chop the tomato", "deliver the plate"],
        ["put the tomato on the plate", "deliver the plate"],
        ["pick up the lettuce", "pick up the onion", "deliver the plate"],
    ]
    for action, listed in zip(_optimal_script(["tomato"]), expected, strict=False):
        *_, info = env.step(action)
        assert info["valid_actions"] == listed == env.valid_actions()
    # an unlisted action is still playable by name and does nothing but cost the step
    env.reset(seed=0)
    _, reward, *_, info = env.step("chop the tomato")
    assert reward == STEP and info["event"] == "nothing" and info["valid_actions"][0] == "pick up the tomato"
    # the dynamics are the default env's: the same script earns the same rewards
    default = KitchenEnv(task="tomato_salad")
    for e in (env, default):
        e.reset(seed=0)
    assert [r[0] for r in _play(env, _optimal_script(["tomato"]))] == [
        r[0] for r in _play(default, _optimal_script(["tomato"]))
    ]
    assert KitchenEnv().valid_actions() == ACTION_NAMES  # the default lists every action


def test_feasible_prompt_lists_the_states_actions_and_the_strict_parser_refuses_the_rest():
    env = KitchenEnv(actions="feasible")
    obs, info = env.reset(seed=0)
    ctx = StepContext(env, obs, info, [], np.random.default_rng(0), 0)
    interface = TextInterface()
    system, user = (m["content"] for m in interface.messages(ctx))
    assert (
        "Valid actions: pick up the tomato, pick up the lettuce, pick up the onion, deliver the plate" in user
    )
    assert "Valid actions:" not in system and "Each step lists the ones that do something." in system
    assert (
        interface.parse("<action>pick up the tomato</action>", info["valid_actions"]) == "pick up the tomato"
    )
    assert interface.parse("<action>chop the tomato</action>", info["valid_actions"]) is None


@pytest.mark.parametrize("task", TASK_NAMES)
def test_feasible_random_and_planner_play_only_listed_actions(task):
    make = lambda: make_env("kitchen", task=task, actions="feasible")  # noqa: E731
    for agent in (RandomAgent(), PlannerAgent("kitchen")):
        for seed, episode in enumerate(rollout(make, agent, range(3))):
            replay = make()
            replay.reset(seed=seed)
            for step in episode.steps:  # each action was listed in the state it was taken in
                assert step.valid and step.action_name in replay.valid_actions()
                assert replay.step(step.action_name)[-1]["event"] != "nothing"
    planner = rollout(make, PlannerAgent("kitchen"), range(2))
    assert all(e.success for e in planner)


def test_unknown_action_list_names_the_choices():
    with pytest.raises(UnknownChoiceError, match="feasible"):
        make_env("kitchen", actions="some")
    with pytest.raises(ConfigError, match="env.actions=some"):
        compose_config(["env=kitchen", "env.actions=some"])
