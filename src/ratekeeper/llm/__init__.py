"""Token and request limits for LLM gateways, settled from the provider's own usage.

The sans-I/O parts — ``SSEParser``, the meters, the usage readers, ``Estimator``, the
provider headers — need nothing beyond ratekeeper; ``Gateway`` (an ASGI reverse proxy) calls
its upstream with httpx, imported when it first does (``pip install ratekeeper[llm]``).
docs/llm.md is the manual.
"""

from .estimate import BadRequest as BadRequest
from .estimate import Estimator as Estimator
from .estimate import Prepared as Prepared
from .estimate import heuristic_tokens as heuristic_tokens
from .gateway import ROUTES as ROUTES
from .gateway import Gateway as Gateway
from .headers import anthropic_headers as anthropic_headers
from .headers import go_duration as go_duration
from .headers import openai_headers as openai_headers
from .keys import api_key as api_key
from .keys import callers as callers
from .limits import Caller as Caller
from .limits import Limit as Limit
from .meters import BodyMeter as BodyMeter
from .meters import Meter as Meter
from .meters import StreamMeter as StreamMeter
from .settling import charge_of as charge_of
from .sse import Event as Event
from .sse import SSEParser as SSEParser
from .usage import TokenUsage as TokenUsage
from .usage import UsageError as UsageError
from .usage import anthropic_usage as anthropic_usage
from .usage import openai_usage as openai_usage
from .usage import responses_usage as responses_usage

__all__ = [
    "ROUTES",
    "BadRequest",
    "BodyMeter",
    "Caller",
    "Estimator",
    "Event",
    "Gateway",
    "Limit",
    "Meter",
    "Prepared",
    "SSEParser",
    "StreamMeter",
    "TokenUsage",
    "UsageError",
    "anthropic_headers",
    "anthropic_usage",
    "api_key",
    "callers",
    "charge_of",
    "go_duration",
    "heuristic_tokens",
    "openai_headers",
    "openai_usage",
    "responses_usage",
]
