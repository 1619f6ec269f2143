"""An experiment preset with another agent than the one it was written for.

The LLM presets (`experiment=rlft_bandit`, `frozenlake_learn`, ...) set agent keys only the LLM agent has
(`agent.cot`, `agent.prefill`, `agent.sampling`, ...). Hydra merges a preset onto the chosen agent's
schema, so `agentrl eval experiment=rlft_bandit agent=random` would stop at "unknown config key
'agent.cot'" although the user asked for the preset's task with another agent, the baseline a paper
table needs. `preset_for_agent` writes such a preset out as explicit overrides without the agent keys
the chosen agent lacks and without its `algo` (the LLM's training; an `algo=` on the command line
chooses the baseline's own): the preset's env, eval and seed settings hold for every agent.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from agentrl.config.schema import SCHEMAS
from agentrl.errors import ConfigError

log = logging.getLogger(__name__)


def preset_for_agent(overrides: list[str], conf_dir: Path, groups: tuple[str, ...]) -> list[str]:
    """`overrides` with `experiment=X` replaced by X's settings, minus its algo and the agent keys that
    the chosen `agent=` option's schema lacks, when there are such keys; otherwise `overrides`
    unchanged (the command line's own settings win over the preset's). A sweep
    over agents (`agent=random,planner`) is expanded when every agent lacks the same keys."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return overrides  # compose_config reports the parse error
    experiment = _single_choice(parsed, "experiment")
    agent = next((o for o in reversed(parsed) if _key(o) == "agent" and not o.is_delete()), None)
    if experiment is None or agent is None:
        return overrides
    agents = list(agent.sweep_string_iterator()) if agent.is_sweep_override() else [str(agent.value())]
    path = conf_dir / "experiment" / f"{experiment}.yaml"
    if not path.is_file() or any(a not in SCHEMAS["agent"] for a in agents):
        return overrides  # unknown names: compose_config names the valid choices
    preset: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(path), resolve=False)  # type: ignore[assignment]
    settings = flatten({k: v for k, v in preset.items() if k not in ("defaults", "algo")})
    lacking = {a: tuple(k for k in settings if _lacks(a, k)) for a in agents}
    if not any(lacking.values()):
        return overrides
    if len(set(lacking.values())) > 1:
        raise ConfigError(
            f"experiment={experiment} sets agent keys that only some of agent={','.join(agents)} have "
            f"({', '.join(sorted({k for keys in lacking.values() for k in keys}))}): sweep them separately"
        )
    dropped = lacking[agents[0]]
    user_keys = {_key(o) for o in parsed}
    expanded = [
        f"{group}={choice}"
        for group, choice in _group_choices(preset, groups)
        if group not in user_keys and group != "algo"
    ]
    expanded += [
        f"{k}={override_text(v)}" for k, v in settings.items() if k not in dropped and k not in user_keys
    ]
    log.info(
        "experiment=%s sets %s for the LLM agent; agent=%s has no such keys, so the preset applies "
        "without them and without its algo settings: %s",
        experiment,
        ", ".join(dropped),
        ",".join(agents),
        " ".join(expanded),
    )
    rest = [o for o, p in zip(overrides, parsed, strict=True) if _key(p) != "experiment"]
    return [*expanded, *rest]


def _key(override: Any) -> str:
    return override.get_key_element().lstrip("+~")


def _single_choice(parsed: list[Any], group: str) -> str | None:
    chosen = next((o for o in reversed(parsed) if _key(o) == group), None)
    if chosen is None or chosen.is_delete() or chosen.is_sweep_override() or chosen.value() is None:
        return None
    return str(chosen.value())


def _lacks(agent: str, key: str) -> bool:
    parts = key.split(".")
    return (
        parts[0] == "agent"
        and len(parts) > 1
        and parts[1] not in {f.name for f in fields(SCHEMAS["agent"][agent])}
    )


def _group_choices(preset: dict[str, Any], groups: tuple[str, ...]) -> list[tuple[str, str]]:
    """The preset's defaults list (`- override /env: bandit`) as (group, option) pairs."""
    choices = []
    for entry in preset.get("defaults") or []:
        if not isinstance(entry, dict):
            continue  # _self_
        for name, option in entry.items():
            group = name.removeprefix("override").strip().lstrip("/")
            if group not in groups:
                raise ConfigError(f"cannot expand the preset's defaults entry {name}: {option}")
            choices.append((group, str(option)))
    return choices


def flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {dotted key: leaf value}; an empty mapping is a leaf."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, dotted))
        else:
            flat[dotted] = value
    return flat


def override_text(value: Any) -> str:
    """A config value as Hydra override text (strings single-quoted: paths may hold `=`, `,` or spaces)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(override_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{override_text(v)}" for k, v in value.items()) + "}"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"
