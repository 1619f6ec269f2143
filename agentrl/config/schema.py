"""Typed schemas of every config option: one dataclass per YAML file under agentrl/conf/, in one module
per config group (root, env, agent, model, algo, distributed); this module maps each group option to its
schema.

Each YAML file names its schema in its defaults list (`defaults: [<option>_schema, _self_]`), so Hydra
merges the file onto the dataclass: field names are the YAML keys, and OmegaConf rejects unknown keys
and values of the wrong type (e.g. `maybe` for a bool) while composing. Ranges and choices are declared
in each field's metadata and checked in `__post_init__`, which runs when a composed node is turned into
its dataclass (`agentrl.config.typed`, or `compose_config`, which does it for every group).

Every field carries `metadata={"help": ..., "source": ...}`: source is `paper` (the method's paper),
`code` (the paper authors' code) or `ours` (our choice); `agentrl config <group>=<option> --describe`
prints them. Method details: docs/algorithms.md; environments: docs/envs.md.
"""

from __future__ import annotations

from agentrl.config.agent import (
    DQNAgentConfig,
    HumanAgentConfig,
    LLMAgentConfig,
    PlannerAgentConfig,
    RandomAgentConfig,
)
from agentrl.config.algo import DQNConfig, MSGRPOConfig, POADConfig, RLFTConfig, SFTConfig
from agentrl.config.base import Schema
from agentrl.config.distributed import DISTRIBUTED, DistributedConfig
from agentrl.config.env import (
    BanditConfig,
    ContextualBanditConfig,
    DataSciCodingConfig,
    FrozenLakeConfig,
    KitchenConfig,
    OpenEnvConfig,
    SnakeConfig,
    TicTacToeConfig,
)
from agentrl.config.model import ModelConfig

#: group -> option -> schema. A model option always uses ModelConfig.
SCHEMAS: dict[str, dict[str, type[Schema]]] = {
    "env": {
        "frozenlake": FrozenLakeConfig,
        "snake": SnakeConfig,
        "snake_poison": SnakeConfig,
        "bandit": BanditConfig,
        "contextual_bandit": ContextualBanditConfig,
        "tictactoe": TicTacToeConfig,
        "datascicoding": DataSciCodingConfig,
        "kitchen": KitchenConfig,
        "openenv": OpenEnvConfig,
    },
    "agent": {
        "llm": LLMAgentConfig,
        "random": RandomAgentConfig,
        "planner": PlannerAgentConfig,
        "human": HumanAgentConfig,
        "dqn": DQNAgentConfig,
    },
    "algo": {
        "msgrpo": MSGRPOConfig,
        "poad": POADConfig,
        "ntpo": POADConfig,
        "twosome": POADConfig,
        "rlft": RLFTConfig,
        "sft": SFTConfig,
        "dqn": DQNConfig,
    },
    "distributed": {name: DistributedConfig for name in DISTRIBUTED},
}
ROOT_SCHEMA_NAME = "agentrl_schema"


def schema_name(cls: type[Schema]) -> str:
    """The ConfigStore name a YAML file puts in its defaults list, e.g. `msgrpo_schema`."""
    names = {
        ModelConfig: "model",
        SnakeConfig: "snake",
        FrozenLakeConfig: "frozenlake",
        BanditConfig: "bandit",
        ContextualBanditConfig: "contextual_bandit",
        TicTacToeConfig: "tictactoe",
        DataSciCodingConfig: "datascicoding",
        KitchenConfig: "kitchen",
        OpenEnvConfig: "openenv",
        LLMAgentConfig: "llm",
        RandomAgentConfig: "random",
        PlannerAgentConfig: "planner",
        HumanAgentConfig: "human",
        DQNAgentConfig: "dqn",
        MSGRPOConfig: "msgrpo",
        POADConfig: "poad",
        RLFTConfig: "rlft",
        SFTConfig: "sft",
        DQNConfig: "dqn",
        DistributedConfig: "distributed",
    }
    return f"{names[cls]}_schema"


def schema_for(group: str, option: str | None = None) -> type[Schema] | None:
    """The schema of a group option (by option name or the node's `name`), or None if there is none."""
    if group == "model":
        return ModelConfig
    return SCHEMAS.get(group, {}).get(str(option)) if option is not None else None
