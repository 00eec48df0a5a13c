"""Rendezvous placement: even spread, minimal movement when shards come and go, stability."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from ratekeeper import ConfigError
from ratekeeper.stores.redis.keys import encode_tag
from ratekeeper.stores.redis.rendezvous import Rendezvous, owner, seed

KEYS = [encode_tag(f"user:{i}") for i in range(100_000)]
OLD = ["redis-a:6379/0", "redis-b:6379/0", "redis-c:6379/0"]
NEW = [*OLD, "redis-d:6379/0"]


def place(names: list[str]) -> list[str]:
    seeds = [seed(n) for n in names]
    return [names[owner(tag, seeds)] for tag in KEYS]


@pytest.fixture(scope="module")
def three() -> list[str]:
    return place(OLD)


def test_100k_keys_over_3_shards_within_5_percent_of_even(three: list[str]) -> None:
    counts = Counter(three)
    assert set(counts) == set(OLD)
    even = len(KEYS) / 3
    for name, n in counts.items():
        assert abs(n - even) <= 0.05 * even, (name, n)


def test_a_fourth_shard_takes_a_quarter_and_moves_nothing_else(three: list[str]) -> None:
    four = place(NEW)
    moved = [(a, b) for a, b in zip(three, four, strict=True) if a != b]
    assert all(b == "redis-d:6379/0" for _, b in moved)  # never between two old shards
    assert abs(len(moved) - len(KEYS) / 4) <= 0.05 * len(KEYS) / 4
    for name in OLD:  # the fourth shard takes evenly from each old one
        taken = sum(1 for a, _ in moved if a == name)
        assert abs(taken - len(KEYS) / 12) <= 0.1 * len(KEYS) / 12


def test_removing_a_shard_moves_only_its_keys(three: list[str]) -> None:
    two = place(OLD[:2])
    for a, b in zip(three, two, strict=True):
        if a != OLD[2]:
            assert a == b


def test_order_of_shards_does_not_matter() -> None:
    forward = Rendezvous(OLD)
    backward = Rendezvous(list(reversed(OLD)))
    for tag in KEYS[:2000]:
        assert forward.names[forward.owner(tag)] == backward.names[backward.owner(tag)]


def test_placement_is_stable_across_processes() -> None:
    """Python's hash() is salted per process; the placement must not be."""
    code = (
        "from ratekeeper.stores.redis.rendezvous import Rendezvous\n"
        f"r = Rendezvous({OLD!r})\n"
        "print([r.owner(f'user:{i}') for i in range(50)])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(salt)},
        ).stdout
        for salt in (1, 2)
    }
    here = Rendezvous(OLD)
    assert outputs == {str([here.owner(f"user:{i}") for i in range(50)]) + "\n"}


def test_one_shard_owns_everything() -> None:
    only = Rendezvous(["solo"])
    assert {only.owner(tag) for tag in KEYS[:100]} == {0}


def test_long_names_are_usable_seeds() -> None:
    names = ["x" * 100 + "1", "x" * 100 + "2"]
    r = Rendezvous(names)
    assert {r.owner(tag) for tag in KEYS[:200]} == {0, 1}


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "at least one shard"),
        (["a", "b", "a"], "'a'"),
        (["a", ""], "non-empty string"),
    ],
)
def test_bad_shard_lists_are_refused(names: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Rendezvous(names)
