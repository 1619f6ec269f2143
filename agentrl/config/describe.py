"""`agentrl config --describe`: every key of the group options named, with its type, default, source,
allowed values and help, read from the schema (schema.py)."""

from __future__ import annotations

from typing import Any

#: the width of `describe_config`'s text when none is given
WIDTH = 100


def describe_config(cfg: Any, overrides: list[str], width: int = WIDTH) -> str:
    """Help text for the group options named in `overrides` (the root keys when none is), one block per
    option: each key (nested keys dotted), its type, its value in the YAML file, help, source, range;
    wrapped at word boundaries to `width` columns."""
    from omegaconf import OmegaConf

    from agentrl.config import CONF_DIR, CONFIG_GROUPS, AgentRLConfig, field_rows, typed

    selected = [
        (key, value)
        for key, _, value in (o.partition("=") for o in overrides)
        if key.lstrip("+") in CONFIG_GROUPS and value and value != "null"
    ]
    only_groups = len(selected) == len(overrides)
    label = "default" if only_groups else "value"
    blocks = []
    root = typed(cfg)
    if not selected:
        rows = [
            r
            for r in field_rows(AgentRLConfig, OmegaConf.to_container(cfg, resolve=True))
            if r["key"]
            not in CONFIG_GROUPS  # the groups' own keys: agentrl config <group>=<option> --describe
        ]
        blocks.append(_describe_block("root config (conf/config.yaml)", AgentRLConfig, rows, label, width))
    for key, option in selected:
        group = key.lstrip("+")
        if group == "experiment":
            preset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{option}.yaml"))
            preset.pop("defaults", None)
            known = {}
            for name in ("env", "agent", "model", "algo"):
                node = getattr(root, name)
                if node is not None:
                    known.update({f"{name}.{r['key']}": r for r in field_rows(type(node))})
            known.update({r["key"]: r for r in field_rows(AgentRLConfig)})
            rows = []
            for dotted in _dotted_keys(preset):
                row = dict(known.get(dotted, {"type": "?", "help": "", "source": "", "allowed": ""}))
                row.update(key=dotted, value=OmegaConf.select(cfg, dotted))
                rows.append(row)
            blocks.append(
                _describe_block(f"experiment={option}: the keys this preset sets", None, rows, "value", width)
            )
            continue
        node = cfg[group]
        cls = type(getattr(root, group))
        rows = field_rows(cls, OmegaConf.to_container(node, resolve=True))
        blocks.append(_describe_block(f"{group}={option}", cls, rows, label, width))
    return "\n\n".join(blocks)


def _dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            keys.extend(_dotted_keys(value, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _describe_block(title: str, cls: Any, rows: list[dict[str, Any]], label: str, width: int) -> str:
    import textwrap

    from agentrl.config.base import show

    def wrapped(text: str, indent: str, more: str) -> list[str]:
        return textwrap.wrap(
            text, max(width, 40), initial_indent=indent, subsequent_indent=more, break_on_hyphens=False
        ) or [indent.rstrip()]

    doc = " ".join((cls.__doc__ or "").split("\n\n")[0].split()) if cls is not None else ""
    head = f"{title}  ({cls.__name__}) {doc}".rstrip() if cls is not None else title
    lines = wrapped(head, "", "  ")
    for row in rows:
        listed = "null" in str(row.get("allowed") or "")  # choices that hold None list it already
        optional = " or null" if row["type"].endswith("| None") and not listed else ""
        allowed = f"; must be {row['allowed']}{optional}" if row.get("allowed") else ""
        source = f"  [{row['source']}]" if row.get("source") else ""
        lines += wrapped(
            f"{row['key']}: {row['type']}  ({label}: {show(row['value'])}){source}", "  ", "      "
        )
        lines += wrapped(f"{row['help']}{allowed}", "      ", "      ")
    return "\n".join(lines)
