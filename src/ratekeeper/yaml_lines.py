"""YAML that remembers where things are: mappings and lists carry the line of each entry.

``Loader`` is a ``yaml.SafeLoader`` whose mappings are ``Map`` (a dict with ``line`` and
``lines[key]``) and whose lists are ``Seq`` (a list with ``line`` and ``lines[i]``), so that
validation can say "file:line: problem". Keys are always the plain text written (``off`` and
``404`` stay strings), and a key written twice is a ``Problem`` rather than a silent overwrite.

``parse`` reads one document; ``need_map``, ``need_seq``, ``need_int``, ``need_bool`` and
``no_unknown`` check a field and raise a ``Problem`` naming it and what is expected.
``Problems`` gathers them instead of stopping at the first: a reader checks each independent
part (a policy, a field, a descriptor) under ``guard()`` and goes on, so one read of a config
reports every problem in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
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
    """A problem at a line of the file being read; turned into a ``ConfigError``. ``more``:
    further problems found by the same check (every unknown key of a mapping)."""

    def __init__(self, line: int, message: str, more: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.line = line
        self.message = message
        self.more = tuple(more)

    @classmethod
    def first_of(cls, found: Sequence[Problem]) -> Problem:
        """One ``Problem`` carrying all of ``found`` (not empty)."""
        return cls(found[0].line, found[0].message, found[1:])


class Problems:
    """Every problem of a set of files: ``at`` names the file being read, ``guard`` records a
    ``Problem`` raised in its block (execution goes on after the block), ``lines`` lists them
    as ``file:line: problem`` in file and line order."""

    def __init__(self) -> None:
        self.found: list[tuple[int, int, str]] = []
        self.index = 0
        self.path = "<config>"

    def at(self, index: int, path: str) -> None:
        """The problems recorded from now on are in ``path``, the ``index``-th file."""
        self.index, self.path = index, path

    @property
    def count(self) -> int:
        return len(self.found)

    def add(self, problem: Problem) -> None:
        for p in (problem, *problem.more):
            self.found.append((self.index, p.line, f"{self.path}:{p.line}: {p.message}"))

    def add_text(self, index: int, text: str) -> None:
        """A problem of a whole file (it cannot be read), already worded."""
        self.found.append((index, 0, text))

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Record a ``Problem`` raised inside instead of letting it stop the read."""
        try:
            yield
        except Problem as exc:
            self.add(exc)

    def lines(self) -> list[str]:
        return [text for _, _, text in sorted(self.found, key=lambda f: (f[0], f[1]))]


def parse(text: str) -> Any:
    """One YAML document as ``Map``/``Seq``/scalars, or a ``Problem`` at the line at fault."""
    try:
        return yaml.load(text, Loader=Loader)  # a SafeLoader: builds plain data only
    except Problem:
        raise
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise Problem(line, f"invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise Problem(1, f"invalid YAML: {exc}") from None
    except RecursionError:
        raise Problem(1, "invalid YAML: lists or mappings nest too deeply") from None
    except ValueError as exc:  # e.g. an integer of over 4300 digits
        raise Problem(1, f"invalid YAML: {str(exc)[:200]}") from None


def no_unknown(body: Map, allowed: set[str] | frozenset[str], where: str) -> None:
    """Refuse the keys of ``body`` that are not in ``allowed`` (all of them, in one
    ``Problem``)."""
    expected = ", ".join(sorted(allowed))
    found = [
        Problem(body.lines[key], f"unknown key {key!r} in {where}; expected one of {expected}")
        for key in body
        if key not in allowed
    ]
    if found:
        raise Problem.first_of(found)


def need_map(value: Any, line: int, what: str) -> Map:
    """``value`` if it is a mapping."""
    if not isinstance(value, Map):
        raise Problem(line, f"{what} must be a mapping, not {type(value).__name__}")
    return value


def need_seq(value: Any, line: int, what: str) -> Seq:
    """``value`` if it is a list."""
    if not isinstance(value, Seq):
        raise Problem(line, f"{what} must be a list, not {type(value).__name__}")
    return value


def need_int(value: Any, line: int, what: str, low: int, high: int) -> int:
    """``value`` if it is a whole number from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Problem(line, f"{what} {value!r} must be a whole number from {low} to {high:_}")
    return value


def need_bool(value: Any, line: int, what: str) -> bool:
    """``value`` if it is true or false."""
    if not isinstance(value, bool):
        raise Problem(line, f"{what} {value!r} must be true or false")
    return value
