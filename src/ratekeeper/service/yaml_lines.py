"""YAML that remembers where things are: mappings and lists carry the line of each entry.

``Loader`` is a ``yaml.SafeLoader`` whose mappings are ``Map`` (a dict with ``line`` and
``lines[key]``) and whose lists are ``Seq`` (a list with ``line`` and ``lines[i]``), so that
validation can say "file:line: problem". Keys are always the plain text written (``off`` and
``404`` stay strings), and a key written twice is a ``Problem`` rather than a silent overwrite.
"""

from __future__ import annotations

from typing import Any

import yaml


class Map(dict[str, Any]):
    """A mapping that remembers the line of each key (and of itself)."""

    line: int = 0
    lines: dict[str, int]


class Seq(list[Any]):
    """A sequence that remembers its line and the line of each item."""

    line: int = 0
    lines: list[int]


class Loader(yaml.SafeLoader):
    """A safe loader building ``Map`` and ``Seq``."""


def _construct_map(loader: Loader, node: yaml.MappingNode) -> Map:
    loader.flatten_mapping(node)
    out = Map()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise Problem(line, "a key must be a plain name, not a list or mapping")
        key = str(key_node.value)  # keys are names: 'off' or '404' stay strings
        if key in out:
            raise Problem(line, f"key {key!r} appears twice (first on line {out.lines[key]})")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = line
    return out


def _construct_seq(loader: Loader, node: yaml.SequenceNode) -> Seq:
    out = Seq(loader.construct_object(item, deep=True) for item in node.value)
    out.line = node.start_mark.line + 1
    out.lines = [item.start_mark.line + 1 for item in node.value]
    return out


Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


class Problem(Exception):
    """A problem at a line of the file being read; turned into a ``ConfigError``."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message
