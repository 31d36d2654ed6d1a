"""`vigil launch --server URL`: the launch supervisor tells the Vigil server what it sees.

The job and its rank -> node / GPU placement once every rank is placed, each rank's exit as it happens, step
telemetry every ``interval_s`` (steps and step time from the probes, loss, gradient norm and tokens/s from the
ranks' heartbeat lines), the lines of the ranks' logs that the signature library names (as ``rank_log`` events,
``vigil.sources.collect.ranklog``) and the verdict when the job ends; the server's engine turns them into
incidents.

The ranks' logs (``OUT/rank<R>.log``, stdout and stderr) are followed as they grow, a bounded number of lines
per rank per look (``vigil.sources.collect.tail``); only the decoded events travel, with the exits and the verdict, in
the same reports, and at most ``MAX_LOG_EVENTS`` of them a report (the earliest: a cascade's first lines name
its cause).

Reporting never stands in the way of training: reports go out from a background thread, a server that is
down or refuses them costs one warning line, and what could not be sent is kept (bounded) and retried.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from vigil.diagnose.hang import HangDiagnosis
from vigil.model import Event, LaunchReport, LaunchVerdict, RankPlacement, RankState, StepTelemetry, rank_id
from vigil.remedy.heartbeat import ProgressTracker
from vigil.sources.collect.base import default_node_name
from vigil.sources.collect.rank_files import LOG_FILE_ATTR, LOG_OFFSET_ATTR
from vigil.sources.collect.ranklog import decode_rank_line
from vigil.sources.collect.tail import LogTail
from vigil.sources.probe.records import RankSnapshot

ROUTE = "/api/v1/launches"
# Reports kept while the server is away; the oldest telemetry goes first (placement, exits and the verdict
# are sent again with every later report, so only step history is lost).
MAX_BUFFERED = 2000
# Decoded log events one report carries at most (the server takes up to 10 000); beyond it they are counted
# (``logs_dropped``) and dropped.
MAX_LOG_EVENTS = 1000
# Decoded log events kept in all the reports waiting for the server; a new report's go when they are more.
MAX_BUFFERED_LOG_EVENTS = 20_000
# Looks at each rank's log when the job ends, for the lines its last moments wrote (each look is bounded).
FINAL_LOG_LOOKS = 8


def gpu_indices(nproc: int, env: Mapping[str, str] | None = None) -> list[int | None]:
    """The GPU each local rank uses, torchrun-style (local rank r -> r-th visible device); None where the node
    has no GPU for it. CUDA_VISIBLE_DEVICES, when it lists indices, says which devices are visible."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if not ids or not all(v.isdigit() for v in ids):
            return [None] * nproc
        return [int(ids[r]) if r < len(ids) else None for r in range(nproc)]
    count = _nvml_device_count()
    return [r if r < count else None for r in range(nproc)]


def _nvml_device_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: a node without GPUs
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


class LaunchReporter:
    """Builds the launch's reports from the supervisor's view and sends them to ``server_url``."""

    def __init__(
        self,
        server_url: str,
        job: str,
        world_size: int,
        nproc: int,
        out_dir: Path,
        *,
        token: str = "",
        node_rank: int = 0,
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
        node: str | None = None,
        gpus: list[int | None] | None = None,
        warn: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = server_url.rstrip("/") + ROUTE
        self.job = job
        self.world_size = world_size
        self.nproc = nproc
        self.node_rank = node_rank
        self.interval_s = interval_s
        self.node = node or default_node_name()
        self.gpus = gpus if gpus is not None else gpu_indices(nproc)
        self.clock = clock
        self.progress = ProgressTracker(out_dir, world_size)
        self.out_dir = out_dir
        self._tails: dict[int, LogTail] = {}
        self._logs: list[Event] = []
        self.logs_dropped = 0
        self._warn = warn or (lambda message: print(message, file=sys.stderr))
        self._client = httpx.Client(timeout=timeout_s, transport=transport,
                                    headers={"Authorization": f"Bearer {token}"} if token else {})
        self._pending: deque[LaunchReport] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._send_loop, name="vigil-launch-report", daemon=True)
        self._thread.start()
        self._placement: list[RankPlacement] = []
        self._exits: dict[int, int | None] = {}
        self._steps: list[StepTelemetry] = []
        self._next_telemetry = 0.0
        self.sent = 0
        self.failures = 0
        self._warned = False

    # ---------------------------------------------------------------- what the supervisor sees

    def watch(self, snapshots: Mapping[int, RankSnapshot], exit_codes: Mapping[int, int | None],
              pids: Mapping[int, int]) -> None:
        """One look, after each supervisor step: placement once all ranks are placed, exits as they happen,
        step telemetry every ``interval_s``, the ranks' new log lines (read at every look, sent with the next
        report, at the latest ``interval_s`` later). Only node 0 of a multi-node job reports (it sees every
        rank)."""
        if self.node_rank != 0:
            return
        now = self.clock()
        placed_now = not self._placement and self._place(snapshots, pids)
        changed = self._changed_exits(exit_codes)
        self.read_logs(now)
        due = False
        if now >= self._next_telemetry:
            self._next_telemetry = now + self.interval_s
            due = self._telemetry(snapshots, now) or bool(self._logs)
        if placed_now or changed or due:
            self._queue(now, ranks=changed)

    def read_logs(self, now: float, looks: int = 1) -> int:
        """Read what the ranks' logs gained (up to ``looks`` bounded looks at each), keep the events of the
        lines the signature library names; returns how many lines were read. Ranks of other nodes (their logs
        in the shared run directory) are read once every rank is placed: their node has cleared its old logs
        by then."""
        ranks = range(self.world_size) if self._placement else range(self.nproc * self.node_rank,
                                                                     self.nproc * (self.node_rank + 1))
        read = 0
        for rank in ranks:
            tail = self._tails.get(rank)
            if tail is None:
                tail = self._tails[rank] = LogTail(self.out_dir / f"rank{rank}.log")
            entity = rank_id(self.job, rank)
            for _ in range(looks):
                lines = tail.read()
                if not lines:
                    break
                read += len(lines)
                for offset, line in zip(tail.line_offsets, lines, strict=True):
                    event = decode_rank_line(entity, line, now)
                    if event is None:
                        continue
                    # where the line is, so the server stores a report sent again once and keeps two equal lines
                    # of one look (the agent's rank-log lines say the same, vigil.sources.collect.rank_files)
                    event.attrs[LOG_FILE_ATTR], event.attrs[LOG_OFFSET_ATTR] = str(tail.path), offset
                    if len(self._logs) < MAX_LOG_EVENTS:
                        self._logs.append(event)
                    else:
                        self.logs_dropped += 1
        return read

    def finish(self, diagnosis: HangDiagnosis, wait_s: float = 10.0) -> None:
        """The verdict, with the exits not reported yet; waits up to ``wait_s`` for the reports to go out (one
        try each: a server that is away does not hold up the end of the launch)."""
        if self.node_rank == 0:
            self.read_logs(self.clock(), looks=FINAL_LOG_LOOKS)
            changed = self._changed_exits({s.rank: s.exit_code for s in diagnosis.ranks})
            exit_codes = {r: c for r, c in self._exits.items() if c is not None}
            verdict = LaunchVerdict(verdict=diagnosis.verdict, culprit_ranks=diagnosis.culprit_ranks,
                                    hang_kind=diagnosis.hang_kind, summary=diagnosis.summary[:4096],
                                    root_error=diagnosis.root_error[:4096] if diagnosis.root_error else None,
                                    exit_codes=exit_codes)
            self._queue(self.clock(), ranks=changed, verdict=verdict)
        self.close(wait_s)

    def _changed_exits(self, exit_codes: Mapping[int, int | None]) -> dict[int, int | None]:
        changed: dict[int, int | None] = {
            r: c for r, c in exit_codes.items() if c is not None and self._exits.get(r) != c}
        self._exits.update(changed)
        return changed

    def close(self, wait_s: float = 0.0) -> None:
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=wait_s)
        if self._pending:
            self._once(f"vigil launch: {len(self._pending)} report(s) to {self.url} could not be sent in time")
        self._client.close()

    def _place(self, snapshots: Mapping[int, RankSnapshot], pids: Mapping[int, int]) -> bool:
        local = range(self.node_rank * self.nproc, (self.node_rank + 1) * self.nproc)
        placement = []
        for rank in range(self.world_size):
            local_rank = rank % self.nproc
            if rank in local:
                node = self.node
            elif rank in snapshots:
                node = snapshots[rank].host.split(".")[0]
            else:
                return False  # a rank of another node that has not written its snapshot yet
            placement.append(RankPlacement(rank=rank, node=node, gpu=self.gpus[local_rank],
                                           pid=pids.get(rank) or (snapshots[rank].pid if rank in snapshots else None)))
        self._placement = placement
        return True

    def _telemetry(self, snapshots: Mapping[int, RankSnapshot], now: float) -> bool:
        """The job's progress: it is as far as its slowest rank and steps at its slowest rank's pace. Nothing
        before the first complete step (start-up is not a stall), and nothing once a rank has failed (exited
        non-zero): the job stops where it is (`vigil launch` restarts no rank; were ``_exits`` cleared for a
        restart, telemetry would resume with it). Before, the failed rank left the step count (the minimum over
        the ranks still running) jumping to its peers' while tokens/s still summed its stale last value: the
        throughput rule read a new step at a stale pace, a false throughput_drop beside the crash."""
        if any(code not in (None, 0) for code in self._exits.values()):
            return False
        running = [s for r, s in snapshots.items() if self._exits.get(r) is None]
        timed = [s.step_times[-1] for s in running if s.step_times]
        if not running or not timed:
            return False
        steps = min(s.steps for s in running)
        self.progress.update()
        losses = self.progress.latest("loss")
        grads = self.progress.latest("grad_norm")
        tokens = self.progress.latest("tokens_per_s")
        for rank in self.progress.ranks:
            del rank.metrics[:-16]  # only the latest values are read
        self._steps.append(StepTelemetry(
            ts=now,
            steps=steps,
            step_time_s=max(timed),
            loss=statistics.fmean(losses) if losses else None,
            grad_norm=max(grads) if grads else None,
            tokens_per_s=sum(tokens) if tokens else None,
            checkpointing=any(s.activity.get("kind") == "checkpoint" for s in running),
        ))
        return True

    # ---------------------------------------------------------------- sending

    def _queue(self, now: float, ranks: Mapping[int, int | None] | None = None,
               verdict: LaunchVerdict | None = None) -> None:
        if not self._placement and verdict is None and not self._steps and not self._logs:
            return
        report = LaunchReport(
            job=self.job, ts=now, world_size=self.world_size, placement=list(self._placement),
            ranks=[RankState(rank=r, exit_code=c) for r, c in sorted((ranks or {}).items())],
            steps=self._steps, logs=self._logs, verdict=verdict)
        self._steps = []
        self._logs = []
        with self._lock:
            if report.logs and sum(len(r.logs) for r in self._pending) + len(report.logs) > MAX_BUFFERED_LOG_EVENTS:
                self.logs_dropped += len(report.logs)
                report.logs = []
            self._pending.append(report)
            while len(self._pending) > MAX_BUFFERED:
                self._pending.popleft()
        self._wake.set()

    def _send_loop(self) -> None:
        """Send what is pending, oldest first; on a failure wait ``interval_s`` (or for the next report) and
        try again. Once closing, one last round."""
        while True:
            self._wake.wait(timeout=self.interval_s)
            self._wake.clear()
            closing = self._closing.is_set()
            while self._pending:
                report = self._pending[0]
                if not self._post(report):
                    break
                with self._lock:
                    if self._pending and self._pending[0] is report:
                        self._pending.popleft()
            if closing:
                return

    def _post(self, report: LaunchReport) -> bool:
        """True when the report is done with: stored, or refused as malformed (sending it again cannot help)."""
        try:
            response = self._client.post(self.url, content=report.model_dump_json(),
                                         headers={"Content-Type": "application/json"})
        except httpx.HTTPError as err:
            return self._failed(f"server {self.url} unreachable ({err})")
        if response.status_code in (401, 403):
            return self._failed(f"server {self.url} refused the token (HTTP {response.status_code})")
        if response.status_code >= 500:
            return self._failed(f"server {self.url} failed (HTTP {response.status_code})")
        if response.status_code >= 400:
            self._once(f"vigil launch: server {self.url} refused a report (HTTP {response.status_code}): "
                       f"{response.text[:200]}")
            return True
        self.sent += 1
        return True

    def _failed(self, why: str) -> bool:
        self.failures += 1
        self._once(f"vigil launch: {why}; training goes on, reports are kept and retried")
        return False

    def _once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self._warn(message)
