"""Who acts: LLM policies (agents/llm.py), classic baselines (agents/baselines.py) and trained DQN
models (agents/dqn.py)."""

from __future__ import annotations

from typing import Any

from agentrl.agents.base import Agent, PolicyAgent
from agentrl.errors import ConfigError, UnknownChoiceError

AGENTS = ("dqn", "human", "llm", "planner", "random")


def check_agent(cfg: Any) -> None:
    """The agent's cheap checks, for before a run starts (no run directory for a bad setup): a human
    player needs a terminal; an LLM's model must exist locally or be loadable from the hub."""
    name = cfg.agent.name
    if name == "human":
        from agentrl.agents.baselines import require_terminal

        require_terminal()
    elif name == "llm":
        from agentrl.models import check_model

        if cfg.agent.get("decision") == "score" and cfg.model.get("backend", "hf") != "hf":
            raise ConfigError(
                f"agent.decision=score scores actions with the model's log-likelihoods: it needs model.backend=hf,"
                f" not {cfg.model.backend}"
            )
        check_model(cfg.model)


def check_trainable(agent_cfg: Any, algo: str) -> None:
    """What the LLM trainers cannot train with: scored decisions outside algo=twosome (the others update
    generated answers) and exploration wrappers (their executed actions are not the policy's samples)."""
    if agent_cfg.get("decision") == "score" and algo != "twosome":
        raise ConfigError(
            f"agent.decision=score: algo={algo} trains generated answers; the scoring policy trains with"
            " algo=twosome (use agent.decision=generate, or algo=twosome)"
        )
    explore = agent_cfg.get("explore") or {}
    if explore.get("try_all") or explore.get("epsilon") or (explore.get("self_consistency") or 1) > 1:
        raise ConfigError(
            "agent.explore applies to evaluation: training rollouts would record actions the policy did not"
            " sample (turn agent.explore.* off for agentrl train)"
        )


def prelaunch_check(cfg: Any, machine: Any) -> None:
    """The agents' checks before launch (agentrl/runs/checks.py): the agent an eval names and what it
    needs, what the LLM trainers can train, DQN's numeric view of the env, the generation backend."""
    from agentrl.runs import checks

    if cfg.task == "eval":
        if cfg.agent.name not in AGENTS:
            raise ConfigError(f"unknown agent {cfg.agent.name!r}; valid choices: {', '.join(AGENTS)}")
        if cfg.agent.name == "planner":
            from agentrl.agents.baselines import PLANNERS

            if cfg.env.name not in PLANNERS:
                raise UnknownChoiceError("env for agent=planner", str(cfg.env.name), sorted(PLANNERS))
        if cfg.agent.name == "dqn":
            from agentrl.agents.dqn import dqn_model_path

            dqn_model_path(
                cfg.agent.path
            )  # a missing or wrong path fails here, before a run directory exists
            machine(check_dqn_fits, cfg)
        machine(check_agent, cfg)  # a human player without a terminal, a model that cannot be found
    if checks.trains_llm(cfg):
        check_trainable(cfg.agent, cfg.algo.name)  # agent settings the trainers cannot train with
        if cfg.model.get("backend") == "vllm":  # TRL's engine: model.vllm keys, mode, tensor parallelism
            from agentrl.agents.backends.trl_vllm import vllm_generation_kwargs
            from agentrl.config import typed

            vllm_generation_kwargs(typed(cfg.algo), cfg.model, 1)
    if cfg.task == "train" and cfg.algo.name == "dqn":
        check_numeric_view(cfg)
    if checks.uses_llm(cfg):
        machine(check_backend, cfg)


def check_backend(cfg: Any) -> None:
    """A generation backend's library, hardware or server: model.backend=vllm needs vllm and a CUDA GPU,
    model.backend=openai an endpoint that answers and serves model.name."""
    from agentrl.errors import BackendError
    from agentrl.runs import checks

    if str(cfg.model.get("backend")) == "openai":
        from agentrl.agents.backends.openai import check_endpoint

        m = cfg.model
        check_endpoint(
            str(m.base_url), str(m.name), api_key_env=m.get("api_key_env"), timeout=float(m.timeout)
        )
        return
    if str(cfg.model.get("backend")) != "vllm":
        return
    if not checks.installed("vllm"):
        raise BackendError("model.backend=vllm needs the vllm package (pip install vllm, on a CUDA machine)")
    if not checks.cuda_available():
        raise BackendError("model.backend=vllm needs a CUDA GPU; on this machine use model.backend=hf")


def check_dqn_fits(cfg: Any) -> None:
    """Load the DQN model agent.path names and check its observation and action shapes fit the env (a
    DQN run evaluated on another env through from_run= is refused here, not after the run starts)."""
    from agentrl.agents.dqn import build_dqn_agent

    build_dqn_agent(cfg)


def check_numeric_view(cfg: Any) -> None:
    """DQN reads the env's numeric view; an env without one (datascicoding) says so here."""
    from agentrl.envs import env_factory

    env = env_factory(cfg.env)()
    try:
        env.unwrapped.numeric_space()
    finally:
        env.close()


def build_agent(cfg: Any, **kwargs: Any) -> Agent:
    """Build the agent named by `cfg.agent.name` from the full composed config, wrapped in the
    exploration mechanisms `cfg.agent.explore` switches on (agents/exploration.py)."""
    from agentrl.agents.exploration import apply_exploration

    return apply_exploration(_build_agent(cfg, **kwargs), cfg.agent.get("explore"))


def _build_agent(cfg: Any, **kwargs: Any) -> Agent:
    name = cfg.agent.name
    if name == "random":
        from agentrl.agents.baselines import RandomAgent

        return RandomAgent()
    if name == "planner":
        from agentrl.agents.baselines import PlannerAgent

        options = {k: v for k, v in cfg.agent.items() if k not in ("name", "explore")}
        return PlannerAgent(cfg.env.name, **options)
    if name == "human":
        from agentrl.agents.baselines import HumanAgent

        return HumanAgent(**kwargs)
    if name == "llm":
        from agentrl.agents.llm import build_llm_agent

        return build_llm_agent(cfg, **kwargs)
    if name == "dqn":
        from agentrl.agents.dqn import build_dqn_agent

        return build_dqn_agent(cfg)
    raise UnknownChoiceError("agent", name, AGENTS)


__all__ = [
    "AGENTS",
    "Agent",
    "PolicyAgent",
    "build_agent",
    "check_agent",
    "check_trainable",
    "prelaunch_check",
]
