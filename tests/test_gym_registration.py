"""`import agentrl` registers the gymnasium ids (as `import ale_py` does) without loading torch, and
every registered env passes gymnasium's env checker."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl  # noqa: F401  (registers the ids in this process too)
from agentrl.envs import ENV_SPECS
from agentrl.sandbox import sandbox_problem

GYM_IDS = [spec.gym_id for spec in ENV_SPECS.values()]
# The checker steps each env a few times; a DataSciCoding step runs a sandboxed program (~1-3 s), and
# tests/test_datascicoding.py::test_env_checker_and_the_reference_actions checks the same class already.
CHECKED_ELSEWHERE = {"agentrl/DataSciCoding-v0"}


def test_import_agentrl_registers_the_ids_in_a_fresh_interpreter():
    code = (
        "import sys, gymnasium, agentrl\n"
        "env = gymnasium.make('agentrl/FrozenLake-v0', map='4x4')\n"
        "obs, info = env.reset(seed=0)\n"
        "assert obs.startswith('P _ _ _'), obs\n"
        f"assert all(i in gymnasium.registry for i in {GYM_IDS!r})\n"
        "heavy = [m for m in ('torch', 'transformers', 'stable_baselines3') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("gym_id", GYM_IDS)
def test_registered_env_passes_the_env_checker(gym_id):
    if gym_id == "agentrl/OpenEnv-v0":  # a client: it plays a served env (tests/test_openenv.py)
        from agentrl.errors import ConfigError
        from agentrl.runs.serve import serving

        with serving(["env=frozenlake", "env.map=4x4"]) as (url, _):
            env = gym.make(gym_id, url=url)
            check_env(env.unwrapped)
            assert env.reset(seed=0)[0].startswith("P _ _ _")
            with pytest.raises(ConfigError, match="no numeric view"):
                env.unwrapped.numeric_space()
            env.close()
        return
    # without bubblewrap here, DataSciCoding is made with the plain child process it would refuse to pick
    unsafe = gym_id == "agentrl/DataSciCoding-v0" and sandbox_problem() is not None
    env = gym.make(gym_id, **({"sandbox": "unsafe-local"} if unsafe else {}))
    if gym_id not in CHECKED_ELSEWHERE:
        check_env(env.unwrapped)
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and "valid_actions" in info
    if env.unwrapped.free_text_action:  # code as the action: no numeric view (DQN refuses it)
        return
    assert env.unwrapped.numeric_space().contains(env.unwrapped.numeric_observation())
    env.close()
