"""Django's key names (django-ratelimit's ``"ip"``, ``"user"``, ``"user_or_ip"``,
``"header:<name>"``, ``"get:<param>"``, ``"post:<param>"``) and the dotted paths settings give
for functions, resolved once each."""

from __future__ import annotations

import functools
from typing import Any

from django.http import HttpRequest
from django.utils.module_loading import import_string

from ..errors import ConfigError
from ..middleware.request import KeyFunc, RequestInfo, client_ip, first, header


def _user(request: HttpRequest) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(getattr(user, "pk", None) or user)


def _field(source: str, name: str) -> KeyFunc:
    def key(request: RequestInfo) -> str | None:
        return getattr(request.raw, source).get(name) or None

    return key


def _user_key(request: RequestInfo) -> str | None:
    return request.user


_NAMED: dict[str, KeyFunc] = {
    "ip": client_ip(),  # behind RATEKEEPER["TRUSTED_PROXIES"]
    "user": _user_key,
    "user_or_ip": first(_user_key, client_ip()),
}


def key_function(spec: str | KeyFunc | None) -> KeyFunc:
    """A key function from a django-ratelimit style name, a dotted path, or a function. The
    same name gives the same function every time, so two views sharing a ``group`` with the
    same ``key`` share one limit."""
    if callable(spec):
        return spec
    if spec is None:
        return _NAMED["ip"]
    if not isinstance(spec, str):
        raise ConfigError(f"key {spec!r} is invalid; expected 'ip', 'user', a function, ...")
    return _named_key(spec)


@functools.lru_cache(maxsize=1024)
def _named_key(spec: str) -> KeyFunc:
    if spec in _NAMED:
        return _NAMED[spec]
    kind, _, name = spec.partition(":")
    if kind == "header" and name:
        return header(name)
    if kind in ("get", "post") and name:
        return _field(kind.upper(), name)
    try:
        found = import_string(spec)
    except ImportError:
        found = None
    if not callable(found):
        raise ConfigError(
            f"key {spec!r} is invalid; expected 'ip', 'user', 'user_or_ip', 'header:<name>', "
            "'get:<param>', 'post:<param>', a function of the request or its dotted path"
        )
    return found  # type: ignore[no-any-return]  # a key function by the user's word


def _function(value: Any, name: str) -> Any:
    if isinstance(value, str):
        value = import_string(value)
    if value is not None and not callable(value):
        raise ConfigError(f"settings.RATEKEEPER[{name!r}] {value!r} is not a function")
    return value
