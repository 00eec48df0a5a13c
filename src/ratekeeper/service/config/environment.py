"""Settings from the environment: ratekeeper's ``RATEKEEPER_…`` variables, and
envoyproxy/ratelimit's own, read as upstream's binary reads them.

Precedence: a command-line flag, else ``RATEKEEPER_<SETTING>``, else upstream's variable, else
the default. Upstream's variables are read in *upstream mode* only: when the environment holds
one that only upstream's deployments set (``RUNTIME_ROOT``, ``REDIS_URL``, ``USE_STATSD``,
``GRPC_PORT``…, see ``UPSTREAM_MARKERS``); generic names such as ``HOST`` or ``PORT`` alone do
not switch it on. In upstream mode the defaults are upstream's too (every address, the
runtime directory ``/srv/runtime_data/current/config``, statsd on ``localhost:8125``). A
variable of upstream's that would change behaviour in a way ratekeeper does not support is
refused (``EnvironmentProblem``), never ignored.

``serve_settings`` resolves the command's own settings (addresses, config paths, logs, statsd);
``config_overlay`` the config's sections (``store:``, ``envoy:``, ``limits:``), which the config
loader lays over the settings file's. Both say where each value came from, for
``check-config``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from ...errors import ConfigError


class EnvironmentProblem(ConfigError):
    """An environment variable with a value that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One effective setting: its value and where it came from (a flag, a variable, a default)."""

    name: str
    value: Any
    source: str


UPSTREAM_MARKERS = frozenset(
    [
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_APPDIRECTORY",
        "RUNTIME_WATCH_ROOT",
        "RUNTIME_IGNOREDOTFILES",
        "REDIS_URL",
        "REDIS_TYPE",
        "REDIS_SOCKET_TYPE",
        "REDIS_AUTH",
        "REDIS_TLS",
        "REDIS_POOL_SIZE",
        "USE_STATSD",
        "STATSD_HOST",
        "STATSD_PORT",
        "GRPC_HOST",
        "GRPC_PORT",
        "BACKEND_TYPE",
        "CONFIG_TYPE",
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "NEAR_LIMIT_RATIO",
    ]
)
"""Variables only an envoyproxy/ratelimit deployment sets: any of them turns upstream mode on."""

UNSUPPORTED: dict[str, tuple[Callable[[str], bool], str]] = {
    "CONFIG_TYPE": (lambda v: v.upper() != "FILE", "the xDS config source is not supported"),
    "BACKEND_TYPE": (lambda v: v.lower() != "redis", "only the redis backend is supported"),
    "GRPC_UDS": (bool, "gRPC on a Unix socket is not supported"),
    "GRPC_SERVER_USE_TLS": (lambda v: _truth(v), "TLS on the gRPC listener is not supported"),
    "USE_DOG_STATSD": (lambda v: _truth(v), "DogStatsD is not supported (plain statsd is)"),
    "EXTRA_TAGS": (bool, "statsd tags are not supported"),
    "REDIS_PERSECOND": (
        lambda v: _truth(v),
        "a second Redis for per-second limits is not supported",
    ),
    "MEMCACHE_HOST_PORT": (bool, "memcached is not supported"),
    "MEMCACHE_SRV": (bool, "memcached is not supported"),
    "TRACING_ENABLED": (lambda v: _truth(v), "tracing is not supported"),
    "PROTO": (lambda v: v.lower() != "tcp", "only tcp listeners are supported"),
}
"""Upstream variables whose value asks for something ratekeeper lacks: refused when so set."""

NO_EFFECT = {
    "REDIS_POOL_SIZE": "decisions share pipelined batches, not a pool per request",
    "RUNTIME_WATCH_ROOT": "the runtime directory and a symlink swap of it are always watched",
    "EXPIRATION_JITTER_MAX_SECONDS": "keys expire a second after their window ends",
    "USE_PROMETHEUS": "GET /metrics on the HTTP port is always on",
    "PROMETHEUS_ADDR": "GET /metrics is served on the HTTP port",
    "PROMETHEUS_PATH": "GET /metrics is served on the HTTP port",
    "DEBUG_HOST": "no debug listener: /metrics and /dashboard are on the HTTP port",
    "DEBUG_PORT": "no debug listener: /metrics and /dashboard are on the HTTP port",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "the service never serves without a valid config",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "/healthz answers 503 while the store does not",
    "GRPC_MAX_CONNECTION_AGE": "gRPC connections are not aged out",
    "GRPC_MAX_CONNECTION_AGE_GRACE": "gRPC connections are not aged out",
}
"""Upstream variables accepted without effect, and why (check-config shows them)."""

LOG_LEVELS = {
    "trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warn": "WARNING",
    "warning": "WARNING", "error": "ERROR", "fatal": "CRITICAL", "panic": "CRITICAL",
    "critical": "CRITICAL",
}  # fmt: skip

# (setting, RATEKEEPER_ variable, upstream variable or "", our default, upstream's default, parse)
_SERVE: list[tuple[str, str, str, Any, Any, str]] = [
    ("host", "RATEKEEPER_HOST", "HOST", "127.0.0.1", "0.0.0.0", "text"),
    ("port", "RATEKEEPER_PORT", "PORT", 8080, 8080, "port"),
    ("grpc_port", "RATEKEEPER_GRPC_PORT", "GRPC_PORT", 8081, 8081, "port"),
    ("no_grpc", "RATEKEEPER_NO_GRPC", "", False, False, "bool"),
    ("config", "RATEKEEPER_CONFIG", "", [], [], "paths"),
    ("config_dotfiles", "RATEKEEPER_CONFIG_DOTFILES", "", False, True, "bool"),
    ("store_wait", "RATEKEEPER_STORE_WAIT", "", 5.0, 5.0, "seconds"),
    ("start_degraded", "RATEKEEPER_START_DEGRADED", "", False, False, "bool"),
    ("header_timeout", "RATEKEEPER_HEADER_TIMEOUT", "", 10.0, 10.0, "timeout"),
    ("body_timeout", "RATEKEEPER_BODY_TIMEOUT", "", 10.0, 10.0, "timeout"),
    ("idle_timeout", "RATEKEEPER_IDLE_TIMEOUT", "", 5.0, 5.0, "timeout"),
    ("send_timeout", "RATEKEEPER_SEND_TIMEOUT", "", 10.0, 10.0, "timeout"),
    ("allowed_host", "RATEKEEPER_ALLOWED_HOST", "", [], [], "list"),
    ("allowed_origin", "RATEKEEPER_ALLOWED_ORIGIN", "", [], [], "list"),
    ("no_auth_warning", "RATEKEEPER_NO_AUTH_WARNING", "", False, False, "bool"),
    ("worker_timeout", "RATEKEEPER_WORKER_TIMEOUT", "", 10.0, 10.0, "timeout"),
    ("max_connections", "RATEKEEPER_MAX_CONNECTIONS", "", None, None, "count"),
    ("workers", "RATEKEEPER_WORKERS", "", 1, 1, "workers"),
    ("grpc_threads", "RATEKEEPER_GRPC_THREADS", "", 0, 0, "count0"),
    ("log_level", "RATEKEEPER_LOG_LEVEL", "LOG_LEVEL", "WARNING", "WARNING", "level"),
    ("log_format", "RATEKEEPER_LOG_FORMAT", "LOG_FORMAT", "text", "text", "format"),
    ("statsd", "RATEKEEPER_STATSD", "", "", "localhost:8125", "address"),
    (
        "statsd_flush_interval",
        "RATEKEEPER_STATSD_FLUSH_INTERVAL",
        "STATS_FLUSH_INTERVAL",
        10.0,
        10.0,
        "duration",
    ),
]


def upstream_mode(env: Mapping[str, str]) -> bool:
    """True when ``env`` holds a variable only envoyproxy/ratelimit's deployments set."""
    return any(name in env for name in UPSTREAM_MARKERS)


def serve_settings(given: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Setting]:
    """``serve``'s settings: ``given`` holds the flags given (a setting absent or None was not
    given). Raises ``EnvironmentProblem`` naming every variable that cannot be used."""
    upstream = upstream_mode(env)
    problems = refused(env) if upstream else []
    out: dict[str, Setting] = {}
    for name, ours, theirs, default, their_default, kind in _SERVE:
        flag = given.get(name)
        if flag is not None and flag is not False and flag != []:
            out[name] = Setting(name, flag, "--" + name.replace("_", "-"))
            continue
        variable = ours if ours in env else theirs if upstream and theirs in env else ""
        if variable:
            try:
                out[name] = Setting(name, _parse(kind, env[variable]), variable)
            except ValueError as exc:
                problems.append(f"{variable}={env[variable]!r}: {exc}")
            continue
        if upstream and their_default != default:
            out[name] = Setting(name, their_default, "envoyproxy/ratelimit's default")
        else:
            out[name] = Setting(name, default, "default")
    if upstream:
        _upstream_serve(env, given, out, problems)
    if problems:
        raise EnvironmentProblem("\n".join(f"environment: {p}" for p in problems))
    return out


def _upstream_serve(
    env: Mapping[str, str], given: Mapping[str, Any], out: dict[str, Setting], problems: list[str]
) -> None:
    """The settings upstream spreads over several variables: the runtime directory, the
    gRPC address, statsd's switches, dot files."""
    if not given.get("config") and "RATEKEEPER_CONFIG" not in env:
        parts = [
            env.get("RUNTIME_ROOT", "/srv/runtime_data/current"),
            env.get("RUNTIME_SUBDIRECTORY", ""),
            env.get("RUNTIME_APPDIRECTORY", "config"),
        ]
        named = [v for v in ("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
                 if v in env]  # fmt: skip
        source = " + ".join(named) if named else "envoyproxy/ratelimit's default"
        out["config"] = Setting("config", [os.path.join(*[p for p in parts if p])], source)
    dotfiles_given = given.get("config_dotfiles") or "RATEKEEPER_CONFIG_DOTFILES" in env
    if not dotfiles_given and "RUNTIME_IGNOREDOTFILES" in env:
        try:
            ignore = _parse("bool", env["RUNTIME_IGNOREDOTFILES"])
        except ValueError as exc:
            problems.append(f"RUNTIME_IGNOREDOTFILES: {exc}")
        else:
            out["config_dotfiles"] = Setting(
                "config_dotfiles", not ignore, "RUNTIME_IGNOREDOTFILES"
            )
    grpc_host = env.get("GRPC_HOST")
    if grpc_host is not None and grpc_host != out["host"].value:
        problems.append(
            f"GRPC_HOST={grpc_host!r} differs from the HTTP address {out['host'].value!r} "
            f"({out['host'].source}); ratekeeper listens for both on one address"
        )
    if not given.get("statsd") and "RATEKEEPER_STATSD" not in env:
        try:
            use = _parse("bool", env.get("USE_STATSD", "true"))
            disabled = _parse("bool", env.get("DISABLE_STATS", "false"))
            port = _parse("port", env.get("STATSD_PORT", "8125"))
        except ValueError as exc:
            problems.append(f"USE_STATSD, DISABLE_STATS or STATSD_PORT: {exc}")
        else:
            named = [v for v in ("USE_STATSD", "STATSD_HOST", "STATSD_PORT", "DISABLE_STATS")
                     if v in env]  # fmt: skip
            source = " + ".join(named) or "envoyproxy/ratelimit's default"
            address = f"{env.get('STATSD_HOST', 'localhost')}:{port}"
            out["statsd"] = Setting("statsd", address if use and not disabled else "", source)


def refused(env: Mapping[str, str]) -> list[str]:
    """Upstream variables set to ask for what ratekeeper does not support."""
    out = []
    for name, (asks, why) in UNSUPPORTED.items():
        value = env.get(name, "")
        try:
            if value and asks(value):
                out.append(f"{name}={value!r}: {why}")
        except ValueError as exc:
            out.append(f"{name}={value!r}: {exc}")
    return out


def ignored(env: Mapping[str, str]) -> list[Setting]:
    """Upstream variables set here that change nothing in ratekeeper, with the reason."""
    if not upstream_mode(env):
        return []
    return [Setting(name, env[name], why) for name, why in NO_EFFECT.items() if name in env]


# --- the config's sections ----------------------------------------------------------------


def config_overlay(env: Mapping[str, str]) -> tuple[dict[str, dict[str, Any]], list[Setting]]:
    """The config sections the environment sets (``{"store": {...}, "envoy": {...},
    "limits": {...}}``, keys as in a settings file), laid over the settings file's by the
    loader; and each value's source. ``RATEKEEPER_STORE`` (a store URL) beats upstream's
    ``REDIS_*``. Raises ``EnvironmentProblem`` naming the variables at fault."""
    sections: dict[str, dict[str, Any]] = {}
    sources: list[Setting] = []
    problems: list[str] = []
    upstream = upstream_mode(env)

    def put(section: str, key: str, value: Any, source: str) -> None:
        sections.setdefault(section, {})[key] = value
        sources.append(Setting(f"{section}.{key}", value, source))

    def read(kind: str, variable: str) -> Any:
        try:
            return _parse(kind, env[variable])
        except ValueError as exc:
            problems.append(f"{variable}={env[variable]!r}: {exc}")
            return None

    if "RATEKEEPER_STORE" in env:
        put("store", "url", env["RATEKEEPER_STORE"], "RATEKEEPER_STORE")
    elif upstream:
        try:
            key, value, source = upstream_store(env)
            put("store", key, value, source)
        except ValueError as exc:
            problems.append(str(exc))
    if "RATEKEEPER_STORE_PREFIX" in env:
        put("store", "prefix", env["RATEKEEPER_STORE_PREFIX"], "RATEKEEPER_STORE_PREFIX")
    elif upstream and env.get("CACHE_KEY_PREFIX"):
        put("store", "prefix", env["CACHE_KEY_PREFIX"], "CACHE_KEY_PREFIX")
    if upstream:
        batch: dict[str, Any] = {}
        if "REDIS_PIPELINE_LIMIT" in env and (limit := read("count0", "REDIS_PIPELINE_LIMIT")):
            batch["max_size"] = limit
        if "REDIS_PIPELINE_WINDOW" in env:
            window = read("duration", "REDIS_PIPELINE_WINDOW")
            if window:
                batch["max_wait_ms"] = window * 1000
        if batch:
            put("store", "batch", batch, "REDIS_PIPELINE_LIMIT / REDIS_PIPELINE_WINDOW")
        if "LOCAL_CACHE_SIZE_IN_BYTES" in env:
            size = read("count0", "LOCAL_CACHE_SIZE_IN_BYTES")
            if size is not None:
                put("limits", "local_cache", size > 0, "LOCAL_CACHE_SIZE_IN_BYTES")
        _upstream_envoy(env, put, read)
    if problems:
        raise EnvironmentProblem("\n".join(f"environment: {p}" for p in problems))
    return sections, sources


def _upstream_envoy(
    env: Mapping[str, str],
    put: Callable[[str, str, Any, str], None],
    read: Callable[[str, str], Any],
) -> None:
    flags = {
        "SHADOW_MODE": "shadow_mode",
        "QUOTA_MODE": "quota_mode",
        "MERGE_DOMAIN_CONFIG": "merge_domains",
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "stop_increment_when_over_limit",
        "RESPONSE_DYNAMIC_METADATA": "response_dynamic_metadata",
    }
    for variable, key in flags.items():
        if variable in env and (value := read("bool", variable)) is not None:
            put("envoy", key, value, variable)
    if "NEAR_LIMIT_RATIO" in env and (ratio := read("ratio", "NEAR_LIMIT_RATIO")) is not None:
        put("envoy", "near_limit_ratio", ratio, "NEAR_LIMIT_RATIO")
    if "LIMIT_RESPONSE_HEADERS_ENABLED" in env:
        enabled = read("bool", "LIMIT_RESPONSE_HEADERS_ENABLED")
        if enabled is not None:
            mode = "upstream" if enabled else "none"
            put("envoy", "response_headers", mode, "LIMIT_RESPONSE_HEADERS_ENABLED")
    names = {}
    for variable, key in (("LIMIT_LIMIT_HEADER", "limit"), ("LIMIT_REMAINING_HEADER",
                          "remaining"), ("LIMIT_RESET_HEADER", "reset")):  # fmt: skip
        if env.get(variable):
            names[key] = env[variable]
    if names:
        put("envoy", "header_names", names, "LIMIT_*_HEADER")


def upstream_store(env: Mapping[str, str]) -> tuple[str, Any, str]:
    """The ``store:`` key and value upstream's ``REDIS_*`` variables describe: ``url`` (one
    Redis), ``sentinel`` or ``cluster``. ``ValueError`` names the variable at fault."""
    socket_type = env.get("REDIS_SOCKET_TYPE", "unix").lower()
    kind = env.get("REDIS_TYPE", "single").lower()
    url = env.get("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
    used = [v for v in ("REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_AUTH",
                        "REDIS_TLS") if v in env]  # fmt: skip
    source = " + ".join(used) or "envoyproxy/ratelimit's default"
    if socket_type not in ("tcp", "unix"):
        raise ValueError(f"REDIS_SOCKET_TYPE={socket_type!r}: expected tcp or unix")
    if kind not in ("single", "sentinel", "cluster"):
        raise ValueError(f"REDIS_TYPE={kind!r}: expected single, sentinel or cluster")
    try:
        tls = _parse("bool", env.get("REDIS_TLS", "false"))
        skip_host = _parse("bool", env.get("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false"))
    except ValueError as exc:
        raise ValueError(f"REDIS_TLS or REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: {exc}") from None
    auth = env.get("REDIS_AUTH", "")
    user, _, password = auth.rpartition(":") if ":" in auth else ("", "", auth)
    credentials = f"{quote(user, safe='')}:{quote(password, safe='')}@" if auth else ""
    query = {}
    if tls:
        for variable, param in (("REDIS_TLS_CACERT", "ssl_ca_certs"),
                                ("REDIS_TLS_CLIENT_CERT", "ssl_certfile"),
                                ("REDIS_TLS_CLIENT_KEY", "ssl_keyfile")):  # fmt: skip
            if env.get(variable):
                query[param] = env[variable]
        if skip_host:
            query["ssl_check_hostname"] = "false"
    tail = "/0" + (f"?{urlencode(query)}" if query else "")
    scheme = "rediss" if tls else "redis"
    addresses = [a.strip() for a in url.split(",") if a.strip()]
    if not addresses:
        raise ValueError("REDIS_URL is empty")
    for address in addresses if kind != "sentinel" else addresses[1:]:
        if socket_type == "tcp" and not re.fullmatch(r"\[?[\w.:-]+\]?:\d{1,5}", address):
            raise ValueError(f"REDIS_URL={url!r}: {address!r} is not host:port")
    if kind == "sentinel":
        if len(addresses) < 2:
            raise ValueError(
                f"REDIS_URL={url!r}: with REDIS_TYPE=sentinel, expected "
                "'<primary name>,<sentinel host:port>,...'"
            )
        sentinels = [f"{scheme}://{a}" for a in addresses[1:]]
        body = {
            "service": addresses[0],
            "sentinels": sentinels,
            "url": f"{scheme}://{credentials}{tail}",
        }
        return "sentinel", body, source
    if kind == "cluster":  # any node: the client finds the rest
        return "cluster", f"{scheme}://{credentials}{addresses[0]}{tail}", source
    if len(addresses) > 1:
        raise ValueError(f"REDIS_URL={url!r}: one address expected with REDIS_TYPE=single")
    if socket_type == "unix":
        password_query = {"password": password} if auth else {}
        if user:
            password_query["username"] = user
        params = urlencode({"db": "0", **password_query})
        return "url", f"unix://{addresses[0]}?{params}", source
    return "url", f"{scheme}://{credentials}{addresses[0]}{tail}", source


# --- values -------------------------------------------------------------------------------


def _truth(text: str) -> bool:
    """Go's strconv.ParseBool, as upstream reads its booleans."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError("expected true or false")


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    """Seconds of a Go duration (``10s``, ``150us``, ``1m30s``) or a plain number of seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ValueError("expected a duration such as 10s, 500ms or 1m30s")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _parse(kind: str, text: str) -> Any:
    """``text`` as a value of ``kind``; ``ValueError`` saying what was expected."""
    if kind == "text":
        if not text:
            raise ValueError("expected a value")
        return text
    if kind == "bool":
        return _truth(text)
    if kind in ("port", "count", "count0", "workers"):
        if kind == "workers" and text == "auto":
            return os.cpu_count() or 1
        if not text.isdigit():
            raise ValueError("expected a whole number")
        value = int(text)
        high = 65535 if kind == "port" else 1_000_000
        low = 1 if kind in ("count", "workers") else 0
        if not low <= value <= high:
            raise ValueError(f"expected {low} to {high}")
        return value
    if kind in ("seconds", "duration"):
        seconds = _duration(text)
        if not 0 <= seconds <= 3600:
            raise ValueError("expected 0 to 3600 seconds")
        return seconds
    if kind == "timeout":
        seconds = _duration(text)
        if not 0 < seconds <= 3600:
            raise ValueError("expected more than 0 and at most 3600 seconds")
        return seconds
    if kind == "list":
        return [item.strip() for item in text.split(",") if item.strip()]
    if kind == "ratio":
        ratio = float(text)
        if not 0 <= ratio <= 1:
            raise ValueError("expected a number from 0 to 1")
        return ratio
    if kind == "paths":
        return [p for p in text.split(os.pathsep) if p]
    if kind == "level":
        if text.lower() not in LOG_LEVELS:
            raise ValueError("expected debug, info, warn, error or fatal")
        return LOG_LEVELS[text.lower()]
    if kind == "format":
        if text.lower() not in ("text", "json"):
            raise ValueError("expected text or json")
        return text.lower()
    if kind == "address":
        if text and not re.fullmatch(r"[\w.-]+:\d{1,5}", text):
            raise ValueError("expected host:port")
        return text
    raise AssertionError(kind)


# --- laying the environment's sections over the config files' ------------------------------

_WHERE = ("url", "shards", "cluster", "sentinel")


def lay_over(docs: list[tuple[int, str, Any]], sections: Mapping[str, Mapping[str, Any]]) -> Any:
    """Lay ``sections`` (``config_overlay``'s) over the settings file among ``docs`` (index,
    path, parsed ``Map``): a key the environment sets replaces the file's, a store address
    replaces the file's address of any kind. Returns a new settings document when no file has
    one (the caller adds it as ``<environment>``), else None."""
    from ...yaml_lines import Map

    if not sections:
        return None
    target = next(
        (doc for _, _, doc in docs if isinstance(doc, Map) and "domain" not in doc
         and any(k in doc for k in ("store", "auth", "limits", "envoy"))),
        None,
    )  # fmt: skip
    created = target is None
    if target is None:
        target = Map()
        target.line, target.lines = 1, {}
    for name, values in sections.items():
        line = target.lines.get(name, target.line)
        existing = target.get(name)
        if name == "store" and isinstance(existing, str):
            existing = {"url": existing}
        merged = _as_map(existing if isinstance(existing, dict) else {}, line)
        if name == "store" and any(k in values for k in _WHERE):
            for key in _WHERE:
                merged.pop(key, None)
        for key, value in values.items():
            merged[key] = _as_map(value, line) if isinstance(value, dict) else value
            merged.lines[key] = line
        target[name] = merged
        target.lines[name] = line
    return target if created else None


def _as_map(value: Mapping[str, Any], line: int) -> Any:
    from ...yaml_lines import Map

    out = Map(value)
    out.line = getattr(value, "line", line)
    out.lines = dict(getattr(value, "lines", {})) or dict.fromkeys(value, line)
    return out
