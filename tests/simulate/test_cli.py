"""The command line: a report that cannot be trusted exits 1 and says why; a bad argument
exits 2 and names it; ``--limit`` takes a key field and an algorithm per candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratekeeper.cli import main
from tests.simulate.traffic import generate


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "access.log"
    path.write_text("".join(line.combined() for line in generate(seconds=120)))
    return path


def run(*args: str) -> int:
    return main(["simulate", *args, "--no-progress"])


def test_nothing_parsed_exits_1_and_says_what_to_try(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.log"
    garbage.write_text("hello\nworld\n")
    assert run(str(garbage), "--limit", "a=1/minute", "--html", str(tmp_path / "r.html")) == 1
    err = capsys.readouterr().err
    assert "no request parsed from" in err and "2 lines, 2 unparsable" in err
    assert "--format" in err and "First bad line (1)" in err
    assert not (tmp_path / "r.html").exists()  # no report of nothing
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert run(str(empty), "--limit", "a=1/minute") == 1
    assert "no request parsed" in capsys.readouterr().err


def test_most_lines_unparsable_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mixed.log"
    lines = "".join(line.combined() for line in generate(seconds=5))
    path.write_text(lines + "junk\n" * (lines.count("\n") + 5))
    assert run(str(path), "--limit", "a=1/minute") == 1
    assert "most lines are unparsable" in capsys.readouterr().err


def test_a_key_field_missing_on_most_lines_exits_1_naming_the_fields(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(str(log), "--limit", "a=10/minute,key=x-api-key") == 1
    err = capsys.readouterr().err
    assert "a: its key field 'x-api-key' is missing on" in err
    assert "fields in the log: bytes, ip, method, path" in err
    # user is missing on about a tenth of the lines: fine, and counted
    assert run(str(log), "--limit", "a=10/minute,key=user", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert 0 < data["limits"][0]["key_missing"] < data["limits"][0]["requests"] / 4


def test_bad_arguments_exit_2_and_name_the_value(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["--limit", "a=1/minute", "--limit", "a=2/minute"], "--limit 'a' is given twice"),
        (["--limit", "a=1/minute,colour=red"], "option 'colour=red' is invalid"),
        (["--limit", "a=1/minute,burst=many"], "burst='many' is not a whole number"),
        (["--limit", "a=1/minute,algorithm=leaky"], "algorithm 'leaky' is unknown"),
        (["--limit", "a=1/minute", "--skew", "soon"], "--skew 'soon' is invalid"),
        (["--limit", "a=1/minute", "--max-line", "0"], "--max-line 0 is invalid"),
        (["--limit", "=1/minute"], "expected NAME=RATE"),
    ]
    for args, message in cases:
        assert run(str(log), *args) == 2, args
        assert message in capsys.readouterr().err, args
    with pytest.raises(SystemExit):
        run(str(log), "--limit", "a=1/minute", "--format", "nope")


def test_each_candidate_has_its_own_key_and_algorithm(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Side by side, each candidate decides what it decides alone."""
    both = tmp_path / "both.json"
    user = "user=3/second,key=user,algorithm=token_bucket,burst=5"
    assert run(str(log), "--limit", "ip=20/minute", "--limit", user, "--json", str(both)) == 0
    together = {x["name"]: x for x in json.loads(both.read_text())["limits"]}
    assert together["user"]["key"] == "user" and together["user"]["algorithm"] == "token_bucket"
    assert together["ip"]["key"] == "ip" and together["ip"]["algorithm"] == "fixed_window"
    assert together["user"]["would_reject"] > 0 and together["ip"]["would_reject"] > 0
    burst = tmp_path / "burst.json"
    assert run(str(log), "--limit", user, "--json", str(burst)) == 0
    [single] = json.loads(burst.read_text())["limits"]
    assert single["would_reject"] == together["user"]["would_reject"]
    assert single["top_keys"] == together["user"]["top_keys"]
