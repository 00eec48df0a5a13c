"""The ``serve`` subcommand: registered on argparse subparsers, light to import, strict ports."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from ratekeeper.service.cli import add_serve_command
from ratekeeper.service.config.environment import serve_settings
from tests.test_cli import ratekeeper


def parse(*argv: str) -> argparse.Namespace:
    """The arguments as ``serve`` runs with them: flags, then (an empty) environment."""
    parser = argparse.ArgumentParser(prog="ratekeeper")
    add_serve_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *argv])
    for name, setting in serve_settings(vars(args), {}).items():
        setattr(args, name, setting.value)
    return args


def test_defaults_and_options() -> None:
    args = parse()
    assert (args.config, args.host, args.port, args.grpc_port, args.no_grpc) == (
        [], "127.0.0.1", 8080, 8081, False,
    )  # fmt: skip
    args = parse("--config", "a.yaml", "--config", "b.yaml", "--port", "0", "--no-grpc")
    assert args.config == ["a.yaml", "b.yaml"] and args.port == 0 and args.no_grpc


def test_grpc_threads() -> None:
    assert parse().grpc_threads == 0  # grpc.aio, whatever the store
    assert parse("--grpc-threads", "0").grpc_threads == 0
    assert parse("--grpc-threads", "8").grpc_threads == 8


@pytest.mark.parametrize("threads", ["-1", "257", "two"])
def test_bad_grpc_threads_are_refused(threads: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--grpc-threads", threads)
    assert f"threads {threads!r} is invalid; expected 0 to 256" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_bad_port_is_refused(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--port", port)
    assert f"port {port!r} is invalid; expected 0 to 65535" in capsys.readouterr().err


def test_the_cli_imports_no_server_dependency() -> None:
    code = (
        "import sys, ratekeeper.cli; "
        "print([m for m in ('grpc', 'yaml', 'uvicorn', 'prometheus_client', "
        "'google.protobuf') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_serve_option_says_its_default() -> None:
    parser = argparse.ArgumentParser(prog="ratekeeper")
    serve = add_serve_command(parser.add_subparsers(dest="command", required=True))
    options = [a for a in serve._actions if a.option_strings and a.help != argparse.SUPPRESS]
    assert len(options) >= 10
    for action in options:
        if action.dest != "help":
            assert action.help and "default" in action.help, action.option_strings


def test_serve_help_shows_defaults_and_token_variables() -> None:
    out = ratekeeper("serve", "--help")
    assert out.returncode == 0, out
    text = " ".join(out.stdout.split())  # argparse wraps to the terminal's width
    for part in (
        "(default: 127.0.0.1)",
        "(default: 8080)",
        "(default: 8081)",
        "(default: 5)",
        "(default: 10)",
        "RATEKEEPER_TOKEN client bearer token",
        "RATEKEEPER_ADMIN_TOKEN admin bearer token",
        "auth.token_env",
        "exit status",
        "ratekeeper check-config",
    ):
        assert part in text, part


def test_help_and_the_manual_agree_on_timeouts_signals_and_exit_status() -> None:
    """``serve --help``, docs/service.md, docs/operations.md and docs/reference.md give the
    same timeouts (with the parser's defaults), signals and exit status."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    service, operations, reference = (
        " ".join((docs / name).read_text().split())
        for name in ("service.md", "operations.md", "reference.md")
    )
    parser = argparse.ArgumentParser(prog="ratekeeper")
    serve = add_serve_command(parser.add_subparsers(dest="command", required=True))
    help_text = " ".join(serve.format_help().split())
    # the defaults serve runs with: the flags' (None: not given) completed by the environment
    resolved = serve_settings({}, {})
    defaults = {
        a.option_strings[0]: resolved[a.dest].value if a.dest in resolved else a.default
        for a in serve._actions
        if a.option_strings
    }
    for flag in ("--idle-timeout", "--header-timeout", "--body-timeout", "--send-timeout"):
        seconds = f"{defaults[flag]:g}"
        assert f"`{flag}`, {seconds} s" in service, flag
        assert f"| `{flag}` | {seconds} s |" in operations, flag
        assert f"| `{flag} SECONDS` | `{seconds}` |" in reference, flag
        action = next(a for a in serve._actions if flag in a.option_strings)
        assert f"(default: {seconds})" in " ".join(str(action.help).split()), flag
    for text in (help_text, service, operations, reference):
        assert (
            "SIGTERM" in text and "SIGINT" in text and "exit 0" in text.replace("exits 0", "exit 0")
        )
    assert (
        "SIGHUP reload the config" in help_text and "ignored until the service serves" in help_text
    )
    assert "| SIGHUP | reload the config. Ignored until the service serves" in service
    for text in (help_text, service, reference):  # exit status 2 and its causes
        assert "2 for an invalid config, a port in use" in text.replace("(--workers) ", "")
    assert "| 2 | an invalid config, a port in use" in operations
