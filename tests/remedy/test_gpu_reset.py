"""GPU reset through a fake ``nvidia-smi`` on PATH (no GPU in CI)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from vigil.model import Action, ActionKind, ActionStatus
from vigil.remedy.actuators.nvidia import GpuResetActuator
from vigil.remedy.audit import AuditLog
from vigil.remedy.remediator import Remediator

FAKE_NVIDIA_SMI = """
import os, sys
with open(os.environ["FAKE_SMI_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[-1] == "3":
    print("Unable to reset GPU 00000000:3B:00.0 because it's being used by some other process", file=sys.stderr)
    sys.exit(255)
print("GPU 00000000:1B:00.0 was successfully reset.")
"""


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable} -I{FAKE_NVIDIA_SMI}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "smi.log"
    monkeypatch.setenv("FAKE_SMI_LOG", str(log))
    return log


def reset(target: str) -> Action:
    return Action(ts=0, kind=ActionKind.RESET_GPU, target=target, reason="Xid 119 GSP timeout")


def test_reset_runs_nvidia_smi_for_local_gpus_only(fake_smi: Path, tmp_path: Path) -> None:
    remediator = Remediator([GpuResetActuator("n7")], AuditLog(f"sqlite:///{tmp_path}/a.db"), dry_run=False)
    done = remediator.execute(reset("gpu/n7/1"))
    assert done.status is ActionStatus.EXECUTED and "successfully reset" in done.result
    assert fake_smi.read_text().splitlines() == ["--gpu-reset -i 1"]
    busy = remediator.execute(reset("gpu/n7/3"))
    assert busy.status is ActionStatus.FAILED and "being used by some other process" in busy.result
    elsewhere = remediator.execute(reset("gpu/n8/1"))
    assert elsewhere.status is ActionStatus.REFUSED  # another node's agent resets that one
    assert len(fake_smi.read_text().splitlines()) == 2


def test_dry_run_describes_the_command(fake_smi: Path, tmp_path: Path) -> None:
    remediator = Remediator([GpuResetActuator("n7")], AuditLog(f"sqlite:///{tmp_path}/a.db"))
    proposed = remediator.execute(reset("gpu/n7/0"))
    assert proposed.status is ActionStatus.PROPOSED and "nvidia-smi --gpu-reset -i 0" in proposed.result
    assert not fake_smi.exists()
