"""Snake rules (growth, every death cause, opponent, poison, step cost, cap), rendering, seeding and
gymnasium compatibility (agentrl/envs/snake.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from omegaconf import OmegaConf

from agentrl.envs import env_factory, make_env
from agentrl.envs.snake import SnakeEnv
from agentrl.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "agentrl" / "conf" / "env"


#: a 6x6 board: head (2,2) heading right, body (2,1),(2,0); enemy head (0,2); apple (4,5); poison below
#: the head
PLACED = {
    "snake": [[2, 2], [2, 1], [2, 0]],
    "direction": "right",
    "opponent": [[0, 2]],
    "apples": [[4, 5]],
    "poison": [[3, 2]],
}


def layout(env: SnakeEnv, seed: int = 0, **options):
    """Reset with a hand-placed board (no opponent unless given)."""
    options.setdefault("opponent", None)
    return env.reset(seed=seed, options=options)


def test_apple_gives_one_and_grows():
    env = make_env("snake")
    layout(env, snake=[[5, 5], [5, 6]], apples=[[5, 4]])
    obs, reward, terminated, _, info = env.step("left")
    assert reward == pytest.approx(1.0 - 0.01) and not terminated
    state = info["state"]
    assert state["head"] == [5, 4] and state["body"] == [[5, 5], [5, 6]]  # the tail stayed: grew by one
    assert state["score"] == 1 and info["event"] == "apple" and info["success"] is True
    assert len(state["apples"]) == 1 and state["apples"][0] not in ([5, 4], [5, 5], [5, 6])  # respawned
    _, reward, _, _, info = env.step("left")  # no apple: the tail follows again
    assert reward == pytest.approx(-0.01) and len(info["state"]["body"]) == 2


def test_approach_reward_pays_steps_toward_the_nearest_apple_only():
    env = make_env("snake", approach_reward=0.1)
    layout(env, snake=[[5, 5]], apples=[[2, 5]])
    rewards = [env.step(a)[1] for a in ["up", "down", "left", "up", "up", "right"]]
    # nearer, back, sideways (one cell farther), nearer, nearer, nearer
    assert rewards == pytest.approx([0.09, -0.11, -0.11, 0.09, 0.09, 0.09])
    _, reward, *_ = env.step("up")  # eats: the apple's reward, no shaping on top
    assert reward == pytest.approx(0.99)
    layout(env, snake=[[0, 0]], apples=[[3, 0]])
    assert env.step("up")[1] == -1.0  # a death is the death reward alone
    assert "nearer" not in env.instructions and "approach" not in env.instructions  # unstated
    plain = make_env("snake")
    layout(plain, snake=[[5, 5]], apples=[[2, 5]])
    assert plain.step("up")[1] == pytest.approx(-0.01)
    with pytest.raises(ConfigError, match="approach_reward"):
        make_env("snake", approach_reward=-1)


def test_step_penalty_every_move_and_configurable():
    env = make_env("snake")
    layout(env, snake=[[5, 5]], apples=[[0, 0]])
    assert [env.step(a)[1] for a in ["up", "left", "down"]] == pytest.approx([-0.01] * 3)
    costly = make_env("snake", step_penalty=0.5)
    layout(costly, snake=[[5, 5]], apples=[[0, 0]])
    assert costly.step("up")[1] == pytest.approx(-0.5)
    assert "costs 0.5" in costly.instructions


@pytest.mark.parametrize(
    ("cells", "action", "cause"),
    [
        ([[0, 3]], "up", "wall"),
        ([[4, 9], [4, 8]], "right", "wall"),
        ([[5, 5], [5, 6], [6, 6], [6, 5], [6, 4]], "down", "self"),  # curled body, not the tail
        ([[5, 5], [5, 6]], "right", "self"),  # reversing into the neck
    ],
)
def test_death_by_wall_and_own_body(cells, action, cause):
    env = make_env("snake")
    layout(env, snake=cells, apples=[[9, 0]])
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (-1.0, True, False)
    assert info["event"] == cause and info["success"] is False and info["state"]["alive"] is False
    assert "Your snake died" in obs
    assert env.step("up")[1:3] == (0.0, True)  # stepping after death changes nothing


def test_one_cell_snake_may_reverse_and_tail_cell_is_free():
    env = make_env("snake")
    layout(env, snake=[[5, 5]], direction="left", apples=[[9, 0]])
    assert env.step("right")[2] is False
    layout(env, snake=[[5, 5], [5, 6], [6, 6], [6, 5]], apples=[[9, 0]])  # a 2x2 loop
    _, reward, terminated, _, info = env.step("down")  # into the tail, which moves away
    assert not terminated and info["state"]["head"] == [6, 5]


def test_death_by_opponent_body():
    env = make_env("snake")
    # The opponent's head is at (3, 6) with its body straight below; whatever it does, (5, 6) stays body.
    for seed in range(5):
        layout(env, seed, snake=[[5, 5], [5, 4]], opponent=[[3, 6], [4, 6], [5, 6], [6, 6]], apples=[[9, 0]])
        _, reward, terminated, _, info = env.step("right")
        assert (reward, terminated, info["event"]) == (-1.0, True, "opponent")


def test_death_by_head_on_collision():
    env = make_env("snake")
    # Opponent in the top-left corner heading left: its only safe move is down to (1, 0).
    for seed in range(5):
        layout(env, seed, snake=[[2, 0], [3, 0]], opponent=[[0, 0], [0, 1]], apples=[[9, 9]])
        _, reward, terminated, _, info = env.step("up")
        assert (reward, terminated, info["event"]) == (-1.0, True, "head_on")


def test_opponent_moves_and_avoids_immediate_death():
    env = make_env("snake")
    for seed in range(10):
        layout(env, seed, snake=[[7, 7]], opponent=[[0, 0], [0, 1]], apples=[[9, 9]])
        info = env.step("up")[4]
        assert info["state"]["opponent"]["head"] == [1, 0] and info["state"]["opponent"]["body"] == [[0, 0]]
    # Unconstrained, it moves one cell per step to random neighbours (not always the same way).
    heads = set()
    for seed in range(10):
        env.reset(seed=seed)
        before = env.state()["opponent"]["head"]
        info = env.step("up" if env.state()["head"][0] > 0 else "down")[4]
        after = info["state"]["opponent"]["head"]
        if info.get("opponent_event") != "died":
            assert abs(after[0] - before[0]) + abs(after[1] - before[1]) == 1
            heads.add((after[0] - before[0], after[1] - before[1]))
    assert len(heads) >= 2


def test_dead_opponent_respawns():
    env = make_env("snake")
    # The opponent is boxed in (walls and the agent's body): every move kills it.
    agent = [[3, 0], [2, 0], [1, 0], [1, 1], [1, 2]]
    layout(env, snake=agent, opponent=[[0, 0], [0, 1]], apples=[[9, 9]])
    _, reward, terminated, _, info = env.step("down")
    assert not terminated and reward == pytest.approx(-0.01) and info["opponent_event"] == "died"
    opp = info["state"]["opponent"]
    assert opp is not None and opp["body"] == []  # respawned at the start length (1)
    own = [info["state"]["head"], *info["state"]["body"]]
    assert opp["head"] not in own and abs(opp["head"][0] - 4) + abs(opp["head"][1]) >= 3


def test_opponent_flag_and_random_start():
    env = make_env("snake", opponent=False)
    _, info = env.reset(seed=0)
    assert info["state"]["opponent"] is None and "enemy snake (2) moves" not in env.instructions
    env = make_env("snake")
    _, info = env.reset(seed=0)
    state = info["state"]
    assert state["opponent"] is not None and state["body"] == [] and len(state["apples"]) == 1
    opp = state["opponent"]["head"]
    assert abs(opp[0] - state["head"][0]) + abs(opp[1] - state["head"][1]) >= 3
    longer = make_env("snake", start_length=3, apples=3)
    state = longer.reset(seed=1)[1]["state"]
    assert len(state["body"]) == 2 and len(state["opponent"]["body"]) == 2 and len(state["apples"]) == 3


def test_poison_reward_symbol_rendering_and_instructions():
    env = make_env("snake_poison")
    obs, info = env.reset(seed=0)
    assert len(info["state"]["poison"]) == 2 and "X" in obs.split("Board:")[1]
    assert "Poison apples (X): (row" in obs
    assert "X is a poison apple" in env.instructions and "gives -1" in env.instructions
    layout(env, snake=[[5, 5]], apples=[[0, 0]], poison=[[5, 4], [9, 9]])
    _, reward, terminated, _, info = env.step("left")
    assert reward == pytest.approx(-1.0 - 0.01) and not terminated and info["event"] == "poison"
    state = info["state"]
    assert state["body"] == [] and state["score"] == 0 and state["poison_eaten"] == 1  # no growth
    assert len(state["poison"]) == 2 and [5, 4] not in state["poison"]  # respawned elsewhere
    mild = make_env("snake", poison_apples=1, poison_reward=-0.5)
    assert "gives -0.5" in mild.instructions
    plain = make_env("snake")
    obs, _ = plain.reset(seed=0)
    assert "poison" not in plain.instructions.lower() and "X" not in obs and "Poison" not in obs


def test_rendering_symbols_and_coordinates():
    env = make_env("snake", size=5)
    obs, _ = env.reset(
        seed=0, options={"snake": [[1, 1], [1, 2]], "opponent": [[3, 3], [4, 3]], "apples": [[0, 4]]}
    )
    assert obs == "\n".join(
        [
            "Your snake (1): head at (row 1, col 1); body: (row 1, col 2).",
            "Enemy snake (2): head at (row 3, col 3); body: (row 4, col 3).",
            "Apples (A): (row 0, col 4).",
            "Board:",
            "_ _ _ _ A",
            "_ 1 T _ _",
            "_ _ _ _ _",
            "_ _ _ 2 _",
            "_ _ _ T _",
        ]
    )
    text = env.instructions
    for needle in [
        "1 is your snake's head",
        "2 is the enemy",
        "T is a body",
        "A is an apple",
        "_ is an empty",
    ]:
        assert needle in text
    assert "at most 100 moves" in text and "up, down, left, right" in text
    assert env.action_names[env.default_action()] == "up"


def test_move_cap_truncates_and_success_needs_an_apple():
    env = make_env("snake", max_steps=4, opponent=False)
    layout(env, snake=[[5, 5]], apples=[[4, 5]])
    results = [env.step(a) for a in ["up", "left", "down", "right"]]  # eats the apple on move 1
    assert [tr for *_, tr, _ in results] == [False, False, False, True]
    assert not any(t for _, _, t, _, _ in results) and results[-1][4]["success"] is True
    layout(env, snake=[[5, 5]], apples=[[0, 0]])
    results = [env.step(a) for a in ["up", "down", "up", "down"]]  # a one-cell snake may reverse
    assert results[-1][3] is True and results[-1][4]["success"] is False  # alive, but no apple
    assert make_env("snake").max_steps == 100


def test_same_seed_same_episode():
    def episode(seed: int) -> list:
        env = make_env("snake_poison", apples=2)
        obs, _ = env.reset(seed=seed)
        actions = np.random.default_rng(7).integers(4, size=40)
        out = [obs]
        for a in actions:
            obs, r, t, tr, info = env.step(int(a))
            out.append((obs, r, t, tr, info["state"]))
            if t or tr:
                break
        return out

    assert episode(11) == episode(11)
    assert episode(11)[0] != episode(12)[0]


def test_state_and_numeric_features():
    env = make_env("snake_poison")
    _, info = layout(
        env, snake=[[2, 2], [2, 3]], opponent=[[7, 7], [8, 7]], apples=[[0, 0]], poison=[[9, 9], [5, 5]]
    )
    assert set(info["state"]) >= {
        "head",
        "body",
        "direction",
        "opponent",
        "apples",
        "poison",
        "size",
        "score",
    }
    assert info["state"]["direction"] == "left" and info["state"]["opponent"]["direction"] == "up"
    obs = env.numeric_observation()
    assert obs.dtype == np.float32 and obs.shape == (26,) and env.numeric_space().contains(obs)
    danger, head_on, poison, apple, room, heading = obs[:24].reshape(6, 4)  # up, down, left, right
    assert danger.tolist() == [0, 0, 0, 1]  # the neck (2, 3) is to the right
    assert head_on.sum() == 0 and poison.sum() == 0  # enemy head and poison are far away
    assert apple.tolist() == [1, 0, 1, 0]  # the apple (0, 0) is up and left
    assert room[3] == 0 and room[0] == pytest.approx(96 / 100)  # all but the enemy's 2 cells and own 2
    assert heading.tolist() == [0, 0, 1, 0]
    assert obs[24] == pytest.approx(2 / 100) and obs[25] == pytest.approx(4 / 20)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("snake", {}), ("snake_poison", {}), ("snake", {"opponent": False, "start_length": 3})],
)
def test_check_env_passes(name, kwargs):
    check_env(make_env(name, **kwargs), skip_render_check=True)


def test_gymnasium_make():
    env = gym.make("agentrl/SnakePoison-v0")
    check_env(env.unwrapped)
    obs, info = env.reset(seed=0)
    assert "Poison apples (X)" in obs and len(info["state"]["poison"]) == 2
    assert isinstance(env.step(0)[0], str)


def test_bad_arguments_raise_config_errors():
    with pytest.raises(ConfigError):
        make_env("snake", size=3)
    with pytest.raises(ConfigError):
        make_env("snake", start_length=6)
    with pytest.raises(ConfigError):
        make_env("snake", apples=-1)
    env = make_env("snake")
    with pytest.raises(ConfigError):
        env.reset(seed=0, options={"snake": [[10, 0]]})


@pytest.mark.parametrize("name", ["snake", "snake_poison"])
def test_config_keys_match_constructor(name):
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    assert cfg.pop("name") == name
    cfg.pop("defaults", None)  # Hydra's defaults list (the schema), not a constructor argument
    params = inspect.signature(SnakeEnv.__init__).parameters
    assert set(cfg) == set(params) - {"self", "render_mode"}
    expected = {k: p.default for k, p in params.items() if k in cfg}
    if name == "snake_poison":
        expected["poison_apples"] = 2  # the registry's variant default
    assert cfg == expected


def test_numeric_features_on_a_placed_board():
    env = make_env("snake", size=6, poison_apples=1)
    layout(env, **PLACED)
    f = env.numeric_observation()
    up, down, left, right = range(4)
    assert f.shape == (26,) and f.dtype == np.float32 and env.numeric_space().contains(f)
    assert f[left] == 1.0  # the neck
    assert f[up] == 0.0 and f[down] == 0.0 and f[right] == 0.0
    assert f[4 + up] == 1.0  # (1,2) is next to the enemy head (0,2)
    assert f[4 + down] == 0.0
    assert f[8 + down] == 1.0  # poison below
    assert list(f[12:16]) == [0.0, 1.0, 0.0, 1.0]  # apple is down and right
    assert f[16 + left] == 0.0 and f[16 + right] > 0.5  # no room into the neck, most of the board right
    assert f[20 + right] == 1.0 and f[20:24].sum() == 1.0  # heading
    assert f[24] == pytest.approx(3 / 36)
    assert f[25] == pytest.approx((2 + 3) / 12)
    # The tail moves away this step, so it is not a danger; the segment before it is.
    layout(env, snake=[[2, 2], [3, 2], [3, 3], [2, 3]], direction="up", apples=[[5, 5]])
    f = env.numeric_observation()
    assert f[right] == 0.0 and f[down] == 1.0
    # at a wall
    layout(env, snake=[[0, 0]], direction="up", apples=[[5, 5]])
    f = env.numeric_observation()
    assert f[up] == 1.0 and f[left] == 1.0 and f[down] == 0.0 and f[right] == 0.0
    assert f[16 + down] == pytest.approx(35 / 36)


def test_room_counts_only_the_reachable_region():
    env = make_env("snake", size=5, start_length=1)
    # A wall of enemy body along column 2 splits the board; the head at (2, 1) can go left or right.
    layout(env, snake=[[2, 1]], direction="up", opponent=[[0, 2], [1, 2], [2, 2], [3, 2], [4, 2]])
    f = env.numeric_observation()
    up, down, left, right = range(4)
    assert f[right] == 1.0 and f[16 + right] == 0.0
    assert f[16 + left] == pytest.approx(9 / 25)  # columns 0-1 without the head


def test_instructions_state_the_tail_and_enemy_rules_the_game_applies():
    text = make_env("snake").instructions
    assert "A tail end that moves away in the same move is not in the way." in text
    assert "avoiding moves that kill it at once when it can" in text and "reappears elsewhere" in text
    env = make_env("snake")
    layout(env, snake=[[5, 5], [5, 6], [6, 6], [6, 5]], apples=[[9, 0]])  # a 2x2 loop
    assert env.step("down")[2] is False  # into the tail end, which moves away
    assert "enemy" not in make_env("snake", opponent=False).instructions.lower()


def test_summary_view_states_the_apple_direction_and_each_move_s_outcome():
    env = make_env("snake", size=6, poison_apples=1, view="summary")
    obs, _ = layout(env, **PLACED)
    assert obs.splitlines() == [
        "Your snake: head at (row 2, col 2), length 3, last move right.",
        "Nearest apple: 2 rows down and 3 columns right of your head.",
        "Nearest poison apple: 1 row down of your head.",
        "Enemy snake's head: 2 rows up of your head.",
        "Moves: up is safe (next to the enemy's head); down is safe (eats a poison apple); "
        "left is deadly (your body); right is safe.",
    ]
    assert "Board:" not in obs and "Symbols:" not in env.instructions
    assert "what each move would run into" in env.instructions
    layout(env, snake=[[0, 5]], direction="up", apples=[[1, 5]])
    assert env.render_text().splitlines()[-1] == (
        "Moves: up is deadly (the wall); down is safe (eats the apple); left is safe; right is deadly (the wall)."
    )
    obs, reward, terminated, *_ = env.step(0)
    assert terminated and reward == -1.0
    assert obs.splitlines()[-1] == "Your snake died: it hit the wall." and "Moves:" not in obs
    both = make_env("snake", view="board+summary")
    obs, _ = both.reset(seed=0)
    assert "Board:" in obs and "Moves: " in obs and "Symbols:" in both.instructions
    assert make_env("snake").reset(seed=0)[0] == obs.split("\nYour snake: head")[0]  # board part unchanged
    with pytest.raises(ConfigError, match="board, summary, board"):
        make_env("snake", view="grid")


def test_summary_view_agrees_with_the_numeric_view_on_random_boards():
    env = make_env("snake", view="summary", start_length=3, poison_apples=1)
    rng = np.random.default_rng(0)
    checked = 0
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        for _ in range(15):
            f = env.numeric_observation()
            moves = obs.splitlines()[-1].removeprefix("Moves: ").rstrip(".").split("; ")
            for k, (name, text) in enumerate(zip(env.action_names, moves, strict=True)):
                assert text.startswith(f"{name} is ")
                assert ("deadly" in text) == bool(f[k]), (obs, f)
                if not f[k]:  # a deadly move names only its cause
                    assert ("next to the enemy's head" in text) == bool(f[4 + k])
                    assert ("poison" in text) == bool(f[8 + k])
            apple = obs.splitlines()[1]
            for k, word in enumerate(("up", "down", "left", "right")):
                assert (f" {word}" in apple) == bool(f[12 + k]), (apple, f[12:16])
            checked += 1
            safe = [k for k in range(4) if not f[k]] or [0]
            obs, _, terminated, truncated, _ = env.step(int(rng.choice(safe)))
            if terminated or truncated:
                break
    assert checked > 100


def test_curriculum_approach_reward_shapes_training_episodes_only():
    from agentrl.config import compose_config, typed
    from agentrl.trainers.multistep import _train_env

    cfg = compose_config(["env=snake", "algo=msgrpo", "algo.curriculum.approach_reward=0.2"])
    train_env, _ = _train_env(cfg, typed(cfg.algo), env_factory)
    assert train_env().approach_reward == 0.2
    assert cfg.env.approach_reward == 0.0  # what evaluation builds from
    lake = compose_config(["env=frozenlake", "algo=msgrpo", "algo.curriculum.approach_reward=0.2"])
    with pytest.raises(ConfigError, match="approach_reward needs an env with an approach reward"):
        _train_env(lake, typed(lake.algo), env_factory)
