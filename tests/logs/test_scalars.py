"""Training-scalar checks on real TensorBoard event files (written by torch's SummaryWriter)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from vigil.logs.scalars import ScalarMonitor, check_event_dir
from vigil.model import VigilInputError

T0 = 1_780_000_000.0


def write_run(path: Path, spike_at: int | None = None, nan_at: int | None = None, pause_at: int | None = None,
              grad_norm: float = 1.0) -> None:
    writer = SummaryWriter(str(path))
    for step in range(150):
        loss = 3.0 - step * 0.005 + 0.02 * ((step * 7) % 5)
        if step == spike_at:
            loss = 12.0
        if step == nan_at:
            loss = math.nan
        wall = T0 + step * 2.0 + (900.0 if pause_at is not None and step >= pause_at else 0.0)
        writer.add_scalar("train/loss", loss, step, walltime=wall)
        writer.add_scalar("train/grad_norm", grad_norm, step, walltime=wall)
    writer.close()


def test_healthy_run_has_no_findings(tmp_path: Path) -> None:
    write_run(tmp_path)
    assert check_event_dir(tmp_path) == []


def test_nan_spike_and_stall_are_found_where_they_happen(tmp_path: Path) -> None:
    write_run(tmp_path, spike_at=80, nan_at=100, pause_at=120)
    found = {(f.fault_type, f.step) for f in check_event_dir(tmp_path) if f.tag == "train/loss"}
    assert found == {("loss_spike", 80), ("nan_loss", 100), ("job_hang", 120)}


def test_vanishing_gradient(tmp_path: Path) -> None:
    write_run(tmp_path, grad_norm=0.001)
    found = [f for f in check_event_dir(tmp_path) if f.fault_type == "vanishing_gradient"]
    assert found and all(f.tag == "train/grad_norm" for f in found)
    assert len(found) == 3  # once per full window of 50 points, not on every point


def test_live_silence_is_a_stall() -> None:
    monitor = ScalarMonitor()
    for step in range(20):
        monitor.update("train/loss", step, T0 + step, 1.0)
    assert monitor.stalled(now=T0 + 25) == []
    assert monitor.stalled(now=T0 + 19 + 600) == ["train/loss"]


def test_missing_or_corrupt_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="does not exist"):
        check_event_dir(tmp_path / "nope")
    with pytest.raises(VigilInputError, match="no events"):
        check_event_dir(tmp_path)
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage" * 3)
    with pytest.raises(VigilInputError, match="corrupt"):
        check_event_dir(tmp_path)
