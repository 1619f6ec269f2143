"""Composes config -> builds objects -> dispatches; owns the run directory.

Every run goes through Hydra's own entry point (`hydra.main`), so `.hydra/` (resolved config,
overrides), run-directory naming and multirun launchers (basic, joblib, submitit) are Hydra's. Before
Hydra starts, each job's config is composed and checked here, so bad input fails with one line and no
run directory is created.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from agentrl.algos import LLM_ALGORITHMS
from agentrl.config import CONF_DIR, compose_config, split_sweep
from agentrl.errors import AgentRLError, ConfigError, RunDirError

log = logging.getLogger(__name__)

TASKS = ("eval", "train")
LLM_ALGOS = tuple(LLM_ALGORITHMS)  # every one runs on trainers/multistep.py
TRAINERS = {
    "dqn": "agentrl.trainers.dqn:train_dqn",
    **{name: "agentrl.trainers.multistep:train_llm" for name in LLM_ALGOS},
}


# ---------------------------------------------------------------------------------------------
# checks before launch
# ---------------------------------------------------------------------------------------------
def check_job(overrides: list[str]) -> DictConfig:
    """Compose one job's config and build what can fail cheaply (env options, agent and algo names)."""
    cfg = compose_config(overrides)
    from agentrl.agents import AGENTS
    from agentrl.envs import env_factory

    env_factory(cfg.env)
    if cfg.task not in TASKS:
        raise ConfigError(f"unknown task {cfg.task!r}; valid choices: {', '.join(TASKS)}")
    if cfg.task == "eval" and cfg.agent.name not in AGENTS:
        raise ConfigError(f"unknown agent {cfg.agent.name!r}; valid choices: {', '.join(AGENTS)}")
    if cfg.task == "eval" and cfg.agent.name == "dqn":
        from agentrl.agents.dqn import dqn_model_path

        dqn_model_path(cfg.agent.path)  # a missing or wrong path fails here, before a run directory exists
    if cfg.task == "train":
        if cfg.get("algo") is None:
            raise ConfigError(f"train needs algo=<name>; valid choices: {', '.join(sorted(TRAINERS))}")
        if cfg.algo.name not in TRAINERS:
            raise ConfigError(
                f"no trainer for algo {cfg.algo.name!r}; valid choices: {', '.join(sorted(TRAINERS))}"
            )
    return cfg


def resume_overrides(run_dir: str, extra: list[str]) -> list[str]:
    """Overrides that recreate a run's config from its .hydra/overrides.yaml, in its own directory."""
    path = Path(run_dir)
    saved = path / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        raise RunDirError(f"cannot resume {run_dir}: no .hydra/overrides.yaml (not an agentrl run directory)")
    previous = [o for o in OmegaConf.load(saved) if not str(o).startswith(("resume=", "hydra.run.dir="))]
    keys = {o.split("=", 1)[0] for o in extra}
    kept = [o for o in previous if o.split("=", 1)[0] not in keys]
    return [*kept, *extra, f"resume={path.resolve()}", f"hydra.run.dir={path.resolve()}"]


# ---------------------------------------------------------------------------------------------
# launching through Hydra
# ---------------------------------------------------------------------------------------------
_RESULTS: list[tuple[Path, dict[str, Any]]] = []


def launch(task: str, overrides: list[str], *, multirun: bool = False) -> list[tuple[Path, dict[str, Any]]]:
    """Check every job's config, then hand the command line to Hydra. Returns (run_dir, metrics)
    for the jobs that ran in this process (the basic launcher); multirun callers read the sweep dir."""
    overrides = [f"task={task}", *overrides]
    jobs = split_sweep(overrides) if multirun else [overrides]
    for job in jobs:
        check_job(job)
    _RESULTS.clear()
    argv = sys.argv
    sys.argv = ["agentrl", *(["--multirun"] if multirun else []), *overrides]
    try:
        _hydra_main()
    finally:
        sys.argv = argv
    return list(_RESULTS)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        metrics = run_job(cfg, run_dir)
    except AgentRLError as exc:
        # Hydra would print a traceback; a user error is one line and a non-zero exit.
        log.error("%s", exc)
        raise SystemExit(exc.exit_code) from exc
    _RESULTS.append((run_dir, metrics))


def run_job(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run one composed job in `run_dir` (created by Hydra)."""
    from agentrl.console import console

    start = time.perf_counter()
    if cfg.task == "eval":
        metrics = run_eval(cfg, run_dir)
    elif cfg.task == "train":
        metrics = run_train(cfg, run_dir)
    else:
        raise ConfigError(f"unknown task {cfg.task!r}; valid choices: {', '.join(TASKS)}")
    log.info("%s done in %.1f s", cfg.task, time.perf_counter() - start)
    console.print(f"[bold]run directory:[/bold] {run_dir}")
    return metrics


def run_eval(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    from agentrl.agents import build_agent
    from agentrl.envs import env_factory
    from agentrl.evaluation import eval_seeds, evaluate, write_eval

    make_env = env_factory(cfg.env)
    agent = build_agent(cfg)
    start = time.perf_counter()
    metrics, episodes = evaluate(
        make_env,
        agent,
        eval_seeds(cfg),
        lockstep=cfg.eval.lockstep,
        description=f"eval {cfg.env.name}",
        agent_seed=int(cfg.seed),
    )
    write_eval(
        run_dir,
        metrics,
        episodes,
        transcripts=cfg.eval.transcripts,
        **describe(cfg),
        wall_time_s=round(time.perf_counter() - start, 3),
    )
    print_metrics(f"{cfg.env.name} / {agent_label(cfg)}", metrics)
    return metrics


def run_train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Train, then write eval.json (the identifying fields, the trainer's extra fields, the final
    evaluation's metrics), episodes.jsonl and transcripts.jsonl: the runner is their only writer."""
    import importlib

    from agentrl.evaluation import write_eval

    module, _, fn = TRAINERS[cfg.algo.name].partition(":")
    train = getattr(importlib.import_module(module), fn)
    result = train(cfg, run_dir, resume=cfg.get("resume") is not None)
    write_eval(
        run_dir,
        result.metrics,
        result.episodes,
        transcripts=cfg.eval.transcripts,
        **describe(cfg),
        **result.extra,
    )
    print_metrics(f"{cfg.env.name} / {cfg.algo.name}", result.metrics)
    return {**result.metrics, **result.extra}


# ---------------------------------------------------------------------------------------------
# small shared pieces
# ---------------------------------------------------------------------------------------------
def agent_label(cfg: DictConfig) -> str:
    if cfg.task == "train" and cfg.get("algo") is not None:
        return str(cfg.algo.name)
    if cfg.agent.name == "llm":
        return f"llm:{cfg.model.name}"
    return str(cfg.agent.name)


def describe(cfg: DictConfig) -> dict[str, Any]:
    """The identifying fields every eval.json starts with (report groups runs by them)."""
    info: dict[str, Any] = {"env": cfg.env.name, "agent": agent_label(cfg), "seed": int(cfg.seed)}
    uses_llm = cfg.algo.name in LLM_ALGOS if cfg.task == "train" else cfg.agent.name == "llm"
    if uses_llm:
        info["model"] = cfg.model.name
    if cfg.get("algo") is not None:
        info["algo"] = cfg.algo.name
    info["created"] = datetime.now().isoformat(timespec="seconds")
    return info


def print_metrics(title: str, metrics: dict[str, Any]) -> None:
    from rich.table import Table

    from agentrl.console import console

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
