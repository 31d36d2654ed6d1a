"""The probe's bootstrap runs a program as `python` would - script, -m MODULE, -c CODE - with the probe in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vigil.run.launcher import probe_command

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], probe_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VIGIL_PROBE_DIR": str(probe_dir), "PYTHONPATH": str(REPO)}
    return subprocess.run(probe_command(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["script", "-m", "-c"])
def test_every_form_runs_as_main_with_its_arguments_and_the_probe(tmp_path: Path, form: str) -> None:
    code = "import sys, json; print(json.dumps([__name__, sys.argv[1:]])); sys.exit(3)"
    (tmp_path / "prog.py").write_text(code)
    argv = {"script": [sys.executable, "prog.py"], "-m": ["python3", "-m", "prog"], "-c": ["python", "-c", code]}[form]
    done = run([*argv, "a", "--b"], tmp_path / "probe", tmp_path)
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["__main__", ["a", "--b"]]
    snapshot = json.loads((tmp_path / "probe" / "rank0.json").read_text())
    assert snapshot["finished"] is True


def test_commands_that_are_not_python_run_unchanged() -> None:
    assert probe_command(["bash", "-c", "true"]) == ["bash", "-c", "true"]
    assert probe_command(["python", "train.py"])[1:3] == ["-m", "vigil.sources.probe.bootstrap"]
