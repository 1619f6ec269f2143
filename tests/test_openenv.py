"""OpenEnv both ways, on the loopback: `agentrl serve`'s server (agentrl/runs/serve.py) played by openenv's
own client and by `env=openenv` (agentrl/envs/openenv.py), against the env in-process; eval and train
through the CLI; a client that vanishes mid-episode; concurrent clients; a generic OpenEnv server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from openenv.core.generic_client import GenericEnvClient  # make install installs OpenEnv: no skip
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.envs import make_env
from agentrl.envs.openenv import OpenEnvEnv, ToolEnv
from agentrl.runs.serve import serving

# a random slippery map per seed: the same transitions need the same seed to reach the env's generator
SERVED = ["env=frozenlake", "env.map=random", "env.slippery=true"]
LAKE = {"map": "random", "slippery": True}


@pytest.fixture(scope="module")
def server():
    with serving(SERVED) as (url, http):
        yield url, http


def play(env, seed: int, actions: list[str]) -> list[tuple]:
    """Every transition of one episode with the given action plan (cycled), until it ends; then the env
    is closed (a served env's session with it)."""
    try:
        obs, info = env.reset(seed=seed)
        seen = [(obs, info["valid_actions"], info["state"])]
        for k in range(100):
            obs, reward, terminated, truncated, info = env.step(actions[k % len(actions)])
            seen.append(
                (obs, reward, terminated, truncated, info["success"], info["valid_actions"], info["state"])
            )
            if terminated or truncated:
                return seen
        raise AssertionError("the episode did not end")
    finally:
        env.close()


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_openenv_client_plays_the_in_process_episode(server):
    url, _ = server
    plan = ["down", "right", "right", "down", "left", "down", "right"]
    for seed in (3, 11):
        local = make_env("frozenlake", **LAKE)
        expected = play(local, seed, plan)
        client = GenericEnvClient(base_url=url).sync()
        with client:
            result = client.reset(seed=seed)
            assert result.observation["text"] == expected[0][0]
            assert result.observation["valid_actions"] == expected[0][1]
            assert client.state()["state"] == expected[0][2]
            for k, step in enumerate(expected[1:]):
                result = client.step({"action": plan[k % len(plan)]})
                obs, reward, terminated, truncated, success, valid, state = step
                seen = result.observation
                assert (seen["text"], result.reward, result.done) == (obs, reward, terminated or truncated)
                assert (seen["terminated"], seen["truncated"], seen["success"]) == (
                    terminated,
                    truncated,
                    success,
                )
                assert seen["info"]["state"] == state and seen["valid"] is True
            assert client.state()["episode_return"] == sum(s[1] for s in expected[1:])
        # and agentrl's client env: the same episode, step for step
        assert play(OpenEnvEnv(url=url), seed, plan) == expected


def test_answers_and_bad_actions_are_the_agent_interfaces_never_a_server_error(server):
    url, _ = server
    local = make_env("frozenlake", **LAKE)
    local.reset(seed=5)
    _, down_reward, *_ = local.step("down")
    with GenericEnvClient(base_url=url).sync() as client:
        first = client.reset(seed=5).observation
        assert (
            first["prompt"][0]["role"] == "system"
            and "<action>NAME</action>" in first["prompt"][1]["content"]
        )
        assert first["action_names"] == ["left", "down", "right", "up"] and first["free_text"] is False
        tagged = client.step({"action": "I go <action>down</action>"})
        assert tagged.observation["valid"] and tagged.observation["played"] == "down"
        assert tagged.reward == down_reward
        client.reset(seed=5)
        by_index = client.step({"action": 1})
        assert by_index.observation["played"] == "down" and by_index.reward == down_reward
        client.reset(seed=5)
        for garbage in ("fly", "<action>north</action>", "", "left right", 9, -1):
            result = client.step({"action": garbage})
            seen = result.observation
            # penalty_default: the env's default action (its first valid one) and the penalty -1
            assert seen["valid"] is False and seen["played"] == "left"
            assert result.reward == pytest.approx(seen["env_reward"] - 1.0)
            if result.done:
                client.reset(seed=5)
        with pytest.raises(RuntimeError, match="reset first"):
            client.reset(seed=5)
            while not client.step({"action": "left"}).done:
                pass
            client.step({"action": "left"})  # after the end: the server says so, and serves on
        assert client.reset(seed=5).observation["text"] == first["text"]


def test_the_server_survives_a_client_that_disconnects_mid_episode(server):
    url, http = server
    assert wait_for(lambda: http.active_sessions == 0)

    async def vanish() -> None:
        from websockets.asyncio.client import connect

        ws = await connect(url.replace("http://", "ws://") + "/ws")
        await ws.send(json.dumps({"type": "reset", "data": {"seed": 7}}))
        await ws.recv()
        await ws.send(json.dumps({"type": "step", "data": {"action": "right"}}))
        await ws.recv()
        ws.transport.abort()  # gone mid-episode: no close frame, no close message

    asyncio.run(vanish())
    assert wait_for(lambda: http.active_sessions == 0), "the vanished client's session was not closed"
    expected = play(make_env("frozenlake", **LAKE), 7, ["right", "down"])
    assert play(OpenEnvEnv(url=url), 7, ["right", "down"]) == expected


def test_concurrent_clients_are_independent(server):
    url, http = server
    plans = {2: ["right", "down"], 9: ["down", "down", "right"], 13: ["left", "up", "right", "down"]}
    expected = {seed: play(make_env("frozenlake", **LAKE), seed, plan) for seed, plan in plans.items()}
    envs = {seed: OpenEnvEnv(url=url) for seed in plans}
    seen = {seed: [env.reset(seed=seed)] for seed, env in envs.items()}
    assert http.active_sessions >= len(plans)
    active = set(plans)
    for k in range(100):  # one step of each in turn: their sessions interleave on the server
        for seed in sorted(active):
            step = envs[seed].step(plans[seed][k % len(plans[seed])])
            seen[seed].append(step)
            if step[2] or step[3]:
                active.discard(seed)
        if not active:
            break
    for seed, steps in seen.items():
        obs, info = steps[0]
        got = [(obs, info["valid_actions"], info["state"])]
        got += [(o, r, te, tr, i["success"], i["valid_actions"], i["state"]) for o, r, te, tr, i in steps[1:]]
        assert got == expected[seed]
        envs[seed].close()
    assert wait_for(lambda: http.active_sessions == 0)


def test_eval_plays_the_served_env_as_in_process(server, tmp_path):
    url, _ = server
    runs = {}
    for name, env in (("remote", ["env=openenv", f"env.url={url}"]), ("local", SERVED)):
        runs[name] = tmp_path / name
        args = ["eval", *env, "agent=random", "eval.episodes=5", f"hydra.run.dir={runs[name]}"]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    episodes = {
        name: [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
        for name, path in runs.items()
    }
    assert len(episodes["remote"]) == 5
    assert [(e["seed"], e["actions"], e["return"], e["success"]) for e in episodes["remote"]] == [
        (e["seed"], e["actions"], e["return"], e["success"]) for e in episodes["local"]
    ]
    assert json.loads((runs["remote"] / "eval.json").read_text())["env"] == "openenv"


TINY = [
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",
    "algo.group_size=2",
    "algo.groups_per_iteration=2",
    "algo.gradient_accumulation_steps=1",
    "algo.iterations=2",
    "algo.eval_before=false",
    "algo.eval_every=0",
    "algo.save_final=false",
    "eval.episodes=2",
]


def test_train_on_the_served_env_gives_the_in_process_returns(server, tmp_path):
    url, _ = server
    rows = {}
    for name, env in (("remote", ["env=openenv", f"env.url={url}"]), ("local", SERVED)):
        run = tmp_path / name
        result = CliRunner().invoke(
            app, ["train", *env, *TINY, f"hydra.run.dir={run}"], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        rows[name] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    keys = ("iteration", "train/mean_return", "train/success_rate", "train/invalid_rate", "loss")
    assert [[r[k] for k in keys] for r in rows["remote"]] == [[r[k] for k in keys] for r in rows["local"]]
    assert [r["iteration"] for r in rows["remote"]] == [1, 2]


def test_tool_env_plays_a_served_episode_for_trl(server):
    from transformers.utils import get_json_schema

    url, _ = server
    schema = get_json_schema(ToolEnv.act)  # how TRL turns an environment's method into a tool
    assert schema["function"]["name"] == "act"
    assert schema["function"]["parameters"]["required"] == ["action"]
    tools = [name for name in vars(ToolEnv) if callable(getattr(ToolEnv, name)) and not name.startswith("_")]
    assert sorted(tools) == ["act", "get_reward", "reset"]  # TRL makes every other public method a tool
    with ToolEnv(url) as env:
        first = env.reset(seed=3)
        assert "Frozen Lake" in first and "Valid actions: left, down, right, up" in first
        local = make_env("frozenlake", **LAKE)
        local.reset(seed=3)
        total, text = 0.0, ""
        for k in range(100):
            action = ["down", "right"][k % 2]
            _, reward, terminated, truncated, _ = local.step(action)
            total += reward
            text = env.act(action)
            if terminated or truncated:
                break
        assert "The episode is over" in text and env.get_reward() == total
        with pytest.raises(ValueError, match="over"):
            env.act("down")
        assert "Reward: -1" in (env.reset(seed=3), env.act("fly"))[1]  # an invalid action: the penalty


@pytest.mark.slow
def test_trls_grpo_trainer_trains_on_a_served_env_through_tool_env(server, tmp_path):
    """TRL's own GRPOTrainer with environment_factory=ToolEnv: one rollout per dataset row resets a
    served episode with the row's seed, `act` is the only tool, and get_reward scores each rollout. The
    tiny random model calls no tool, so its rewards are the untouched episodes' returns (0)."""
    import functools

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from agentrl.models import ensure_tiny_random

    url, _ = server
    calls: list[tuple] = []

    class Counted(ToolEnv):
        def reset(self, seed=None, **kwargs):
            calls.append(("reset", seed))
            return super().reset(seed=seed, **kwargs)

        def get_reward(self):
            calls.append(("reward", super().get_reward()))
            return calls[-1][1]

    path = ensure_tiny_random()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = (
        qwen2_5_chat_template  # a template TRL parses tool calls of (same special tokens)
    )
    prompt = [{"role": "user", "content": "Play Frozen Lake with the act tool."}]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=8,
        max_tool_calling_iterations=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        processing_class=tokenizer,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [prompt] * 4, "seed": [11, 12, 13, 14]}),
        environment_factory=functools.partial(Counted, url),
    )
    assert [tool.__name__ for tool in trainer._env_tools[None]] == ["act"]
    trainer.train()
    resets = [seed for kind, seed in calls if kind == "reset"]
    assert len(resets) == 2 and len(set(resets)) == 1 and resets[0] in (11, 12, 13, 14)
    assert [c for c in calls if c[0] == "reward"] == [("reward", 0.0), ("reward", 0.0)]
    assert trainer.state.log_history[0]["rewards/Counted/mean"] == 0.0


def test_env_openenv_config_errors_are_one_line_and_leave_no_run_directory(tmp_path):
    for overrides, message in (
        (["env=openenv"], "env=openenv needs env.url"),
        (["env=openenv", "env.url=http://127.0.0.1:9"], "cannot reach the OpenEnv server"),
    ):
        run = tmp_path / "run"
        args = ["eval", *overrides, "agent=random", f"hydra.run.dir={run}"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and message in result.output, result.output
        assert not run.exists()


# ---- generic OpenEnv servers: integer legal actions, and free text (tests/openenv_games.py) ----------
@pytest.fixture(scope="module")
def generic_servers():
    import openenv_games

    from agentrl.envs.openenv import AppThread

    running = {
        free_text: AppThread(app)
        for free_text, app in ((False, openenv_games.count_app), (True, openenv_games.echo_app))
    }
    yield {free_text: server.url for free_text, server in running.items()}
    for server in running.values():
        server.stop()


def test_a_generic_openenv_server_maps_to_the_text_env_contract(generic_servers):
    env = OpenEnvEnv(url=generic_servers[False], instructions="Reach the target exactly.")
    obs, info = env.reset(seed=1)
    assert env.action_names == ["1", "2"] and info["valid_actions"] == ["1", "2"]
    assert not env.free_text_action and env.instructions == "Reach the target exactly."
    assert "total: 0" in obs and "target: 4" in obs and "legal_actions" not in obs
    steps = [env.step("2"), env.step(1)]  # by name and by index: 2 then 2 again -> exactly 4
    assert [s[1:4] for s in steps] == [(0.0, False, False), (1.0, True, False)]
    assert steps[-1][4]["success"] is True and steps[-1][4]["state"]["total"] == 4
    env.close()

    echo = OpenEnvEnv(url=generic_servers[True], max_steps=3)
    assert echo.free_text_action
    obs, _ = echo.reset(seed=0)
    assert obs == "Say: hello"
    _, reward, terminated, _, info = echo.step("hello")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    echo.close()


def test_eval_plays_a_generic_openenv_server_by_url_app_or_environment_class(generic_servers, tmp_path):
    played = {}
    for source in (
        f"env.url={generic_servers[False]}",
        "env.app=openenv_games:count_app",
        "env.app=openenv_games:CountGame",
    ):
        run = tmp_path / str(len(played))
        args = ["eval", "env=openenv", source, "agent=random", "eval.episodes=4", f"hydra.run.dir={run}"]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
        assert len(episodes) == 4 and all(set(e["actions"]) <= {"1", "2"} for e in episodes)
        assert all(e["return"] in (1.0, -1.0) and e["success"] == (e["return"] == 1.0) for e in episodes)
        played[source] = [(e["seed"], e["actions"], e["return"]) for e in episodes]
    assert len({json.dumps(p) for p in played.values()}) == 1  # the same episodes, however it is reached
    for spec, message in (
        ("openenv_games", "give module:attribute"),
        ("openenv_games:nothing", "has no attribute 'nothing'"),
        ("openenv_games:AddAction", "AddAction is not an openenv Environment"),
    ):
        result = CliRunner().invoke(app, ["eval", "env=openenv", f"env.app={spec}", "agent=random"])
        assert result.exit_code == 2 and message in result.output, result.output


def test_agentrl_serve_runs_until_interrupted_and_refuses_bad_options_in_one_line(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    for args, message in (
        (["env=nope"], "unknown env 'nope'"),
        (["--port", "70000"], "--port 70000: must be in [0, 65535]"),
        (["env=openenv"], "env=openenv is a client of another server"),
    ):
        result = CliRunner().invoke(app, ["serve", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "serve",
        "env=tictactoe",
        "env.opponent=perfect",
        "--port",
        "0",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving env=tictactoe on http://127.0.0.1:"), line
        url = line.split(" on ")[1].split()[0]
        local = make_env("tictactoe", opponent="perfect")
        plan = [str(cell) for cell in range(1, 10)]  # an occupied cell: the env's own illegal move (a loss)
        assert play(OpenEnvEnv(url=url), 4, plan) == play(local, 4, plan)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
