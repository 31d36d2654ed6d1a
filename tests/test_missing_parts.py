"""A missing real part skips on a developer's machine and fails under CI=true."""

from __future__ import annotations

import pytest

from tests.conftest import missing, require_binary


def test_missing_part_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no-such-binary-vigil is not installed"):
        require_binary("no-such-binary-vigil")


def test_missing_part_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="data set gone"):
        missing("data set gone")


def test_present_binary_is_found() -> None:
    assert require_binary("sh").endswith("sh")
