"""Authentication for tests, without a database: ``X-User: alice`` is user ``alice``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest
from django.utils.decorators import sync_and_async_middleware
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request


@dataclass(frozen=True)
class User:
    """An authenticated user named by the ``X-User`` header (no database needed)."""

    pk: str
    is_authenticated: bool = True


@sync_and_async_middleware
def header_user(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Authentication for tests: ``X-User: alice`` is user ``alice``."""

    def attach(request: HttpRequest) -> None:
        name = request.headers.get("x-user")
        if name:
            request.user = User(name)  # type: ignore[assignment]  # a stand-in user

    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> Any:
            attach(request)
            return await get_response(request)

    else:

        def middleware(request: HttpRequest) -> Any:  # type: ignore[misc]  # sync twin
            attach(request)
            return get_response(request)

    return middleware


class HeaderAuth(BaseAuthentication):
    """DRF authentication for tests: ``X-User: alice``."""

    def authenticate(self, request: Request) -> tuple[User, None] | None:
        name = request.headers.get("x-user")
        return (User(name), None) if name else None
