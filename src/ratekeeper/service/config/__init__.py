"""The service's configuration language: YAML files -> one frozen ``ServiceConfig``.

- ``loader``: the files, their sections and their checks -> ``ServiceConfig`` (``load``,
  ``parse_text``); ``example.yaml`` and ``schema.json``: an example and the JSON Schema;
- ``environment``: settings from flags and ``RATEKEEPER_*`` (and upstream's) variables;
- ``policies``: named rate stacks and concurrency caps; ``settings``: ``store:`` and ``auth:``;
  ``quotas``: the ``quotas:`` section (tenants' plans);
- ``envoy``: Envoy-format domains compiled into descriptor trees; ``rlqs``: the ``rlqs:`` section;
- ``files``: which files ``--config`` names; ``watch``: reload when they change.

The YAML that remembers each entry's line is ``ratekeeper.yaml_lines`` (the quota plans'
files read it too).
"""

from .loader import EXAMPLE as EXAMPLE
from .loader import ServiceConfig as ServiceConfig
from .loader import load as load
from .loader import parse_text as parse_text
