"""A server install ([server], no [train] / [learn]) runs the demo: the learned detector's torch is imported only
once a trained model is there to load."""

from __future__ import annotations

import json
from pathlib import Path

from tests.extras import TRAIN_AND_LEARN, run_without


def test_demo_runs_without_the_training_and_learning_packages(tmp_path: Path) -> None:
    run, loaded = run_without(TRAIN_AND_LEARN, "demo", "--nodes", "2", "--gpus", "2", "--minutes", "10", "--json",
                              "--home", str(tmp_path / "demo"), home=tmp_path)
    assert run.returncode == 0, run.stderr
    assert loaded == []
    report = json.loads(run.stdout)
    assert report["detectors"] == ["rules"] and report["cluster"]["gpus"] == 4
