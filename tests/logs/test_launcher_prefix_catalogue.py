"""Launcher and log-collector line prefixes: the root error is read under each, from the producers' source.

A job-wide log interleaves the lines of several processes, each under the prefix of whatever relayed it. Each row
below is one producer's prefix, built from its format string; the job it wraps is the same for every row - two workers
interleaved, worker 1 printing a traceback line by line between worker 0's lines, then the exception - and the test
asserts that triage names worker 1's exception line, reads its traceback (the user's frame) and attributes it to the
rank, host and worker the prefix names. Where a producer's prefix names no process (the CRI format), the job is one
process's lines.

Sources (read in the stored copies of each repository):

* Ray (github.com/ray-project/ray, stored versions of ``python/ray/_private/worker.py``): ``print_worker_logs``
  prints ``"{color}({prefix}{pid}, ip={ip}){RESET_ALL} {line}"`` - ``prefix_for`` is ``"{actor_name} pid="`` or
  ``"{task_name} pid="``, nothing for the raylet and the autoscaler, and the ``, ip=`` part only for another node's
  lines; the colour codes are colorama's (CYAN, or one per pid under ``RAY_COLOR_PREFIX=1``). The deduplicator
  (``python/ray/_private/ray_logging``: ``DedupState.formatted``) appends ``" [repeated {count}x across cluster]"``,
  the first time with a note on ``RAY_DEDUP_LOGS`` (``python/ray/tests/test_logging.py`` test_dedup_logs asserts the
  suffix).
* SkyPilot runs a task's commands as Ray tasks named ``"{node_name}, rank={rank},"`` so Ray's prefix reads
  ``(head, rank=0, pid=2431)`` and ``(worker1, rank=1, pid=2215, ip=172.31.38.117)``: the node's rank, not a
  process rank.
* Open MPI (github.com/open-mpi/ompi, stored ``orte/mca/iof/base`` output code): ``--tag-output`` puts
  ``"[%s,%s]%s"`` - job id, rank, ``<stdout>`` / ``<stderr>`` / ``<stddiag>`` - and a colon before every line; with
  ``--timestamp-output`` a ctime stamp stands before the tag. Horovod's ``horovodrun`` relays the same tag. PRRTE
  (Open MPI 5) puts a space after the colon.
* kubectl (github.com/kubernetes/kubernetes, stored ``staging/src/k8s.io/kubectl/pkg/cmd/logs/logs.go``):
  ``addPrefixIfNeeded`` writes ``fmt.Sprintf("[pod/%s/%s] ", ref.Name, containerName)`` for ``--prefix``.
* The CRI log format the kubelet and containerd write under ``/var/log/pods``: ``<RFC 3339 nano time> <stdout|stderr>
  <P|F> <line>`` (the collectors' CRI parsers in the stored copies of OpenTelemetry's stanza and Loki read it so).
* Not read in source here, from the tools' manuals: ``srun --label`` (``0: ``, the task id, padded to the widest),
  pdsh's ``host: `` (DeepSpeed's multi-node runner launches through pdsh: ``worker-0: ``), docker compose's
  ``service-1  | ``, syslog / journald's short format ``Dec  6 21:00:00 host prog[pid]: ``. torchrun's
  ``[rank3]:`` / ``[default3]:`` (``--tee``, ``--local-ranks-filter``; accelerate launches through torchrun) was read
  before this survey.

DeepSpeed's own logger (``[2024-01-01 00:00:00,000] [INFO] [launch.py:...]``) is a timestamp and level, not a relay's
prefix: it stays part of the line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from vigil.knowledge.line_prefix import split_prefix
from vigil.logs.triage import triage

Wrap = Callable[[int, int, str], str]  # (worker, second, line) -> the line as the relay prints it


@dataclass(frozen=True)
class Prefix:
    name: str
    source: str
    wrap: Wrap
    rank: int | None = None  # what the prefix says of worker 1
    node: str | None = None
    worker: str | None = None
    interleaved: bool = True


def _ray(name: str, ip: bool = False, colour: bool = False) -> Wrap:
    def wrap(w: int, s: int, line: str) -> str:
        head = f"({name}pid={4100 + w}" + (f", ip=10.0.0.{w + 1})" if ip else ")")
        return (f"\x1b[36m{head}\x1b[0m " if colour else f"{head} ") + line
    return wrap


def _skypilot(w: int, s: int, line: str) -> str:
    return ("(head, rank=0, pid=2431) " if w == 0 else "(worker1, rank=1, pid=2215, ip=172.31.38.117) ") + line


PREFIXES = [
    Prefix("torchrun --tee", "torch/distributed/elastic/multiprocessing (read before)",
           lambda w, s, line: f"[rank{w}]:{line}", rank=1),
    Prefix("torchrun, older elastic", "torch/distributed/elastic (read before)",
           lambda w, s, line: f"[default{w}]:{line}", rank=1),
    Prefix("Ray actor", "ray python/ray/_private/worker.py print_worker_logs (stored)", _ray("RayTrainWorker "),
           worker="RayTrainWorker pid=4101"),
    Prefix("Ray actor on another node", "ray worker.py print_worker_logs ', ip=' form (stored)",
           _ray("WorkerDict ", ip=True), node="10.0.0.2", worker="WorkerDict pid=4101"),
    Prefix("Ray task, coloured", "ray worker.py color_for / colorama codes (stored)",
           _ray("train_loop_per_worker ", ip=True, colour=True), node="10.0.0.2",
           worker="train_loop_per_worker pid=4101"),
    Prefix("Ray, bare pid", "ray worker.py prefix_for without a name (stored)", _ray(""), worker="pid=4101"),
    Prefix("SkyPilot", "SkyPilot's Ray task names under Ray's prefix", _skypilot, node="172.31.38.117",
           worker="worker1, rank=1, pid=2215"),
    Prefix("srun --label", "srun(1) --label", lambda w, s, line: f"{w}: {line}", rank=1),
    Prefix("srun --label, 16 tasks", "srun(1) --label, padded", lambda w, s, line: f"{w + 9:>2}: {line}", rank=10),
    Prefix("mpirun --tag-output", "ompi orte/mca/iof/base (stored)",
           lambda w, s, line: f"[1,{w}]<stderr>:{line}", rank=1),
    Prefix("Horovod / mpirun, stdout", "ompi orte/mca/iof/base <stdout> (stored)",
           lambda w, s, line: f"[1,{w + 2}]<stdout>:{line}", rank=3),
    Prefix("PRRTE --output tag", "Open MPI 5 / PRRTE, a space after the colon",
           lambda w, s, line: f"[1,{w}]<stderr>: {line}", rank=1),
    Prefix("mpirun --tag-output --timestamp-output", "ompi orte/mca/iof/base, ctime before the tag",
           lambda w, s, line: f"Sun Dec  6 21:00:{s:02d} 2026[1,{w}]<stderr>:{line}", rank=1),
    Prefix("pdsh / DeepSpeed multi-node", "pdsh(1) host prefix; deepspeed/launcher/multinode_runner.py PDSHRunner",
           lambda w, s, line: f"worker-{w}: {line}", node="worker-1"),
    Prefix("pdsh over torchrun", "pdsh's host, then torchrun's rank",
           lambda w, s, line: f"gpu-node-0{w}: [rank{8 + w}]: {line}", rank=9, node="gpu-node-01"),
    Prefix("pdsh, an address", "pdsh(1) host prefix, hosts given as addresses",
           lambda w, s, line: f"10.1.0.{w + 11}: {line}", node="10.1.0.12"),
    Prefix("kubectl logs --prefix", "kubectl pkg/cmd/logs/logs.go addPrefixIfNeeded (stored)",
           lambda w, s, line: f"[pod/llama-ft-worker-{w}/pytorch] {line}", worker="pod/llama-ft-worker-1/pytorch"),
    Prefix("docker compose", "docker compose logs, service-N and padding",
           lambda w, s, line: f"trainer-{w + 1}  | {line}", worker="trainer-2"),
    Prefix("CRI log file", "kubelet / containerd CRI format (collectors' parsers, stored)",
           lambda w, s, line: f"2026-12-06T21:00:{s:02d}.123456789Z stderr F {line}", interleaved=False),
    Prefix("journald short", "journalctl -o short", lambda w, s, line: f"Dec 06 21:00:{s:02d} gpu{w:02d} "
           f"python[{3100 + w}]: {line}", node="gpu01"),
    Prefix("syslog RFC 3164", "syslog's short form, the day padded with a space",
           lambda w, s, line: f"Dec  6 21:00:{s:02d} node-{w} train.sh[{77 + w}]: {line}", node="node-1"),
    Prefix("CRI over kubectl over Ray", "the relays stacked: a Ray worker's pod log read with --prefix",
           lambda w, s, line: f"[pod/raycluster-head/ray-head] 2026-12-06T21:00:{s:02d}.5Z stdout F "
           + _ray("RayTrainWorker ", ip=True)(w, s, line), node="10.0.0.2", worker="RayTrainWorker pid=4101"),
]

# (worker, line); worker 1's traceback is interleaved with worker 0's progress, and worker 0 reports the collective
# that worker 1 never joined only after it.
TRACEBACK_JOB = [
    (0, "Epoch 3 step 1200 loss 2.3141"),
    (1, "Epoch 3 step 1200 loss 2.3098"),
    (1, "Traceback (most recent call last):"),
    (0, "Epoch 3 step 1201 loss 2.3120"),
    (1, '  File "/workspace/train.py", line 88, in <module>'),
    (1, "    main()"),
    (0, "Epoch 3 step 1202 loss 2.3102"),
    (1, '  File "/workspace/train.py", line 61, in main'),
    (1, "    loss = model(batch)"),
    (1, "ValueError: Expected input batch_size (32) to match target batch_size (31)."),
    (0, "[E1206 21:00:09.000000 4100 ProcessGroupNCCL.cpp:1316] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1203, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600043 milliseconds before timing out."),
]
CUDA_JOB = [
    (0, "Epoch 3 step 1200 loss 2.3141"),
    (1, "Traceback (most recent call last):"),
    (0, "Epoch 3 step 1201 loss 2.3120"),
    (1, '  File "/workspace/train.py", line 61, in main'),
    (1, "    loss.backward()"),
    (1, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    (0, "[E1206 21:00:09.000000 4100 ProcessGroupNCCL.cpp:1316] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1203, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600043 milliseconds before timing out."),
]


def _write(tmp_path: Path, entry: Prefix, job: list[tuple[int, str]], root: str) -> tuple[Path, int]:
    """The job's log under the prefix, and the line number of the root (worker 1's exception)."""
    rows = job if entry.interleaved else [(w, line) for w, line in job if w == 1]
    log = tmp_path / "job.log"
    log.write_text("".join(entry.wrap(w, i, line) + "\n" for i, (w, line) in enumerate(rows)))
    return log, next(i for i, (w, line) in enumerate(rows, 1) if w == 1 and line.startswith(root))


@pytest.mark.parametrize("entry", PREFIXES, ids=[p.name for p in PREFIXES])
def test_an_exception_under_the_prefix_is_the_root_with_its_traceback_and_its_writer(tmp_path: Path,
                                                                                      entry: Prefix) -> None:
    log, expected = _write(tmp_path, entry, TRACEBACK_JOB, "ValueError")
    result = triage(log)
    root = result.root
    assert root is not None and root.lineno == expected, (entry.source, result.summary)
    assert root.signature == "python.exception" and root.line.startswith("ValueError: Expected"), entry.source
    assert root.attrs.get("user_frame") == "/workspace/train.py:61 in main", (entry.source, root.attrs)
    if entry.interleaved:
        assert (root.rank, root.node, root.attrs.get("worker")) == (entry.rank, entry.node, entry.worker), \
            entry.source


@pytest.mark.parametrize("entry", PREFIXES, ids=[p.name for p in PREFIXES])
def test_a_cuda_error_under_the_prefix_outranks_the_peer_timeout(tmp_path: Path, entry: Prefix) -> None:
    log, expected = _write(tmp_path, entry, CUDA_JOB, "RuntimeError")
    result = triage(log)
    root = result.root
    assert root is not None and root.lineno == expected, (entry.source, result.summary)
    assert root.signature.startswith("cuda."), (entry.source, root.signature)
    assert root.attrs.get("user_frame") == "/workspace/train.py:61 in main", (entry.source, root.attrs)


def test_ray_dedup_suffix_is_read_off_and_counted(tmp_path: Path) -> None:
    line = ("(RayTrainWorker pid=4101, ip=10.0.0.2) ValueError: Expected input batch_size (32) to match target "
            "batch_size (31). [repeated 7x across cluster] (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 "
            "to disable log deduplication, or see https://docs.ray.io/en/master/ray-observability/user-guides/"
            "configure-logging.html#log-deduplication for more options.)")
    (tmp_path / "driver.log").write_text(line + "\n")
    result = triage(tmp_path)
    assert result.root is not None and result.root.signature == "python.exception", result.summary
    assert result.root.attrs["message"].endswith("batch_size (31).")
    assert result.root.attrs["repeated"] == 7


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "srun: error: gpu-07: task 3: Exited with exit code 1",
    "slurmstepd: error: *** STEP 4242.0 ON gpu-07 CANCELLED AT 2025-06-01T10:00:00 ***",
    "n000:1234:5678 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "  File \"/workspace/train.py\", line 61, in main",
    "Epoch 3: 100%|##########| 1200/1200 [10:00<00:00,  2.00it/s]",
])
def test_a_line_with_no_relay_prefix_is_left_whole(line: str) -> None:
    """An exception's class, a launcher's own name, NCCL's host:pid:tid and a progress bar are not relays' prefixes."""
    assert split_prefix(line) is None, line


def test_the_survey_counts() -> None:
    assert len(PREFIXES) == 22


def test_srun_labels_task_is_kept_under_a_ranks_prefix() -> None:
    """srun --label's task names the torchrun agent (one a node) a worker's line came through; the inner [rankN]:
    names the worker."""
    prefix = split_prefix("1: [rank8]: RuntimeError: CUDA error: an illegal memory access was encountered")
    assert prefix is not None and (prefix.task, prefix.rank, prefix.rank_scope) == (1, 8, "rank")
