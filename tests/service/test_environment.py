"""Settings from the environment: flags > RATEKEEPER_… > envoyproxy/ratelimit's variables >
defaults; upstream's variables (and defaults) only in upstream mode; whatever cannot be used
is refused with the variable named, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratekeeper.errors import ConfigError
from ratekeeper.service.config import environment as envmod
from ratekeeper.service.config import load
from ratekeeper.service.config.environment import (
    EnvironmentProblem,
    config_overlay,
    serve_settings,
    upstream_store,
)


def values(given: dict[str, object], env: dict[str, str]) -> dict[str, object]:
    return {name: s.value for name, s in serve_settings(given, env).items()}


def test_without_upstream_markers_generic_names_are_not_read() -> None:
    got = values({}, {"HOST": "build-box-7", "PORT": "9999", "LOG_LEVEL": "debug"})
    assert (got["host"], got["port"], got["log_level"]) == ("127.0.0.1", 8080, "WARNING")
    assert got["statsd"] == "" and got["config"] == []


def test_precedence_flag_then_ours_then_upstreams_then_default() -> None:
    env = {
        "REDIS_URL": "r:6379",
        "PORT": "7000",
        "RATEKEEPER_GRPC_PORT": "7001",
        "GRPC_PORT": "7002",
    }
    settings = serve_settings({"host": "127.0.0.2"}, env)
    assert settings["host"].value == "127.0.0.2" and settings["host"].source == "--host"
    assert (settings["port"].value, settings["port"].source) == (7000, "PORT")
    assert (settings["grpc_port"].value, settings["grpc_port"].source) == (
        7001,
        "RATEKEEPER_GRPC_PORT",
    )
    assert settings["store_wait"].source == "default"
    flagged = serve_settings({"port": 0, "grpc_port": 0}, env)
    assert (flagged["port"].value, flagged["grpc_port"].value) == (0, 0)


def test_upstream_mode_takes_upstreams_defaults() -> None:
    got = values({}, {"USE_STATSD": "true"})
    assert got["host"] == "0.0.0.0"
    assert got["config"] == ["/srv/runtime_data/current/config"]
    assert got["config_dotfiles"] is True  # RUNTIME_IGNOREDOTFILES defaults to false upstream
    assert got["statsd"] == "localhost:8125" and got["statsd_flush_interval"] == 10.0


def test_a_statsd_flag_beats_upstreams_statsd_variables() -> None:
    env = {"USE_STATSD": "true", "STATSD_HOST": "stats", "STATSD_PORT": "9125"}
    assert values({}, env)["statsd"] == "stats:9125"
    settings = serve_settings({"statsd": "127.0.0.1:8125"}, env)
    assert (settings["statsd"].value, settings["statsd"].source) == ("127.0.0.1:8125", "--statsd")


def test_the_runtime_directory_and_its_switches() -> None:
    env = {"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit",
           "RUNTIME_IGNOREDOTFILES": "true", "USE_STATSD": "false",
           "STATS_FLUSH_INTERVAL": "1m30s", "LOG_LEVEL": "WARN", "LOG_FORMAT": "json"}  # fmt: skip
    got = values({}, env)
    assert got["config"] == ["/data/ratelimit/config"] and got["config_dotfiles"] is False
    assert got["statsd"] == "" and got["statsd_flush_interval"] == 90.0
    assert (got["log_level"], got["log_format"]) == ("WARNING", "json")
    assert values({"config": ["mine.yaml"]}, env)["config"] == ["mine.yaml"]


def test_every_bad_or_unsupported_variable_is_named_at_once() -> None:
    env = {"REDIS_URL": "r:1", "PORT": "http", "CONFIG_TYPE": "GRPC_XDS_SOTW",
           "USE_DOG_STATSD": "true", "GRPC_UDS": "/tmp/s", "GRPC_HOST": "10.0.0.9",
           "USE_STATSD": "maybe"}  # fmt: skip
    with pytest.raises(EnvironmentProblem) as caught:
        serve_settings({}, env)
    text = str(caught.value)
    for name in (
        "PORT='http'",
        "CONFIG_TYPE",
        "USE_DOG_STATSD",
        "GRPC_UDS",
        "GRPC_HOST",
        "USE_STATSD",
    ):
        assert name in text, text
    assert isinstance(caught.value, ConfigError)


def test_default_values_of_unsupported_variables_are_accepted() -> None:
    env = {"REDIS_URL": "r:1", "CONFIG_TYPE": "FILE", "BACKEND_TYPE": "redis",
           "USE_DOG_STATSD": "false", "TRACING_ENABLED": "false"}  # fmt: skip
    assert values({}, env)["host"] == "0.0.0.0"


@pytest.mark.parametrize(
    ("env", "key", "value"),
    [
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379"}, "url", "redis://redis:6379/0"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "h:1", "REDIS_AUTH": "p@ss"},
         "url", "redis://:p%40ss@h:1/0"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "h:1", "REDIS_AUTH": "app:pw"},
         "url", "redis://app:pw@h:1/0"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "h:1", "REDIS_TLS": "true",
          "REDIS_TLS_CACERT": "/ca.pem"}, "url", "rediss://h:1/0?ssl_ca_certs=%2Fca.pem"),
        ({"REDIS_URL": "/run/redis.sock"}, "url", "unix:///run/redis.sock?db=0"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7000"},
         "cluster", "redis://a:7000/0"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_AUTH": "pw",
          "REDIS_URL": "mymaster,s1:26379,s2:26379"}, "sentinel",
         {"service": "mymaster", "sentinels": ["redis://s1:26379", "redis://s2:26379"],
          "url": "redis://:pw@/0"}),
    ],
)  # fmt: skip
def test_the_store_from_upstreams_redis_variables(env: dict[str, str], key: str, value: object):
    assert upstream_store(env)[:2] == (key, value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "no-port"}, "is not host:port"),
        ({"REDIS_SOCKET_TYPE": "udp"}, "expected tcp or unix"),
        ({"REDIS_TYPE": "memcache"}, "expected single, sentinel or cluster"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "m"}, "sentinel"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "a:1,b:2"}, "one address expected"),
    ],
)
def test_unusable_redis_variables_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        upstream_store(env)


def test_the_environment_is_laid_over_the_settings_file(tmp_path: Path) -> None:
    (tmp_path / "settings.yaml").write_text(
        "store: {url: 'redis://file:6379/0', prefix: filep}\n"
        "envoy: {near_limit_ratio: 0.5, response_headers: ratekeeper}\n"
    )
    (tmp_path / "edge.yaml").write_text("domain: edge\ndescriptors: [{key: user}]\n")
    env = {"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "env:6380", "SHADOW_MODE": "true",
           "NEAR_LIMIT_RATIO": "0.9", "LOCAL_CACHE_SIZE_IN_BYTES": "0"}  # fmt: skip
    config = load([str(tmp_path)], env=env)
    assert config.store.url == "redis://env:6380/0" and config.store.prefix == "filep"
    assert config.envoy.near_limit_ratio == 0.9 and config.envoy.shadow_mode
    assert config.envoy.response_headers == "ratekeeper"  # the file's, not set by the env
    assert config.local_cache is False
    assert "<environment>" not in config.files


def test_without_a_settings_file_the_environment_is_one() -> None:
    env = {"RATEKEEPER_STORE": "redis://10.1.2.3:6379/2", "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
           "LIMIT_RESET_HEADER": "X-Reset", "RUNTIME_ROOT": "/x"}  # fmt: skip
    sections, sources = config_overlay(env)
    assert sections["store"] == {"url": "redis://10.1.2.3:6379/2"}
    assert {s.name: s.source for s in sources}["store.url"] == "RATEKEEPER_STORE"
    config = load([], env=env)
    assert config.store.kind == "redis" and config.envoy.response_headers == "upstream"
    assert config.envoy.header_names.reset == "X-Reset"


def test_an_invalid_value_from_the_environment_fails_the_load() -> None:
    with pytest.raises(ConfigError, match="NEAR_LIMIT_RATIO='2'"):
        load([], env={"REDIS_URL": "r:1", "REDIS_SOCKET_TYPE": "tcp", "NEAR_LIMIT_RATIO": "2"})


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10), ("150us", 0.00015), ("1m30s", 90),
                                               ("2", 2), ("0.5s", 0.5)])  # fmt: skip
def test_go_durations(text: str, seconds: float) -> None:
    assert envmod._duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["ten", "10 s", "1d", "", "s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        envmod._duration(text)
