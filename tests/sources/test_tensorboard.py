"""The TensorBoard run index: real event files, incremental reads, restarts, merges, and the HTTP face."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from vigil.logs.scalars import read_scalars
from vigil.model import VigilInputError
from vigil.sources.tensorboard import RunIndex


def write_run(directory: Path, steps: range, value: float = 1.0, tag: str = "loss") -> None:
    """A real TensorBoard event file (torch's writer), one scalar per step."""
    writer = SummaryWriter(log_dir=str(directory))
    for step in steps:
        writer.add_scalar(tag, value / (1 + step), global_step=step)
        writer.add_scalar("lr", 0.001, global_step=step)
    writer.close()


def test_index_matches_tensorboards_reader(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_run(logs / "a", range(0, 200))
    write_run(logs / "b", range(0, 50), value=2.0)
    index = RunIndex(tmp_path / "runs.sqlite")
    assert index.update(logs) == {"a": 400, "b": 100}
    truth = [(s, v) for tag, s, _, v in read_scalars(logs / "a") if tag == "loss"]
    series = index.series("a", "loss")
    assert list(series.steps) == [s for s, _ in truth]
    assert np.allclose(series.values, [v for _, v in truth])
    runs = {r.name: (r.tags, r.points) for r in index.runs()}
    assert runs == {"a": (["loss", "lr"], 400), "b": (["loss", "lr"], 100)}
    assert index.update(logs) == {}  # nothing new: nothing read again


def test_a_restart_into_the_same_directory_replaces_points_from_its_first_step(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_run(logs / "job", range(0, 100), value=1.0)
    index = RunIndex(tmp_path / "runs.sqlite")
    index.update(logs)
    # The job crashed after step 99 and restarted from its step-60 checkpoint into the same directory.
    write_run(logs / "job", range(60, 150), value=5.0)
    assert index.update(logs) == {"job": 180}
    series = index.series("job", "loss")
    assert list(series.steps) == list(range(150))
    assert np.allclose(series.values[:60], [1.0 / (1 + s) for s in range(60)])
    assert np.allclose(series.values[60:], [5.0 / (1 + s) for s in range(60, 150)])


def test_merged_runs_and_alignment(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_run(logs / "seg1", range(0, 100), value=1.0)
    write_run(logs / "seg2", range(80, 120), value=3.0)
    index = RunIndex(tmp_path / "runs.sqlite")
    index.update(logs)
    index.merge("whole", ["seg1", "seg2"])
    whole = index.series("whole", "loss")
    assert list(whole.steps) == list(range(120))
    assert whole.values[79] == pytest.approx(1.0 / 80) and whole.values[80] == pytest.approx(3.0 / 81)
    (merged_series, x_step), (seg_series, x_time) = index.compare(["whole", "seg2"], "loss", "time")
    assert x_time[0] == 0.0 and np.all(np.diff(x_time) >= 0)
    with pytest.raises(VigilInputError, match="already exists"):
        index.merge("whole", ["seg1", "seg2"])
    with pytest.raises(VigilInputError, match="unknown run"):
        index.merge("x", ["seg1", "nope"])
    with pytest.raises(VigilInputError, match="not merged runs"):
        index.merge("y", ["whole", "seg1"])
    with pytest.raises(VigilInputError, match="no scalar"):
        index.series("seg1", "accuracy")


def test_a_file_being_written_is_read_to_its_last_whole_record_then_continued(tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_run(source / "r", range(0, 100))
    event_file = next((source / "r").glob("events.out.tfevents.*"))
    data = event_file.read_bytes()
    live = tmp_path / "logs" / "r"
    live.mkdir(parents=True)
    target = live / event_file.name
    target.write_bytes(data[: len(data) // 2 + 7])  # cut inside a record, as a writer mid-flush leaves it
    index = RunIndex(tmp_path / "runs.sqlite")
    first = index.update(tmp_path / "logs")["r"]
    assert 0 < first < 200
    target.write_bytes(data)
    second = index.update(tmp_path / "logs")["r"]
    assert first + second == 200
    assert list(index.series("r", "loss").steps) == list(range(100))


def test_a_corrupt_record_stops_that_file_only(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_run(logs / "good", range(0, 20))
    write_run(logs / "bad", range(0, 20))
    bad_file = next((logs / "bad").glob("events.out.tfevents.*"))
    raw = bytearray(bad_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad_file.write_bytes(bytes(raw))
    index = RunIndex(tmp_path / "runs.sqlite")
    added = index.update(logs)
    assert added["good"] == 40 and added.get("bad", 0) < 40
    assert len(index.series("good", "loss").steps) == 20


def test_downsampling_keeps_spikes(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    writer = SummaryWriter(log_dir=str(logs / "spiky"))
    for step in range(5000):
        writer.add_scalar("loss", 100.0 if step == 3333 else 1.0, global_step=step)
    writer.close()
    index = RunIndex(tmp_path / "runs.sqlite")
    index.update(logs)
    shown = index.series("spiky", "loss").downsampled(200)
    assert len(shown.steps) <= 200 and 3333 in shown.steps.tolist() and shown.values.max() == 100.0
    ((preview, x),) = index.compare(["spiky"], "loss")  # the stored 1,000-point preview
    assert len(preview.steps) <= 1000 and 3333 in x.tolist() and preview.values.max() == 100.0


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="does not exist"):
        RunIndex(tmp_path / "i.sqlite").update(tmp_path / "missing")
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 1000)
    with pytest.raises(VigilInputError, match="not a readable database"):
        RunIndex(bad)
    assert bad.read_bytes() == b"garbage" * 1000


def test_cli_index_ls_compare_merge(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_run(logs / "a", range(0, 30))
    write_run(logs / "b", range(20, 40))
    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home")}

    def vigil(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vigil", *args], capture_output=True, text=True, env=env)

    assert json.loads(vigil("runs", "index", str(logs), "--json").stdout) == {"a": 60, "b": 40}
    assert vigil("runs", "merge", "ab", "a", "b").returncode == 0
    listed = json.loads(vigil("runs", "ls", "--json").stdout)
    assert [r["name"] for r in listed] == ["a", "b", "ab"] and listed[2]["merged_from"] == ["a", "b"]
    compared = json.loads(vigil("runs", "compare", "a", "ab", "--tag", "loss", "--json").stdout)
    assert [len(c["x"]) for c in compared] == [30, 40]
    again = vigil("runs", "merge", "ab", "a", "b")
    assert again.returncode == 2 and "already exists" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    shutil.rmtree(logs)
    gone = vigil("runs", "index", str(logs))
    assert gone.returncode == 2 and "does not exist" in gone.stderr
