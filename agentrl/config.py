"""Compose the Hydra config for given overrides, turning Hydra's multi-line errors into one clear line."""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentrl.errors import ConfigError, UnknownChoiceError

CONF_DIR = Path(__file__).parent / "conf"
CONFIG_GROUPS = ("env", "agent", "model", "algo", "experiment")


def group_options(group: str) -> list[str]:
    """Available options of a config group (the yaml files under conf/<group>/)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose conf/config.yaml with `overrides`; raise ConfigError with a one-line message."""
    overrides = list(overrides)
    _check_groups(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_one_line(exc, overrides)) from exc
    finally:
        GlobalHydra.instance().clear()
    return cfg


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


def _one_line(exc: Exception, overrides: list[str]) -> str:
    text = str(exc)
    match = re.search(r"Could not override '([^']+)'", text) or re.search(
        r"Key '([^']+)' is not in struct", text
    )
    if match:
        key = match.group(1)
        parent, _, leaf = key.rpartition(".")
        valid = _valid_keys(parent, overrides)
        where = f" under '{parent}'" if parent else ""
        hint = f"; valid keys{where}: {', '.join(valid)}" if valid else ""
        return f"unknown config key '{key}'{hint} (use +{key}=... to add a new key)"
    if isinstance(exc, MissingConfigException):
        return text.splitlines()[0]
    first = next((line for line in text.splitlines() if line.strip()), text)
    return first


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
