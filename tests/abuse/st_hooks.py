"""Schemathesis hooks for ``scripts/fuzz``: half of the request bodies name the configured
policy ``p``, so generated requests reach the decision code instead of stopping at a 404.
Only a non-empty string policy is replaced, so a body made invalid on purpose stays invalid."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st


@schemathesis.hook
def flatmap_body(context: Any, body: Any) -> Any:
    if isinstance(body, dict) and isinstance(body.get("policy"), str) and body["policy"]:
        return st.sampled_from([body, {**body, "policy": "p"}])
    return st.just(body)
