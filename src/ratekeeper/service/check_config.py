"""``ratekeeper check-config``: validate service config files without starting anything.

Reads the files as ``ratekeeper serve --config`` would (ratekeeper's format and
envoyproxy/ratelimit's, files and directories, merged) and prints every problem, one
``file:line: problem`` a line, then exits 1 (2 when a path cannot be read, as every command
does); a valid config prints a summary and its warnings and exits 0. It does not contact the
store. Importing this module imports nothing of the server extra.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from .cli import missing_extra

_WARNING = re.compile(r"^(.*?:\d+): (.*)$", re.DOTALL)


def add_check_config_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``check-config`` to ``parser.add_subparsers()``; it runs ``run_check_config``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check-config",
        help="check service config files and report every problem (no store is contacted)",
        description=(
            "Check service config files as `ratekeeper serve --config` reads them: "
            "ratekeeper's format and envoyproxy/ratelimit's, files and directories, merged. "
            "Every problem is printed as file:line: problem; the exit status is 1 if there "
            "is any (2 if a path cannot be read), else 0. The store is not contacted. Token "
            "environment variables (RATEKEEPER_TOKEN, RATEKEEPER_ADMIN_TOKEN, auth.token_env) "
            "are checked as serve checks them."
        ),
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="a config file or a directory of them; several are merged as repeated --config "
        "(default: what serve would read: RATEKEEPER_CONFIG, or upstream's runtime directory "
        "in upstream mode, else the built-in example)",
    )
    parser.add_argument(
        "--config-dotfiles",
        action="store_true",
        help="read dot files in config directories too (default: skipped, as serve does)",
    )
    parser.set_defaults(func=run_check_config)
    return parser


def run_check_config(args: argparse.Namespace) -> int:
    """Check the files; print problems to stderr (exit 1) or a summary to stdout (exit 0)."""
    try:
        from .config.loader import load
    except ImportError as exc:
        return missing_extra("check-config", exc)
    from .config import environment

    given = {"config": args.paths, "config_dotfiles": args.config_dotfiles or None}
    try:
        settings = environment.serve_settings(given, os.environ)
        _, overlay = environment.config_overlay(os.environ)
    except environment.EnvironmentProblem as exc:
        for line in str(exc).splitlines():
            print(line, file=sys.stderr)
        print("the environment is invalid", file=sys.stderr)
        return 1
    paths, dotfiles = settings["config"].value, settings["config_dotfiles"].value
    try:
        config = load(paths, dotfiles=dotfiles)
    except ConfigError as exc:
        problems = str(exc).splitlines()
        for line in problems:
            print(line, file=sys.stderr)
        count = len(problems)
        missing = _unreadable(paths, dotfiles)
        verdict = "a config path cannot be read" if missing else "the config is invalid"
        print(f"{count} problem{'s' if count != 1 else ''}; {verdict}", file=sys.stderr)
        return 2 if missing else 1
    for warning in config.warnings:
        match = _WARNING.match(warning)
        print(f"{match[1]}: warning: {match[2]}" if match else f"warning: {warning}")
    # an Envoy descriptor's limit is a policy named domain/..., which no policy of ours can be
    rates = sum(1 for name in config.policies if "/" not in name)
    example = " (the built-in example)" if not paths else ""
    print(
        f"ok: {len(config.files)} file{'s' if len(config.files) != 1 else ''}{example}, "
        f"{rates} rate and {len(config.concurrency)} concurrency policies, "
        f"{len(config.domains)} Envoy domain{'s' if len(config.domains) != 1 else ''}, "
        f"store {config.store.kind}"
    )
    print_settings([*settings.values(), *overlay], environment.ignored(os.environ))
    return 0


def _unreadable(paths: list[str], dotfiles: bool) -> bool:
    """True when a config path does not exist, holds no file or cannot be read: the input
    is missing (exit 2, as every command's), not invalid (exit 1)."""
    from .config.files import config_files

    try:
        files = config_files(paths, dotfiles)
    except ConfigError:
        return True
    for path in files:
        try:
            with open(path, "rb"):
                pass
        except OSError:
            return True
    return False


_LEVEL_NAMES = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error",
                "CRITICAL": "fatal"}  # fmt: skip
"""Python's level names as ``--log-level`` spells them."""


def print_settings(settings: list[Any], ignored: list[Any]) -> None:
    """The effective settings and where each came from (flag > RATEKEEPER_… > upstream's
    variable > default); secrets in store URLs redacted."""
    from ..stores.redis.urls import redact

    print("settings (a flag > RATEKEEPER_... > envoyproxy/ratelimit's variable > default):")
    for s in settings:
        value = s.value
        if s.name == "log_level":
            value = _LEVEL_NAMES.get(value, value)
        elif s.name == "config" and not value:
            from .config.loader import EXAMPLE

            value = [str(EXAMPLE)]
            s = replace(s, source=f"{s.source}: the built-in example")
        if isinstance(value, str) and "://" in value:
            value = redact(value)
        elif isinstance(value, dict):
            value = {k: redact(v) if isinstance(v, str) and "://" in v else v
                     for k, v in value.items()}  # fmt: skip
        print(f"  {s.name} = {value!r}  [{s.source}]")
    for s in ignored:
        print(f"  ({s.name}={s.value!r} has no effect: {s.source})")
