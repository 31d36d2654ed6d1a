"""`vigil serve` / `vigil mcp`: a user mistake is one line on stderr and exit status 2, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.conftest import REPO


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--launch-dir", "{tmp}/missing"], "--launch-dir"),
        (["serve", "--metrics-dir", "{tmp}/missing"], "--metrics-dir"),
        (["serve", "--actuator", "ansible"], "--actuator 'ansible': expected none, kubernetes or slurm"),
        (["mcp", "--transport", "sse"], "--transport 'sse'"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    env = {
        **os.environ,
        "VIGIL_HOME": str(tmp_path),
        "VIGIL_DB_URL": f"sqlite:///{tmp_path / 'vigil.db'}",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-m", "vigil", *[a.format(tmp=tmp_path) for a in args]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr
