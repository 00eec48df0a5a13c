"""Coverage-guided fuzzing (atheris) of ``Rate.parse`` and the config loader, for
``scripts/fuzz``: ``python -m tests.abuse.atheris_targets rate|config [libFuzzer flags]``.

Any exception other than our own error (``RateSpecError``; ``ConfigError`` starting with
"<file>:<line>: ") is a finding: atheris prints the input and exits non-zero.
"""

from __future__ import annotations

import re
import sys

import atheris

with atheris.instrument_imports():
    from ratekeeper.errors import ConfigError, RateSpecError
    from ratekeeper.rates import MAX_COUNT, MAX_PERIOD_MS, Rate
    from ratekeeper.service.config.loader import parse_text

LINE_PREFIX = re.compile(r"^<config>:\d+: \S")


def rate(data: bytes) -> None:
    text = data[:200].decode("utf-8", "replace")
    try:
        rates = Rate.parse(text)
    except RateSpecError:
        return
    for r in rates:
        if not (1 <= r.count <= MAX_COUNT and 1 <= r.period_ms <= MAX_PERIOD_MS):
            raise AssertionError(f"{text!r} parsed to {r!r}, out of range")
        if Rate.parse(str(r)) != (r,):
            raise AssertionError(f"{r!r} does not read back from {str(r)!r}")


def config(data: bytes) -> None:
    text = data[:4000].decode("utf-8", "replace")
    try:
        parse_text(text)
    except ConfigError as exc:
        if not LINE_PREFIX.match(str(exc)):
            raise AssertionError(f"error without file:line: {exc}") from None


SEEDS = {
    "rate": ["100/minute", "2/second; 100/minute", "5 per 30s", "1/1d,10/h"],
    "config": [
        "policies:\n  p:\n    rate: 5/minute\n    algorithm: token_bucket\n    burst: 3\n",
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n"
        "    rate_limit: {unit: hour, requests_per_unit: 2}\n",
        "store:\n  url: redis://127.0.0.1:1\n  batch: {max_size: 8}\nauth:\n"
        "  token: abcdefghijklmnopqrstuvwxyz\npolicies:\n  p: {rate: 1/s}\n",
    ],
}


def main() -> None:
    """``rate|config [corpus dir] [libFuzzer flags]``: the seeds are written to a new corpus."""
    target, rest = sys.argv[1], sys.argv[2:]
    fn = {"rate": rate, "config": config}[target]
    for i, seed in enumerate(SEEDS[target]):  # the seeds must pass before fuzzing starts
        fn(seed.encode())
        if rest and not rest[0].startswith("-"):
            with open(f"{rest[0]}/seed-{i}", "wb") as f:
                f.write(seed.encode())
    atheris.Setup([sys.argv[0], *rest], fn)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
