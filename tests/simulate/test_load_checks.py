"""``--checks module:attr`` finds the app's module from the current directory, as
``uvicorn app:app`` does, and says what is wrong when it cannot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ratekeeper.errors import ConfigError
from ratekeeper.middleware import RateCheck
from ratekeeper.simulate.targets import load_checks


def test_a_module_of_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shopapp").mkdir()
    (tmp_path / "shopapp" / "__init__.py").write_text("")
    (tmp_path / "shopapp" / "limits.py").write_text(
        "from ratekeeper.middleware import RateCheck\n"
        "checks = [RateCheck('per-ip', '5/minute')]\n"
        "def more():\n    return checks * 2\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "shopapp", raising=False)
    monkeypatch.delitem(sys.modules, "shopapp.limits", raising=False)
    checks = load_checks("shopapp.limits:checks")
    assert [type(c) for c in checks] == [RateCheck] and checks[0].name == "per-ip"
    assert len(load_checks("shopapp.limits:more")) == 2


def test_what_cannot_be_loaded_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="cannot import 'nowhere_app' for --checks"):
        load_checks("nowhere_app:checks")
    with pytest.raises(ConfigError, match="expected module:attribute"):
        load_checks("nowhere_app")
