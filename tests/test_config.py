"""Typed configs: every YAML option has a schema, bad values fail at composition with one line naming
the key, `typed()` gives the dataclasses, `agentrl config ... --describe` explains every key."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields, is_dataclass

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import (
    CONF_DIR,
    AgentRLConfig,
    DQNConfig,
    FrozenLakeConfig,
    LLMAgentConfig,
    ModelConfig,
    MSGRPOConfig,
    compose_config,
    group_options,
    option_config,
    split_sweep,
    typed,
)
from agentrl.config import schema as S
from agentrl.config.algo import LOSS_TYPES, LR_SCHEDULERS, AAWConfig
from agentrl.config.base import _hints, field_rows
from agentrl.config.env import (
    BANDIT_MAX_ARMS,
    BANDIT_REWARDS,
    FROZENLAKE_MAPS,
    FROZENLAKE_VIEWS,
    TICTACTOE_MARKS,
    TICTACTOE_OPPONENTS,
)
from agentrl.config.model import DTYPES
from agentrl.errors import ConfigError

runner = CliRunner()

TYPED_GROUPS = ("env", "agent", "model", "algo")


def all_schemas() -> set[type]:
    """Every schema class, nested ones included."""
    found: set[type] = set()
    todo = [AgentRLConfig, ModelConfig, *(c for options in S.SCHEMAS.values() for c in options.values())]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.add(cls)
        hints = _hints(cls)
        todo.extend(t for t in hints.values() if isinstance(t, type) and is_dataclass(t))
    return found


# ---- bad values: one line naming the key ---------------------------------------------------------------
BAD = [
    (["algo=msgrpo", "algo.aaw.fraction=1.5"], "algo.aaw.fraction=1.5: must be in (0, 1]"),
    (["agent.history=-2"], "agent.history=-2: must be >= 0"),
    (["algo=msgrpo", "algo.aaw.enabled=maybe"], "algo.aaw.enabled=maybe: expected a boolean"),
    (["agent.cot=maybe"], "agent.cot=maybe: expected a boolean"),
    (["agent.cot=yes"], "agent.cot=yes: expected a boolean"),
    (["algo=msgrpo", "algo.aaw.enabled=1"], "algo.aaw.enabled=1: expected a boolean"),
    (["env.slippery=maybe"], "env.slippery=maybe: expected a boolean"),
    (["env.map=bogus"], "env.map=bogus: must be one of: 4x4, 8x8, random"),
    (["env.p=0"], "env.p="),
    (["env=tictactoe", "env.opponent=god"], "env.opponent=god: must be one of: random, mcts, perfect"),
    (["env=tictactoe", "env.agent_mark=Z"], "env.agent_mark=Z"),
    (["env=tictactoe", "env.mcts_simulations=0"], "env.mcts_simulations=0"),
    (["env=bandit", "env.reward=poisson"], "env.reward=poisson: must be one of: bernoulli, gaussian"),
    (["env=bandit", "env.arms=30"], "env.arms=30: must be in [2, 24]"),
    (["env=bandit", "env.arms=1"], "env.arms=1"),
    (["env=bandit", "env.gaussian_sd=0"], "env.gaussian_sd="),
    (["env=snake", "env.size=2"], "env.size=2: must be >= 4"),
    (["env=snake", "env.start_length=6"], "env.start_length=6: must be <= size/2 = 5"),
    (["env=snake", "env.opponent=maybe"], "env.opponent=maybe: expected a boolean"),
    (["env=snake_poison", "env.poison_apples=-1"], "env.poison_apples=-1"),
    (["algo=msgrpo", "algo.group_size=-4"], "algo.group_size=-4: must be >= 2"),
    (["algo=msgrpo", "algo.group_size=1"], "algo.group_size=1"),
    (["algo=msgrpo", "algo.group_size=abc"], "algo.group_size=abc: expected an integer"),
    (["algo=msgrpo", "algo.groups_per_iteration=0"], "algo.groups_per_iteration=0"),
    (["algo=msgrpo", "algo.iterations=0"], "algo.iterations=0"),
    (["algo=msgrpo", "algo.aaw.fraction=0"], "algo.aaw.fraction="),
    (["algo=msgrpo", "algo.aaw.count=-1"], "algo.aaw.count=-1"),
    (["algo=msgrpo", "algo.learning_rate=0"], "algo.learning_rate="),
    (["algo=msgrpo", "algo.gradient_accumulation_steps=0"], "algo.gradient_accumulation_steps=0"),
    (
        ["algo=msgrpo", "algo.curriculum.random_start=1.5"],
        "algo.curriculum.random_start=1.5: must be in [0, 1]",
    ),
    (["algo=msgrpo", "algo.curriculum.random_start=nan"], "algo.curriculum.random_start=nan"),
    (["algo=msgrpo", "algo.temperature=0"], "algo.temperature="),
    (["algo=msgrpo", "algo.epsilon=0"], "algo.epsilon="),
    (["algo=msgrpo", "algo.beta=-0.1"], "algo.beta=-0.1"),
    (["algo=msgrpo", "algo.loss_type=ppo"], "algo.loss_type=ppo: must be one of: grpo,"),
    (["algo=msgrpo", "algo.lr_scheduler=sometimes"], "algo.lr_scheduler=sometimes: must be one of: linear,"),
    (["algo=msgrpo", "algo.eval_every=-1"], "algo.eval_every=-1"),
    (["algo=msgrpo", "algo.checkpoint_every=-1"], "algo.checkpoint_every=-1"),
    (["algo=msgrpo", "algo.keep_checkpoints=0"], "algo.keep_checkpoints=0"),
    (["algo=msgrpo", "algo.min_informative_groups=-1"], "algo.min_informative_groups=-1"),
    (["algo=msgrpo", "algo.max_rollout_rounds=0"], "algo.max_rollout_rounds=0"),
    (["algo=msgrpo", "algo.time_limit_minutes=0"], "algo.time_limit_minutes="),
    (["algo=msgrpo", "algo.top_p=1.5"], "algo.top_p=1.5"),
    (["algo=msgrpo", "algo.aaw=null"], "algo.aaw=null: must not be null"),
    (
        ["agent.invalid_rule=skip"],
        "agent.invalid_rule=skip: must be one of: penalty_default, penalty_end, random",
    ),
    (["agent.sampling.temperature=-1"], "agent.sampling.temperature=-1"),
    (["agent.sampling.top_p=0"], "agent.sampling.top_p="),
    (["agent.sampling.top_p=1.5"], "agent.sampling.top_p=1.5"),
    (["agent.sampling.top_k=-1"], "agent.sampling.top_k=-1"),
    (["agent.sampling.max_new_tokens=0"], "agent.sampling.max_new_tokens=0"),
    (["agent.sampling.stop=abc"], "agent.sampling.stop=abc: expected a list"),
    (["agent.answer_tag='a b'"], "agent.answer_tag=a b: must be a plain tag name"),
    (["agent=planner", "agent.ucb_c=-1"], "agent.ucb_c=-1"),
    (["model.backend=tf"], "model.backend=tf: must be one of: hf, openai, vllm"),
    (["model.dtype=int8"], "model.dtype=int8: must be one of: auto,"),
    (["model.lora.r=-1"], "model.lora.r=-1"),
    (["model.name_or_path=null"], "model.name_or_path=null: required with backend hf"),
    (["algo=dqn", "algo.net_arch=[0,64]"], "algo.net_arch=[0, 64]"),
    (["algo=dqn", "algo.gamma=1.5"], "algo.gamma=1.5"),
    (["algo=dqn", "algo.exploration_final_eps=2"], "algo.exploration_final_eps="),
    (["algo=dqn", "algo.total_timesteps=0"], "algo.total_timesteps=0"),
    (["algo=dqn", "algo.save_replay_buffer=maybe"], "algo.save_replay_buffer=maybe: expected a boolean"),
    (["eval.episodes=0"], "eval.episodes=0"),
    (["eval.lockstep=maybe"], "eval.lockstep=maybe: expected a boolean"),
    (["task=nope"], "task=nope: must be one of: eval, train"),
    (["seed=x"], "seed=x: expected an integer"),
    (["algo=msgrpo", "algo.nosuch=1"], "unknown config key 'algo.nosuch'; valid keys under 'algo': aaw,"),
    (["algo=msgrpo", "algo.aaw.nosuch=1"], "valid keys under 'algo.aaw': count, enabled, eps, fraction"),
    (["env.nosuch=1"], "valid keys under 'env': map, max_steps, name, p, size, slippery"),
    (
        ["task=train", "algo=msgrpo", "algo.trainable_layers=4", "model.lora.r=8"],
        "algo.trainable_layers=4: is for full fine-tuning",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_value_is_one_line_naming_the_key(overrides, expected):
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_typed_bool_rejects_words_it_does_not_know():
    # only true and false: OmegaConf alone would read yes, on, 1 or 2 as True
    assert compose_config(["algo=msgrpo", "algo.aaw.enabled=false"]).algo.aaw.enabled is False
    assert typed(compose_config(["agent.cot=true"]).agent).cot is True


# ---- every option composes, validates and matches its YAML keys ----------------------------------------
@pytest.mark.parametrize(
    ("group", "option"), [(g, o) for g in TYPED_GROUPS for o in group_options(g)], ids=lambda x: str(x)
)
def test_every_group_option_composes_and_validates(group, option):
    cfg = compose_config([f"{group}={option}", *(["task=train"] if group == "algo" else [])])
    node = typed(cfg[group])
    assert isinstance(node, S.schema_for(group, option))
    assert node.name == cfg[group].name
    root = typed(cfg)
    assert isinstance(root, AgentRLConfig) and isinstance(getattr(root, group), type(node))


@pytest.mark.parametrize(
    ("group", "option"), [(g, o) for g in TYPED_GROUPS for o in group_options(g)], ids=lambda x: str(x)
)
def test_schema_fields_equal_the_yaml_keys(group, option):
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    defaults = raw.pop("defaults")
    cls = S.schema_for(group, option)
    if defaults[0] in group_options(group):  # a variant of another option (ntpo: poad with one switch)
        base = OmegaConf.load(CONF_DIR / group / f"{defaults[0]}.yaml")
        assert S.schema_for(group, defaults[0]) is cls, "a variant shares its base option's schema"
        raw = OmegaConf.to_container(OmegaConf.merge(base, raw))
        defaults = raw.pop("defaults")
    assert defaults == [S.schema_name(cls), "_self_"], "the YAML must name its schema first"

    def keys(data, prefix=""):
        out = set()
        for k, v in data.items():
            out |= keys(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "vllm" else {f"{prefix}{k}"}
        return out

    schema_keys = {row["key"] for row in field_rows(cls)}
    if group == "model":  # one schema for hf and openai models: each file uses a subset
        assert keys(raw) <= schema_keys
    else:
        assert keys(raw) == schema_keys


def test_model_schema_is_the_union_of_the_model_files_plus_vllm():
    union = set()
    for option in group_options("model"):
        raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{option}.yaml"))
        raw.pop("defaults")
        union |= set(raw)
    assert {f.name for f in fields(ModelConfig)} == union | {"vllm"}
    assert typed(compose_config([]).model).vllm == {}


def test_experiment_preset_composes_and_overrides_group_keys():
    cfg = compose_config(["experiment=frozenlake_learn"])
    algo, agent, env = typed(cfg.algo), typed(cfg.agent), typed(cfg.env)
    assert isinstance(algo, MSGRPOConfig) and isinstance(agent, LLMAgentConfig)
    assert isinstance(env, FrozenLakeConfig)
    assert (algo.group_size, algo.groups_per_iteration, algo.aaw.fraction) == (8, 32, 0.75)
    assert algo.curriculum.random_start == 0.75 and algo.time_limit_minutes == 30.0
    assert agent.prefill == "I move" and agent.sampling.max_new_tokens == 1
    assert cfg.eval.episodes == 4 and env.max_steps == 8
    # the train command's own overrides still apply on top
    assert typed(compose_config(["experiment=frozenlake_learn", "algo.iterations=3"]).algo).iterations == 3
    with pytest.raises(ConfigError, match=r"algo\.aaw\.fraction=2"):
        compose_config(["experiment=frozenlake_learn", "algo.aaw.fraction=2"])


def test_root_defaults_and_optional_algo():
    cfg = compose_config([])
    root = typed(cfg)
    assert root.algo is None and cfg.get("algo") is None
    assert root.name == "eval_frozenlake" and root.eval.episodes == 20 and root.task == "eval"
    assert isinstance(root.model, ModelConfig) and isinstance(root.agent, LLMAgentConfig)
    # an env's new constructor options can still be added with + (a key no code reads cannot: test_cli_walk)
    assert compose_config(["+env.render_mode=ansi"]).env.render_mode == "ansi"


def test_sweep_jobs_are_checked_one_by_one():
    jobs = split_sweep(["algo=msgrpo", "algo.aaw.fraction=0.5,1.5"])
    compose_config(jobs[0])
    with pytest.raises(ConfigError, match=r"algo\.aaw\.fraction=1\.5"):
        compose_config(jobs[1])


# ---- typed() ----------------------------------------------------------------------------------------------
def test_typed_gives_the_dataclass_with_yaml_key_attributes():
    cfg = compose_config(["algo=msgrpo", "model=tiny-random"])
    algo = typed(cfg.algo)
    assert isinstance(algo, MSGRPOConfig)
    assert (algo.group_size, algo.aaw.enabled, algo.aaw.fraction, algo.loss_type) == (16, True, 0.5, "dapo")
    assert typed(cfg.algo, MSGRPOConfig) == algo
    assert typed(cfg.model).lora.r == 0 and typed(cfg.model).name_or_path == "builtin:tiny-random"
    with pytest.raises(ConfigError, match="not a DQNConfig"):
        typed(cfg.algo, DQNConfig)


def test_typed_accepts_a_plain_yaml_node_and_checks_it():
    plain = OmegaConf.create({"algo": OmegaConf.load(CONF_DIR / "algo" / "msgrpo.yaml"), "seed": 0})
    assert typed(plain.algo).group_size == 16  # the YAML's `defaults` list is ignored
    bad = OmegaConf.merge(plain, OmegaConf.from_dotlist(["algo.aaw.fraction=1.5"]))
    with pytest.raises(ConfigError, match=r"^algo\.aaw\.fraction=1\.5: must be in \(0, 1\]$"):
        typed(bad.algo)
    with pytest.raises(ConfigError, match=r"algo\.group_size=1: must be >= 2"):
        typed({"name": "msgrpo", "group_size": 1}, MSGRPOConfig)
    with pytest.raises(ConfigError, match="unknown config key 'algo.bogus'"):
        typed({"name": "msgrpo", "bogus": 1}, MSGRPOConfig)


def test_direct_construction_is_checked_too():
    with pytest.raises(ConfigError, match=r"algo\.aaw\.fraction=1\.5"):
        MSGRPOConfig(aaw=AAWConfig(fraction=1.5))
    with pytest.raises(ConfigError, match=r"env\.slippery=maybe: expected a boolean"):
        FrozenLakeConfig(slippery="maybe")
    assert MSGRPOConfig().group_size == 16


def test_option_config_has_the_yaml_keys_and_constructor_arguments():
    from agentrl.envs.snake import SnakeEnv

    env = OmegaConf.to_container(option_config("env", "snake_poison"))
    assert env.pop("name") == "snake_poison" and env["poison_apples"] == 2
    params = inspect.signature(SnakeEnv.__init__).parameters
    assert set(env) == set(params) - {"self", "render_mode"}


# ---- metadata and constants ---------------------------------------------------------------------------------
def test_every_schema_field_has_help_and_source():
    for cls in all_schemas():
        for f in fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
            assert f.metadata.get("source") in ("paper", "code", "ours"), f"{cls.__name__}.{f.name}"
            assert "\n" not in f.metadata["help"]


def test_choices_match_the_modules_that_use_them():
    from agentrl.agents.backends import BACKENDS
    from agentrl.agents.llm import INVALID_RULES
    from agentrl.envs import ENV_SPECS
    from agentrl.envs.bandit import COLOURS, REWARD_KINDS
    from agentrl.envs.frozenlake import MAP_CHOICES, VIEW_CHOICES
    from agentrl.envs.tictactoe import MARKS, OPPONENTS

    assert FROZENLAKE_MAPS == MAP_CHOICES and FROZENLAKE_VIEWS == VIEW_CHOICES
    assert BANDIT_REWARDS == REWARD_KINDS and BANDIT_MAX_ARMS == len(COLOURS)
    assert TICTACTOE_MARKS == MARKS and TICTACTOE_OPPONENTS == OPPONENTS
    assert INVALID_RULES == INVALID_RULES and BACKENDS == BACKENDS
    assert set(S.SCHEMAS["env"]) == set(ENV_SPECS) == set(group_options("env"))
    assert set(S.SCHEMAS["algo"]) == set(group_options("algo"))
    assert set(S.SCHEMAS["agent"]) == set(group_options("agent"))


def test_dtypes_are_the_ones_models_resolves():
    from agentrl.models import resolve_dtype

    for dtype in DTYPES:
        resolve_dtype(dtype, "cpu")


def test_loss_types_and_schedulers_match_trl_and_transformers():
    from transformers.trainer_utils import SchedulerType
    from trl import GRPOConfig

    assert LR_SCHEDULERS == tuple(s.value for s in SchedulerType)
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    supported = re.search(r"Supported values are (.*?)\.", help_text).group(1)
    assert set(LOSS_TYPES) == set(re.findall(r"'(\w+)'", supported))


# ---- the command line -----------------------------------------------------------------------------------------
def test_describe_lists_every_key_with_type_default_help_and_source():
    result = runner.invoke(app, ["config", "algo=msgrpo", "--describe"])
    assert result.exit_code == 0, result.output
    out = result.output
    flat = " ".join(out.split())  # help is wrapped to the terminal's width
    for row in field_rows(MSGRPOConfig):
        assert f"  {row['key']}: {row['type']}" in out
        assert " ".join(row["help"].split()) in flat
    assert "aaw.fraction: float | None  (default: 0.5)  [ours]" in out
    assert "group_size: int  (default: 16)  [code]" in out
    assert "must be in (0, 1] or null" in out
    assert "seed_offset" not in out


def test_describe_shows_the_yaml_values_of_the_option():
    out = runner.invoke(app, ["config", "env=snake_poison", "--describe"]).output
    assert "poison_apples: int  (default: 2)" in out and "SnakeConfig" in out
    out = runner.invoke(app, ["config", "--describe"]).output
    assert "eval.episodes: int  (default: 20)" in out and "seed: int" in out
    out = runner.invoke(app, ["config", "experiment=frozenlake_learn", "--describe"]).output
    assert "algo.aaw.fraction: float | None  (value: 0.75)" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "algo.aaw.fraction=1.5"], "algo.aaw.fraction=1.5: must be in (0, 1]"),
        (["train", "algo=msgrpo", "algo.aaw.enabled=maybe"], "algo.aaw.enabled=maybe: expected a boolean"),
        (["eval", "agent.history=-2"], "agent.history=-2: must be >= 0"),
        (["eval", "agent=random", "env=tictactoe", "env.opponent=god"], "env.opponent=god"),
        (["sweep", "algo=msgrpo", "algo.group_size=8,-1"], "algo.group_size=-1: must be >= 2"),
        (["config", "algo=msgrpo", "algo.iterations=0"], "algo.iterations=0: must be >= 1"),
    ],
)
def test_cli_bad_value_exits_2_with_one_line_and_no_run_dir(tmp_path, args, expected):
    run = tmp_path / "never"
    where = f"hydra.sweep.dir={run}" if args[0] == "sweep" else f"hydra.run.dir={run}"
    result = runner.invoke(app, [*args, *([where] if args[0] != "config" else [])])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.output
    assert not run.exists() and not (tmp_path / "outputs").exists()
