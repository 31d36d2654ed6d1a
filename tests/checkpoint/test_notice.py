"""A tidal preemption notice reaching a real training process: the notice signal (what ``scancel --signal=USR1``
delivers) makes it save a DCP checkpoint through the CheckpointManager and stop; a second run resumes from it.
The Kubernetes form: the deadline annotation in a Downward API file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vigil.checkpoint.manager import complete_steps
from vigil.checkpoint.notice import PreemptionNotice

ROOT = Path(__file__).resolve().parents[2]

TRAIN = """
import sys, time
import torch
from vigil.checkpoint.manager import CheckpointManager
from vigil.checkpoint.notice import PreemptionNotice, checkpoint_on_notice

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
manager = CheckpointManager(sys.argv[1])
restored = manager.restore_latest(model, optimizer)
start = restored.step + 1 if restored else 0
notice = PreemptionNotice().install()
print("start", start, flush=True)
for step in range(start, 100000):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if checkpoint_on_notice(notice, manager, step, model, optimizer):
        print("checkpoint", step, notice.received.name, flush=True)
        break
    if step == start + 2:
        print("trained", step, flush=True)
    time.sleep(0.01)
manager.close()
"""


def _run_until_notice(script: Path, directory: Path) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, str(script), str(directory)], stdout=subprocess.PIPE, text=True,
                               env=env)
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("start"), first
    trained = process.stdout.readline()  # a few steps done: the checkpoint must land past the start
    assert trained.startswith("trained"), trained
    os.kill(process.pid, signal.SIGUSR1)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    (line,) = [x for x in out.splitlines() if x.startswith("checkpoint")]
    return int(first.split()[1]), line


@pytest.mark.slow
def test_notice_signal_checkpoints_through_the_manager_and_the_next_run_resumes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    start, line = _run_until_notice(script, tmp_path / "ckpt")
    step = int(line.split()[1])
    assert start == 0 and step > 0 and line.endswith("SIGUSR1")
    assert complete_steps(tmp_path / "ckpt") == [step]
    resumed, line = _run_until_notice(script, tmp_path / "ckpt")
    assert resumed == step + 1
    assert complete_steps(tmp_path / "ckpt")[-1] == int(line.split()[1]) > step


def test_kubernetes_deadline_annotation(tmp_path: Path) -> None:
    podinfo = tmp_path / "annotations"
    notice = PreemptionNotice(annotations=podinfo)
    assert not notice.requested()  # no file yet: the kubelet writes it
    podinfo.write_text('kueue.x-k8s.io/workload="job-train-spot-a-5c1d2"\n')
    assert not notice.requested()
    podinfo.write_text('kueue.x-k8s.io/workload="job-train-spot-a-5c1d2"\nvigil.dev/preempt-at="2026-12-02T15:00:00Z"\n')
    assert notice.requested() and notice.deadline() == 1796223600.0
    assert notice.take() and not notice.take()  # one checkpoint per notice
    podinfo.write_text('vigil.dev/preempt-at="2026-12-02T15:05:00Z"\n')
    assert notice.take()  # a new deadline is a new notice
    podinfo.write_text('vigil.dev/preempt-at="soon"\n')
    assert notice.requested() and notice.deadline() is None  # unreadable deadline: checkpoint anyway
