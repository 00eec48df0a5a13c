"""Checks deploy/'s Istio and Envoy Gateway examples, whose resources no schema here covers:
each document has an apiVersion, kind and name, and every Envoy ``typed_config`` in them (the
rate-limit filter, a cluster's protocol options) parses as its Envoy proto (xds-protos).

Usage: python -m tests.deploy_check FILE...   (run by scripts/check-deploy)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

# importing the generated modules registers their messages in the default pool
import envoy.config.cluster.v3.cluster_pb2
import envoy.extensions.filters.http.ratelimit.v3.rate_limit_pb2
import envoy.extensions.upstreams.http.v3.http_protocol_options_pb2  # noqa: F401
import yaml
from google.protobuf import json_format, symbol_database

PREFIX = "type.googleapis.com/"


def typed_configs(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping with an ``@type`` below ``node``."""
    if isinstance(node, dict):
        if isinstance(node.get("@type"), str):
            yield node
        for value in node.values():
            yield from typed_configs(value)
    elif isinstance(node, list):
        for value in node:
            yield from typed_configs(value)


def check_typed(config: dict[str, Any]) -> None:
    """Parse ``config`` as the message its ``@type`` names; ``ValueError`` if it does not."""
    name = config["@type"].removeprefix(PREFIX)
    message = symbol_database.Default().GetSymbol(name)()
    body = {k: v for k, v in config.items() if k != "@type"}
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as exc:
        raise ValueError(f"{name}: {exc}") from exc


def check_file(path: str) -> int:
    """Check one multi-document YAML file; the number of typed configs checked."""
    checked = 0
    with open(path, encoding="utf-8") as f:
        documents = [d for d in yaml.safe_load_all(f) if d is not None]
    if not documents:
        raise ValueError(f"{path}: no document")
    for doc in documents:
        meta = doc.get("metadata") or {}
        if not (doc.get("apiVersion") and doc.get("kind") and meta.get("name")):
            raise ValueError(f"{path}: a document lacks apiVersion, kind or metadata.name")
        for config in typed_configs(doc.get("spec")):
            try:
                check_typed(config)
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}: {doc['kind']} {meta['name']}: {exc}") from exc
            checked += 1
    return checked


def main(paths: list[str]) -> int:
    """Check every file; exit status 1 with the first problem of each file named."""
    status = 0
    for path in paths:
        try:
            print(f"{path}: {check_file(path)} Envoy typed configs parse as their protos")
        except ValueError as exc:
            print(exc, file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
