"""Views of the test project: plain Django (sync, async, class-based, streaming) and DRF."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ratekeeper.compat import django_ratelimit as compat_ratelimit
from ratekeeper.compat import drf as compat_drf
from ratekeeper.integrations.django import UNSAFE, exempt, nested_ratelimit, ratelimit
from ratekeeper.integrations.drf import AnonRateThrottle, ScopedRateThrottle, UserRateThrottle
from ratekeeper.middleware import CheckLevel, RequestInfo, costs, keys

STREAMED: list[int] = []


PLANS = {"free": "2/minute", "pro": "4/minute"}


def plan_rate(request: RequestInfo) -> str | None:
    plan = request.header("x-plan") or "free"
    return None if plan == "internal" else PLANS[plan]


def items(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit("2/minute", cost=lambda r: int(r.header("x-cost") or 1))
def search(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit("10/minute", override_defaults=False)
def both(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit("3/minute", group="reports")
def report_a(request: HttpRequest) -> HttpResponse:
    return HttpResponse("a")


@ratelimit("3/minute", group="reports")
def report_b(request: HttpRequest) -> HttpResponse:
    return HttpResponse("b")


@ratelimit(plan_rate, key="header:x-api-user")
def plan(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@csrf_exempt
@ratelimit("2/minute", key="user_or_ip", methods=UNSAFE, charge_when=lambda s: s >= 400)
def login(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=200 if request.POST.get("password") == "right" else 401)


def etag(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=304)


@exempt
def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def stream(request: HttpRequest) -> StreamingHttpResponse:
    def chunks() -> Iterator[bytes]:
        for i in range(3):
            STREAMED.append(i)
            yield b"x" * 10

    return StreamingHttpResponse(chunks())


async def async_items(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit("1/minute")
async def async_search(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@exempt
class Page(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("page")


@exempt
class UserView(APIView):
    throttle_classes: ClassVar[list[Any]] = [UserRateThrottle]

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


@exempt
class AnonView(APIView):
    throttle_classes: ClassVar[list[Any]] = [AnonRateThrottle]

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


@exempt
class BurstView(APIView):
    throttle_classes: ClassVar[list[Any]] = [ScopedRateThrottle, UserRateThrottle]
    throttle_scope = "burst"

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


@exempt
class OpenView(APIView):
    throttle_classes: ClassVar[list[Any]] = [ScopedRateThrottle]  # no throttle_scope: not throttled

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


TOKENS = [
    CheckLevel("org", "1000/minute", key=keys.header("x-org")),
    CheckLevel("key", "100/minute", key=keys.header("x-key")),
]


@nested_ratelimit(TOKENS, cost=40, actual=costs.header("x-usage-tokens"))
def completion(request: HttpRequest) -> HttpResponse:
    response = HttpResponse("done")
    response["X-Usage-Tokens"] = request.GET.get("tokens", "0")
    return response


@nested_ratelimit(TOKENS, cost=40, actual=costs.reported(), name="streamed")
def streamed_completion(request: HttpRequest) -> StreamingHttpResponse:
    def chunks() -> Iterator[bytes]:
        for _ in range(int(request.GET.get("tokens", "0"))):
            costs.report(request.META, 1)
            yield b"tok "

    return StreamingHttpResponse(chunks())


@method_decorator(ratelimit("2/minute"), name="get")
class Decorated(View):
    """django-ratelimit's documented way for class-based views: the decorator on a method."""

    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("decorated")

    def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("not limited")


@method_decorator(ratelimit("2/minute", key="header:x-api-key"), name="dispatch")
class Dispatched(View):
    """The decorator on ``dispatch``: every method of the view."""

    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("get")

    def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("post")


@ratelimit("3/minute", key="user_or_ip", group="by-user")
def by_user_a(request: HttpRequest) -> HttpResponse:
    return HttpResponse("a")


@ratelimit("3/minute", key="user_or_ip", group="by-user")  # a named key, one group: one limit
def by_user_b(request: HttpRequest) -> HttpResponse:
    return HttpResponse("b")


@ratelimit("2/minute", block=False)
def watched(request: HttpRequest) -> HttpResponse:
    return HttpResponse("limited" if getattr(request, "limited", False) else "fine")


@ratelimit("5/minute")
@ratelimit("2/minute")
def stacked(request: HttpRequest) -> HttpResponse:
    return HttpResponse("stacked")


@exempt
@compat_ratelimit.ratelimit(key="ip", rate="10/m")
def compat_limited(request: HttpRequest) -> HttpResponse:
    """django-ratelimit's decorator through ratekeeper.compat (exempt from the defaults)."""
    return HttpResponse("ok")


@exempt
class CompatUserView(APIView):
    throttle_classes: ClassVar[list[Any]] = [compat_drf.UserRateThrottle]

    def get(self, request: Request) -> Response:
        return Response({"ok": True})
