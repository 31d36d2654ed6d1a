"""The out-of-process supervisor: where the probe's records meet detection, diagnosis and action.

It reads every rank's exit status and probe records (sources), asks ``vigil.detect.hang`` *whether*
the job is hung or mismatched, gathers evidence from outside the ranks (py-spy stacks, FR dumps via
the probes), stops the job, and asks ``vigil.diagnose.hang`` *who* and *why*.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vigil.detect.hang import HangTrigger
from vigil.diagnose.hang import STALE_HEARTBEAT_S, HangDiagnosis, RunEvidence, diagnose, write_diagnosis
from vigil.diagnose.stack_clusters import append_sweep, periodic_file, sweep_of
from vigil.diagnose.stacks import MAIN_THREAD, RankStacks, collective_split, from_pyspy, from_python_stacks
from vigil.diagnose.straggler import find_straggler, first_step_end, median_step_s
from vigil.diagnose.timeline import write_timeline
from vigil.model import VigilInputError
from vigil.run.nodes import PRE_STEP_STACKS_PATTERN, NodeGroup
from vigil.run.rank_procs import stop_groups
from vigil.sources.probe.pyspy import dump_all, native_frames
from vigil.sources.probe.records import (
    DEFAULT_HANG_TIMEOUT_S,
    DIAGNOSIS_FILE,
    DUMP_REQUEST_FILE,
    FR_DIR,
    RUN_FILE,
    STACKS_FILE,
    RankSnapshot,
    current_op_path,
    read_rank,
    snapshot_path,
)

EventSink = Callable[[str], None]
# After the first rank fails, wait up to this long for the peers' own errors so the cascade is visible; the
# verdict comes as soon as every rank has exited, so a crash whose peers fail fast is not delayed. A rank that
# raised may take seconds to exit (torch's teardown, under load), and its peers see it gone only then: at 2 s,
# a loaded machine stopped them before they printed their "Connection closed by peer".
CRASH_GRACE_S = 10.0
# Before the first step a silent job is looked at with py-spy at most this often.
PRE_STEP_LOOK_S = 2.0


@dataclass
class SupervisorConfig:
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S
    checkpoint_timeout_s: float = 600.0
    startup_grace_s: float = 60.0
    tick_s: float = 0.25
    pyspy_timeout_s: float = 10.0
    evidence_wait_s: float = 3.0
    flight_recorder: bool = True
    job: str = "local"
    # Periodic py-spy sweeps of every rank (vigil.diagnose.stack_clusters); 0 turns them off.
    stack_period_s: float = 300.0


@dataclass
class Supervisor:
    procs: dict[int, subprocess.Popen[bytes]]
    out_dir: Path
    config: SupervisorConfig = field(default_factory=SupervisorConfig)
    on_event: EventSink = field(default=lambda message: None)
    snapshots: dict[int, RankSnapshot] = field(default_factory=dict)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    exit_times: dict[int, float] = field(default_factory=dict)
    _seen: dict[int, tuple[float, bytes]] = field(default_factory=dict)
    _straggler_reported: bool = False
    _next_straggler_check: float = 0.0
    _next_stack_look: float = 0.0
    _next_sweep: float = 0.0
    _first_failure: float | None = None
    log_paths: dict[int, Path] = field(default_factory=dict)
    # Several nodes: this supervisor's ranks are ``procs``; the job has ``world`` ranks in all.
    nodes: NodeGroup | None = None
    world: int | None = None
    # Called after every step that reached no verdict (``vigil launch --server`` reports from here).
    watch: Callable[[Supervisor], None] | None = None
    trigger: HangTrigger = field(init=False)

    def __post_init__(self) -> None:
        self.trigger = HangTrigger(
            hang_timeout_s=self.config.hang_timeout_s,
            checkpoint_timeout_s=self.config.checkpoint_timeout_s,
            startup_grace_s=self.config.startup_grace_s,
        )

    @property
    def world_size(self) -> int:
        return self.world or len(self.procs)

    def run(self) -> HangDiagnosis:
        """Supervise until the job ends or a verdict is reached; the job is stopped on a verdict."""
        while True:
            verdict = self.step()
            if verdict is not None:
                return verdict
            if self.watch is not None:
                self.watch(self)
            time.sleep(self.config.tick_s)

    def step(self) -> HangDiagnosis | None:
        """One look at the ranks: the verdict once the job ended or went wrong (then it is stopped)."""
        if self.nodes is not None and self.nodes.claimed_by_other():
            return self._follow()
        now = time.time()
        self._poll_exits(now)
        self._read_snapshots()
        alive = [r for r, code in self.exit_codes.items() if code is None]
        failed = [r for r, code in self.exit_codes.items() if code not in (None, 0)]
        raised = [r for r in alive if r in self.snapshots and self.snapshots[r].error is not None]
        if failed and self._first_failure is None:
            self._first_failure = now
            self.on_event(f"rank {failed[0]} exited with status {self.exit_codes[failed[0]]}")
        elif raised and self._first_failure is None:
            # An uncaught exception is a crash even if the process then hangs on its way out.
            self._first_failure = now
            error = self.snapshots[raised[0]].error or {}
            self.on_event(f"rank {raised[0]} raised {error.get('type')}: {str(error.get('message'))[:200]}")
        if not alive:
            return self._conclude("exit" if not (failed or raised) else "crash", now)
        if self._first_failure is not None:
            return self._conclude("crash", now) if now - self._first_failure >= CRASH_GRACE_S else None
        if self.trigger.mismatch(self.snapshots, self.world_size, now):
            self.on_event("collective signature mismatch across ranks")
            return self._conclude("mismatch", now)
        reason = self.trigger.stall(self.snapshots, set(alive), now) or self._pre_step_hang(alive, now)
        if reason is not None:
            self.on_event(f"hang: {reason}")
            return self._conclude("hang", now)
        self._watch_straggler(now)
        self._periodic_stacks(alive, now)
        return None

    # ------------------------------------------------------------------ observation

    def _poll_exits(self, now: float, final: bool = False, stopped: set[int] | None = None) -> None:
        for rank, proc in self.procs.items():
            if self.exit_codes.get(rank) is None:
                code = proc.poll()
                self.exit_codes[rank] = code
                if code is not None:
                    self.exit_times[rank] = now
        if self.nodes is None:
            return
        local = {r: c for r, c in self.exit_codes.items() if r in self.procs}
        self.nodes.publish({r: p.pid for r, p in self.procs.items()}, local, self.exit_times, final, stopped)
        codes, times = self.nodes.remote_exits()
        for rank in range(self.world_size):
            if rank not in self.procs:
                # A node that has not published yet: its ranks count as running.
                self.exit_codes[rank] = codes.get(rank)
                if rank in times:
                    self.exit_times[rank] = times[rank]

    def _read_snapshots(self) -> None:
        for rank in range(self.world_size):
            try:
                # The current-op file is written through a memory map, which need not touch its mtime:
                # its bytes (2 KB) are the change mark.
                seen = (snapshot_path(self.out_dir, rank).stat().st_mtime, _read(current_op_path(self.out_dir, rank)))
            except FileNotFoundError:
                continue
            if self._seen.get(rank) == seen:
                continue
            try:
                self.snapshots[rank] = read_rank(self.out_dir, rank)
            except VigilInputError:
                continue
            self._seen[rank] = seen

    def _pre_step_hang(self, alive: list[int], now: float) -> str | None:
        """A job silent before its first step, in a collective the probe never saw: every rank's stack says
        whether some wait in a collective while others are elsewhere (looked at, at most, once per hang
        timeout). py-spy reaches local processes alone, so with several nodes each node leaves its ranks'
        stacks in the shared directory and splits the job once every node's stacks of this look are in."""
        if now < self._next_stack_look:
            return None
        if not self.trigger.pre_step_suspects(self.snapshots, set(alive), now):
            return None
        look = max(self.config.hang_timeout_s, PRE_STEP_LOOK_S)
        self._next_stack_look = now + look
        stacks, _ = self._pyspy({r: self.procs[r].pid for r in alive if r in self.procs})
        if self.nodes is not None:
            self.nodes.write_stacks(stacks, PRE_STEP_STACKS_PATTERN)
            # The other nodes look on the same evidence (the shared snapshots) within one look of this one.
            stacks = {**self.nodes.read_stacks(PRE_STEP_STACKS_PATTERN, since=now - look), **stacks}
            if not set(alive) <= set(stacks):
                return None
        split = collective_split(stacks)
        if split is None:
            return None
        waiting, elsewhere = split
        return (f"no step yet and no progress for {now - max(s.last_progress() for s in self.snapshots.values()):.1f}"
                f" s: rank(s) {waiting} wait in a collective, rank(s) {elsewhere} are elsewhere")

    def _periodic_stacks(self, alive: list[int], now: float) -> None:
        """One py-spy sweep of this node's training ranks per ``stack_period_s`` once the job has stepped (start-up
        stacks - imports, rendezvous - say nothing about a machine), appended to the run's periodic stacks
        file; ranks past their script's end, or with no main-thread stack left, are left out."""
        period = self.config.stack_period_s
        if period <= 0 or now < self._next_sweep or not any(s.steps > 0 for s in self.snapshots.values()):
            return
        # Sweeps fall on multiples of the period of the wall clock, numbered by them, so every node of the
        # job looks at its ranks at the same moment and the sweeps of one number form one picture.
        slot = math.floor(now / period)
        first = self._next_sweep == 0.0
        self._next_sweep = (slot + 1) * period
        if first:
            return
        pids = {r: self.procs[r].pid for r in alive
                if r in self.procs and not (r in self.snapshots and self.snapshots[r].finished)}
        if not pids:
            return
        dumps = dump_all(pids, self.config.pyspy_timeout_s)
        stacks = {r: threads for r, d in dumps.dumps.items() if (threads := from_pyspy(d)).get(MAIN_THREAD)}
        if stacks:
            hosts = {r: s.host for r, s in self.snapshots.items()}
            path = self.out_dir / periodic_file(self.nodes.node_rank if self.nodes is not None else None)
            append_sweep(path, sweep_of(stacks, hosts, self.config.job, slot, now))

    def _watch_straggler(self, now: float) -> None:
        if self._straggler_reported or now < self._next_straggler_check:
            return
        self._next_straggler_check = now + 2.0
        finding = find_straggler({r: s.ops for r, s in self.snapshots.items()},
                                 step_s=median_step_s([s.step_times for s in self.snapshots.values()]),
                                 since=first_step_end(self.snapshots.values()))
        if finding is not None:
            self._straggler_reported = True
            self.on_event(f"straggler: {finding.describe()}")

    # ------------------------------------------------------------------ verdict

    def _conclude(self, trigger: str, now: float) -> HangDiagnosis:
        if self.nodes is not None and not self.nodes.claim(trigger):
            return self._follow()
        alive = {r: p.pid for r, p in self.procs.items() if self.exit_codes.get(r) is None}
        stopped: set[int] = set()
        stacks: RankStacks = {}
        stack_source = "none"
        heartbeat_ages = {
            r: max(0.0, now - s.heartbeat) for r, s in self.snapshots.items() if self.exit_codes.get(r) is None
        }
        native: dict[int, list[str]] = {}
        if alive:
            (self.out_dir / DUMP_REQUEST_FILE).touch()
            if trigger in ("hang", "mismatch"):
                stacks, stack_source = self._pyspy(alive)
                native = self._native(alive, heartbeat_ages)
            self._wait_for_probe_evidence(alive, heartbeat_ages)
        if self.nodes is not None:
            stacks.update(self._gather_nodes())
            stack_source = "py-spy" if stacks else stack_source
            # The other nodes stop their running ranks once this verdict is written.
            stopped |= {r for r, code in self.exit_codes.items() if code is None and r not in self.procs}
        if not stacks:
            stacks = {r: from_python_stacks(s.stacks) for r, s in self.snapshots.items() if s.stacks}
            stack_source = "probe" if stacks else "none"
        if alive:
            stopped |= set(alive)
            self._stop(alive)
            self._poll_exits(time.time(), final=True, stopped=set(alive))
        evidence = RunEvidence(
            world_size=self.world_size,
            snapshots=self.snapshots,
            exit_codes=dict(self.exit_codes),
            exit_times=dict(self.exit_times),
            stopped_by_supervisor=stopped,
            logs=self._logs(),
            stacks=stacks,
            stack_source=stack_source,
            trigger=trigger if trigger in ("hang", "mismatch") else None,
            detected_at=now,
            heartbeat_ages=heartbeat_ages,
            hang_timeout_s=self.config.hang_timeout_s,
            job=self.config.job,
            native=native,
        )
        diag = diagnose(evidence)
        self._write(evidence, diag)
        return diag

    def _pyspy(self, alive: dict[int, int]) -> tuple[RankStacks, str]:
        self.on_event(f"collecting py-spy stacks of {len(alive)} rank(s)")
        dumps = dump_all(alive, self.config.pyspy_timeout_s)
        for rank, error in sorted(dumps.errors.items()):
            self.on_event(f"rank {rank}: {error}")
        stacks = {r: from_pyspy(d) for r, d in dumps.dumps.items()}
        return stacks, "py-spy" if stacks else "none"

    def _native(self, alive: dict[int, int], heartbeat_ages: dict[int, float]) -> dict[int, list[str]]:
        """C / C++ frames of the ranks whose probe froze: they hold the GIL inside native code."""
        frozen = {r: pid for r, pid in alive.items() if heartbeat_ages.get(r, 0.0) > STALE_HEARTBEAT_S}
        if not frozen:
            return {}
        dumps = dump_all(frozen, self.config.pyspy_timeout_s, native=True)
        return {r: frames for r, d in dumps.dumps.items() if (frames := native_frames(d))}

    def _gather_nodes(self) -> RankStacks:
        """The claimer waits for the other nodes' stacks of their own ranks (taken while every rank still
        runs: a rank stopped early would make its peers fail, and that cascade is no crash)."""
        assert self.nodes is not None
        deadline = time.time() + self.config.pyspy_timeout_s + self.config.evidence_wait_s + 5.0
        while time.time() < deadline and not self.nodes.stacks_in():
            time.sleep(0.1)
        self._poll_exits(time.time())
        return self.nodes.read_stacks()

    def _follow(self) -> HangDiagnosis:
        """Another node reached the verdict: leave this node's stacks, wait for the verdict, then stop
        this node's ranks (not before: the claimer is still reading evidence from its own)."""
        assert self.nodes is not None
        self.on_event(f"node {self.nodes.claimer()} reached a verdict; reading this node's stacks")
        self._poll_exits(time.time())
        alive = {r: p.pid for r, p in self.procs.items() if self.exit_codes.get(r) is None}
        try:
            self.nodes.write_stacks(self._pyspy(alive)[0] if alive else {})
            path = self.out_dir / DIAGNOSIS_FILE
            deadline = time.time() + self.config.pyspy_timeout_s + self.config.evidence_wait_s + 30.0
            while time.time() < deadline:
                if path.exists() and path.stat().st_mtime >= self.nodes.started:
                    try:
                        return HangDiagnosis.model_validate_json(path.read_text())
                    except ValueError:
                        pass  # being written
                time.sleep(0.1)
            raise VigilInputError(f"node {self.nodes.claimer()} claimed the verdict but wrote no {path}")
        finally:
            self._stop(alive)
            self._poll_exits(time.time(), final=True, stopped=set(alive))

    def _wait_for_probe_evidence(self, alive: dict[int, int], heartbeat_ages: dict[int, float]) -> None:
        """Give responsive probes a moment to write stacks and FR dumps; frozen ones are not waited for."""
        responsive = [r for r in alive if heartbeat_ages.get(r, 0.0) < 2.0]
        deadline = time.time() + self.config.evidence_wait_s
        while time.time() < deadline:
            self._read_snapshots()
            if all(self.snapshots.get(r) is not None and self.snapshots[r].stacks for r in responsive):
                fr_ready = not self.config.flight_recorder or all(
                    (self.out_dir / FR_DIR / f"rank_{r}").exists() for r in responsive
                )
                if fr_ready:
                    return
            time.sleep(0.1)

    def _stop(self, alive: dict[int, int]) -> None:
        stop_groups([self.procs[rank] for rank in alive])

    def _logs(self) -> dict[int, str]:
        logs = {}
        for rank in range(self.world_size):
            path = self.log_paths.get(rank, self.out_dir / f"rank{rank}.log")
            if path.exists():
                logs[rank] = path.read_text(errors="replace")[-20000:]
        return logs

    def _write(self, evidence: RunEvidence, diag: HangDiagnosis) -> None:
        (self.out_dir / STACKS_FILE).unlink(missing_ok=True)
        if evidence.stacks:
            payload = {str(r): {"threads": t} for r, t in evidence.stacks.items()}
            (self.out_dir / STACKS_FILE).write_text(json.dumps(payload, indent=1))
        meta = {
            "job": self.config.job,
            "world_size": self.world_size,
            "trigger": evidence.trigger,
            "detected_at": evidence.detected_at,
            "exit_codes": evidence.exit_codes,
            "exit_times": evidence.exit_times,
            "stopped_by_supervisor": sorted(evidence.stopped_by_supervisor),
            "heartbeat_ages": evidence.heartbeat_ages,
            "hang_timeout_s": self.config.hang_timeout_s,
            "stack_source": evidence.stack_source,
            "native_frames": evidence.native,
        }
        (self.out_dir / RUN_FILE).write_text(json.dumps(meta, indent=1))
        write_diagnosis(self.out_dir, diag)
        write_timeline(self.out_dir, evidence, diag)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""

