"""The base of every config schema: `setting` (a dataclass field with its help line, source, range
and choices) and `Schema`, whose `__post_init__` checks each field's type, range and choices in one line."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from agentrl.errors import ConfigError

#: where a default comes from: the method's paper, its authors' code, or our choice
SOURCES = ("paper", "code", "ours")


def setting(
    default: Any = MISSING,
    help: str = "",
    source: str = "ours",
    *,
    factory: Any = None,
    choices: tuple[Any, ...] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A schema field: default (or `factory`), one-line help, source, and the checks its value must pass."""
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {SOURCES}")
    metadata: dict[str, Any] = {"help": help, "source": source}
    for name, value in (("choices", choices), ("ge", ge), ("gt", gt), ("le", le), ("lt", lt)):
        if value is not None:
            metadata[name] = value
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def show(value: Any) -> str:
    """A value as it is written on the command line (null, true, 1.5, text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def rule_text(meta: typing.Mapping[str, Any]) -> str:
    """The allowed values a field's metadata declares, e.g. `in (0, 1]`, `>= 1`, `one of: a, b`."""
    if "choices" in meta:
        return "one of: " + ", ".join(show(c) for c in meta["choices"])
    low = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    high = ("]", meta["le"]) if "le" in meta else (")", meta["lt"]) if "lt" in meta else None
    if low and high:
        return f"in {low[0]}{show(low[1])}, {show(high[1])}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {show(low[1])}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {show(high[1])}"
    return ""


def _in_range(value: float, meta: typing.Mapping[str, Any]) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    return (
        ("ge" not in meta or value >= meta["ge"])
        and ("gt" not in meta or value > meta["gt"])
        and ("le" not in meta or value <= meta["le"])
        and ("lt" not in meta or value < meta["lt"])
    )


def type_name(annotation: Any) -> str:
    """`int`, `float | None`, `list[int]`, `any` ... for --describe."""
    if annotation is Any:
        return "any"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{origin.__name__}[{args}]" if args else origin.__name__
    return getattr(annotation, "__name__", str(annotation))


def _type_error(annotation: Any, value: Any) -> str | None:
    """What a value of the wrong type should have been, or None when it fits `annotation`."""
    if annotation is Any:
        return None
    args = typing.get_args(annotation)
    if type(None) in args:
        if value is None:
            return None
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else Any
        return _type_error(annotation, value)
    if value is None:
        return "must not be null"
    origin = typing.get_origin(annotation) or annotation
    if origin is bool:
        return None if isinstance(value, bool) else "expected a boolean (true or false)"
    if origin is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if origin is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "expected a number"
    if origin is str:
        return None if isinstance(value, str) else "expected a string"
    if origin is list:
        if not isinstance(value, list):
            return "expected a list"
        (item,) = typing.get_args(annotation) or (Any,)
        bad = [v for v in value if _type_error(item, v)]
        return f"expected a list of {type_name(item)}" if bad else None
    if origin is dict:
        return None if isinstance(value, dict) else "expected a mapping"
    return None


@dataclass
class Schema:
    """Base of every schema: `__post_init__` checks types, choices and ranges of each field, then the
    cross-field rules of `check`. A group's schema sets PREFIX (its full key, e.g. "algo") and checks
    its nested schemas too; nested schemas (PREFIX None) are checked by the group that holds them."""

    PREFIX: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if self.PREFIX is not None:
            self.validate(self.PREFIX)

    def validate(self, prefix: str) -> None:
        hints = _hints(type(self))
        for f in fields(self):
            key = f"{prefix}.{f.name}" if prefix else f.name
            value = getattr(self, f.name)
            if isinstance(value, Schema):
                value.validate(key)
                continue
            problem = _type_error(hints[f.name], value)
            if problem is None and value is not None:
                meta = f.metadata
                if "choices" in meta and value not in meta["choices"]:
                    problem = f"must be {rule_text(meta)}"
                elif any(k in meta for k in ("ge", "gt", "le", "lt")) and not _in_range(value, meta):
                    problem = f"must be {rule_text(meta)}"
            if problem:
                raise ConfigError(f"{key}={show(value)}: {problem}{self.context()}")
        self.check(prefix)

    def context(self) -> str:
        """Appended to error lines: which option's rules applied (an env's keys depend on the env)."""
        return ""

    def check(self, prefix: str) -> None:
        """Rules that involve more than one field (override in a schema)."""

    def fail(self, prefix: str, key: str, problem: str) -> None:
        """Raise the one-line error for `key` (relative to this node)."""
        value: Any = self
        for part in key.split("."):
            value = getattr(value, part)
        full = f"{prefix}.{key}" if prefix else key
        raise ConfigError(f"{full}={show(value)}: {problem}{self.context()}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def field_rows(cls: type, values: Any = None, prefix: str = "") -> list[dict[str, Any]]:
    """One row per leaf field of a schema, nested fields dotted (aaw.fraction): key, type, value (from
    `values`, a mapping or object, else the dataclass default), help, source and the allowed values."""
    rows: list[dict[str, Any]] = []
    hints = _hints(cls)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        value = _value_of(values, f)
        annotation = hints[f.name]
        if isinstance(annotation, type) and is_dataclass(annotation):
            rows.extend(field_rows(annotation, value, prefix=f"{key}."))
            continue
        rows.append(
            {
                "key": key,
                "type": type_name(annotation),
                "value": value,
                "help": f.metadata.get("help", ""),
                "source": f.metadata.get("source", ""),
                "allowed": rule_text(f.metadata),
            }
        )
    return rows


def _value_of(values: Any, f: Field) -> Any:
    if values is not None:
        if isinstance(values, typing.Mapping) or hasattr(values, "keys"):
            if f.name in values:
                return values[f.name]
        elif hasattr(values, f.name):
            return getattr(values, f.name)
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None
