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


__all__ = ["AGENTS", "Agent", "PolicyAgent", "build_agent", "check_agent", "check_trainable"]
