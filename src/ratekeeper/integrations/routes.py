"""Per-route limits as data, and which gate positions each route walks — for every framework.

A ``Limit`` is a rate rule not yet bound to a route (what ``@limit``, ``shared_limit`` and a
FastAPI dependency hold). A ``RouteTable`` remembers the limits and exemptions put on views and
on groups of views (a Flask blueprint, a class-based view); ``Routes`` binds a table to one
app's gate and answers, once per route, which positions its requests walk.

Rules, the same in every framework:

- a limit without a name counts per route: each route gets its own check, named after the route
  (``"GET /items/{id}"``, a Flask endpoint, a Django view name), then ``#2``, ``#3`` for a
  route's further limits; a limit with a name (``shared_limit``) is one check, one counter,
  wherever it is used;
- default limits apply to every route that has no limit of its own (or whose own limits say
  ``override_defaults=False``) and is not exempt;
- application limits (named: one counter for the whole app) apply to every route that is not
  exempt, whatever its own limits;
- ``exempt`` on a view or a group frees its routes from the default and application limits;
  limits put on the view or the group explicitly still apply;
- a limit keeps its check (and counter) on a route however the route is reached: the first
  walk that meets a limit on a route names and registers it, every later walk finds the same
  position, so a limit found by two walks of one request (Django's middleware and the view's
  own decorator) is one check, never two, and the table grows with the limits and routes
  there are, not with requests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from ..errors import ConfigError
from ..middleware.checks import ChargeWhen, CostFunc, RateCheck, RateFunc, RateSpec
from ..middleware.gate import Gate
from ..middleware.request import KeyFunc, client_ip
from .nested_routes import NestedLimit

T = TypeVar("T")
RouteLimit = Union["Limit", NestedLimit]
"""What a route can carry: a rate limit, or a nested one (``nested_routes``)."""


@dataclass(frozen=True, slots=True)
class Limit:
    """A rate rule for routes; ``None`` fields take the integration's defaults when bound."""

    rate: RateSpec | RateFunc
    key: KeyFunc | None = None
    name: str | None = None
    algorithm: str | None = None
    burst: int | None = None
    buckets: int | None = None
    cost: int | CostFunc = 1
    methods: tuple[str, ...] = ()
    charge_when: ChargeWhen | None = None
    override_defaults: bool = True
    message: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.methods, str):
            object.__setattr__(self, "methods", (self.methods,))
        object.__setattr__(self, "methods", tuple(m.upper() for m in self.methods))
        self.bind(self.name or "limit", client_ip(), "fixed_window")  # bad input fails here

    def bind(self, name: str, key: KeyFunc, algorithm: str) -> RateCheck:
        """The check this limit is on a route named ``name`` (its own name if it has one)."""
        return RateCheck(
            self.name or name,
            self.rate,
            key=self.key or key,
            algorithm=self.algorithm or algorithm,
            burst=self.burst,
            buckets=self.buckets,
            methods=self.methods,
            cost=self.cost,
            charge_when=self.charge_when,
            message=self.message,
        )


def as_limits(default: str | Limit | Iterable[str | Limit] | None) -> tuple[Limit, ...]:
    """Default limits from a rate string (a stack counts as one limit), a ``Limit``, or a list
    of either."""
    if default is None:
        return ()
    if isinstance(default, str | Limit):
        default = [default]
    out = []
    for item in default:
        if isinstance(item, str):
            item = Limit(item)
        if not isinstance(item, Limit):
            raise ConfigError(
                f"default limit {item!r} is invalid; expected a rate such as '100/minute'"
            )
        out.append(item)
    return tuple(out)


def _unwrapped(target: Any) -> Iterable[Any]:
    """``target``, what it wraps (``functools.wraps``), and a class-based view's class."""
    seen = 0
    while target is not None and seen < 32:
        yield target
        view_class = getattr(target, "view_class", None)
        if view_class is not None:
            yield view_class
        target = getattr(target, "__wrapped__", None)
        seen += 1


class RouteTable:
    """Limits and exemptions put on views and groups of views, by object."""

    def __init__(self) -> None:
        self._limits: dict[Any, list[RouteLimit]] = {}
        self._exempt: set[Any] = set()
        self._shared: dict[str, RouteLimit] = {}
        self._gates: list[Gate] = []
        self.settling = False
        """Whether a limit here settles after the response (``NestedLimit`` with ``actual``)."""

    def attach(self, gate: Gate) -> None:
        """Bind ``gate`` to this table: told (``Gate.settling``) once a limit here settles, so
        its middleware keeps each request's usage before the route's check is first added."""
        self._gates.append(gate)
        if self.settling:
            gate.settling = True

    def note(self, limit: RouteLimit) -> None:
        """Remember whether ``limit`` settles (``mark`` does; a dependency's limit too)."""
        if isinstance(limit, NestedLimit) and limit.settles:
            self.settling = True
            for gate in self._gates:
                gate.settling = True

    def mark(self, limit: RouteLimit) -> Callable[[T], T]:
        """A decorator putting ``limit`` on a view or group; returns it unchanged."""
        self.note(limit)
        if limit.name is not None:
            known = self._shared.setdefault(limit.name, limit)
            if known != limit:
                raise ConfigError(
                    f"shared limit {limit.name!r} is defined twice with different settings; "
                    "give each shared limit its own name"
                )

        def decorate(target: T) -> T:
            marked = self._limits.setdefault(target, [])
            if not any(known is limit for known in marked):  # once, however often applied
                marked.insert(0, limit)  # decorators apply inside-out
            return target

        return decorate

    def exempt(self, target: T) -> T:
        """Free a view or group from the default limits; returns it unchanged."""
        self._exempt.add(target)
        return target

    def limits_of(self, target: Any) -> tuple[bool, list[RouteLimit]]:
        """Whether ``target`` is exempt, and the limits put on it (through wrappers too)."""
        exempt = False
        limits: list[RouteLimit] = []
        for obj in _unwrapped(target):
            try:
                exempt = exempt or obj in self._exempt
                limits.extend(self._limits.get(obj, ()))
            except TypeError:  # unhashable: nothing was put on it
                continue
        return exempt, limits


class Routes:
    """A ``RouteTable`` bound to one app's gate: the positions each route walks, cached."""

    def __init__(
        self,
        table: RouteTable,
        gate: Gate,
        default: Sequence[Limit],
        key: KeyFunc,
        algorithm: str,
        application: Sequence[Limit] = (),
    ) -> None:
        self.table = table
        self.gate = gate
        self.default = tuple(default)
        self.application = tuple(application)
        self.key = key
        self.algorithm = algorithm
        self._cache: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._bound: dict[tuple[str, int], tuple[RouteLimit, int]] = {}
        """(route, id(limit)) -> (the limit, kept alive; its position)."""
        self._unnamed: dict[str, int] = {}
        """Limits without a name bound so far per route (their names: route, route#2, ...)."""
        self._lock = threading.Lock()
        table.attach(gate)

    def positions(self, route: str, targets: Sequence[Any]) -> tuple[int, ...]:
        """The positions a request to ``route`` walks; ``targets`` are the view, then the groups
        it belongs to (innermost first)."""
        own, rest = self.parts(route, targets)
        return own + rest if rest else own

    def parts(self, route: str, targets: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The positions of ``route``'s own limits (those put on its targets), and of the rest
        it walks (default and application limits), each without repeats."""
        cache_key = (route, *targets)
        found = self._cache.get(cache_key)
        if found is not None:
            return found
        exempt = False
        own: list[RouteLimit] = []
        for target in targets:
            is_exempt, limits = self.table.limits_of(target)
            exempt = exempt or is_exempt
            own.extend(limits)
        rest: list[RouteLimit] = []
        if not exempt and not any(limit.override_defaults for limit in own):
            rest.extend(self.default)
        if not exempt:
            rest.extend(self.application)
        mine = tuple(dict.fromkeys(self.bind(limit, route) for limit in own))
        others = tuple(p for p in dict.fromkeys(self.bind(x, route) for x in rest) if p not in mine)
        found = (mine, others)
        with self._lock:
            self._cache[cache_key] = found
        return found

    def position(self, limit: RouteLimit, route: str, label: str) -> int:
        """The position of one limit on ``route`` outside the table (a dependency): named
        ``route@label`` unless the limit has a name of its own."""
        return self.gate.add(limit.bind(f"{route}@{label}", self.key, self.algorithm))

    def bind(self, limit: RouteLimit, route: str) -> int:
        """The position of ``limit`` on ``route``: the same every time (see the module
        docstring); an unnamed limit is named after the route (``route``, ``route#2``, ...)."""
        key = (route, id(limit))
        found = self._bound.get(key)
        if found is not None:
            return found[1]
        with self._lock:
            found = self._bound.get(key)
            if found is not None:
                return found[1]
            name = route
            if limit.name is None:
                count = self._unnamed[route] = self._unnamed.get(route, 0) + 1
                name = route if count == 1 else f"{route}#{count}"
            position = self.gate.add(limit.bind(name, self.key, self.algorithm))
            self._bound[key] = (limit, position)
            return position
