"""The documentation runs: every code block of README.md and docs/*.md, checked as written.

- ``python`` blocks run, each in a fresh interpreter (frameworks keep global state), from a
  scratch directory. ``redis://127.0.0.1:6379/0`` becomes a test Redis and ``localhost:8080``
  a real ``ratekeeper serve``; Redis stores get a 5 s socket timeout (a loaded machine must
  not fail open where an example shows headers). A top-level ``print(...)`` followed by
  ``# text`` — on its line or the next — must print ``text``, and nothing else is printed.
  A block whose first line is ``# fragment`` (a settings.py, a piece of a larger file) is
  only compiled. A block whose first line names a file (``# myapp/limits.py``) is that file:
  it is written where the page's other blocks and commands run, so they can import it.
  ``CHECKS`` adds assertions after a few blocks that show an app without calling it.
- ``yaml`` blocks are service configs: each document (``---`` separates alternatives) loads
  with the service's config loader. A ``# fragment`` block is only parsed as YAML.
- README.md's blocks run in an environment that holds only what the README says to install:
  a virtual environment made by the README's own install commands, run as written from the
  checkout (``.venv`` becomes a scratch path), once per session (``readme_env``). A block that
  needs what the page does not install fails.
- Shell commands of README.md and docs/deploy.md (``bash`` blocks) run as written where they
  can, against a real ``ratekeeper serve`` on free ports, in the environment the page's own
  install commands made; ``README_COMMANDS`` and ``DEPLOY_COMMANDS`` say how each is run, or
  why not, and a command missing from them fails the test.
- docs/reference.md names every public option (read from the code), and links between pages
  resolve (files and heading anchors).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ratekeeper.metrics import METRICS
from ratekeeper.service.config import loader as config
from tests.service.proc import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.S | re.M
)
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
SERVICE = "localhost:8080"
TOKENS = {
    "RATEKEEPER_TOKEN": "doc-client-token-0123",
    "RATEKEEPER_ADMIN_TOKEN": "doc-admin-0123456",
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str

    @property
    def fragment(self) -> bool:
        return self.text.startswith("# fragment")


def _blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 2  # the block's first line
            body = textwrap.dedent(m.group("body"))
            out.append(Block(str(page.relative_to(ROOT)), line, m.group("lang"), body))
    return out


BLOCKS = _blocks()


def params(lang: str) -> list[object]:
    return [
        pytest.param(b, id=f"{b.page}:{b.line}", marks=_group(b.page))
        for b in BLOCKS
        if b.lang == lang
    ]


def _group(page: str) -> list[pytest.MarkDecorator]:
    """A page with an environment of its own (``readme_env``, ``deploy_env``): its tests on
    one worker, the one that built it."""
    return [pytest.mark.xdist_group(ENV_GROUPS[page])] if page in ENV_GROUPS else []


ENV_GROUPS = {"README.md": "readme-env", "docs/deploy.md": "deploy-env"}


# --- python -----------------------------------------------------------------------------------

RUNNER = """\
import sys
for name, cls in (("single", "RedisStore"), ("sharded", "ShardedRedisStore"),
                  ("cluster", "RedisClusterStore")):
    module = __import__("ratekeeper.stores.redis." + name, fromlist=[cls])
    defaults = getattr(module, cls).__init__.__kwdefaults__
    if defaults and "socket_timeout" in defaults:
        defaults["socket_timeout"] = 5.0
main = sys.modules["__main__"] = type(sys)("__main__")  # the block is __main__ (Django's urls)
exec(compile(sys.stdin.read(), sys.argv[1], "exec"), main.__dict__)
"""
"""Runs a block read from stdin as ``__main__``, under its page's name (tracebacks point into
the page)."""

CHECKS = {
    ("docs/middleware.md", "controls = Controls(source=redis_flags"): """
from starlette.testclient import TestClient
with TestClient(app, client=("10.1.1.1", 1)) as client:
    response = client.get("/items", headers={"X-Forwarded-For": "198.51.100.1"})
    assert response.status_code == 200, response.text
    assert response.headers["X-RateLimit-Resource"] == "per-ip"
    assert client.post("/charges").status_code == 200
assert controls.stats()["per-ip"]["allowed"] == 2
""",
    ("docs/middleware.md", "app = Flask(__name__)"): """
client = app.test_client()
response = client.get("/items", buffered=True, environ_base={"REMOTE_ADDR": "127.0.0.1"})
assert response.status_code == 200
assert response.headers["X-RateLimit-Resource"] == "per-ip"
assert response.headers["RateLimit-Policy"].startswith('"per-ip.10/1s";q=10;w=1')
""",
    ("docs/middleware.md", "AdmissionCheck(),"): """
from starlette.testclient import TestClient
with TestClient(app) as client:
    assert client.get("/reports").status_code == 200
    assert client.post("/charges").status_code == 200
""",
    ("docs/middleware.md", "queue_delay=delay"): """
from ratekeeper.middleware import WorkerCheck
from ratekeeper.overload.signals import Worst
assert isinstance(check, WorkerCheck) and check.queue_delay is delay
assert isinstance(check.shedder.utilization, Worst)
assert 0 <= check.shedder.utilization() <= 1
""",
    ("docs/observing.md", "register(metrics)"): """
assert metrics.count_of("100/1m", "allowed") == 1
""",
    ("docs/observing.md", 'Mount("/dashboard"'): """
from starlette.testclient import TestClient
with TestClient(app) as client:
    assert client.get("/dashboard").status_code == 200
    assert client.get("/dashboard/data").json()["policies"][0]["name"] == "per-ip"
""",
}
"""Assertions run after a block that defines an app or a recorder without exercising it:
(page, a line of the block) -> code run in the block's namespace."""


def checks_for(block: Block) -> str:
    return "".join(
        code
        for (page, marker), code in CHECKS.items()
        if page == block.page and marker in block.text
    )


def expected_output(block: str) -> list[str]:
    lines = block.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        comment = re.search(r"\)\s+# (.+)$", line)
        if comment:
            out.append(comment.group(1).strip())
        elif i + 1 < len(lines) and lines[i + 1].startswith("# "):
            out.append(lines[i + 1][2:].strip())
    return out


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """``ratekeeper serve`` as the README starts it (built-in example, memory store)."""
    proc = ServiceProcess(grpc=False)
    yield proc
    proc.stop()


def test_every_check_belongs_to_one_block() -> None:
    for page, marker in CHECKS:
        found = [b for b in BLOCKS if b.page == page and marker in b.text]
        assert len(found) == 1, (page, marker, len(found))


FILE_LINE = re.compile(r"# ([\w./-]+\.py)\n")


def write_files(page: str, into: Path) -> None:
    """The page's file blocks (first line ``# path.py``), written under ``into``."""
    for b in BLOCKS:
        m = FILE_LINE.match(b.text)
        if b.page == page and b.lang == "python" and m:
            (into / m.group(1)).parent.mkdir(parents=True, exist_ok=True)
            (into / m.group(1)).write_text(b.text)


@pytest.mark.parametrize("block", params("python"))
def test_python_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if block.fragment:
        compile(block.text, f"{block.page}:{block.line}", "exec")
        return
    write_files(block.page, tmp_path)
    source = block.text
    if LOCAL_REDIS in source:
        source = source.replace(LOCAL_REDIS, request.getfixturevalue("redis_url"))
    if SERVICE in source:
        service: ServiceProcess = request.getfixturevalue("service")
        source = source.replace(SERVICE, f"127.0.0.1:{service.port}")
    source = "\n" * (block.line - 1) + source + checks_for(block)  # line numbers of the page
    python = sys.executable
    if block.page == "README.md":  # only what the README installs
        python = str(request.getfixturevalue("readme_env") / "bin" / "python")
    done = subprocess.run(
        [python, "-W", "ignore", "-c", RUNNER, block.page],
        input=source,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    printed = [line.strip() for line in done.stdout.splitlines()]
    assert printed == expected_output(block.text), done.stdout


# --- yaml -------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", params("yaml"))
def test_yaml_block_loads(block: Block, tmp_path: Path) -> None:
    if block.fragment:
        yaml.safe_load(block.text)
        return
    for i, document in enumerate(re.split(r"^---[ ]*$", block.text, flags=re.M)):
        path = tmp_path / f"block-{i}.yaml"
        path.write_text(document)
        config.load([str(path)], env=TOKENS)


# --- pages' tables ---------------------------------------------------------------------------


def test_the_metric_table_is_the_vocabulary() -> None:
    text = (ROOT / "docs" / "observing.md").read_text()
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(ratekeeper_\w+)` \| \w+ \| ([^|]*) \|", text, re.M)
    }
    assert set(rows) == {s.exposed for s in METRICS}
    for s in METRICS:
        assert rows[s.exposed].strip() == (", ".join(f"`{x}`" for x in s.labels) or "\N{EN DASH}")


# --- the pages' environments and commands ---------------------------------------------------


def page_commands(page: str) -> list[str]:
    """A page's shell commands: lines of ``bash`` blocks, continuations joined, comments and
    blank lines dropped."""
    out = []
    for block in BLOCKS:
        if block.page != page or block.lang != "bash":
            continue
        joined = block.text.replace("\\\n", " ")
        for line in joined.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()  # a comment after the command
            if line and not line.startswith("#"):
                out.append(re.sub(r"\s+", " ", line))
    return out


def readme_commands() -> list[str]:
    return page_commands("README.md")


def printed_after(page: str, command: str) -> list[str]:
    """The output a page shows under a command: the ``# text`` lines after it in its block
    (``#   ...`` says the rest is left out)."""
    for block in BLOCKS:
        if block.page == page and block.lang == "bash":
            joined = re.sub(r"\s+", " ", block.text.replace("\\\n", " "))
            if command in joined:
                tail = block.text.split("\n# ", 1)
                lines = ("# " + tail[1]).splitlines() if len(tail) == 2 else []
                return [ln[2:] for ln in lines if ln.startswith("# ") and ln != "#   ..."]
    return []


def _script(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    path = str(found) if found.exists() else shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed")
    return path


def _made_by(commands: list[str], venv: str, into: Path, log: Path) -> None:
    """Run a page's install commands as written, from the checkout, with the page's venv
    path (``.venv``, ``/opt/ratekeeper``) pointing at ``into``; pip's output in ``log``."""
    for command in commands:
        command = command.split(f" && {venv}/bin/ratekeeper")[0]  # install, not serve
        command = command.replace(f"{venv}/", f"{into}/").replace(f"venv {venv}", f"venv {into}")
        with log.open("a") as out:
            out.write(f"$ {command}\n")
            out.flush()
            done = subprocess.run(
                ["bash", "-c", command], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=900,
            )  # fmt: skip
        assert done.returncode == 0, f"{command!r} failed:\n{log.read_text()[-3000:]}"


def _page_env(factory: pytest.TempPathFactory, name: str, commands: list[str], venv: str) -> Path:
    """The venv a page's install commands make, built once for every test process (the
    first to ask builds it under a lock, the others wait and reuse it)."""
    root = factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    into, done = shared / name, shared / f"{name}.done"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(into, ignore_errors=True)
            _made_by(commands, venv, into, shared / f"{name}.log")
            done.write_text("")
    return into


def _installs(page: str, venv: str) -> list[str]:
    return [c for c in page_commands(page) if c.startswith((f"python3 -m venv {venv}",
                                                           f"{venv}/bin/pip install"))]  # fmt: skip


@pytest.fixture(scope="session")
def readme_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding what the README says to install, and nothing else."""
    return _page_env(tmp_path_factory, "readme-venv", _installs("README.md", ".venv"), ".venv")


@pytest.fixture(scope="session")
def deploy_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment made by docs/deploy.md's install command, as written."""
    venv = "/opt/ratekeeper"
    return _page_env(tmp_path_factory, "deploy-venv", _installs("docs/deploy.md", venv), venv)


INSTALL_AND_SERVE = (
    'python3 -m venv .venv && .venv/bin/pip install -e ".[server]" && .venv/bin/ratekeeper serve'
)
README_COMMANDS: dict[str, tuple[str, str]] = {
    INSTALL_AND_SERVE: ("serve", "installed by readme_env, then served from it"),
    '.venv/bin/pip install -e ".[fastapi]"': ("install", "run by readme_env"),
    "./scripts/test": ("skip", "this test is part of it"),
    ". .venv/bin/activate": ("activate", "the README's venv on PATH for the commands after it"),
    "curl -si localhost:8080/v1/hit -H 'content-type: application/json' -d "
    '\'{"policy": "api.core", "key": "user:42"}\'': ("run", '"allowed":true'),
    "ratekeeper demo": ("run", "fixed_window"),
    "ratekeeper simulate access.log.gz --checks myapp.limits:checks --html report.html": (
        "run",
        "per-ip",
    ),
    "ratekeeper check-config ratekeeper.yaml": ("run", "ok: 1 file"),
}
"""Each README command: ("serve", note) starts it in the background (free ports; later
commands reach it at localhost:8080); ("install", note): made by ``readme_env``;
("activate", note): the commands after it have the venv's ``bin`` on PATH; ("run",
text) runs it in a shell, which must succeed and print ``text``; ("skip", why) does not run
it."""

FILES = {"ratekeeper.yaml": config.EXAMPLE.read_text(), "myapp/__init__.py": ""}
"""What the README's commands read besides its file blocks, in the directory they run in."""
LOG = "".join(
    f"198.51.100.{i % 3} - - [10/Oct/2026:13:{i // 60:02d}:{i % 60:02d} +0000] "
    f'"GET /items HTTP/1.1" 200 12 "-" "curl/8"\n'
    for i in range(30)
)


def test_every_readme_command_is_known() -> None:
    assert sorted(readme_commands()) == sorted(README_COMMANDS)


@pytest.mark.xdist_group("readme-env")
def test_readme_commands_run(tmp_path: Path, readme_env: Path) -> None:
    """As a newcomer runs them: in the README's environment, with no ``ratekeeper`` on PATH
    until the README activates its venv (a command that needs it before fails)."""
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    write_files("README.md", tmp_path)
    (tmp_path / "access.log.gz").write_bytes(gzip.compress(LOG.encode()))
    bin_dir = readme_env / "bin"
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not Path(p, "ratekeeper").exists()]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(path)
    server: ServiceProcess | None = None
    try:
        for command in readme_commands():
            how, expected = README_COMMANDS[command]
            if how == "serve":
                if server is not None:
                    server.stop()
                serving = command.split(" && ")[-1].replace(".venv/bin/", f"{bin_dir}/")
                server = serve(serving, tmp_path, env)
            elif how == "activate":
                env = {**env, "VIRTUAL_ENV": str(readme_env),
                       "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}  # fmt: skip
            elif how == "run":
                if SERVICE in command:
                    assert server is not None, f"no service started before {command!r}"
                    command = command.replace(SERVICE, f"127.0.0.1:{server.port}")
                done = subprocess.run(
                    ["bash", "-c", command],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, (command, done.stderr)
                assert expected in done.stdout, (command, done.stdout)
        assert (tmp_path / "report.html").stat().st_size > 1000  # simulate's HTML report
    finally:
        if server is not None:
            server.stop()


@pytest.mark.xdist_group("readme-env")
def test_the_readme_environment_holds_only_what_the_readme_installs(readme_env: Path) -> None:
    """The environment cannot pass a block the README's installs would fail: the dev tools
    and the extras it does not name are absent."""
    missing = subprocess.run(
        [str(readme_env / "bin" / "python"), "-c",
         "import importlib.util as u; print([m for m in ('flask', 'django', 'pytest', "
         "'hypothesis', 'uvicorn', 'fastapi', 'grpc') if u.find_spec(m) is None])"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    assert missing == "['flask', 'django', 'pytest', 'hypothesis', 'uvicorn']"


def serve(command: str, cwd: Path, env: dict[str, str]) -> ServiceProcess:
    """A page's ``ratekeeper serve`` command, run as written but on free ports."""
    argv = command.split()
    assert argv[0].endswith("ratekeeper") and argv[1] == "serve", command
    args = [argv[0] if "/" in argv[0] else _script("ratekeeper"), *argv[1:]]
    for flag in ("--port", "--grpc-port"):
        if flag in args:
            args[args.index(flag) + 1] = "0"
        else:
            args += [flag, "0"]
    return ServiceProcess(argv=args, cwd=cwd, env=env)


CHECK_CONFIG = (
    "REDIS_SOCKET_TYPE=tcp REDIS_URL=10.0.0.1:6379 REDIS_AUTH=s3cret USE_STATSD=false "
    "RUNTIME_ROOT=deploy/compose/runtime RUNTIME_SUBDIRECTORY=ratelimit "
    "/opt/ratekeeper/bin/ratekeeper check-config"
)
NO_CONTAINERS = "no container engine here: ./scripts/test-image builds and runs the image"
DEPLOY_COMMANDS: dict[str, tuple[str, str]] = {
    "python3 -m venv /opt/ratekeeper && /opt/ratekeeper/bin/pip install '.[server]'": (
        "install",
        "run by deploy_env",
    ),
    "/opt/ratekeeper/bin/ratekeeper serve --help": ("run", "usage: ratekeeper serve"),
    CHECK_CONFIG: ("run", "printed"),
    "python3 -m pip wheel --no-deps -w deploy/wheels .": ("skip", NO_CONTAINERS),
    "docker build -f deploy/Containerfile -t ratekeeper:0.1.0 deploy": ("skip", NO_CONTAINERS),
    "docker run -p 8080:8080 -p 8081:8081 -e REDIS_SOCKET_TYPE=tcp -e REDIS_URL=redis:6379 "
    '-v "$PWD/deploy/compose/runtime:/srv/runtime_data/current:ro" ratekeeper:0.1.0': (
        "skip",
        NO_CONTAINERS,
    ),
    "docker compose -f deploy/compose/compose.yaml up --build": ("skip", NO_CONTAINERS),
    "curl -i localhost:10000/ -H 'x-user: alice'": ("skip", "the Compose deployment's Envoy"),
}
"""docs/deploy.md's commands, as ``README_COMMANDS``; ("run", "printed"): what the page shows
under the command (its ``# ...`` lines) must be printed."""


def test_every_deploy_command_is_known() -> None:
    assert sorted(set(page_commands("docs/deploy.md"))) == sorted(DEPLOY_COMMANDS)


@pytest.mark.xdist_group("deploy-env")
def test_deploy_commands_run(deploy_env: Path) -> None:
    """From the checkout, as the page runs them, with /opt/ratekeeper its environment."""
    for command in page_commands("docs/deploy.md"):
        how, expected = DEPLOY_COMMANDS[command]
        if how != "run":
            continue
        done = subprocess.run(
            ["bash", "-c", command.replace("/opt/ratekeeper/", f"{deploy_env}/")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (command, done.stderr)
        wanted = printed_after("docs/deploy.md", command) if expected == "printed" else [expected]
        assert wanted, command
        for line in wanted:
            assert line in done.stdout, (command, line, done.stdout)


def test_the_server_extra_is_what_deploy_says_it_brings() -> None:
    """docs/deploy.md names each distribution of ``[server]``, and no other server."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["server"]
    names = [re.split(r"[<>=;\s\[]", requirement, maxsplit=1)[0] for requirement in extra]
    text = " ".join((ROOT / "docs" / "deploy.md").read_text().split())
    sentence = text.split("The `[server]` extra brings", 1)[1].split("Python 3.11", 1)[0]
    assert [n for n in names if f"`{n}`" not in sentence] == []
    assert "no uvicorn" in sentence  # the service's HTTP server is its own


# --- the reference page -----------------------------------------------------------------------

REFERENCE = (ROOT / "docs" / "reference.md").read_text()


CODE_SPANS = re.findall(r"`([^`\n]+)`", REFERENCE)


def _named(name: str) -> bool:
    """``name`` is a word of some code on the reference page (`name`, `f(name=1)`, ...)."""
    word = re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")
    return any(word.search(span) for span in CODE_SPANS)


def _parameters(obj: object) -> list[str]:
    skip = {"self", "app", "args", "kwargs", "breaker"}
    return [p for p in inspect.signature(obj).parameters if p not in skip]  # type: ignore[arg-type]


def _client_names() -> list[str]:
    from ratekeeper import client

    return [*client.__all__, "PacedTransport", "AsyncPacedTransport", "PacedAdapter",
            "PacedMiddleware"]  # fmt: skip


def _client_surface() -> list[object]:
    """ratekeeper.client's constructors and functions, the drop-ins' too (every argument of
    each must be named on the reference page)."""
    from ratekeeper import client
    from ratekeeper.client import pacer
    from ratekeeper.client.aiohttp import PacedMiddleware
    from ratekeeper.client.httpx import AsyncPacedTransport, PacedTransport
    from ratekeeper.client.requests import PacedAdapter

    exported = [getattr(client, n) for n in client.__all__]
    return [*exported, pacer._PacerBase.__init__, PacedTransport, AsyncPacedTransport,
            PacedAdapter, PacedMiddleware]  # fmt: skip


def test_the_reference_names_every_public_option() -> None:
    import ratekeeper
    from ratekeeper import llm, middleware
    from ratekeeper.dashboard import Dashboard
    from ratekeeper.limiter import _Base
    from ratekeeper.metrics import Metrics

    exported = [getattr(ratekeeper, n) for n in ratekeeper.__all__]
    exported += [getattr(middleware, n) for n in middleware.__all__]
    exported += [getattr(llm, n) for n in llm.__all__]
    names = [*ratekeeper.__all__, *middleware.__all__, *llm.__all__]
    missing = [n for n in names if not _named(n)]
    owners = [o for o in exported if isinstance(o, type) and not issubclass(o, Exception)]
    owners.remove(ratekeeper.Decision)  # its fields are checked below
    functions = [_Base.__init__, ratekeeper.Limiter.hit, middleware.priorities]
    functions += _client_surface()
    missing += [n for n in _client_names() if not _named(n)]
    for owner in [*owners, *functions, middleware.redis_flags, Metrics, Dashboard]:
        missing += [f"{owner}.{p}" for p in _parameters(owner) if not _named(p)]
    missing += [f"Decision.{f}" for f in ("allowed", "limit", "remaining", "reset_at",
                "retry_after", "rate", "stack", "now", "degraded", "quotas", "used")
                if not _named(f)]  # fmt: skip
    assert missing == [], missing


def test_the_reference_names_every_flag_and_config_key() -> None:
    from ratekeeper.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {
        flag
        for sub in commands.choices.values()
        for action in sub._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
        if flag not in ("-h", "--help")
    }
    assert {f for f in flags if not _named(f)} == set()
    schema = json.loads((ROOT / "src/ratekeeper/service/config/schema.json").read_text())
    keys: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            keys.update(node.get("properties", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    assert {k for k in keys if not _named(k)} == set()


# --- links ------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_every_link_between_pages_resolves() -> None:
    anchors = {
        page: {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)} for page in PAGES
    }
    broken = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            missing = anchor and file in anchors and anchor not in anchors[file]
            if not file.exists() or missing:
                broken.append(f"{page.name}: {target}")
    assert broken == []


def test_the_readme_leads_to_every_page() -> None:
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", (ROOT / "README.md").read_text()))
    assert {p.name for p in PAGES[1:]} - linked == set()
