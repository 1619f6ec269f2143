"""Every experiment preset composes and passes the pre-launch checks (`--dry-run`) with the tiny test
model; the transfer presets evaluate a trained run's own model on another env."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import CONF_DIR, CONFIG_GROUPS, compose_config
from agentrl.config.presets import preset_for_agent
from agentrl.errors import ConfigError
from agentrl.runs.launch import dry_run
from agentrl.runs.sweep import sweep_trains
from agentrl.runs.trained import plays_trained_model, trained_model

runner = CliRunner()
PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def _preset(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml"))


def _trains(name: str) -> bool:
    return any(isinstance(d, dict) and "override /algo" in d for d in _preset(name).get("defaults", []))


@pytest.fixture
def snake_run(tmp_path) -> Path:
    """A Snake training run as `agentrl train experiment=paper_snake_3b model=tiny-random` leaves it
    (.hydra/ and a final/ model directory; no weights: a dry run never loads them)."""
    run = tmp_path / "snake_run"
    overrides = ["algo=msgrpo", "experiment=paper_snake_3b", "model=tiny-random", "agent.history=2"]
    cfg = compose_config(["task=train", *overrides])
    (run / ".hydra").mkdir(parents=True)
    (run / "final").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(["task=train", *overrides]), run / ".hydra" / "overrides.yaml")
    (run / "final" / "config.json").write_text("{}")
    return run


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_dry_runs_with_the_tiny_model(name, snake_run, tmp_path):
    if _trains(name):
        args = ["train", f"experiment={name}", "model=tiny-random"]
    elif _preset(name).get("from_run_env"):
        args = ["eval", f"experiment={name}", f"from_run={snake_run}"]  # the run's model is tiny-random
    else:
        args = ["eval", f"experiment={name}", "model=tiny-random"]
    result = runner.invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run: agentrl" in result.output and "run dir" in result.output
    assert not (tmp_path / "outputs").exists()  # nothing created


def test_paper_presets_hold_the_papers_settings():
    frozen = compose_config(["task=train", "experiment=paper_frozenlake_3b"])
    snake = compose_config(["task=train", "experiment=paper_snake_3b"])
    for cfg in (frozen, snake):
        assert cfg.model.name_or_path == "Qwen/Qwen2.5-3B-Instruct"
        assert (cfg.algo.group_size, cfg.algo.groups_per_iteration, cfg.algo.learning_rate) == (16, 2, 1e-6)
        assert cfg.algo.eval_temperature == 0.5
    assert (frozen.algo.beta, frozen.algo.temperature, frozen.env.map) == (0.0, 1.25, "random")
    assert (snake.algo.beta, snake.algo.temperature, snake.algo.top_k) == (0.1, 1.5, 3)
    zero = compose_config(["experiment=zero_shot_72b"])
    assert (zero.model.backend, zero.model.name) == ("openai", "Qwen/Qwen2.5-72B-Instruct")


def test_transfer_preset_evaluates_the_trained_model_on_frozenlake(snake_run):
    plan = dry_run("eval", ["experiment=transfer_snake_to_frozenlake", f"from_run={snake_run}"])
    cfg = plan.cfg
    assert cfg.model.name_or_path == str((snake_run / "final").resolve())  # not the base model
    assert cfg.model.name == "tiny-random" and cfg.env.name == "frozenlake" and cfg.env.map == "random"
    # the run's own agent settings (its preset's cot and answer length, its command line's history)
    # and its eval temperature stay; the Snake env settings do not
    assert cfg.agent.cot is True and cfg.agent.history == 2 and cfg.agent.sampling.max_new_tokens == 256
    assert cfg.agent.sampling.temperature == 0.5 and cfg.env.max_steps == 8
    assert plan.run_dir is not None and plan.run_dir.name.endswith("_eval_frozenlake")

    poison = dry_run("eval", ["experiment=poison_apple", f"from_run={snake_run}"]).cfg
    assert poison.env.name == "snake_poison" and poison.env.poison_apples == 2
    assert poison.model.name_or_path == str((snake_run / "final").resolve())
    # the command line wins over the trained model: the base model with the same settings
    base = dry_run(
        "eval", ["experiment=poison_apple", f"from_run={snake_run}", "model.name_or_path=builtin:x"]
    )
    assert base.cfg.model.name_or_path == "builtin:x" and base.cfg.agent.cot is True
    # ... and eval.json then labels the model that played, not the trained run
    assert plays_trained_model(cfg, trained_model(snake_run))
    assert not plays_trained_model(base.cfg, trained_model(snake_run))


def test_plain_from_run_keeps_the_runs_own_env(snake_run):
    cfg = dry_run("eval", [f"from_run={snake_run}"]).cfg
    assert cfg.env.name == "snake" and cfg.env.max_steps == 8
    assert cfg.model.name_or_path == str((snake_run / "final").resolve())


def test_dry_run_errors_are_one_line_exit_2(snake_run):
    bad = runner.invoke(app, ["train", "experiment=paper_snake_3b", "algo.nope=1", "--dry-run"])
    assert bad.exit_code == 2 and "unknown config key 'algo.nope'" in bad.output
    alone = runner.invoke(app, ["eval", "experiment=poison_apple", "--dry-run"])
    assert alone.exit_code == 2 and "from_run_env=snake_poison" in alone.output
    trains = runner.invoke(app, ["train", "from_run_env=snake", "model=tiny-random", "--dry-run"])
    assert trains.exit_code == 2 and "from_run_env=snake" in trains.output
    wrong = runner.invoke(app, ["eval", f"from_run={snake_run}", "from_run_env=lake", "--dry-run"])
    assert wrong.exit_code == 2 and "unknown from_run_env 'lake'" in wrong.output


def test_sweep_of_a_training_preset_trains():
    assert sweep_trains(["experiment=frozenlake_learn", "seed=0,1,2", "algo.aaw.enabled=true,false"])
    assert sweep_trains(["experiment=zero_shot_72b,paper_snake_3b"])
    assert not sweep_trains(["experiment=zero_shot_72b", "env=snake"])


# ---- a preset with a baseline agent ---------------------------------------------------------------
EVAL_PRESETS = [name for name in PRESETS if not _preset(name).get("from_run_env")]
TRANSFER_PRESETS = [name for name in PRESETS if _preset(name).get("from_run_env")]


@pytest.mark.parametrize("agent", ["random", "planner"])
@pytest.mark.parametrize("name", EVAL_PRESETS)
def test_every_preset_composes_with_a_baseline_agent_and_keeps_its_env(name, agent):
    """The LLM presets' agent keys (cot, prefill, sampling, ...) do not exist for random or planner:
    they are left out, and the preset's env and eval settings still hold."""
    preset = compose_config(["task=eval", f"experiment={name}"])
    cfg = compose_config(["task=eval", f"experiment={name}", f"agent={agent}"])
    assert cfg.agent.name == agent
    assert cfg.env == preset.env and cfg.eval == preset.eval and cfg.seed == preset.seed


def test_a_preset_with_its_own_agent_is_not_rewritten():
    cfg = compose_config(["task=eval", "experiment=rlft_bandit", "agent=llm"])
    assert cfg.agent.cot is True and cfg.agent.invalid_penalty == -5.0


def test_the_users_settings_win_over_the_expanded_preset():
    cfg = compose_config(["task=eval", "experiment=rlft_bandit", "agent=random", "env.arms=7", "env=bandit"])
    assert cfg.env.arms == 7 and cfg.env.horizon == 20


def test_a_sweep_over_agents_the_preset_fits_differently_is_refused():
    with pytest.raises(ConfigError, match="sweep them separately"):
        preset_for_agent(["experiment=rlft_bandit", "agent=llm,random"], CONF_DIR, CONFIG_GROUPS)
    same = preset_for_agent(["experiment=rlft_bandit", "agent=random,planner"], CONF_DIR, CONFIG_GROUPS)
    assert "env.arms=5" in same and "agent=random,planner" in same and not any("cot" in o for o in same)


def test_eval_of_a_preset_with_the_random_agent_through_the_cli(tmp_path):
    run = tmp_path / "run"
    args = ["eval", "experiment=rlft_bandit", "agent=random", "eval.episodes=2", f"hydra.run.dir={run}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert (saved.env.name, saved.env.arms, saved.env.horizon, saved.agent.name) == (
        "bandit",
        5,
        20,
        "random",
    )
    assert (run / "eval.json").is_file()


@pytest.mark.parametrize("name", TRANSFER_PRESETS)
def test_a_transfer_preset_with_a_baseline_agent_plays_its_env(name, tmp_path):
    """The floor of a transfer table: `agentrl eval experiment=poison_apple agent=random` has no run
    to transfer and plays the preset's env (the LLM agent without from_run= is refused above)."""
    run = tmp_path / "run"
    result = runner.invoke(
        app, ["eval", f"experiment={name}", "agent=random", "eval.episodes=2", f"hydra.run.dir={run}"]
    )
    assert result.exit_code == 0, result.output
    saved = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert saved.env.name == _preset(name)["from_run_env"] and saved.agent.name == "random"


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from agentrl.models import load_tokenizer, model_config

    return load_tokenizer(model_config(compose_config(["task=train"]).model))


@pytest.mark.parametrize("name", PRESETS)
def test_every_answer_of_a_preset_fits_its_token_budget(name, smollm2_tokenizer):
    """Under strict parsing an answer cut by `max_new_tokens` before its closing tag is invalid: every
    action's answer (with `agent.cot`, the templated rationale listing every action first) must fit the
    budget with the embedded model's tokenizer, the one these presets run."""
    from agentrl.agents.llm import TextInterface, demonstration_answer, env_action_names, resolve_interface
    from agentrl.envs import env_factory

    cfg = compose_config(["task=train" if _trains(name) else "task=eval", f"experiment={name}"])
    if (
        cfg.agent.get("name", "llm") != "llm"
        or cfg.model.name != "smollm2-135m"
        or cfg.env.name == "datascicoding"
    ):
        pytest.skip("not an LLM preset on the embedded model with named actions")
    env = env_factory(cfg.env)()
    env.reset(seed=0)
    names = env.valid_actions()  # the first state's list: the longest in these envs
    resolved = resolve_interface(cfg.agent, env_action_names(cfg), smollm2_tokenizer, free_text=False)
    interface = TextInterface.from_cfg(cfg.agent, prefill=resolved.prefill)
    budget = resolved.max_new_tokens
    for action in names:
        # with `algo.state_facts` the rationale also states the env's facts (the RLFT runners' warm-ups)
        for facts in (None, env.facts()):
            answer = demonstration_answer(interface, action, names, facts)
            tokens = len(smollm2_tokenizer(answer, add_special_tokens=False).input_ids)
            assert tokens <= budget, f"{name}: {answer!r} is {tokens} tokens, max_new_tokens={budget}"
