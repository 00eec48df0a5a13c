"""Matching one Envoy descriptor against a domain's tree, as envoyproxy/ratelimit matches it.

Entry by entry, at each level: the composite key ``key_value`` exactly; else the first
wildcard of the level (in config order) that matches ``key_value`` (each ``*`` matches any run
of characters, the pattern's pieces split once at load); else ``key`` alone (any value). The
limit is the one of the node reached by the *last* entry: a descriptor with more entries than
the tree has levels, or ending on a node without a limit, gets none.

What a match also yields, as upstream computes it:

- ``counter``: the entries the counter is keyed by; an entry matched by a ``share_threshold``
  wildcard counts under the pattern (``files/*``), so all its values share one counter;
- ``stats_key``: the stat key (``domain.key_value.key``): the configured path, or, with
  ``detailed_metric`` on the limit, every entry's ``key_value``; with ``value_to_metric`` on a
  node, that entry's runtime value; ``dynamic`` tells that the key holds caller text (the
  metrics bound those).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.envoy import EnvoyLimit, EnvoyNode

Entries = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Match:
    """The limit a descriptor reached, and how it is counted and reported."""

    limit: EnvoyLimit
    counter: Entries
    stats_key: str
    dynamic: bool = False


def wildcard_match(parts: tuple[str, ...], text: str) -> bool:
    """Whether ``text`` matches the pattern split on ``*`` into ``parts`` (``*``: any run)."""
    first, last = parts[0], parts[-1]
    if not text.startswith(first) or not text.endswith(last):
        return False
    if len(text) < sum(len(p) for p in parts):
        return False
    rest = text[len(first) : len(text) - len(last)]
    for part in parts[1:-1]:
        at = rest.find(part)
        if at < 0:
            return False
        rest = rest[at + len(part) :]
    return True


def find(domain: str, root: EnvoyNode, entries: Entries) -> Match | None:
    """The limit ``entries`` reach in ``root`` (see the module docstring), or None."""
    level = root
    last = len(entries) - 1
    found: EnvoyLimit | None = None
    shared: dict[int, str] | None = None
    steps: list[tuple[EnvoyNode, str, bool]] = []  # node, wildcard matched, matched by value
    simple = True
    for i, (key, value) in enumerate(entries):
        composite = key + "_" + value
        children = level.children
        node = children.get(composite)
        wild = ""
        if node is None and level.wildcards:
            for pattern, parts in level.wildcards:
                if wildcard_match(parts, composite):
                    node, wild = children[pattern], pattern
                    break
        by_value = node is not None
        if node is None:
            node = children.get(key)
            if node is None:
                return None
        if wild:
            simple = False
            if node.share_threshold:
                if shared is None:
                    shared = {}
                shared[i] = node.final.removeprefix(key + "_")
        elif node.value_to_metric:
            simple = False
        steps.append((node, wild, by_value))
        if i == last and node.limit is not None:
            found = node.limit
        if not node.children:
            break
        level = node
    if found is None:
        return None
    counter = entries if shared is None else _shared(entries, shared)
    if simple and not found.detailed_metric:
        return Match(found, counter, found.stats_key)
    return Match(found, counter, _stats_key(domain, entries, found, shared, steps), True)


def override_stats_key(domain: str, entries: Entries) -> str:
    """Upstream's stat key of a limit override: the domain and every ``key_value``."""
    return domain + "." + ".".join(k + "_" + v if v else k for k, v in entries)


def _shared(entries: Entries, shared: dict[int, str]) -> Entries:
    return tuple((k, shared.get(i, v)) for i, (k, v) in enumerate(entries))


def _stats_key(
    domain: str,
    entries: Entries,
    limit: EnvoyLimit,
    shared: dict[int, str] | None,
    steps: list[tuple[EnvoyNode, str, bool]],
) -> str:
    if limit.detailed_metric:
        if shared:
            parts = [
                k + "_" + shared[i] if i in shared else (k + "_" + v if v else k)
                for i, (k, v) in enumerate(entries)
            ]
        else:
            parts = [k + "_" + v for k, v in entries]
        return domain + "." + ".".join(parts)
    parts = []
    for i, ((key, value), (node, wild, by_value)) in enumerate(zip(entries, steps, strict=True)):
        if wild:
            if shared and i in shared:
                shown = shared[i]
            elif node.value_to_metric:
                shown = value
            else:
                shown = wild.removeprefix(key + "_")
        elif by_value:
            shown = value
        else:
            shown = value if node.value_to_metric else ""
        parts.append(key + "_" + shown if shown else key)
    return domain + "." + ".".join(parts)
