"""The estimate before the call: the most a request can cost, and the body sent upstream.

A request is reserved at its worst case and settled with what the provider reports, so the
estimate must not be lower than the truth where the client chooses it. ``Estimator.prepare``
reads a request's JSON body and returns a ``Prepared`` request:

- **output**: the request's own most (chat: ``max_completion_tokens`` / ``max_tokens``;
  completions and Anthropic messages: ``max_tokens``; responses: ``max_output_tokens``;
  embeddings write nothing), capped by the model's most (``model_max_output``, else
  ``max_output``) and rewritten to that cap in the body, so the upstream cannot write more
  than was reserved. A request that names no most gets ``default_output``, written into the
  body (never unlimited). Chat's ``n`` and completions' ``n``/``best_of`` multiply it.
- **input**: the prompt's size through the token counter, over every string of the body
  (keys too: tool schemas are prompt) except a few that are not prompt (``model``,
  ``metadata``...); ``message_tokens`` more per object in a list (a message's framing); an
  image, audio or file part (or a ``data:`` URL) counts ``part_tokens``, its bytes unread;
  a list of token ids counts one per id.
- **the body sent** is always the one read, written again (``json.dumps``): a key given twice
  (``{"max_tokens": 1, "max_tokens": 90000}``) reaches the upstream once, as estimated. For a
  streamed chat or completion, ``stream_options.include_usage`` is forced on, so the usage
  comes back in the stream.

``heuristic_tokens`` is the default counter: a third of the text's UTF-8 bytes, rounded up
(English runs about 4 bytes a token and code about 3, so this is an over-estimate for most
text; a prompt built to tokenize worse is charged its true usage at the settle, within the
levels' debt). Any ``Callable[[str], int]`` serves instead, e.g. a tokenizer's
``lambda text: len(encoding.encode(text))``.

A body that is not a JSON object, or whose ``stream``, most or ``n`` is not what the API
takes, is refused (``BadRequest``, the client's 400), before anything is charged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .meters import APIS, TokenCounter


def heuristic_tokens(text: str) -> int:
    """A third of ``text``'s UTF-8 bytes, rounded up (module docstring)."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return (size + 2) // 3


class BadRequest(ValueError):
    """A request the gateway refuses (400); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request read: the body to send upstream, whether it streams, its model, and its
    estimate's parts (``input_tokens`` of prompt, at most ``output_tokens`` written)."""

    body: bytes
    stream: bool
    model: str | None
    input_tokens: int
    output_tokens: int

    @property
    def estimate(self) -> int:
        """The reservation: the prompt plus the most the call may write (at least 1)."""
        return max(1, self.input_tokens + self.output_tokens)


_MAX_FIELDS: dict[str, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "embeddings": (),
    "messages": ("max_tokens",),
}
_NOT_PROMPT = frozenset({
    "model", "metadata", "user", "service_tier", "stream", "stream_options", "store",
    "prompt_cache_key", "safety_identifier", "reasoning_effort", "encoding_format",
})  # fmt: skip
_PARTS = frozenset({
    "image_url", "input_image", "image", "input_audio", "audio", "file", "input_file",
    "document",
})  # fmt: skip
MAX_N = 128


@dataclass(frozen=True, slots=True)
class Estimator:
    """How requests are estimated and capped (module docstring).

    ``count`` is the token counter; ``max_output`` the most any call may write,
    ``model_max_output`` the most per model (the upstream's own); ``default_output`` what a
    request naming no most is given; ``chat_max_field`` the field written into a chat request
    that names none (``max_tokens`` for upstreams that know no other)."""

    count: TokenCounter = heuristic_tokens
    max_output: int = 16_384
    model_max_output: Mapping[str, int] = field(default_factory=dict)
    default_output: int = 4_096
    message_tokens: int = 4
    part_tokens: int = 1_024
    chat_max_field: str = "max_completion_tokens"

    def __post_init__(self) -> None:
        for name in ("max_output", "default_output", "message_tokens", "part_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < (0 if name.endswith("_tokens") else 1):
                raise ValueError(f"{name}={value!r} is invalid; expected a whole number")
        for model, most in self.model_max_output.items():
            if type(most) is not int or most < 1:
                raise ValueError(f"model_max_output[{model!r}]={most!r} is invalid; expected "
                                 "a whole number >= 1")  # fmt: skip
        if self.chat_max_field not in _MAX_FIELDS["chat"]:
            raise ValueError(f"chat_max_field={self.chat_max_field!r} is invalid; expected "
                             "'max_completion_tokens' or 'max_tokens'")  # fmt: skip
        if not callable(self.count):
            raise ValueError(f"count={self.count!r} is invalid; expected a function of a text")

    def prepare(self, api: str, raw: bytes) -> Prepared:
        """Read ``raw``, a request body of ``api``; ``BadRequest`` if it is not one."""
        if api not in APIS:
            raise ValueError(f"api {api!r} is unknown; expected one of {', '.join(APIS)}")
        body = _object(raw)
        stream = body.get("stream", False)
        if type(stream) is not bool:
            raise BadRequest(f"stream must be true or false, not {_show(stream)}", "stream")
        model = body.get("model")
        model = model if isinstance(model, str) else None
        output = self._output(api, body, model) * _choices(api, body)
        if stream and api in ("chat", "completions"):
            options = body.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            options["include_usage"] = True
            body["stream_options"] = options
        try:
            sent = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            sent_bytes = sent.encode()
        except (UnicodeEncodeError, RecursionError, ValueError) as exc:
            raise BadRequest(f"the body cannot be sent on: {exc}") from exc
        return Prepared(sent_bytes, stream, model, self._prompt(body), output)

    def _output(self, api: str, body: dict[str, Any], model: str | None) -> int:
        """The most the call may write, capped and written into ``body``."""
        fields = _MAX_FIELDS[api]
        if not fields:
            return 0
        cap = self.model_max_output.get(model, self.max_output) if model else self.max_output
        most = 0
        for name in fields:
            if name not in body or body[name] is None:
                continue
            asked = body[name]
            if type(asked) is not int or asked < 1:
                raise BadRequest(f"{name} must be a whole number >= 1, not {_show(asked)}", name)
            if asked > cap:
                body[name] = asked = cap
            most = max(most, asked)
        if most == 0:
            most = min(self.default_output, cap)
            body[self.chat_max_field if api == "chat" else fields[0]] = most
        return most

    def _prompt(self, body: dict[str, Any]) -> int:
        """The prompt's tokens (module docstring); iterative, so any depth is fine."""
        count = self.count
        total = 0
        stack: list[Any] = [v for k, v in body.items() if k not in _NOT_PROMPT]
        total += sum(count(k) for k in body if k not in _NOT_PROMPT)
        while stack:
            value = stack.pop()
            if isinstance(value, str):
                total += self.part_tokens if value.startswith("data:") else count(value)
            elif isinstance(value, dict):
                if value.get("type") in _PARTS:
                    total += self.part_tokens
                    continue
                for k, v in value.items():
                    total += count(k)
                    stack.append(v)
            elif isinstance(value, list):
                for item in value:
                    if type(item) is int:
                        total += 1
                    else:
                        if isinstance(item, dict):
                            total += self.message_tokens
                        stack.append(item)
        return total


def _object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the body is not JSON: {str(exc)[:80]}") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(body).__name__}")
    return body


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _choices(api: str, body: Mapping[str, Any]) -> int:
    """How many completions one call writes (chat's ``n``, completions' ``n`` and ``best_of``)."""
    if api not in ("chat", "completions"):
        return 1
    most = 1
    for name in ("n", "best_of") if api == "completions" else ("n",):
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int or not 1 <= value <= MAX_N:
            raise BadRequest(f"{name} must be a whole number from 1 to {MAX_N}, not "
                             f"{_show(value)}", name)  # fmt: skip
        most = max(most, value)
    return most


def _show(value: object) -> str:
    text = (
        json.dumps(value) if isinstance(value, str | int | float | bool) else type(value).__name__
    )
    return text if len(text) <= 40 else text[:37] + "..."
