"""What a call is charged once its response has ended (pure): the settle's figure, or a cancel.

The reservation was the worst case (``estimate.Prepared.estimate``). At the end:

- 2xx, the provider's usage read and nothing amiss: ``price(usage)`` (default its total);
- 2xx, the usage missing, invalid or given twice, the stream malformed, cut by
  ``stream_timeout`` or by a drain that did not finish: the estimate, or more where the
  stream showed more (a usage, the text counted);
- 2xx, the client left and the gateway stopped reading (``on_disconnect="close"``): what was
  produced so far, the prompt (the stream's own figure, else the estimate's) plus the text
  streamed, counted, or a usage already read;
- 2xx, the upstream broke mid-stream: the same, and a cancel if it broke before any token;
- 4xx from the upstream: its usage if it sent one, else 0 tokens (the request still counts);
- 5xx, no answer, a connect error: cancelled, the tokens given back (the request counts).

"Counted" is the prompt plus the output tokens the meter counted from the text: a lower
bound of what the provider bills, used only where no usage can be read.
"""

from __future__ import annotations

from collections.abc import Callable

from ..nested import MAX_COST
from .estimate import Prepared
from .meters import Meter
from .usage import TokenUsage

Price = Callable[[TokenUsage], int]
"""What a usage is charged: ``total_tokens`` unless the gateway is told otherwise."""

HOWS = ("complete", "left", "timeout", "broken")
"""How the gateway's reading of the response ended: to its end; stopped because the client left;
cut by a timeout (the stream's, or the drain's); the upstream failed mid-body."""


def total(usage: TokenUsage) -> int:
    """The default price: every token the call processed."""
    return usage.total_tokens


def priced(price: Price, usage: TokenUsage) -> int:
    """``price(usage)``, which must be a whole number from 0 to 10**12 (``ValueError``)."""
    value = price(usage)
    if type(value) is not int or not 0 <= value <= MAX_COST:
        raise ValueError(f"price {value!r} is invalid; expected a whole number from 0 to 10**12")
    return value


def charge_of(
    meter: Meter, prepared: Prepared, how: str, status: int, price: Price = total
) -> int | None:
    """The settle's figure for this response, or None to cancel (module docstring); the meter
    reads what it was fed first."""
    meter.flush()
    usage = meter.usage
    clean = usage is not None and not meter.problems and how != "timeout"
    if status >= 500:
        return priced(price, usage) if clean and usage is not None else None
    if status >= 400:
        return priced(price, usage) if clean and usage is not None else 0
    if clean and usage is not None:
        return priced(price, usage)
    prompt = meter.input if meter.input is not None else prepared.input_tokens
    counted = prompt + meter.output
    if meter.best is not None:
        counted = max(counted, priced(price, meter.best))
    if how == "left":
        return counted
    if how == "broken":
        return None if meter.output == 0 and meter.best is None else counted
    return max(prepared.estimate, counted)
