"""The ``ratekeeper`` command: argparse subcommands, each registered by the module that owns it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .service.cli import add_serve_command


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return the exit code."""
    parser = argparse.ArgumentParser(prog="ratekeeper", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_serve_command(subparsers)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
