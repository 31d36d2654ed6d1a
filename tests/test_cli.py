"""The spine's verbs, run as a user runs them: the installed `vigil` command in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vigil_command import vigil


@pytest.mark.slow
def test_demo_defaults_meet_the_targets_and_feed_the_read_commands(tmp_path: Path) -> None:
    out = json.loads(vigil("demo", "--json", home=tmp_path).stdout)
    assert out["faults_injected"] >= 8
    assert out["precision"] >= 0.9 and out["recall"] >= 0.9
    assert {"faults_injected", "faults_detected", "precision", "recall", "incidents"} <= set(out)
    incidents = json.loads(vigil("incidents", "--json", home=tmp_path).stdout)
    assert {i["id"] for i in incidents} == {i["id"] for i in out["incidents"]}
    nodes = json.loads(vigil("nodes", "--json", home=tmp_path).stdout)
    assert len(nodes) == 16 and all(len(n["gpus"]) == 8 for n in nodes)
    sick = {n["node"] for n in nodes if n["level"] != "healthy"}
    # One form of fault level in every JSON answer: the label.
    labels = {"healthy", "observe", "degraded", "drain", "isolate"}
    assert {i["level"] for i in incidents} <= labels and {n["level"] for n in nodes} <= labels
    assert {i["level"] for i in out["incidents"]} <= labels
    assert sick <= {e for i in incidents if i["status"] == "open" for e in
                    {f"node/{x.split('/')[1]}" for x in i["entities"] if x.split("/")[0] in ("gpu", "nic", "node")}}
    human = vigil("demo", "--minutes", "20", "--nodes", "4", home=tmp_path).stdout
    assert "precision" in human and "Injected faults" in human


def test_demo_ids_are_the_same_for_the_same_seed(tmp_path: Path) -> None:
    """Two runs with the same seed into fresh homes name the same incidents and anomalies (a link to an
    incident in a write-up still works after the demo is run again); ids stay unique within a store."""
    args = ("demo", "--nodes", "4", "--minutes", "30", "--seed", "3", "--json")
    first = json.loads(vigil(*args, "--home", str(tmp_path / "a"), home=tmp_path).stdout)["incidents"]
    second = json.loads(vigil(*args, "--home", str(tmp_path / "b"), home=tmp_path).stdout)["incidents"]
    assert first, "the demo opened no incident to compare"
    assert [(i["id"], i["anomalies"]) for i in first] == [(i["id"], i["anomalies"]) for i in second]
    ids = [i["id"] for i in first]
    anomalies = [a for i in first for a in i["anomalies"]]
    assert len(set(ids)) == len(ids) and len(set(anomalies)) == len(anomalies)
    stored = json.loads(vigil("incidents", "--json", home=tmp_path / "b").stdout)
    assert {i["id"] for i in stored} == set(ids)


def test_demo_refuses_to_overwrite_a_store_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "vigil.db").write_text("someone else's data")
    proc = vigil("demo", "--json", home=tmp_path, check=False)
    assert proc.returncode == 2
    assert "did not write" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "vigil.db").read_text() == "someone else's data"


def test_bad_flags_give_one_line_errors(tmp_path: Path) -> None:
    proc = vigil("demo", "--nodes", "0", "--home", str(tmp_path / "x"), home=tmp_path, check=False)
    assert proc.returncode == 2 and "nodes >= 1" in proc.stderr and "Traceback" not in proc.stderr
    proc = vigil("incidents", "--status", "weird", home=tmp_path, check=False)
    assert proc.returncode == 2 and "bad --status" in proc.stderr


def test_sim_writes_files(tmp_path: Path) -> None:
    out = json.loads(vigil("sim", "--out", str(tmp_path / "run"), "--nodes", "2", "--minutes", "10", "--json",
                           home=tmp_path).stdout)
    assert out["ticks"] == 60 and (tmp_path / "run" / "metrics" / "gpu.npz").exists()


@pytest.mark.slow
def test_demo_runs_a_trained_learned_detector_beside_the_rules(tmp_path: Path) -> None:
    run_dir, home = tmp_path / "run", tmp_path / "home"
    vigil("sim", "--out", str(run_dir), "--nodes", "4", "--minutes", "60", "--seed", "1", "--json", home=tmp_path)
    vigil("detect", "train", "--data", str(run_dir), "--format", "sim", "--history", "60", "--epochs", "2",
          "--out", str(home / "models" / "tce-gpu"), "--json", home=tmp_path)
    out = json.loads(vigil("demo", "--nodes", "4", "--minutes", "30", "--json", "--home", str(home),
                           home=tmp_path).stdout)
    assert out["detectors"] == ["rules", "tce"]
    rules_only = json.loads(vigil("demo", "--nodes", "4", "--minutes", "30", "--json", "--home",
                                  str(tmp_path / "plain"), home=tmp_path).stdout)
    assert rules_only["detectors"] == ["rules"]
