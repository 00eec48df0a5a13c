"""The ``serve`` subcommand: registered on argparse subparsers, light to import, strict ports."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from ratekeeper.service.cli import add_serve_command


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ratekeeper")
    add_serve_command(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def test_defaults_and_options() -> None:
    args = parse()
    assert (args.config, args.host, args.port, args.grpc_port, args.no_grpc) == (
        [], "127.0.0.1", 8080, 8081, False,
    )  # fmt: skip
    args = parse("--config", "a.yaml", "--config", "b.yaml", "--port", "0", "--no-grpc")
    assert args.config == ["a.yaml", "b.yaml"] and args.port == 0 and args.no_grpc


def test_grpc_threads() -> None:
    assert parse().grpc_threads is None  # the server chooses by store
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
