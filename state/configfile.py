"""Reading YAML configuration files with errors that name the file, the key and the bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

_MAX_ECHO = 120


class ConfigError(ValueError):
    """A configuration file is unreadable or invalid; the message says where and why."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_unique_mapping,
)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file (an empty file is an empty mapping)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def describe_validation_error(source: str, error: ValidationError) -> str:
    """One line per problem: ``source: key.path: message (got value)``."""
    lines = []
    for problem in error.errors(include_url=False):
        where = _key_path(problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        # A section's own check (its input a whole mapping) names its keys in its message; the
        # mapping is not echoed, since it may hold secrets (passwords, kafka.client values).
        if problem["type"] == "missing" or isinstance(problem.get("input", {}), dict):
            lines.append(f"{source}: {where}: {message}")
            continue
        got = repr(problem["input"])
        if len(got) > _MAX_ECHO:
            got = got[: _MAX_ECHO - 3] + "..."
        lines.append(f"{source}: {where}: {message} (got {got})")
    return "\n".join(lines)


def _key_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item.isidentifier() and not parts:
            parts.append(item)
        elif item.isidentifier():
            parts.append(f".{item}")
        else:
            parts.append(f"[{item!r}]")
    return "".join(parts) or "(top level)"
