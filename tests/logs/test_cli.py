"""`vigil logs parse | triage | scalars | signatures`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from vigil.faces.cli.main import app
from vigil_eval.logcorpus import simulate_failure

runner = CliRunner()


def test_parse_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_text("worker 1 up\nworker 22 up\ndisk full on /dev/sda1\n")
    result = runner.invoke(app, ["logs", "parse", str(log), "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert rows[0]["template_id"] == rows[1]["template_id"] != rows[2]["template_id"]
    assert rows[0]["template"] == "worker <*> up"


def test_parse_resumes_from_state(tmp_path: Path) -> None:
    state = tmp_path / "templates.json"
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text("job 7 started\n")
    second.write_text("job 9 started\n")
    runner.invoke(app, ["logs", "parse", str(first), "--state", str(state)])
    result = runner.invoke(app, ["logs", "parse", str(second), "--state", str(state), "--json"])
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert rows[0]["template_id"] == "t1"


def test_triage_json(tmp_path: Path) -> None:
    label = simulate_failure("cuda_oom", tmp_path / "job", seed=2, world=4)
    result = runner.invoke(app, ["logs", "triage", str(tmp_path / "job"), "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert (verdict["root"]["source"], verdict["root"]["lineno"]) == (label.source, label.lineno)
    assert verdict["root"]["fault_type"] == "gpu_oom"
    table = runner.invoke(app, ["logs", "triage", str(tmp_path / "job")])
    assert table.exit_code == 0 and "root error on rank" in table.stdout


def test_signatures_json() -> None:
    result = runner.invoke(app, ["logs", "signatures", "--json"])
    ids = {s["id"] for s in json.loads(result.stdout)}
    assert {"nvrm.xid", "cuda.oom", "nccl.watchdog_timeout", "python.exception"} <= ids


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "vigil", "logs", "triage", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error:") and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_triage_reads_a_slurm_output_file_on_its_own(tmp_path: Path) -> None:
    out = tmp_path / "slurm-4242.out"
    out.write_text("epoch 3 step 120 loss 2.31\n"
                   "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.batch cgroup. Some of your "
                   "processes may have been killed by the cgroup out-of-memory handler.\n")
    result = runner.invoke(app, ["logs", "triage", str(out), "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert verdict["job"] == "slurm-4242"
    assert (verdict["root"]["source"], verdict["root"]["lineno"]) == ("slurm-4242.out", 2)
    assert verdict["root"]["fault_type"] == "host_oom"


def test_scalars_on_a_run_with_nothing_recorded_says_so(tmp_path: Path) -> None:
    (tmp_path / "events.out.tfevents.1780000000.node1.1.0").write_bytes(b"")  # the writer opened, nothing flushed
    result = runner.invoke(app, ["logs", "scalars", str(tmp_path)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert "no scalars recorded yet" in said and "no problems found" not in said
