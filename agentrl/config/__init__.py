"""Compose and validate the Hydra config for given overrides, turning Hydra's and OmegaConf's multi-line
errors into one clear line.

The YAML files under conf/ are validated against the dataclasses in `agentrl.config.schema` (each file
names its schema in its defaults list; the schemas are registered in Hydra's ConfigStore on import):
OmegaConf checks keys and types while composing, and `compose_config` then builds every group's
dataclass, whose `__post_init__` checks ranges and choices, before anything heavy (a model) loads.
`typed(cfg.algo)` gives a consumer that dataclass, with attributes named exactly as the YAML keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode, StringNode

from agentrl.config.agent import (
    DQNAgentConfig,
    HumanAgentConfig,
    LLMAgentConfig,
    PlannerAgentConfig,
    RandomAgentConfig,
    SamplingSchema,
)
from agentrl.config.algo import AAWConfig, CurriculumConfig, DQNConfig, MSGRPOConfig
from agentrl.config.base import Schema, field_rows, show
from agentrl.config.env import BanditConfig, FrozenLakeConfig, SnakeConfig, TicTacToeConfig
from agentrl.config.model import LoRAConfig, ModelConfig
from agentrl.config.presets import preset_for_agent
from agentrl.config.root import AgentRLConfig, EvalConfig
from agentrl.config.schema import ROOT_SCHEMA_NAME, SCHEMAS, schema_for, schema_name
from agentrl.errors import ConfigError, UnknownChoiceError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_GROUPS = ("env", "agent", "model", "algo", "distributed", "experiment")
#: the groups whose options have a schema (experiment presets are plain overrides of the root)
TYPED_GROUPS = ("env", "agent", "model", "algo", "distributed")

S = TypeVar("S", bound=Schema)


def register_schemas() -> None:
    """Store every schema in Hydra's ConfigStore under the name its YAML files use (idempotent)."""
    store = ConfigStore.instance()
    store.store(name=ROOT_SCHEMA_NAME, node=AgentRLConfig)
    store.store(group="model", name=schema_name(ModelConfig), node=ModelConfig)
    for group, options in SCHEMAS.items():
        for cls in set(options.values()):
            store.store(group=group, name=schema_name(cls), node=cls)


register_schemas()


def group_options(group: str) -> list[str]:
    """Available options of a config group (the yaml files under conf/<group>/)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose conf/config.yaml with `overrides` and validate every group against its schema; raise
    ConfigError with a one-line message. Returns the DictConfig (typed by the schemas)."""
    overrides = preset_for_agent(list(overrides), CONF_DIR, CONFIG_GROUPS)
    _check_groups(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_one_line(exc, overrides)) from exc
    finally:
        GlobalHydra.instance().clear()
    _check_bool_overrides(cfg, overrides)
    _check_added_keys(cfg, overrides)
    validate(cfg)
    return cfg


#: where `+key=value` adds what code reads: an env's options are its constructor's arguments (a wrong
#: one fails when the env is built); the keys of a free-form mapping (model.vllm) are read as a whole
OPEN_NODES = ("env",)


def _check_added_keys(cfg: DictConfig, overrides: list[str]) -> None:
    """A key that `+key=value` (or `++key=value`) adds to a node with a schema is read by no code, since
    code reads a schema's fields only: a typo such as `+eval.episode=5` would be ignored in silence.
    It is refused, naming the closest real key. Adding under `OPEN_NODES` or a free-form mapping, a
    group option (`+experiment=...`) and Hydra's own keys stay allowed."""
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if not (override.is_add() or override.is_force_add()) or key in CONFIG_GROUPS or "@" in key:
            continue
        if key.split(".")[0] == "hydra":
            continue
        node: Any = cfg
        parts = key.split(".")
        for depth, part in enumerate(parts):
            schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
            if (
                not (isinstance(schema, type) and is_dataclass(schema))
                or ".".join(parts[:depth]) in OPEN_NODES
            ):
                break
            names = [f.name for f in fields(schema)]
            if part not in names:
                raise ConfigError(_added_key_line(override, parts[: depth + 1], names))
            node = node._get_node(part)


def _added_key_line(override: Any, path: list[str], names: list[str]) -> str:
    """`+eval.episode=5: eval has no key 'episode' and no code would read it; did you mean
    eval.episodes=5? (valid keys under 'eval': ...)`."""
    parent = ".".join(path[:-1])
    owner = parent or "the config"
    value = override.input_line.partition("=")[2]
    guess = _did_you_mean(parent, path[-1], names, value)
    return f"{override.input_line}: {owner} has no key '{path[-1]}' and no code would read it" + (
        guess or f" ({_valid_line(parent, names)})"
    )


def _did_you_mean(parent: str, key: str, names: list[str], value: str | None = None) -> str:
    """`; did you mean eval.episodes=5?` for the name of `names` closest to `key`, or ""."""
    import difflib

    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean {_join(parent, close[0])}{'' if value is None else '=' + value}?"


def _valid_line(parent: str, names: list[str]) -> str:
    where = f" under '{parent}'" if parent else ""
    return f"valid keys{where}: {', '.join(sorted(names))}"


def _check_bool_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """A bool key takes only true or false: OmegaConf would also turn yes, on, 1 or 2 into True."""
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element().lstrip("+~")
        if override.is_delete() or override.is_sweep_override() or key in CONFIG_GROUPS or "@" in key:
            continue
        node: Any = cfg
        for part in key.split("."):
            node = node._get_node(part) if isinstance(node, DictConfig) and part in node else None
        if isinstance(node, BooleanNode) and not isinstance(override.value(), bool):
            raise ConfigError(f"{key}={show(override.value())}: expected a boolean (true or false)")


def refuse_under_deepspeed(
    max_batch_tokens: int | None, ppo_epochs: int, save_optimizer: bool = True
) -> None:
    """Settings whose optimizer-step logic runs after DeepSpeed's engine has already stepped (it steps
    inside the backward of every pass that synchronises gradients, and `no_sync` does nothing at
    ZeRO >= 2), and model-only checkpoints, which DeepSpeed cannot resume from (transformers resumes a
    DeepSpeed run only from the engine's own `global_step*/`, which holds the optimizer): refused, with
    the setting named."""
    if not save_optimizer:
        raise ConfigError(
            "algo.save_optimizer=false: DeepSpeed (distributed=zero2/zero3) resumes only from its own "
            "checkpoint with the optimizer state; set algo.save_optimizer=true or use distributed=ddp/fsdp2"
        )
    if max_batch_tokens:
        raise ConfigError(
            f"algo.max_batch_tokens={max_batch_tokens}: DeepSpeed (distributed=zero2/zero3) steps the "
            "optimizer after every pass of a split micro-batch; set algo.max_batch_tokens=null "
            "(algo.gradient_checkpointing=true saves memory instead)"
        )
    if ppo_epochs > 1:
        raise ConfigError(
            f"algo.ppo_epochs={ppo_epochs}: DeepSpeed (distributed=zero2/zero3) steps inside each "
            "backward, before the epochs' KL gate can act; set algo.ppo_epochs=1 or use distributed=fsdp2"
        )


def validate(cfg: DictConfig) -> AgentRLConfig:
    """Build the root dataclass and each group's (their `__post_init__` checks ranges and choices), then
    the rules that span groups. Returns the typed root."""
    root = typed(cfg, AgentRLConfig)
    algo, model = root.algo, root.model
    if (
        root.task == "train"
        and isinstance(algo, MSGRPOConfig)
        and isinstance(model, ModelConfig)
        and algo.trainable_layers
        and model.lora.r > 0
    ):
        raise ConfigError(
            f"algo.trainable_layers={algo.trainable_layers}: is for full fine-tuning; "
            f"with LoRA (model.lora.r={model.lora.r}) set algo.trainable_layers=null or model.lora.r=0"
        )
    engine = getattr(root.distributed, "name", "none")
    if root.task == "train" and engine != "none" and isinstance(model, ModelConfig):
        if model.device_map:
            raise ConfigError(
                f"model.device_map={model.device_map}: cannot be used with distributed={engine} (each "
                "process holds its own copy or shard of the model); set model.device_map=null"
            )
        critic = (
            getattr(algo, "name", "") in ("poad", "ntpo", "twosome")
            or getattr(algo, "advantage", "") == "gae"
        )
        if getattr(algo, "name", "") == "twosome" and engine in ("zero3", "fsdp2"):
            raise ConfigError(
                f"algo=twosome scores a different number of candidate actions per row, which "
                f"distributed={engine} (every forward a collective) cannot train; use distributed=ddp/zero2"
            )
        if engine in ("zero2", "zero3"):
            budget = getattr(algo, "max_batch_tokens", None)
            refuse_under_deepspeed(
                budget if isinstance(budget, int) else None,
                getattr(algo, "ppo_epochs", 1),
                getattr(algo, "save_optimizer", True),
            )
        if critic and engine in ("zero3", "fsdp2") and model.lora.r == 0:
            raise ConfigError(
                f"algo={algo.name} with full fine-tuning keeps a frozen copy of the model as the critic's "
                f"trunk, which distributed={engine} cannot shard; use LoRA (model.lora.r=16: the trunk is "
                "the base) or distributed=ddp/zero2"
            )
    return root


def typed(node: Any, schema: type[S] | None = None) -> S:
    """The dataclass instance of a config node: `typed(cfg.algo)` -> MSGRPOConfig, `typed(cfg.model)`
    -> ModelConfig, `typed(cfg)` -> AgentRLConfig (its env/agent/model/algo typed too).

    A node composed by `compose_config` (or Hydra) already knows its schema. A plain node (a dict, or a
    DictConfig made from a YAML file) gets `schema`, else the schema of its group option, found from its
    key in the parent (`cfg.algo` -> algo) and its `name`. The values are checked on the way: a bad one
    raises ConfigError with one line naming the key.
    """
    if isinstance(node, Schema):
        if schema is not None and not isinstance(node, schema):
            raise ConfigError(f"a {type(node).__name__} is not a {schema.__name__}")
        return node  # type: ignore[return-value]
    if isinstance(node, Mapping) and not isinstance(node, DictConfig):
        node = OmegaConf.create(dict(node))
    if not isinstance(node, DictConfig):
        raise ConfigError(f"cannot type a config node of type {type(node).__name__}")
    prefix = "" if node._key() is None else str(node._get_full_key(""))
    if _is_plain(node):
        cls = _plain_schema(node, schema, prefix)
        structured = _merge_plain(node, cls, prefix or cls.PREFIX or "")
    else:
        cls = OmegaConf.get_type(node)  # type: ignore[assignment]
        if schema is not None and not issubclass(cls, schema):  # type: ignore[arg-type]
            raise ConfigError(f"{prefix or 'config'}: is a {cls.__name__}, not a {schema.__name__}")  # type: ignore[union-attr]
        structured = node
    try:
        return OmegaConf.to_object(structured)  # type: ignore[return-value]
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:
        raise ConfigError(_typed_line(exc, "")) from exc


def _is_plain(node: DictConfig) -> bool:
    object_type = OmegaConf.get_type(node)
    return not (isinstance(object_type, type) and is_dataclass(object_type))


def _plain_schema(node: DictConfig, schema: type[Schema] | None, prefix: str) -> type[Schema]:
    """The schema for a plain node: `schema`, the root's for a node without a parent, else its option's."""
    group = prefix.rpartition(".")[2]
    name = node.get("name")
    if schema is None and not prefix:
        return AgentRLConfig
    cls = schema or schema_for(group, name)
    if cls is None:
        raise ConfigError(_no_schema(group or "config", name))
    choices = next((f.metadata.get("choices") for f in fields(cls) if f.name == "name"), None)
    if name is not None and choices and name not in choices:
        raise ConfigError(
            f"{_join(prefix, 'name')}={show(name)}: {cls.__name__} describes {', '.join(choices)}"
        )
    return cls


def _merge_plain(node: DictConfig, cls: type[Schema], prefix: str) -> DictConfig:
    """A plain node merged onto its schema (the root: each group onto its own), errors as one line."""
    data = _plain_dict(node)
    if cls is AgentRLConfig:
        for group in TYPED_GROUPS:
            if isinstance(node.get(group), DictConfig):
                data[group] = _merge_plain(node[group], _plain_schema(node[group], None, group), group)
    try:
        return OmegaConf.merge(OmegaConf.structured(cls), data)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        raise ConfigError(_typed_line(exc, prefix)) from exc


def _plain_dict(node: DictConfig) -> dict[str, Any]:
    """The node's values, without the `defaults` list a YAML file loaded directly still carries."""
    data = OmegaConf.to_container(node, resolve=True)
    return {k: v for k, v in data.items() if k != "defaults"}  # type: ignore[union-attr]


def _typed_line(exc: BaseException, prefix: str) -> str:
    """One line for an error of merging onto a schema or building it: unknown key or wrong type."""
    unknown = _find(exc, (ConfigKeyError, ConfigAttributeError))
    if unknown is not None and unknown.full_key:
        key = _join(prefix, str(unknown.full_key))
        owner = unknown.object_type
        valid = (
            sorted(f.name for f in fields(owner)) if isinstance(owner, type) and is_dataclass(owner) else []
        )
        return _unknown_key_line(key, valid)
    invalid = _find(exc, (ValidationError,))
    if invalid is not None and invalid.full_key:
        return _validation_line(invalid, prefix)
    return _one_line(exc, [])


def _no_schema(group: str, name: Any) -> str:
    known = sorted(SCHEMAS.get(group, {}))
    hint = f"; options with a schema: {', '.join(known)}" if known else ""
    return f"no schema for {group} {name!r}{hint}"


def option_config(group: str, option: str) -> DictConfig:
    """One group option's composed config (its YAML file on its schema, no `defaults` list), checked,
    e.g. `option_config("env", "frozenlake")`: for code and tests that want one option's values."""
    if group not in CONFIG_GROUPS:
        raise UnknownChoiceError("config group", group, CONFIG_GROUPS)
    cfg = compose_config([f"{group}={option}"])
    return cfg if group == "experiment" else cfg[group]


# ---- one-line errors ---------------------------------------------------------------------------------
def _check_groups(overrides: list[str]) -> None:
    """Name the valid choices for an unknown group option before Hydra prints its long listing."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError(f"cannot parse overrides: {str(exc).splitlines()[0]}") from exc
    for override in parsed:
        key = override.get_key_element().lstrip("+~")
        if key in CONFIG_GROUPS and not override.is_delete():
            values = (
                list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
            )
            for value in values:
                if value is None or str(value) == "null":
                    continue
                if str(value) not in group_options(key):
                    raise UnknownChoiceError(key, str(value), group_options(key))


def _one_line(exc: BaseException, overrides: list[str]) -> str:
    text = str(exc)
    match = re.search(r"Could not override '([^']+)'", text)
    unknown = _find(exc, (ConfigKeyError, ConfigAttributeError))
    if match or (unknown is not None and unknown.full_key and "not in" in str(unknown)):
        key = match.group(1) if match else str(unknown.full_key)
        return _unknown_key_line(key, _valid_keys(key.rpartition(".")[0], overrides))
    invalid = _find(exc, (ValidationError,))
    if invalid is not None and invalid.full_key:
        return _validation_line(invalid)
    several = re.search(r"Ambiguous value for argument '(.+)'", text)
    if several:  # a comma list (env=frozenlake,snake) is a sweep, which one run cannot be
        return (
            f"{several.group(1)}: several values make one job each: run them with agentrl sweep and the "
            "same overrides (a list that is one value is written in brackets: key=[a,b])"
        )
    taken = re.search(r"An item is already at '([^']+)'", text)
    if taken:  # `+key=value` for a key the config has
        key = taken.group(1)
        given = next((o for o in overrides if o.lstrip("+").partition("=")[0] == key), f"+{key}=...")
        return f"{given}: {key} exists already; set it without the +: {given.lstrip('+')}"
    if isinstance(exc, MissingConfigException):
        return text.splitlines()[0]
    first = next((line for line in text.splitlines() if line.strip()), text)
    return first


def _unknown_key_line(key: str, valid: list[str]) -> str:
    """`unknown config key 'algo.iteration'; did you mean algo.iterations?; valid keys under 'algo': ...`;
    a key under a group with no option chosen (`algo.iterations` without algo=) says so."""
    parent, _, name = key.rpartition(".")
    guess = _did_you_mean(parent, name, valid)
    line = f"unknown config key '{key}'{guess}"
    if valid and not guess:
        line += f"; {_valid_line(parent, valid)}"
    elif parent in TYPED_GROUPS:
        line += f"; no {parent} is chosen: {parent}=<option> ({', '.join(group_options(parent))})"
    if parent in OPEN_NODES:
        line += f" (+{key}=... passes a new option to the {parent}'s constructor)"
    return line


def _find(exc: BaseException | None, kinds: tuple[type, ...]) -> Any:
    """The first exception of `kinds` in the chain exc, its cause, its cause's cause ..."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, kinds):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _validation_line(exc: ValidationError, prefix: str = "") -> str:
    """`algo.aaw.enabled=maybe: expected a boolean (true or false)`."""
    key = _join(prefix, str(exc.full_key))
    message = str(exc.msg or exc).splitlines()[0]
    node = exc.child_node
    if "is not Optional" in message:
        expected = "must not be null"
    elif isinstance(node, BooleanNode):
        expected = "expected a boolean (true or false)"
    elif isinstance(node, IntegerNode):
        expected = "expected an integer"
    elif isinstance(node, FloatNode):
        expected = "expected a number"
    elif isinstance(node, StringNode):
        expected = "expected a string"
    elif isinstance(node, ListConfig):
        expected = "expected a list"
    elif isinstance(node, DictConfig):
        expected = "expected a mapping"
    else:
        expected = message
    return f"{key}={show(exc.value)}: {expected}"


def _valid_keys(parent: str, overrides: list[str]) -> list[str]:
    groups_only = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in CONFIG_GROUPS]
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            base = compose(config_name="config", overrides=groups_only)
        node = OmegaConf.select(base, parent) if parent else base
        return sorted(node.keys()) if isinstance(node, DictConfig) else []
    except Exception:
        return []
    finally:
        GlobalHydra.instance().clear()


def split_sweep(overrides: list[str]) -> list[list[str]]:
    """Expand sweep overrides (a=1,2 b=x,y) into the list of per-job override lists, as Hydra's basic
    sweeper does, so every job's config can be checked before anything is launched."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError(f"cannot parse overrides: {str(exc).splitlines()[0]}") from exc
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [job for batch in batches for job in batch]


__all__ = [
    "refuse_under_deepspeed",
    "CONFIG_GROUPS",
    "CONF_DIR",
    "TYPED_GROUPS",
    "AAWConfig",
    "AgentRLConfig",
    "BanditConfig",
    "CurriculumConfig",
    "DQNAgentConfig",
    "DQNConfig",
    "EvalConfig",
    "FrozenLakeConfig",
    "HumanAgentConfig",
    "LLMAgentConfig",
    "LoRAConfig",
    "MSGRPOConfig",
    "ModelConfig",
    "PlannerAgentConfig",
    "RandomAgentConfig",
    "SamplingSchema",
    "Schema",
    "SnakeConfig",
    "TicTacToeConfig",
    "compose_config",
    "field_rows",
    "group_options",
    "option_config",
    "schema_for",
    "split_sweep",
    "typed",
    "validate",
]
