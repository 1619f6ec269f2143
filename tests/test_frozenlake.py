"""Frozen Lake rules, rendering, seeding and gymnasium compatibility (agentrl/envs/frozenlake.py)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS
from gymnasium.utils.env_checker import check_env
from omegaconf import OmegaConf

from agentrl.envs import make_env
from agentrl.envs.frozenlake import FrozenLakeEnv, transition_model
from agentrl.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "agentrl" / "conf" / "env"
# Shortest path on gymnasium's standard 4x4 map ("SFFF", "FHFH", "FFFH", "HFFG").
SOLUTION_4X4 = ["down", "down", "right", "right", "down", "right"]


def play(env: FrozenLakeEnv, actions: list[Any]) -> list[tuple]:
    return [env.step(a) for a in actions]


def test_fixed_map_rendering_and_state():
    env = make_env("frozenlake", map="4x4")
    obs, info = env.reset(seed=0)
    assert obs == (
        "P _ _ _\n_ O _ O\n_ _ _ O\nO _ _ G\nYou are at (row 0, col 0). The goal is at (row 3, col 3)."
    )
    state = info["state"]
    assert (state["row"], state["col"], state["goal"], state["size"]) == (0, 0, [3, 3], 4)
    assert state["holes"] == [[1, 1], [1, 3], [2, 3], [3, 0]]
    assert state["map"] == MAPS["4x4"] and state["slippery"] is False
    assert info["valid_actions"] == ["left", "down", "right", "up"] and info["success"] is False
    assert env.action_names[env.default_action()] == "left"


def test_instructions_name_rules_symbols_reward_cap_and_actions():
    text = make_env("frozenlake", map="4x4").instructions
    for needle in [
        "P is you",
        "O is a hole",
        "G is the goal",
        "_ is safe ice",
        "Reward: 1",
        "at most 8 moves",
    ]:
        assert needle in text
    assert "left, down, right, up" in text
    assert "slippery" in make_env("frozenlake", map="4x4", slippery=True).instructions.lower()


def test_hole_terminates_with_zero():
    env = make_env("frozenlake", map="4x4")
    env.reset(seed=0)
    (_, r1, t1, _, _), (obs, r2, t2, tr2, info) = play(env, ["down", "right"])  # (1, 1) is a hole
    assert (r1, t1) == (0.0, False)
    assert (r2, t2, tr2) == (0.0, True, False)
    assert info["success"] is False and info["event"] == "hole"
    assert "fell into a hole" in obs and (info["state"]["row"], info["state"]["col"]) == (1, 1)


def test_goal_gives_one_and_success():
    env = make_env("frozenlake", map="4x4")
    env.reset(seed=0)
    results = play(env, SOLUTION_4X4)
    assert [r for _, r, *_ in results] == [0.0] * 5 + [1.0]
    assert [t for _, _, t, *_ in results] == [False] * 5 + [True]
    obs, _, _, truncated, info = results[-1]
    assert info["success"] is True and truncated is False and "reached the goal" in obs


def test_move_cap_truncates_at_eight():
    env = make_env("frozenlake", map="4x4")
    env.reset(seed=0)
    results = play(env, ["left"] * 8)  # bumping into the edge: stays at the start
    assert [tr for *_, tr, _ in results] == [False] * 7 + [True]
    assert not any(t for _, _, t, _, _ in results)
    assert results[-1][4]["success"] is False and results[-1][4]["state"]["steps_left"] == 0
    env6 = make_env("frozenlake", map="4x4", max_steps=6)
    env6.reset(seed=0)
    assert [tr for *_, tr, _ in play(env6, ["left"] * 6)] == [False] * 5 + [True]


def test_step_accepts_index_or_name():
    env = make_env("frozenlake", map="4x4")
    env.reset(seed=0)
    assert env.step(1)[4]["state"]["row"] == 1  # index 1 = down
    assert env.step("Down")[4]["state"]["row"] == 2
    with pytest.raises(ValueError):
        env.step("jump")


def test_random_maps_differ_by_seed_and_are_reproducible():
    env = make_env("frozenlake", map="random")
    maps = {seed: tuple(env.reset(seed=seed)[1]["state"]["map"]) for seed in range(10)}
    assert len(set(maps.values())) >= 5
    other = make_env("frozenlake", map="random")
    assert all(tuple(other.reset(seed=s)[1]["state"]["map"]) == m for s, m in maps.items())
    for rows in maps.values():  # gymnasium's generator: start top-left, goal bottom-right
        assert rows[0][0] == "S" and rows[-1][-1] == "G" and len(rows) == 4
    big = make_env("frozenlake", map="random", size=6)
    assert len(big.reset(seed=0)[1]["state"]["map"]) == 6
    # The fixed map ignores the seed.
    fixed = make_env("frozenlake", map="4x4")
    assert fixed.reset(seed=1)[1]["state"]["map"] == fixed.reset(seed=2)[1]["state"]["map"] == MAPS["4x4"]


def test_same_seed_same_episode_slippery():
    def episode(seed: int) -> list[tuple]:
        env = make_env("frozenlake", map="4x4", slippery=True, max_steps=30)
        env.reset(seed=seed)
        out = []
        for action in ["right", "down"] * 15:
            obs, r, t, tr, info = env.step(action)
            out.append((obs, r, t, tr))
            if t or tr:
                break
        return out

    assert episode(3) == episode(3)
    assert len({str(episode(s)) for s in range(10)}) > 1


def _start(env: FrozenLakeEnv, seed: int, **options: Any) -> tuple[int, int]:
    state = env.reset(seed=seed, options=options or None)[1]["state"]
    return state["row"], state["col"]


def test_random_start_option_is_seeded_and_lands_on_safe_ice():
    env = make_env("frozenlake", map="random", size=6)
    starts = [_start(env, s, random_start=1.0) for s in range(30)]
    assert starts == [_start(env, s, random_start=1.0) for s in range(30)]  # a seed fixes the start
    assert len(set(starts)) > 5
    for seed, (r, c) in enumerate(starts):
        rows = env.reset(seed=seed)[1]["state"]["map"]  # the same map: the option draws after it
        assert rows[r][c] in "SF"
    # With a probability in between, some episodes keep the start cell and some do not.
    fixed = make_env("frozenlake", map="4x4")
    half = [_start(fixed, s, random_start=0.5) for s in range(40)]
    assert 5 < half.count((0, 0)) < 35


def test_reset_options_are_listed():
    assert make_env("frozenlake", map="4x4").reset_option_names == ("random_start",)
    assert "random_start" not in make_env("snake").reset_option_names


def test_random_start_zero_is_the_plain_reset():
    def episode(seed: int, **options: Any) -> list[tuple]:
        env = make_env("frozenlake", map="random", slippery=True, max_steps=30)
        obs, _ = env.reset(seed=seed, options=options)
        out = [obs]
        for action in ["right", "down"] * 15:  # slippery moves draw from the same generator
            obs, r, t, tr, _ = env.step(action)
            out.append((obs, r, t, tr))
            if t or tr:
                break
        return out

    for seed in range(5):
        assert episode(seed, random_start=0.0) == episode(seed) == episode(seed, random_start=0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "often", None, float("nan"), True])
def test_random_start_out_of_range_raises(bad):
    with pytest.raises(ConfigError, match="random_start"):
        make_env("frozenlake", map="4x4").reset(seed=0, options={"random_start": bad})


def test_slippery_differs_and_follows_gymnasium_dynamics():
    outcomes = []
    for seed in range(300):
        env = make_env("frozenlake", map="4x4", slippery=True)
        env.reset(seed=seed)
        info = env.step("right")[4]
        outcomes.append((info["state"]["row"], info["state"]["col"]))
    counts = {cell: outcomes.count(cell) for cell in set(outcomes)}
    # right slips to up (stays at (0, 0)) or down ((1, 0)), each with probability 1/3.
    assert set(counts) == {(0, 1), (0, 0), (1, 0)}
    assert all(70 < c < 130 for c in counts.values())
    deterministic = make_env("frozenlake", map="4x4")
    for seed in range(20):
        deterministic.reset(seed=seed)
        info = deterministic.step("right")[4]
        assert (info["state"]["row"], info["state"]["col"]) == (0, 1)
    # The model planners use is gymnasium's own table.
    table = transition_model(MAPS["4x4"], True)[0][2]
    assert [(nxt, r, done) for _, nxt, r, done in table] == [
        (4, 0.0, False),
        (1, 0.0, False),
        (0, 0.0, False),
    ]
    assert [p for p, *_ in table] == pytest.approx([1 / 3] * 3)


def test_numeric_observation_one_hot_planes():
    env = make_env("frozenlake", map="4x4")
    env.reset(seed=0)
    env.step("down")
    obs = env.numeric_observation()
    assert obs.dtype == np.float32 and obs.shape == (48,) and env.numeric_space().contains(obs)
    planes = obs.reshape(3, 4, 4)
    assert planes[0].sum() == 1 and planes[0, 1, 0] == 1
    assert {tuple(x) for x in np.argwhere(planes[1] == 1).tolist()} == {(1, 1), (1, 3), (2, 3), (3, 0)}
    assert planes[2, 3, 3] == 1 and planes[2].sum() == 1
    assert make_env("frozenlake", map="8x8").numeric_space().shape == (192,)


@pytest.mark.parametrize(
    "kwargs", [{}, {"map": "random"}, {"slippery": True}, {"map": "8x8"}, {"map": "random", "size": 5}]
)
def test_check_env_passes(kwargs):
    check_env(make_env("frozenlake", **kwargs), skip_render_check=True)


def test_gymnasium_make_and_render_modes():
    env = gym.make("agentrl/FrozenLake-v0", map="4x4")
    check_env(env.unwrapped)  # with a spec: also checks the declared render modes
    obs, _ = env.reset(seed=0)
    assert obs.startswith("P _ _ _")
    obs, reward, terminated, truncated, _ = env.step(1)
    assert isinstance(obs, str) and reward == 0.0 and not terminated and not truncated


def test_bad_arguments_raise_config_errors():
    with pytest.raises(ConfigError, match="random"):
        make_env("frozenlake", map="5x5")
    with pytest.raises(ConfigError):
        make_env("frozenlake", map="4x4", max_steps=0)
    with pytest.raises(ConfigError):
        make_env("frozenlake", map="random", p=0.0)


def test_config_keys_match_constructor_defaults():
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "frozenlake.yaml"))
    assert cfg.pop("name") == "frozenlake"
    cfg.pop("defaults", None)  # Hydra's defaults list (the schema), not a constructor argument
    params = inspect.signature(FrozenLakeEnv.__init__).parameters
    assert set(cfg) == set(params) - {"self", "render_mode"}
    assert all(params[k].default == v for k, v in cfg.items())


def test_the_default_is_a_new_random_map_per_seed_with_the_papers_cap():
    env = make_env("frozenlake")
    assert (env.map_name, env.size, env.max_steps) == ("random", 4, 8)
    assert len({tuple(env.reset(seed=s)[1]["state"]["map"]) for s in range(20)}) > 5


@pytest.mark.parametrize(
    ("kwargs", "cap"),
    [
        ({"map": "4x4"}, 8),
        ({"map": "8x8"}, 16),
        ({"map": "random", "size": 6}, 12),
        ({"map": "random", "size": 8}, 16),
        ({"map": "4x4", "slippery": True}, 100),
        ({"map": "8x8", "slippery": True}, 200),
        ({"map": "8x8", "max_steps": 20}, 20),
    ],
)
def test_the_cap_fits_the_board(kwargs, cap):
    env = make_env("frozenlake", **kwargs)
    assert env.max_steps == cap and f"at most {cap} moves" in env.instructions


def test_a_cap_no_route_fits_is_refused_naming_the_route():
    with pytest.raises(ConfigError, match=r"map=8x8: its shortest route is 14 moves.*max_steps=8.*16"):
        make_env("frozenlake", map="8x8", max_steps=8)
    with pytest.raises(ConfigError, match=r"size=6: every route is at least 10 moves.*max_steps=8.*12"):
        make_env("frozenlake", map="random", size=6, max_steps=8)
    make_env("frozenlake", map="8x8", max_steps=14)  # the shortest route fits exactly


@pytest.mark.parametrize(("size", "p", "cap"), [(4, 0.8, None), (6, 0.8, None), (8, 0.8, None), (8, 0.6, 14)])
def test_every_random_map_has_a_route_within_the_cap(size, p, cap):
    from agentrl.envs.frozenlake import generate_random_map, shortest_route

    env = make_env("frozenlake", map="random", size=size, p=p, max_steps=cap)
    redrawn = 0
    for seed in range(60):
        rows = env.reset(seed=seed)[1]["state"]["map"]
        assert shortest_route(rows) <= env.max_steps
        # the same seed always gives the same map; gymnasium's own draw is kept where its route fits
        assert env.reset(seed=seed)[1]["state"]["map"] == rows
        first = generate_random_map(size, p, seed=int(np.random.default_rng(seed).integers(2**31 - 1)))
        fits = shortest_route(first) is not None and shortest_route(first) <= env.max_steps
        assert (rows == first) == fits
        redrawn += not fits
    if cap == 14:  # p 0.6 on 8x8: some of gymnasium's maps need detours longer than 14 moves
        assert redrawn > 5


def test_random_maps_the_cap_cannot_fit_are_refused_after_many_draws(monkeypatch):
    import agentrl.envs.frozenlake as fl

    monkeypatch.setattr(fl, "MAP_ATTEMPTS", 3)
    monkeypatch.setattr(fl, "generate_random_map", lambda size, p, seed: ["SFF", "HHF", "GFF"])  # route 6
    with pytest.raises(ConfigError, match="no random 3x3 map .* in 3 draws .* max_steps=5"):
        fl.FrozenLakeEnv(map="random", size=3, max_steps=5)
    assert fl.FrozenLakeEnv(map="random", size=3, max_steps=6).reset(seed=0)[1]["state"]["goal"] == [2, 0]


def test_neighbours_view_states_what_each_move_runs_into():
    env = make_env("frozenlake", map="4x4", view="board+neighbours")
    obs = env.reset(seed=0)[0]
    assert obs.startswith("P _ _ _\n") and obs.endswith(
        "\nNext to you: left edge, down ice, right ice, up edge."
    )
    obs = env.step("down")[0]  # (1, 0): a hole to the right
    assert obs.endswith("Next to you: left edge, down ice, right hole, up ice.")
    for action in ["down", "right", "right", "down", "right"]:
        obs = env.step(action)[0]
    assert obs.endswith("You reached the goal.") and "Next to you" not in obs
    plain = make_env("frozenlake", map="4x4").reset(seed=0)[0]
    assert "Next to you" not in plain and obs.count("\n") == plain.count("\n")
    env.reset(seed=0)
    env.step("down")
    env.step("down")
    assert env.step("right")[0].endswith("Next to you: left ice, down ice, right ice, up hole.")


def test_describe_spells_out_the_map_and_cap():
    assert make_env("frozenlake", map="4x4").describe() == (
        "the fixed 4x4 map SFFF / FHFH / FFFH / HFFG (shortest route 6 moves); cap 8 moves (2 x the side); "
        "non-slippery; view board"
    )
    text = make_env("frozenlake", size=6, max_steps=11, slippery=True).describe()
    assert text.startswith("a new random 6x6 map per seed (p=0.8)") and "cap 11 moves; slippery" in text


@pytest.mark.parametrize("variant", [["env.map=8x8"], ["env.size=6"], ["env.slippery=true", "env.map=4x4"]])
def test_the_planner_solves_the_documented_variants_through_the_cli(variant, tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli import app

    run = tmp_path / "run"
    args = ["eval", "agent=planner", *variant, "eval.episodes=10", f"hydra.run.dir={run}"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    success = json.loads((run / "eval.json").read_text())["success_rate"]
    assert success >= (0.5 if "env.slippery=true" in variant else 1.0)  # 0.00 at the 8-move cap


def test_a_cap_no_route_fits_is_one_line_exit_2_and_no_run_dir_and_the_dry_run_shows_the_map(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli import app

    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "env.map=8x8", "env.max_steps=8", f"hydra.run.dir={run}"])
    assert result.exit_code == 2 and not run.exists()
    assert result.output.strip().count("\n") == 0 and "shortest route is 14 moves" in result.output
    result = CliRunner().invoke(app, ["train", "env.map=8x8", "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    assert (
        "task the fixed 8x8 map SFFFFFFF / FFFFFFFF /" in shown
        and "(shortest route 14 moves); cap 16 moves" in shown
    )
