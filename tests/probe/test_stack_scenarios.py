"""Real gloo jobs on the stacks people train with - DDP (Python and built-in C++ comm hooks), FSDP2,
hand-written collectives - through `vigil launch`, one fault in one rank: verdict, culprit, timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vigil.diagnose.hang import HangDiagnosis
from vigil.remedy.audit import AuditLog
from vigil.remedy.jobspec import TrainingJob
from vigil.run.failover import FailoverSupervisor, LocalJob
from vigil.run.launcher import free_port, launch
from vigil.run.rank_procs import LAUNCHED_PATTERN, launched, surviving_ranks
from vigil.sources.probe.flight import ENV_DDP_RECORDING
from vigil.sources.probe.records import read_rank

JOB = Path(__file__).with_name("stack_job.py")
HANG_TIMEOUT = 3.0
WORLD = 3
LATENCY_BUDGET = HANG_TIMEOUT + 5.0

pytestmark = pytest.mark.slow


def run(tmp_path: Path, stack: str, fault: str, *extra: str, culprit: int = 1, world: int = WORLD,
        startup_grace: float = 60.0, env: dict[str, str] | None = None) -> HangDiagnosis:
    args = ["--stack", stack, "--fault", fault, "--rank", str(culprit), *extra]
    out = tmp_path / f"{stack}-{fault}"
    diagnosis = launch(JOB, args, nproc=world, hang_timeout=HANG_TIMEOUT, out_dir=out, startup_grace=startup_grace,
                       env=env)
    assert sorted(launched(out)) == list(range(world))
    assert surviving_ranks(out) == {}, "every rank the launcher started is stopped when it returns"
    return diagnosis


def start_nodes(out: Path, hang_timeout: float, *job_args: str, launch_args: tuple[str, ...] = (),
                node_names: tuple[str, str] | None = None, env: dict[str, str] | None = None
                ) -> list[subprocess.Popen[str]]:
    """Two `vigil launch` processes as two nodes of one job, 2 ranks each, sharing ``out``; ``node_names``
    name the two machines (VIGIL_NODE_NAME) where both run on this one."""
    port = str(free_port())
    return [
        subprocess.Popen(
            [sys.executable, "-m", "vigil", "launch", "script", str(JOB), "--nproc-per-node", "2", "--nnodes", "2",
             "--node-rank", str(node), "--master-port", port, "--hang-timeout", str(hang_timeout),
             "--out", str(out), "--json", *launch_args, "--", *job_args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **(env or {}), **({"VIGIL_NODE_NAME": node_names[node]} if node_names else {})},
        )
        for node in (0, 1)
    ]


def kill_launchers(launchers: list[subprocess.Popen[str]]) -> None:
    """A failed test still ends the launchers it started (and with them, their ranks)."""
    for launcher in launchers:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def node_verdicts(nodes: list[subprocess.Popen[str]]) -> list[HangDiagnosis]:
    """Each node's printed verdict of a hang (exit status 4); the launchers are ended whatever happens."""
    verdicts = []
    try:
        for node in nodes:
            stdout, _ = node.communicate(timeout=240)
            assert node.returncode == 4, stdout
            verdicts.append(HangDiagnosis.model_validate_json(stdout))
    finally:
        kill_launchers(nodes)
    return verdicts


def wait_until_gone(out: Path, timeout_s: float = 30.0) -> dict[int, int]:
    deadline = time.time() + timeout_s
    while (alive := surviving_ranks(out)) and time.time() < deadline:
        time.sleep(0.2)
    return alive


@pytest.mark.parametrize(("stack", "recording"), [("ddp", "ring"), ("ddp", "hook"), ("fsdp", "ring"),
                                                  ("ddp_builtin", "ring"), ("ddp_builtin", "hook"), ("manual", "ring")])
def test_rank_stuck_in_forward_is_the_culprit(tmp_path: Path, stack: str, recording: str) -> None:
    """DDP's gradient all_reduces are read from the Flight Recorder ring by default (a built-in C++ comm hook's
    too), or pass through the probe's Python comm hook (``VIGIL_DDP_RECORDING=hook``)."""
    diagnosis = run(tmp_path, stack, "forward", env={ENV_DDP_RECORDING: recording})
    assert diagnosis.verdict == "hang"
    assert diagnosis.culprit_ranks == [1]
    assert diagnosis.detected_after_s is not None
    assert HANG_TIMEOUT * 0.9 <= diagnosis.detected_after_s <= LATENCY_BUDGET
    assert diagnosis.fork_point is not None and diagnosis.fork_point.ranks == [1]
    if (stack, recording) == ("ddp_builtin", "hook"):
        # Without the ring the built-in hook's all_reduce never passes through Python: progress alone found it.
        assert "still compute while the others wait" in diagnosis.summary
    else:
        assert diagnosis.hang_kind == "not_enqueued"


STARTUP_GRACE = 10.0
# The probe's fallback: DDP through its Python comm hook, collectives issued from C++ unseen.
UNREAD_RING = {ENV_DDP_RECORDING: "hook"}


def test_compiled_collectives_are_read_from_the_ring(tmp_path: Path) -> None:
    """The c10d_functional operators a compiled graph calls pass through no Python collective API; the
    probe reads them from the Flight Recorder ring, so the rank stuck before its first one is named from the
    records."""
    diagnosis = run(tmp_path, "compiled_ops", "forward", "--at-step", "0", startup_grace=STARTUP_GRACE)
    assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.hang_kind) == ("hang", [1], "not_enqueued")
    assert "rank(s) [1] never entered all_reduce #1" in diagnosis.summary
    assert diagnosis.fork_point is not None and diagnosis.fork_point.ranks == [1]


def test_hang_before_the_first_step_in_a_collective_the_probe_never_saw(tmp_path: Path) -> None:
    """Gradients reduced through the c10d_functional operators a compiled graph calls (no Python collective
    API), with the Flight Recorder ring left unread: rank 1 is stuck in its very first forward, so no rank
    ever steps and the probe records no op. Past the startup allowance every rank's py-spy stack splits the
    job: the rank outside the collective."""
    diagnosis = run(tmp_path, "compiled_ops", "forward", "--at-step", "0", startup_grace=STARTUP_GRACE,
                    env=UNREAD_RING)
    assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.hang_kind) == ("hang", [1], "not_enqueued")
    assert "rank(s) [1] never entered it" in diagnosis.summary
    assert diagnosis.stack_source == "py-spy"
    assert diagnosis.fork_point is not None and diagnosis.fork_point.ranks == [1]
    # Timed from the moment the waiting ranks fell silent (their last compute before the collective): the
    # probe's start is earlier by however long torch took to import and rendezvous on this machine.
    out = tmp_path / "compiled_ops-forward"
    detected_at = json.loads((out / "run.json").read_text())["detected_at"]
    for rank in (0, 2):
        silent_since = read_rank(out, rank).last_compute
        assert silent_since is not None
        assert STARTUP_GRACE * 0.9 <= detected_at - silent_since <= STARTUP_GRACE + LATENCY_BUDGET


@pytest.mark.parametrize(("stack", "world", "group_ranks"), [("funcol", 3, [0, 1, 2]), ("mesh", 4, [0, 1])])
def test_functional_collectives_are_seen_and_name_the_culprit(
    tmp_path: Path, stack: str, world: int, group_ranks: list[int]
) -> None:
    """Functional collectives on the world group, and on the "dp" dimension of a 2 x 2 DeviceMesh (ranks 0-1
    and 2-3 each reduce in their own sub-group): recorded as ops of their group, so the rank that never
    entered its group's all_reduce is named from the records."""
    diagnosis = run(tmp_path, stack, "forward", world=world)
    assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.hang_kind) == ("hang", [1], "not_enqueued")
    assert "never entered all_reduce" in diagnosis.summary
    records = json.loads((tmp_path / f"{stack}-forward" / "rank0.json").read_text())["ops"]
    reduces = [op for op in records if op["op"] == "all_reduce"]
    assert reduces and {tuple(op["group_ranks"]) for op in reduces} == {tuple(group_ranks)}
    assert reduces[-1]["state"] == "started"
    assert all(op["state"] == "completed" for op in reduces[:-1])


@pytest.mark.parametrize(("stack", "waiting_in"), [("ddp", "all_reduce"), ("fsdp", "all_gather_single")])
def test_uneven_inputs_blame_the_rank_that_left_the_loop(tmp_path: Path, stack: str, waiting_in: str) -> None:
    diagnosis = run(tmp_path, stack, "uneven", culprit=2)
    assert diagnosis.verdict == "mismatch"
    assert diagnosis.culprit_ranks == [2]
    assert f"barrier no tensor where the others have {waiting_in}" in diagnosis.summary


@pytest.mark.parametrize("stack", ["ddp", "fsdp"])
def test_straggler_waits_least(tmp_path: Path, stack: str) -> None:
    diagnosis = run(tmp_path, stack, "straggler", "--steps", "12", "--sleep", "0.4")
    assert diagnosis.verdict == "slow"
    assert diagnosis.culprit_ranks == [1]
    waits = diagnosis.evidence[0].attrs["wait_by_rank"]
    assert min(waits, key=lambda rank: waits[rank]) == 1


@pytest.mark.parametrize(
    ("stack", "fault"), [("fsdp", "checkpoint"), ("ddp", "eval"), ("ddp_builtin", "warmup")]
)
def test_long_pauses_that_are_not_hangs(tmp_path: Path, stack: str, fault: str) -> None:
    diagnosis = run(tmp_path, stack, fault, "--sleep", str(2.5 * HANG_TIMEOUT), "--steps", "8")
    assert diagnosis.verdict == "ok", diagnosis.summary


def test_crash_under_fsdp_names_the_raising_rank(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "fsdp", "crash", culprit=0)
    assert diagnosis.verdict == "crash"
    assert diagnosis.culprit_ranks == [0]
    assert diagnosis.root_error is not None and "illegal memory access" in diagnosis.root_error


def test_native_call_holding_the_gil_under_ddp(tmp_path: Path) -> None:
    diagnosis = run(tmp_path, "ddp", "gil", culprit=2)
    assert diagnosis.verdict == "hang"
    assert diagnosis.culprit_ranks == [2]
    assert any("holds the GIL" in e.summary for e in diagnosis.evidence)
    # py-spy --native: the C frames it is stuck in (libc's sleep, called through ctypes' libffi).
    [native] = [e for e in diagnosis.evidence if "inside native code" in e.summary]
    assert any(frame.startswith(("sleep", "clock_nanosleep", "nanosleep")) for frame in native.attrs["native_frames"])


def test_job_spec_launch_gets_the_same_hang_verdict(tmp_path: Path) -> None:
    """`vigil launch --job` runs the ranks through the same launcher and supervisor as `vigil launch
    SCRIPT`: the rank stuck in DDP's forward is the culprit there too, not "the rank behind"."""
    spec = TrainingJob.from_dict({
        "metadata": {"name": "ddp-stuck"},
        "spec": {
            "replicas": WORLD,
            "command": ["python", str(JOB), "--stack", "ddp", "--fault", "forward", "--rank", "2"],
            "healthCheck": {"hangTimeout": f"{HANG_TIMEOUT:g}s"},
            "failoverPolicy": {"maxRetries": 0, "action": "restart"},
        },
    })
    report = FailoverSupervisor(LocalJob(spec, tmp_path / "run"), AuditLog(f"sqlite:///{tmp_path}/a.db")).run()
    assert not report.succeeded
    [anomaly] = report.anomalies
    assert (anomaly.fault_type, anomaly.entity) == ("training_hang", "job/ddp-stuck/rank/2")
    assert "never entered all_reduce" in anomaly.evidence[0].summary
    diagnosis_file = tmp_path / "run" / "probe" / "attempt0" / "diagnosis.json"
    written = HangDiagnosis.model_validate_json(diagnosis_file.read_text())
    assert written.culprit_ranks == [2] and written.hang_kind == "not_enqueued"
    assert sorted(launched(diagnosis_file.parent)) == list(range(WORLD))
    assert surviving_ranks(diagnosis_file.parent) == {}


def test_two_nodes_name_the_culprit_across_nodes(tmp_path: Path) -> None:
    """Two `vigil launch` processes as two nodes of one FSDP2 job (torchrun-style static rendezvous,
    2 ranks each, a shared run directory); the rank stuck in forward lives on node 1."""
    out = tmp_path / "shared"
    verdicts = node_verdicts(start_nodes(out, HANG_TIMEOUT, "--stack", "fsdp", "--fault", "forward", "--rank", "2"))
    for diagnosis in verdicts:
        assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.world_size) == ("hang", [2], 4)
        assert diagnosis.detected_after_s is not None and diagnosis.detected_after_s <= LATENCY_BUDGET
    # Every node stopped its own ranks, the spinning culprit on node 1 included.
    assert sorted(launched(out)) == [0, 1, 2, 3]
    assert surviving_ranks(out) == {}
    # Node 1's own py-spy stacks reached the verdict written by node 0.
    assert verdicts[0].stack_source == "py-spy" and 2 in verdicts[0].stacks


def test_two_nodes_find_a_hang_before_the_first_step(tmp_path: Path) -> None:
    """The pre-step case across two nodes: no rank ever steps and the probe records no op (c10d_functional
    operators, the Flight Recorder ring unread), rank 1 on node 0 is stuck in its first forward. Each node
    leaves its own ranks' py-spy stacks in the shared directory, so the split of the whole job - ranks 0, 2, 3
    in the collective - is made."""
    out = tmp_path / "shared"
    verdicts = node_verdicts(start_nodes(out, HANG_TIMEOUT, "--stack", "compiled_ops", "--fault", "forward",
                                         "--rank", "1", "--at-step", "0",
                                         launch_args=("--startup-grace", str(STARTUP_GRACE)), env=UNREAD_RING))
    for diagnosis in verdicts:
        assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.world_size) == ("hang", [1], 4)
        assert "rank(s) [1] never entered it" in diagnosis.summary
    assert sorted(verdicts[0].stacks) == [0, 1, 2, 3]
    assert sorted(surviving_ranks(out)) == []


@pytest.mark.parametrize(("node0_signal", "node1_signal"), [(signal.SIGTERM, signal.SIGKILL),
                                                            (signal.SIGKILL, signal.SIGHUP)])
def test_signalled_node_launchers_leave_no_rank_running(
    tmp_path: Path, node0_signal: signal.Signals, node1_signal: signal.Signals
) -> None:
    """Launchers stopped from outside mid-run - SIGTERM / SIGHUP (the launch's cleanup runs) or SIGKILL (the
    ranks die with their parent) - on a two-node FSDP2 job whose rank 2 spins in its forward pass."""
    out = tmp_path / "shared"
    nodes = start_nodes(out, 60.0, "--stack", "fsdp", "--fault", "forward", "--rank", "2", "--steps", "1000")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not all(
            (out / LAUNCHED_PATTERN.format(node=n)).exists() and (out / f"rank{2 * n + 1}.json").exists()
            for n in (0, 1)
        ):
            time.sleep(0.2)
        ranks = launched(out)
        assert sorted(ranks) == [0, 1, 2, 3]
        assert sorted(surviving_ranks(out)) == [0, 1, 2, 3]
        nodes[0].send_signal(node0_signal)
        nodes[1].send_signal(node1_signal)
        for node in nodes:
            assert node.wait(timeout=60) != 0
    finally:
        kill_launchers(nodes)
    assert wait_until_gone(out) == {}


def test_periodic_stacks_flag_the_machine_that_is_the_outlier_in_every_job(tmp_path: Path) -> None:
    """Two two-node DDP jobs on "machines" node-a and node-b, a py-spy sweep of every rank each second; in
    both jobs the rank that lags every step (sleeping while its peers wait in the gradient all_reduce)
    lives on node-b: `vigil stacks` clusters the sweeps and flags node-b, not node-a."""
    runs = []
    for job, slow_rank in (("first", "2"), ("second", "3")):
        out = tmp_path / job
        nodes = start_nodes(out, 30.0, "--stack", "ddp", "--fault", "straggler", "--rank", slow_rank, "--steps", "24",
                            "--sleep", "0.5", launch_args=("--stack-period", "1"), node_names=("node-a", "node-b"))
        try:
            for node in nodes:
                node.communicate(timeout=240)
                assert node.returncode == 0
        finally:
            kill_launchers(nodes)
        runs.append(str(out))
    result = subprocess.run([sys.executable, "-m", "vigil", "stacks", *runs, "--json"], capture_output=True,
                            text=True, timeout=120, check=True)
    report = json.loads(result.stdout)
    for job, slow_rank in zip(report["jobs"], (2, 3), strict=True):
        assert job["sweeps"] >= 3
        assert job["hosts"] == {"0": "node-a", "1": "node-a", "2": "node-b", "3": "node-b"}
        counts = {int(r): n for r, n in job["outlier_counts"].items()}
        assert max(counts, key=lambda rank: counts[rank]) == slow_rank
        assert 2 * counts[slow_rank] > job["sweeps"]
    machines = {m["host"]: m for m in report["machines"]}
    assert machines["node-b"]["flagged"] and machines["node-b"]["outlier_jobs"] == 2
    assert not machines["node-a"]["flagged"]
