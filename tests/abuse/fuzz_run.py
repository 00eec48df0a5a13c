"""The driver of ``scripts/fuzz``: every abuse phase within one time budget, then a Markdown
table (input | what was checked | figure | pass/fail) on stdout and in ``--out``.

Phases and their share of the budget: the hypothesis properties of ``test_fuzz.py`` and
``test_grpc_fuzz.py`` with many
more examples (25%), atheris on ``Rate.parse`` (10%) and the config loader (20%),
schemathesis against a real ``ratekeeper serve`` process and its own ``/openapi.json`` (35%),
then the flood figures (``tests.abuse.flood``, a few seconds). Every phase has a hard timeout
(its share plus a margin), so the whole run stays bounded.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ST = str(Path(PY).with_name("st"))
ARTIFACTS = ROOT / "fuzz-artifacts"
"""Where atheris leaves a crashing input (``crash-<sha1>``) to replay."""
SERVICE_CONFIG = """\
auth:
  token: client-token-fuzz-0123456789
  admin_token: admin-token-fuzz-0123456789
limits:
  max_key_length: 128
policies:
  p:
    rate: 20/minute; 100/hour
    algorithm: sliding_window
"""


@dataclass
class Row:
    input: str
    checked: str
    figure: str
    ok: bool | None  # None: skipped

    def markdown(self) -> str:
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[self.ok]
        return f"| {self.input} | {self.checked} | {self.figure} | {verdict} |"


def run(cmd: list[str], timeout: float, **kwargs: object) -> tuple[int, str, float]:
    """Run ``cmd``; (exit code, combined output, seconds). A timeout is exit code -9."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs
        )
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = -9
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
    return code, out, time.monotonic() - start


def hypothesis_phase(seconds: float) -> Row:
    examples = max(200, int(seconds * 8))
    env = {**os.environ, "RATEKEEPER_FUZZ_EXAMPLES": str(examples)}
    code, out, took = run(
        [
            PY,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/abuse/test_fuzz.py",
            "tests/abuse/test_grpc_fuzz.py",
        ],
        timeout=seconds + 120,
        env=env,
    )
    passed = re.search(r"(\d+) passed", out)
    tests = passed.group(1) if passed else "?"
    return Row(
        "Rate.parse, config loader, HTTP API, gRPC API (hypothesis)",
        "own error only (RateSpecError / ConfigError file:line / 4xx naming the field); "
        "no 500, no logged traceback, no hang (10 s per request)",
        f"{tests} properties x up to {examples} examples in {took:.0f} s",
        code == 0,
    )


def atheris_phase(target: str, seconds: float) -> Row:
    label = {"rate": "Rate.parse (atheris)", "config": "config loader (atheris)"}[target]
    checked = {
        "rate": "RateSpecError or in-range rates that read back the same",
        "config": "ConfigError starting with file:line, nothing else",
    }[target]
    try:
        import atheris  # noqa: F401
    except ImportError:
        return Row(label, checked, "atheris not installed on this Python", None)
    ARTIFACTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as corpus:
        code, out, _ = run(
            [PY, "-m", "tests.abuse.atheris_targets", target, corpus,
             f"-max_total_time={int(seconds)}", "-timeout=10", "-rss_limit_mb=1024",
             f"-artifact_prefix={ARTIFACTS}/"],
            timeout=seconds + 60,
        )  # fmt: skip
    runs = re.search(r"Done (\d+) runs in (\d+) second", out)
    figure = f"{int(runs.group(1)):,} inputs in {runs.group(2)} s" if runs else "no summary"
    if code != 0:
        finding = re.search(r"(?m)^(\w+Error: .*)$", out)
        figure += f"; finding: {finding.group(1)[:120] if finding else 'exit ' + str(code)}"
    return Row(label, checked, figure, code == 0)


def schemathesis_phase(seconds: float) -> Row:
    from tests.service.proc import ServiceProcess

    label = "HTTP API (schemathesis, real process, /openapi.json)"
    checked = "all checks: no 5xx, status codes, schemas, headers, methods, auth"
    if not Path(ST).exists():
        return Row(label, checked, "schemathesis not installed", None)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "ratekeeper.yaml"
        config.write_text(SERVICE_CONFIG)
        proc = ServiceProcess(config, grpc=False)
        try:
            env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.abuse.st_hooks"}
            env["PYTHONPATH"] = str(ROOT)
            code, out, _ = run(
                [ST, "run", f"{proc.url}/openapi.json", "--checks", "all",
                 "-H", "Authorization: Bearer admin-token-fuzz-0123456789",
                 "--max-time", str(int(seconds)), "--workers", "1", "--no-color",
                 "--generation-database", "none", "--request-timeout", "10",
                 "--report", "junit", "--report-dir", tmp],
                timeout=seconds + 120,
                env=env,
            )  # fmt: skip
        finally:
            stderr = proc.stop()
    cases = re.search(r"(\d+) generated, (.*?)(?:\n|$)", out)
    figure = f"{cases.group(1)} cases, {cases.group(2).strip()}" if cases else "no summary"
    tracebacks = stderr.count("Traceback")
    figure += f"; service tracebacks: {tracebacks}"
    if code != 0:
        failures = re.findall(r"❌ (ST\d+ [^:\n]+): (\d+)", out)
        figure += "; " + ", ".join(f"{n}x {what}" for what, n in failures)
        (ROOT / "fuzz-schemathesis.log").write_text(out)
    return Row(label, checked, figure, code == 0 and tracebacks == 0)


def flood_phase() -> list[Row]:
    code, out, _ = run([PY, "-m", "tests.abuse.flood"], timeout=300)
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 7 or not cells[1][:1].isdigit():
            continue
        label, sn, sf, cn, cf, un, uf = cells
        ok = code == 0 and float(sf) <= float(sn) and float(cf) <= float(cn)
        rows.append(
            Row(
                f"one key flooded: {label}",
                "Redis script calls and commands per flood request <= a normal request's",
                f"scripts {sf} vs {sn}; commands {cf} vs {cn}; Redis CPU {uf} vs {un} us",
                ok,
            )
        )
    return rows or [Row("one key flooded", "Redis calls per request", out[-200:], False)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("seconds", nargs="?", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=ROOT / "fuzz-results.md")
    args = parser.parse_args()
    budget = args.seconds
    rows = [hypothesis_phase(budget * 0.25)]
    print(rows[-1].markdown(), flush=True)
    for target, share in (("rate", 0.10), ("config", 0.20)):
        rows.append(atheris_phase(target, budget * share))
        print(rows[-1].markdown(), flush=True)
    rows.append(schemathesis_phase(budget * 0.35))
    print(rows[-1].markdown(), flush=True)
    rows += flood_phase()
    table = ["| input | what was checked | figure | pass/fail |", "| --- | --- | --- | --- |"]
    table += [r.markdown() for r in rows]
    args.out.write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
