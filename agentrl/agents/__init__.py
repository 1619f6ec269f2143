"""Who acts: LLM policies (agents/llm.py), classic baselines (agents/baselines.py) and trained DQN
models (agents/dqn.py)."""

from __future__ import annotations

from typing import Any

from agentrl.agents.base import Agent, PolicyAgent
from agentrl.errors import UnknownChoiceError

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

        check_model(cfg.model)


def build_agent(cfg: Any, **kwargs: Any) -> Agent:
    """Build the agent named by `cfg.agent.name` from the full composed config."""
    name = cfg.agent.name
    if name == "random":
        from agentrl.agents.baselines import RandomAgent

        return RandomAgent()
    if name == "planner":
        from agentrl.agents.baselines import PlannerAgent

        options = {k: v for k, v in cfg.agent.items() if k != "name"}
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


__all__ = ["AGENTS", "Agent", "PolicyAgent", "build_agent", "check_agent"]
