"""``ratekeeper check-config`` and the config reader behind it: every problem of a config is
reported at once, each as ``file:line: problem``, for our format, Envoy's, and directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratekeeper.errors import ConfigError
from ratekeeper.service.config import loader as config
from ratekeeper.service.config.loader import EXAMPLE
from tests.test_cli import ratekeeper

OURS = """\
store:
  url: redis://127.0.0.1:6379/0
  socket_timeout: 0
  colour: blue
limits:
  max_key_length: 0
policies:
  api.core:
    rate: 100/fortnight
    shadow: maybe
    flavour: mint
  api.ok:
    rate: 10/minute
  uploads:
    kind: concurrency
    capacity: 0
"""

EDGE = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: parsec, requests_per_unit: 10}
  - key: tenant
    policy: api.core
  - key: user
    policy: nowhere
  - key: path
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: -2}
      - key: other
        colour: red
"""

# (file, line, part of the message): every problem of OURS and EDGE, and nothing else
EXPECTED = [
    ("edge.yaml", 4, "invalid rate limit unit 'parsec'"),
    ("edge.yaml", 8, "policy 'nowhere' is not defined"),
    ("edge.yaml", 12, "requests_per_unit -2"),
    ("edge.yaml", 14, "unknown key 'colour'"),
    ("ours.yaml", 3, "socket_timeout 0"),
    ("ours.yaml", 4, "unknown key 'colour' in store"),
    ("ours.yaml", 6, "limits.max_key_length 0"),
    ("ours.yaml", 9, "rate unit 'fortnight'"),
    ("ours.yaml", 10, "shadow 'maybe'"),
    ("ours.yaml", 11, "unknown key 'flavour'"),
    ("ours.yaml", 16, "capacity 0"),
]


@pytest.fixture
def bad_dir(tmp_path: Path) -> Path:
    d = tmp_path / "conf"
    d.mkdir()
    (d / "ours.yaml").write_text(OURS)
    (d / "edge.yaml").write_text(EDGE)
    return d


def _problems(text: str, d: Path) -> list[str]:
    lines = text.splitlines()
    assert all(line.startswith(f"{d}/") for line in lines), lines
    return [line[len(f"{d}/") :] for line in lines]


def test_load_reports_every_problem_in_file_and_line_order(bad_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config.load([str(bad_dir)], env={})
    found = _problems(str(info.value), bad_dir)
    assert len(found) == len(EXPECTED), found
    for line, (name, number, part) in zip(found, EXPECTED, strict=True):
        assert line.startswith(f"{name}:{number}: ") and part in line, (line, part)


def test_a_refused_policy_named_by_a_descriptor_is_not_a_second_problem(bad_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config.load([str(bad_dir)], env={})
    assert "'api.core' is not defined" not in str(info.value)  # edge.yaml:6 names it


def test_one_problem_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "one.yaml"
    f.write_text("policies:\n  a:\n    rate: 1/s\n    shadow: yes please\n")
    with pytest.raises(ConfigError) as info:
        config.load([str(f)], env={})
    assert str(info.value) == f"{f}:4: shadow 'yes please' must be true or false"


def test_every_unknown_key_and_every_bad_value_is_named(tmp_path: Path) -> None:
    f = tmp_path / "keys.yaml"
    f.write_text(
        "envoy:\n  shadow_mod: true\n  quota_mod: true\n  near_limit_ratio: 2\n"
        "domains:\n  - domain: d\n    descriptors:\n      - key: a\n        value: 1.5\n"
        "      - key: b\n        value: 2.5\n"
    )
    with pytest.raises(ConfigError) as info:
        config.load([str(f)], env={})
    lines = str(info.value).splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [f"{f}:{n}" for n in (2, 3, 4, 9, 11)]
    assert "'shadow_mod'" in lines[0] and "'quota_mod'" in lines[1] and "1.5" in lines[3]


def test_missing_and_unreadable_paths_are_reported_with_the_rest(
    tmp_path: Path, bad_dir: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError) as info:
        config.load([str(tmp_path / "missing.yaml"), str(empty), str(bad_dir)], env={})
    lines = str(info.value).splitlines()
    assert "missing.yaml: cannot read config file" in lines[0]
    assert "the config directory holds no file" in lines[1]
    assert len(lines) == 2 + len(EXPECTED)


def test_check_config_prints_every_problem_and_exits_1(bad_dir: Path) -> None:
    out = ratekeeper("check-config", str(bad_dir))
    assert out.returncode == 1, out
    *problems, summary = out.stderr.splitlines()
    assert len(_problems("\n".join(problems), bad_dir)) == len(EXPECTED)
    assert summary == f"{len(EXPECTED)} problems; the config is invalid"
    assert out.stdout == ""


def test_check_config_accepts_the_example_and_envoy_files(tmp_path: Path) -> None:
    out = ratekeeper("check-config", str(EXAMPLE))
    assert (out.returncode, out.stderr) == (0, ""), out
    summary, heading, *settings = out.stdout.splitlines()
    assert summary == "ok: 1 file, 4 rate and 1 concurrency policies, 1 Envoy domain, store memory"
    assert heading.startswith("settings (a flag > RATEKEEPER_")
    assert f"  config = [{str(EXAMPLE)!r}]  [--config]" in settings
    assert "  port = 8080  [default]" in settings
    upstream = tmp_path / "config.yaml"  # envoyproxy/ratelimit's own format, as is
    upstream.write_text(
        "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n"
        "    rate_limit:\n      unit: second\n      requests_per_unit: 500\n"
        "      unlimited: false\n    quota_mode: false\n    detailed_metric: false\n"
        "  - key: database\n    value: default\n    unit: second\n"
    )
    out = ratekeeper("check-config", str(upstream), str(EXAMPLE))
    assert out.returncode == 0, out
    warning, summary = out.stdout.splitlines()[:2]
    assert warning.startswith(f"{upstream}:13: warning: key 'unit' has no effect")
    assert summary.startswith("ok: 2 files, 4 rate and 1 concurrency policies, 2 Envoy domains")


def test_check_config_usage_errors_exit_2() -> None:
    out = ratekeeper("check-config", "--no-such-flag")
    assert out.returncode == 2 and "--no-such-flag" in out.stderr


def test_check_config_without_a_path_checks_what_serve_would_read(tmp_path: Path) -> None:
    out = ratekeeper("check-config")  # the built-in example, as serve without --config
    assert out.returncode == 0, out
    assert out.stdout.startswith("ok: 1 file (the built-in example), 4 rate"), out
    assert f"  config = [{str(EXAMPLE)!r}]  [default: the built-in example]\n" in out.stdout
    assert "  log_level = 'warn'  [default]\n" in out.stdout  # as --log-level spells it
    runtime = tmp_path / "ratelimit" / "config"
    runtime.mkdir(parents=True)
    (runtime / "edge.yaml").write_text("domain: edge\ndescriptors: [{key: user}]\n")
    env = {
        "RUNTIME_ROOT": str(tmp_path),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": "10.0.0.1:6379",
        "REDIS_AUTH": "s3cret",
    }
    out = ratekeeper("check-config", env=env)
    assert out.returncode == 0, out
    assert "1 Envoy domain, store redis" in out.stdout
    assert "[RUNTIME_ROOT + RUNTIME_SUBDIRECTORY]" in out.stdout
    assert "store.url = 'redis://:***@10.0.0.1:6379/0'" in out.stdout
    assert "s3cret" not in out.stdout


def test_serve_refuses_an_invalid_config_with_every_problem(bad_dir: Path) -> None:
    out = ratekeeper("serve", "--config", str(bad_dir), "--port", "0", "--no-grpc")
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == len(EXPECTED), out.stderr


def test_a_bad_rate_and_a_bad_algorithm_of_one_policy_are_both_reported(tmp_path: Path) -> None:
    f = tmp_path / "two.yaml"
    f.write_text(
        "policies:\n  api:\n    rate: 100/minit\n    algorithm: sliding_windo\n"
        "  up:\n    rate: 5/fortnight\n    algorithm: sliding_window\n    burst: 3\n"
    )
    out = ratekeeper("check-config", str(f))
    assert out.returncode == 1, out
    lines = out.stderr.splitlines()
    assert [line.split(": ", 1)[0] for line in lines[:-1]] == [f"{f}:{n}" for n in (3, 4, 6, 8)]
    assert "rate unit 'minit'" in lines[0] and "algorithm 'sliding_windo' is unknown" in lines[1]
    assert "rate unit 'fortnight'" in lines[2]
    assert "option 'burst' does not apply to sliding_window" in lines[3]
    assert lines[-1] == "4 problems; the config is invalid"


@pytest.mark.parametrize("log_level", ["debug", "info", "warn", "error"])
def test_the_log_level_is_printed_as_the_flag_spells_it(log_level: str) -> None:
    out = ratekeeper("check-config", env={"RATEKEEPER_LOG_LEVEL": log_level})
    assert f"  log_level = {log_level!r}  [RATEKEEPER_LOG_LEVEL]\n" in out.stdout, out.stdout


def test_a_path_that_cannot_be_read_exits_2_as_from_every_command(
    tmp_path: Path, bad_dir: Path
) -> None:
    """docs/reference.md's convention: 1 is a finding (the config is invalid), 2 a command
    that could not do what was asked (here: read its input), the same from every command."""
    missing = str(tmp_path / "missing.yaml")
    out = ratekeeper("check-config", missing, str(bad_dir))
    assert out.returncode == 2, out
    lines = out.stderr.splitlines()
    assert lines[0] == f"{missing}: cannot read config file: no such file or directory"
    assert len(lines) == 2 + len(EXPECTED)  # the other problems are reported all the same
    assert lines[-1] == f"{1 + len(EXPECTED)} problems; a config path cannot be read"
    for command in (["simulate", missing, "--limit", "a=10/s"],
                    ["simulate", str(EXAMPLE), "--config", missing, "--key", "api.core=ip"],
                    ["serve", "--config", missing, "--port", "0", "--no-grpc"],
                    ["admin", "--config", missing, "status", "k"]):  # fmt: skip
        out = ratekeeper(*command)
        assert out.returncode == 2, (command, out)
        assert "missing.yaml" in out.stderr and "Traceback" not in out.stderr, (command, out)
