"""``python -m tests.reliability [--quick] [--soak-seconds N] [--no-write]``: run every fault,
load and exactness scenario, print the table and write it into docs/reliability.md.

The full run takes about 15 minutes (10 of them the soak); ``--quick`` runs the pytest-sized
versions in about two minutes. Figures come from a shared, loaded machine: read them as orders
of magnitude, and the pass/fail column as the claim.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.reliability import exactness, faults, service
from tests.reliability.report import Row, table, write_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def scenarios(quick: bool, soak_seconds: float) -> list[tuple[str, Callable[[], list[Row]]]]:
    return [
        ("SIGKILL", lambda: faults.outage("kill", quick)),
        ("SIGSTOP", lambda: faults.outage("stop", quick)),
        ("restart empty", lambda: faults.restart_empty(quick)),
        ("failover", lambda: faults.failover(quick)),
        ("sentinel failover", lambda: faults.sentinel_failover(quick)),
        ("lost shard", lambda: faults.shard_lost(quick)),
        ("service outage", lambda: service.service_outage(quick)),
        ("stale replica", faults.stale_replica),
        ("clock skew", lambda: faults.clock_skew(1 if quick else 5)),
        ("contention", lambda: exactness.contention(2, 2) if quick else exactness.contention(4, 4)),
        (
            "memory flood",
            lambda: (
                service.flood_memory(100_000, 10_000)
                if quick
                else service.flood_memory(1_000_000, 100_000, check_speed=True)
            ),
        ),
        (
            "service flood",
            lambda: (
                service.flood_service(8, 2_000)
                if quick
                else service.flood_service(120, 20_000, 1000.0)
            ),
        ),
        ("soak", lambda: service.soak(soak_seconds, max(2.0, soak_seconds / 20))),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short versions (about 2 minutes)")
    parser.add_argument("--soak-seconds", type=float, default=None, help="soak length (600)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    soak = args.soak_seconds or (40.0 if args.quick else 600.0)
    rows: list[Row] = []
    began = time.monotonic()
    for name, run in scenarios(args.quick, soak):
        t = time.monotonic()
        try:
            got = run()
        except Exception as exc:  # a scenario that crashed is a failed row, not a lost run
            got = [Row(name, "scenario ran to the end", f"{type(exc).__name__}: {exc}", False)]
        rows += got
        print(f"== {name}: {time.monotonic() - t:.0f} s", file=sys.stderr)
        print(table(got).split("\n", 2)[2], flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    block = (
        f"Run: `./scripts/reliability{' --quick' if args.quick else ''}` at commit `{commit}`, "
        f"{time.monotonic() - began:.0f} s, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs. Latencies vary between runs: read them as orders of magnitude "
        "and the result column as the claim.\n\n" + table(rows)
    )
    print("\n" + table(rows))
    if not args.no_write:
        write_doc(DOC, block)
        print(f"wrote {DOC}", file=sys.stderr)
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
