"""`vigil detect train` and `vigil detect eval` on a small CSV data set in the documented format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from vigil.faces.cli.main import app
from vigil.model import VigilInputError

torch.set_num_threads(1)


def write_entities(root: Path, names: list[str]) -> None:
    rng = np.random.default_rng(0)
    for k, name in enumerate(names):
        n = 400
        t = np.arange(n)
        a = np.sin(t / 10 + k) + rng.normal(0, 0.1, n)
        b = np.cos(t / 10 + k) + rng.normal(0, 0.1, n)
        label = np.zeros(n, dtype=int)
        for start in (240, 320):
            label[start:start + 12] = 1
            a[start:start + 12] += 3.0
        split = ["train" if i < 200 else "test" for i in range(n)]
        rows = ["timestamp,cpu,mem,label,split"] + [f"{i},{a[i]:.4f},{b[i]:.4f},{label[i]},{split[i]}"
                                                      for i in range(n)]
        (root / f"{name}.csv").write_text("\n".join(rows) + "\n")


def test_eval_json_protocol_b(tmp_path: Path) -> None:
    write_entities(tmp_path, ["a", "b", "c"])
    result = CliRunner().invoke(app, ["detect", "eval", "--data", str(tmp_path), "--format", "csv",
                                      "--train-entities", "a,b", "--detectors", "tce,pca,random",
                                      "--history", "40", "--epochs", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert {r["detector"] for r in out["results"]} == {"tce", "pca", "random"}
    assert {r["entity"] for r in out["results"]} == {"c"}
    for row in out["results"]:
        assert {"f1", "auc_pr", "vus_pr", "f1_pa", "event_recall", "delay"} <= set(row)
    assert out["summary"]["pca"]["auc_pr"] > out["summary"]["random"]["auc_pr"]
    assert out["protocol"].startswith("b")


def test_eval_table_protocol_a_and_bad_input(tmp_path: Path) -> None:
    write_entities(tmp_path, ["a"])
    result = CliRunner().invoke(app, ["detect", "eval", "--data", str(tmp_path), "--format", "csv",
                                      "--detectors", "kmeans,random", "--history", "20"])
    assert result.exit_code == 0, result.output
    assert "point-a" in result.output and "kmeans" in result.output
    bad = CliRunner().invoke(app, ["detect", "eval", "--data", str(tmp_path), "--format", "csv",
                                   "--detectors", "magic"])
    assert isinstance(bad.exception, VigilInputError) and "unknown detector" in str(bad.exception)


def test_train_chooses_on_inner_folds_as_the_benchmark_does(tmp_path: Path) -> None:
    from vigil.detect.learned.tce import full_mix, load_detector
    from vigil_eval.detection import (
        SERVER_TCE,
        candidates_for,
        choose_on_inner_folds,
        history_windows,
        labelled_windows,
        scaled_inputs,
        variant_grid,
    )
    from vigil_eval.formats import load

    write_entities(tmp_path, ["a", "b", "c"])
    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["detect", "train", "--data", str(tmp_path), "--format", "csv",
                                      "--out", str(out), "--history", "40", "--epochs", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["features"] == ["cpu", "mem"] and meta["classes"] == ["normal", "anomaly"]
    choice = report["choice"]
    assert meta["choice"] == choice and choice["development"] == ["a", "b", "c"] and choice["epochs"] == 1
    # The same inner folds, run directly, make the same choice: the command is the benchmark's inner loop.
    dataset = load("csv", tmp_path)
    params = {**SERVER_TCE, "history": 40, "epochs": 1, "members": 1, "scales": (12, 24)}
    candidates = candidates_for("tce", params)
    direct = choose_on_inner_folds(scaled_inputs(dataset), candidates, ["a", "b", "c"], inner=2, history=40, seed=0)
    assert candidates[direct.candidate].normalise == choice["scaling"] and direct.variant == choice["variant"]
    assert direct.threshold == pytest.approx(choice["threshold"])
    model = load_detector(out)
    variant = variant_grid(model)[choice["variant"]]
    assert list(model.mix) == report["mix"] == list(full_mix(variant["mix"])) and model.smooth == variant["smooth"]
    assert model.combine == report["combine"] == variant["combine"]
    assert model.threshold_ == pytest.approx(choice["threshold"])
    # The saved model scores a machine against its own history, and the bursts rank above normal rows.
    series = scaled_inputs(dataset)[choice["scaling"]].entities["c"]
    windows = labelled_windows(series, history=40)
    scores = model.relative_score(windows, history_windows(series, history=40))
    assert scores[windows.labels > 0].mean() > scores[windows.labels == 0].mean()


def test_train_saves_under_the_vigil_home_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.config import settings

    write_entities(tmp_path, ["a", "b"])
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["detect", "train", "--data", str(tmp_path), "--format", "csv",
                                          "--history", "40", "--epochs", "1", "--json"])
    finally:
        settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["model"] == str(tmp_path / "home" / "models" / "tce")
    assert (tmp_path / "home" / "models" / "tce" / "meta.json").is_file() and not (tmp_path / ".vigil").exists()


def test_train_refuses_too_few_entities_for_the_inner_folds(tmp_path: Path) -> None:
    write_entities(tmp_path, ["a"])
    result = CliRunner().invoke(app, ["detect", "train", "--data", str(tmp_path), "--format", "csv",
                                      "--out", str(tmp_path / "m"), "--history", "40", "--epochs", "1"])
    assert isinstance(result.exception, VigilInputError) and "inner-fold choice needs" in str(result.exception)


@pytest.mark.parametrize("fmt", ["asd", "sim"])
def test_missing_data_is_a_clear_error(tmp_path: Path, fmt: str) -> None:
    result = CliRunner().invoke(app, ["detect", "eval", "--data", str(tmp_path / "none"), "--format", fmt])
    assert isinstance(result.exception, VigilInputError)
