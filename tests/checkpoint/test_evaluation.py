"""`vigil checkpoint watch`: every checkpoint of a real training job evaluated exactly once, across crashes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from vigil.checkpoint.evaluation import CheckpointEvaluator, EvalConfig, EvalState, Ledger
from vigil.checkpoint.manager import complete_steps
from vigil.model import VigilInputError
from vigil.run.launcher import free_port

EVAL_JOB = Path(__file__).with_name("eval_job.py")
EVAL = f"{sys.executable} {EVAL_JOB}"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of the tiny data-parallel job: checkpoints at steps 4, 8, 12, 16, 20."""
    root = tmp_path_factory.mktemp("job")
    env = dict(
        os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
    )
    subprocess.run(
        [sys.executable, "-m", "vigil_eval.tinytrain", "--steps", "20", "--run-dir", str(root / "run"),
         "--checkpoint-dir", str(root / "ckpt"), "--checkpoint-every", "4", "--keep-last", "100"],
        env=env, check=True, timeout=300,
    )
    assert complete_steps(root / "ckpt") == [4, 8, 12, 16, 20]
    return root / "ckpt"


def copy_of(checkpoints: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(checkpoints), str(target)], check=True)
    return target


def runs_per_step(log: Path) -> Counter[int]:
    return Counter(int(line) for line in log.read_text().split())


def watch(directory: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "vigil", "checkpoint", "watch", str(directory), "--eval", f"{EVAL} {{checkpoint}}",
         "--interval", "0.1", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_every_checkpoint_is_evaluated_once_with_scalars(checkpoints: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ckpt = copy_of(checkpoints, tmp_path)
    env = dict(os.environ, EVAL_LOG=str(tmp_path / "runs.log"), VIGIL_HOME=str(tmp_path / "home"))
    done = watch(ckpt, env, "--once", "--max-parallel", "2", "--logdir", str(tmp_path / "tb"))
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    assert runs_per_step(tmp_path / "runs.log") == Counter({4: 1, 8: 1, 12: 1, 16: 1, 20: 1})

    listed = subprocess.run([sys.executable, "-m", "vigil", "checkpoint", "evals", str(ckpt), "--json"],
                            capture_output=True, text=True, env=env, check=True)
    records = json.loads(listed.stdout)
    assert [r["step"] for r in records] == [4, 8, 12, 16, 20]
    assert all(r["state"] == "done" and r["attempts"] == 1 for r in records)
    assert [r["metrics"]["step_seen"] for r in records] == [4, 8, 12, 16, 20]
    losses = [r["metrics"]["loss"] for r in records]
    assert losses[-1] < losses[0]  # the loss fell as the job trained: the evaluation read the real weights

    events = EventAccumulator(str(tmp_path / "tb" / "eval"))
    events.Reload()
    scalars = sorted(events.Scalars("eval/loss"), key=lambda s: s.step)  # written as evaluations finish
    assert [s.step for s in scalars] == [4, 8, 12, 16, 20]
    assert [round(s.value, 5) for s in scalars] == [round(v, 5) for v in losses]

    # A second watcher finds nothing new to do.
    again = watch(ckpt, env, "--once")
    again.communicate(timeout=120)
    assert runs_per_step(tmp_path / "runs.log") == Counter({4: 1, 8: 1, 12: 1, 16: 1, 20: 1})


def test_a_killed_watcher_neither_repeats_nor_misses(checkpoints: Path, tmp_path: Path) -> None:
    ckpt = copy_of(checkpoints, tmp_path)
    gate = tmp_path / "gate"
    gate.mkdir()
    log = tmp_path / "runs.log"
    env = dict(os.environ, EVAL_LOG=str(log), EVAL_GATE=str(gate), VIGIL_HOME=str(tmp_path / "home"))
    first = watch(ckpt, env, "--max-parallel", "2")
    deadline = time.monotonic() + 120
    while not (log.is_file() and len(runs_per_step(log)) == 2):  # two evaluations started and held open
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    for step in (4, 8, 12, 16, 20):
        (gate / str(step)).touch()
    second = watch(ckpt, env, "--once", "--max-parallel", "2")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert runs_per_step(log) == Counter({4: 1, 8: 1, 12: 1, 16: 1, 20: 1})
    ledger = Ledger(ckpt)
    assert [(r.step, r.state, r.attempts) for r in ledger.records()] == [
        (s, EvalState.DONE, 1) for s in (4, 8, 12, 16, 20)
    ]
    ledger.close()


def test_a_crashed_evaluation_is_retried_then_becomes_an_incident(checkpoints: Path, tmp_path: Path) -> None:
    ckpt = copy_of(checkpoints, tmp_path)
    log = tmp_path / "runs.log"
    env = dict(os.environ, EVAL_LOG=str(log), EVAL_FAIL_ONCE="8", VIGIL_HOME=str(tmp_path / "home"))
    done = watch(ckpt, env, "--once", "--retries", "1")
    done.communicate(timeout=300)
    assert runs_per_step(log)[8] == 2
    ledger = Ledger(ckpt)
    assert {r.step: (r.state, r.attempts) for r in ledger.records()}[8] == (EvalState.DONE, 2)
    ledger.close()

    (tmp_path / "second").mkdir()
    ckpt2 = copy_of(checkpoints, tmp_path / "second")
    done = watch(ckpt2, {**env, "EVAL_LOG": str(tmp_path / "runs2.log")}, "--once", "--retries", "0", "--job", "j7")
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    incidents = subprocess.run([sys.executable, "-m", "vigil", "incidents", "--json"], capture_output=True,
                               text=True, env=env, check=True)
    found = [i for i in json.loads(incidents.stdout) if "checkpoint_eval_failed" in i["fault_types"]]
    assert len(found) == 1 and found[0]["scope"] == "job/j7" and "step 8" in found[0]["title"]


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="does not exist"):
        CheckpointEvaluator(tmp_path / "missing", EvalConfig(command=["true"]))
    with pytest.raises(VigilInputError, match="empty"):
        EvalConfig(command=[])
    with pytest.raises(VigilInputError, match="timeout"):
        EvalConfig(command=["true"], timeout_s=float("nan"))
    (tmp_path / "c").mkdir()
    bad = subprocess.run([sys.executable, "-m", "vigil", "checkpoint", "watch", str(tmp_path / "c"), "--eval",
                          "'unclosed"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_a_watcher_says_it_started(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    env = dict(os.environ, VIGIL_HOME=str(tmp_path / "home"))
    watcher = watch(tmp_path / "c", env)
    try:
        assert watcher.stderr is not None
        ready, _, _ = select.select([watcher.stderr], [], [], 60)  # the start-up line, not a wait for a checkpoint
        first = watcher.stderr.readline() if ready else ""
    finally:
        watcher.terminate()
        watcher.communicate(timeout=60)
    assert first.startswith(f"watching {tmp_path / 'c'} every 0.1 s for complete checkpoints"), first
