"""The import rule of the layout (pyproject's [tool.importlinter]) holds, so `make test` enforces it as CI runs it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_import_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    # import-linter configures logging with disable_existing_loggers, which would silence every logger that later
    # tests in this process read through caplog: keep each logger's state as it was
    before = {name: logger.disabled for name, logger in logging.root.manager.loggerDict.items()
              if isinstance(logger, logging.Logger)}
    try:
        status = lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    finally:
        for name, disabled in before.items():
            logging.getLogger(name).disabled = disabled
    report = capsys.readouterr().out
    assert status == EXIT_STATUS_SUCCESS, report
