"""Hang and mismatch triggers: when has a distributed job stopped, judged from its ranks' probe records.

Three ways a job shows it has stopped, each enough on its own:
- an op in flight past its timeout (the probe's adaptive one: a multiple of the op's recent worst
  duration) while the whole job makes no communication or step progress;
- a rank whose probe heartbeat stopped (it holds the GIL in a C call, or is frozen);
- no rank finished a step for longer than the job's own step times allow, while some rank neither
  computes nor communicates: it waits for a peer. This one needs no op record at all, so a collective
  the probe never saw (issued from C++, a compiled graph) still ends in a verdict.
What is not a hang: a rank saving a checkpoint that keeps writing (bytes reached its file or the kernel
within the last ``hang_timeout_s``: a save that wrote nothing that long is stuck, as on a hung mount) or
running forward passes without gradients (an evaluation loop), up to ``checkpoint_timeout_s``; ranks
that compute without stepping; anything before the job's first step (data-loader warm-up, the first
compile), which gets ``startup_grace_s``; a job that never stepped is judged by its ops and heartbeats only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vigil.detect.collectives import signature_mismatches
from vigil.sources.probe.records import DEFAULT_HANG_TIMEOUT_S, RankSnapshot

# A step may take this many times the job's slowest recent step before silence counts as a hang.
STEP_FACTOR = 4.0
# A mismatch must hold this long before it is reported, so a rank that is merely late is not flagged.
MISMATCH_CONFIRM_S = 1.0
# A rank computed "just now" within this many seconds (the probe marks model forwards and matmuls).
RECENT_S = 2.0


@dataclass
class HangTrigger:
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S
    checkpoint_timeout_s: float = 600.0
    startup_grace_s: float = 60.0

    def stall(self, snapshots: Mapping[int, RankSnapshot], live: set[int], now: float) -> str | None:
        """Why the job counts as hung now, or None. ``live``: ranks whose process still runs."""
        # A rank past its script's end (the probe saw the interpreter exit) waits for nobody.
        alive = {r: s for r, s in snapshots.items() if r in live and not s.finished}
        if not alive:
            return None
        last_progress = max(s.last_progress() for s in snapshots.values())
        if self._saving_checkpoint(alive, now):
            return None
        # A rank evaluating (its peers may wait for it in a collective) has the checkpoint allowance.
        evaluating = any(_evaluating(s, now, self.hang_timeout_s) for s in alive.values())
        if evaluating and now - last_progress < self.checkpoint_timeout_s:
            return None
        started = any(s.steps > 0 for s in snapshots.values())
        floor = self.hang_timeout_s if started else max(self.hang_timeout_s, self.startup_grace_s)
        if now - last_progress >= floor:
            for rank, snap in sorted(alive.items()):
                for op in snap.ops:
                    timeout = max(op.timeout_s or self.hang_timeout_s, floor)
                    if op.in_flight and now - op.t_start > timeout:
                        waited = now - op.t_start
                        return f"rank {rank} has waited {waited:.1f} s in {op.op} #{op.seq} (timeout {timeout:.1f} s)"
        for rank, snap in sorted(alive.items()):
            if now - snap.heartbeat > self.hang_timeout_s and not snap.finished:
                return f"rank {rank}'s probe heartbeat stopped {now - snap.heartbeat:.1f} s ago"
        return self._no_steps(snapshots, alive, now, started)

    def pre_step_suspects(self, snapshots: Mapping[int, RankSnapshot], live: set[int], now: float) -> list[int]:
        """Before the job's first step: the ranks silent (no op, no compute) for the startup allowance while
        no rank made op progress either. Silence alone proves nothing here - a long warm-up looks the same -
        so the caller confirms with every rank's stack (``vigil.diagnose.stacks.collective_split``)."""
        alive = {r: s for r, s in snapshots.items() if r in live and not s.finished}
        if not alive or any(s.steps > 0 for s in snapshots.values()) or self._saving_checkpoint(alive, now):
            return []
        floor = max(self.hang_timeout_s, self.startup_grace_s)
        if now - max(s.last_progress() for s in snapshots.values()) < floor:
            return []
        return sorted(r for r, s in alive.items() if now - _last_activity(s) >= floor)

    def step_timeout(self, snapshots: Mapping[int, RankSnapshot]) -> float:
        """The hang timeout, or a multiple of the job's slowest recent step when that is longer."""
        worst = max((max(s.step_times) for s in snapshots.values() if s.step_times), default=0.0)
        return max(self.hang_timeout_s, STEP_FACTOR * worst)

    def _no_steps(
        self, snapshots: Mapping[int, RankSnapshot], alive: Mapping[int, RankSnapshot], now: float, started: bool
    ) -> str | None:
        if not started:
            # Silence means nothing from a job that never stepped (it may not be a training loop).
            return None
        last_step = max(s.last_step or s.started for s in snapshots.values())
        limit = self.step_timeout(snapshots)
        if now - last_step <= limit:
            return None
        idle = sorted(r for r, s in alive.items() if now - _last_activity(s) > self.hang_timeout_s)
        if not idle:
            return None
        return (
            f"no rank finished a step for {now - last_step:.1f} s (limit {limit:.1f} s from the job's step "
            f"times); rank(s) {idle} neither compute nor communicate"
        )

    def _saving_checkpoint(self, alive: Mapping[int, RankSnapshot], now: float) -> bool:
        return any(
            saving_checkpoint(snap, now, self.hang_timeout_s, self.checkpoint_timeout_s) for snap in alive.values()
        )

    def mismatch(self, snapshots: Mapping[int, RankSnapshot], world_size: int, now: float) -> bool:
        """Every member entered collective #k, but someone's op, shape or dtype differs - for a while."""
        if len(snapshots) < world_size:
            return False
        ops = {r: s.ops for r, s in snapshots.items()}
        return any(f.oldest_wait_s >= MISMATCH_CONFIRM_S for f in signature_mismatches(ops, now))


def saving_checkpoint(snap: RankSnapshot, now: float, quiet_s: float, limit_s: float) -> bool:
    """Inside a checkpoint save that is still writing: begun less than ``limit_s`` ago, and its last byte
    written less than ``quiet_s`` ago. A record without write progress (an older probe) counts the begin only."""
    activity = snap.activity
    if activity.get("kind") != "checkpoint":
        return False
    since = float(activity.get("since", now))
    if now - since >= limit_s:
        return False
    return "progress_at" not in activity or now - float(activity["progress_at"]) < quiet_s


def stuck_checkpoint_s(snap: RankSnapshot, now: float) -> float | None:
    """Seconds since a rank inside a checkpoint save last wrote a byte, or None when it is not saving."""
    activity = snap.activity
    if activity.get("kind") != "checkpoint" or "progress_at" not in activity:
        return None
    return now - float(activity["progress_at"])


def _last_activity(snap: RankSnapshot) -> float:
    return max(snap.last_progress(), snap.last_compute or 0.0)


def _evaluating(snap: RankSnapshot, now: float, within_s: float) -> bool:
    """Forward passes without gradients within the last hang timeout: an evaluation loop, not a stuck training
    step. Not "within 2 s": a validation loader that takes seconds a batch spaces the forwards that far apart."""
    return snap.last_eval is not None and now - snap.last_eval < max(RECENT_S, within_s)
