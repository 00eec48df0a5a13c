"""The ``ratekeeper`` command: argparse subcommands, each registered by the module that owns it.

A subcommand is one ``add_<name>_command(subparsers)`` call below: the owning module adds its
parser and ``set_defaults(func=...)``, a function taking the parsed arguments and returning the
exit code. Keep this module to that wiring; importing it must stay cheap (no optional
dependency is imported until a command runs).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ._version import __version__
from .demo import add_demo_command
from .service.admin_cli import add_admin_command
from .service.check_config import add_check_config_command
from .service.cli import add_serve_command
from .service.healthcheck import add_healthcheck_command
from .simulate.cli import add_simulate_command


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="ratekeeper",
        description="Distributed rate limiting and load shedding for APIs.",
    )
    parser.add_argument("--version", action="version", version=f"ratekeeper {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_command(subparsers)
    add_check_config_command(subparsers)
    add_admin_command(subparsers)
    add_demo_command(subparsers)
    add_simulate_command(subparsers)
    add_healthcheck_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return the exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
